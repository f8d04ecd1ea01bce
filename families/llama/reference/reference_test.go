package reference

import (
	"math"
	"testing"

	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/fixtures"
)

// TestIncrementalMatchesFullPass: on every llama fixture (the sliding window of mistral-tiny
// included, whose 6 keys a 12-token prompt plus 8 steps run well past) the cached one-token
// decode equals a full forward pass, and the full pass is causal.
func TestIncrementalMatchesFullPass(t *testing.T) {
	prompt := []int32{1, 300, 301, 302, 500, 12, 13, 14, 600, 700, 5, 9}
	for _, name := range []string{fixtures.LlamaTiny, fixtures.LlamaTinyLlama3, fixtures.MistralTiny} {
		t.Run(name, func(t *testing.T) {
			dir, _, err := fixtures.Ensure("", name)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := numeric.CheckIncremental(m, prompt, 8, 1e-9); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSlidingWindowMatters: mistral-tiny's window of 6 changes the logits once a sequence is
// longer than 6 and not before; with the window removed the model is plain causal attention.
func TestSlidingWindowMatters(t *testing.T) {
	dir, _, err := fixtures.Ensure("", fixtures.MistralTiny)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.window != 6 {
		t.Fatalf("window %d, want mistral-tiny's sliding_window 6", m.window)
	}
	ids := []int32{1, 300, 301, 302, 500, 12, 13, 14, 600, 700}
	windowed, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	m.window = 0
	full, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	for p := range ids {
		d := 0.0
		for j := range full[p] {
			d = math.Max(d, math.Abs(full[p][j]-windowed[p][j]))
		}
		if p < 6 && d != 0 {
			t.Errorf("position %d (within the window): logits differ by %.3g", p, d)
		}
		if p >= 6 && d < 1e-3 {
			t.Errorf("position %d (past the window): logits differ by only %.3g; the window is not applied", p, d)
		}
	}
}

// TestRotaryDefinitions checks the rope types against their definitions on values worked by
// hand: linear divides every frequency by the factor; llama3 keeps short wavelengths, divides
// long ones by the factor and blends between; yarn's attention scaling is 0.1·ln(s)+1.
func TestRotaryDefinitions(t *testing.T) {
	base := Config{HeadDim: 8, MaxPositionEmbeddings: 1024}
	base.Rope.RopeTheta = 10000
	plain := []float64{1, 0.1, 0.01, 0.001} // 10000^(-2i/8)
	c := base
	c.Rope.RopeType = "linear"
	c.Rope.Factor = 4
	inv, att, err := RotaryFrequencies(c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range plain {
		if math.Abs(inv[i]-plain[i]/4) > 1e-15 || att != 1 {
			t.Errorf("linear: inv[%d] = %g, want %g", i, inv[i], plain[i]/4)
		}
	}
	// llama3 with original context 64, low 1, high 4: wavelengths 2π/θ are 6.28, 62.8, 628,
	// 6283; high_freq_wavelen 16, low_freq_wavelen 64. So θ0 kept, θ2 and θ3 divided by 8, θ1
	// (62.8, between) blended with s = (64/62.83 − 1)/3.
	c = base
	c.Rope = Rope{RopeType: "llama3", RopeTheta: 10000, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	inv, _, err = RotaryFrequencies(c)
	if err != nil {
		t.Fatal(err)
	}
	s := (64/(2*math.Pi/0.1) - 1) / 3
	want := []float64{1, (1-s)*0.1/8 + s*0.1, 0.01 / 8, 0.001 / 8}
	for i := range want {
		if math.Abs(inv[i]-want[i]) > 1e-15 {
			t.Errorf("llama3: inv[%d] = %g, want %g", i, inv[i], want[i])
		}
	}
	c = base
	c.Rope = Rope{RopeType: "yarn", RopeTheta: 10000, Factor: 4}
	if _, att, err = RotaryFrequencies(c); err != nil || math.Abs(att-(0.1*math.Log(4)+1)) > 1e-15 {
		t.Errorf("yarn attention scaling %g (err %v), want %g", att, err, 0.1*math.Log(4)+1)
	}
}
