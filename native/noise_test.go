package native

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// zimageGolden is the part of fixtures/golden/zimage-tiny.json (made by diffusers and torch on
// the GPU host, see fixtures/PROVENANCE.md) that the noise test reads.
type zimageGolden struct {
	Noise []struct {
		Seed   uint64 `json:"seed"`
		N      int    `json:"n"`
		Values string `json:"values"`
	} `json:"noise"`
	Cases []struct {
		Name           string `json:"name"`
		Seed           uint64 `json:"seed"`
		InitialLatents string `json:"initial_latents"`
	} `json:"cases"`
}

func decodeF32(t *testing.T, s string) []float32 {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		t.Fatalf("golden float array: %v (%d bytes)", err, len(b))
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestTorchRandnMatchesTorch: every seed and size torch drew (both sides of its 16-element
// vectorised path, seeds beyond 32 bits) and every pipeline case's initial latents are
// reproduced to float precision (torch's AVX-512 kernels and our libm may differ by an ulp or
// two in log/sin/cos).
func TestTorchRandnMatchesTorch(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "fixtures", "golden", "zimage-tiny.json"))
	if err != nil {
		t.Fatalf("%v: regenerate it with fixtures/golden/make_zimage_golden.py", err)
	}
	var g zimageGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Noise) == 0 || len(g.Cases) == 0 {
		t.Fatal("the golden has no noise or no cases")
	}
	check := func(what string, seed uint64, want []float32) float64 {
		got, err := TorchRandn(seed, len(want))
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i := range want {
			d := math.Abs(float64(got[i]) - float64(want[i]))
			tol := 4e-6 * math.Max(1, math.Abs(float64(want[i])))
			if d > tol {
				t.Fatalf("%s seed %d n %d: value %d is %g, torch drew %g", what, seed, len(want), i, got[i], want[i])
			}
			worst = math.Max(worst, d)
		}
		return worst
	}
	worst := 0.0
	for _, n := range g.Noise {
		want := decodeF32(t, n.Values)
		if len(want) != n.N {
			t.Fatalf("golden seed %d: %d values, want %d", n.Seed, len(want), n.N)
		}
		worst = math.Max(worst, check("randn", n.Seed, want))
	}
	for _, c := range g.Cases {
		worst = math.Max(worst, check("case "+c.Name+" initial latents", c.Seed, decodeF32(t, c.InitialLatents)))
	}
	t.Logf("%d draws and %d initial latents match torch; max |diff| %.3g", len(g.Noise), len(g.Cases), worst)
}

// TestTorchRandnBF16MatchesTorch: torch's bf16 draws (fixtures/golden/torch-randn-bf16.json,
// made by torch on the GPU host) are reproduced bit for bit, and they are not the float stream of
// the same seed (a bf16 pipeline that drew fp32 noise would pass the first check only by luck).
func TestTorchRandnBF16MatchesTorch(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "fixtures", "golden", "torch-randn-bf16.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Draws []struct {
			Seed   uint64 `json:"seed"`
			N      int    `json:"n"`
			Values string `json:"values"`
		} `json:"draws"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Draws) == 0 {
		t.Fatal("the golden has no draws")
	}
	for _, d := range g.Draws {
		want := decodeF32(t, d.Values)
		if len(want) != d.N {
			t.Fatalf("seed %d: %d values, want %d", d.Seed, len(want), d.N)
		}
		got, err := TorchRandnBF16(d.Seed, len(want))
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("seed %d: value %d is %g, torch drew %g in bf16", d.Seed, i, got[i], want[i])
			}
		}
		f32, err := TorchRandn(d.Seed, len(want))
		if err != nil {
			t.Fatal(err)
		}
		same := 0
		for i := range want {
			if math.Abs(float64(f32[i]-want[i])) < 0.01 {
				same++
			}
		}
		if same > len(want)/10 {
			t.Errorf("seed %d: %d of %d bf16 values within 0.01 of the float stream's; the streams should be unrelated", d.Seed, same, len(want))
		}
	}
}
