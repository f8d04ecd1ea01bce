package reference

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/families/internal/safetensors"
)

// writeTiny writes a random GPT-2 checkpoint (vocab 50, 2 layers, width 8, 2 heads, 32
// positions) with the GPT2LMHeadModel tensor names.
func writeTiny(t *testing.T, prefix string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{"vocab_size": 50, "n_positions": 32, "n_embd": 8, "n_layer": 2, "n_head": 2,
		"layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "architectures": []string{"GPT2LMHeadModel"}}
	if len(extra) > 0 {
		cfg["tie_word_embeddings"] = false
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var ts []safetensors.Tensor
	add := func(name string, scale float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		d := make([]float64, n)
		for i := range d {
			d[i] = r.NormFloat64() * scale
		}
		ts = append(ts, safetensors.Tensor{Name: prefix + name, Shape: shape, Data: d})
	}
	add("wte.weight", 0.5, 50, 8)
	add("wpe.weight", 0.5, 32, 8)
	for l := 0; l < 2; l++ {
		p := "h." + string(rune('0'+l)) + "."
		add(p+"ln_1.weight", 1, 8)
		add(p+"ln_1.bias", 0.1, 8)
		add(p+"attn.c_attn.weight", 0.3, 8, 24)
		add(p+"attn.c_attn.bias", 0.1, 24)
		add(p+"attn.c_proj.weight", 0.3, 8, 8)
		add(p+"attn.c_proj.bias", 0.1, 8)
		add(p+"ln_2.weight", 1, 8)
		add(p+"ln_2.bias", 0.1, 8)
		add(p+"mlp.c_fc.weight", 0.3, 8, 32)
		add(p+"mlp.c_fc.bias", 0.1, 32)
		add(p+"mlp.c_proj.weight", 0.3, 32, 8)
		add(p+"mlp.c_proj.bias", 0.1, 8)
	}
	add("ln_f.weight", 1, 8)
	add("ln_f.bias", 0.1, 8)
	for _, name := range extra {
		// Untied head tensors, written without the prefix as GPT2LMHeadModel does.
		d := make([]float64, 50*8)
		for i := range d {
			d[i] = r.NormFloat64()
		}
		ts = append(ts, safetensors.Tensor{Name: name, Shape: []int{50, 8}, Data: d})
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestIncrementalMatchesFullPass(t *testing.T) {
	for _, prefix := range []string{"", "transformer."} {
		m, err := Load(writeTiny(t, prefix))
		if err != nil {
			t.Fatalf("prefix %q: %v", prefix, err)
		}
		if err := numeric.CheckIncremental(m, []int32{3, 14, 15, 9, 26}, 12, 1e-9); err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
		}
	}
}

func TestPositionsMatter(t *testing.T) {
	m, err := Load(writeTiny(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	// The same token at two positions must give different logits: wpe is added.
	l, err := m.Logits([]int32{7, 7})
	if err != nil {
		t.Fatal(err)
	}
	same := true
	for j := range l[0] {
		same = same && l[0][j] == l[1][j]
	}
	if same {
		t.Error("token 7 at positions 0 and 1 gave identical logits; learned positions are not applied")
	}
}

func TestBuildingBlocks(t *testing.T) {
	// GELU-tanh known values (Hendrycks & Gimpel 2016): gelu(0)=0, gelu(1)≈0.841192,
	// gelu(-1)≈-0.158808.
	for x, want := range map[float64]float64{0: 0, 1: 0.8411919906082768, -1: -0.15880800939172324} {
		if got := geluTanh(x); math.Abs(got-want) > 1e-12 {
			t.Errorf("geluTanh(%v) = %v, want %v", x, got, want)
		}
	}
	// LayerNorm of [1,2,3,4]: mean 2.5, biased variance 1.25.
	x := numeric.Matrix{Rows: 1, Cols: 4, Data: []float64{1, 2, 3, 4}}
	y := layerNorm(x, []float64{1, 1, 1, 2}, []float64{0, 0, 0, 1}, 0)
	want := []float64{-1.5 / math.Sqrt(1.25), -0.5 / math.Sqrt(1.25), 0.5 / math.Sqrt(1.25), 2*1.5/math.Sqrt(1.25) + 1}
	for i := range want {
		if math.Abs(y.Data[i]-want[i]) > 1e-12 {
			t.Errorf("layerNorm[%d] = %v, want %v", i, y.Data[i], want[i])
		}
	}
}

func TestBadInput(t *testing.T) {
	m, err := Load(writeTiny(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Logits([]int32{50}); err == nil || !strings.Contains(err.Error(), "token id 50") {
		t.Errorf("out-of-vocabulary id: %v", err)
	}
	if _, err := m.Greedy([]int32{1}, 40); err == nil || !strings.Contains(err.Error(), "exceeds the 32 positions") {
		t.Errorf("over-context greedy: %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("empty directory: %v", err)
	}
}

func TestUntiedHead(t *testing.T) {
	tied, err := Load(writeTiny(t, "transformer."))
	if err != nil {
		t.Fatal(err)
	}
	untied, err := Load(writeTiny(t, "transformer.", "lm_head.weight"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := tied.Logits([]int32{1, 2})
	b, _ := untied.Logits([]int32{1, 2})
	if a[1][0] == b[1][0] {
		t.Error("tie_word_embeddings false with its own lm_head.weight gave the tied logits")
	}
	if err := numeric.CheckIncremental(untied, []int32{4, 5}, 6, 1e-9); err != nil {
		t.Error(err)
	}
	if _, err := Load(writeTiny(t, "", "not_lm_head")); err == nil || !strings.Contains(err.Error(), `"lm_head.weight" missing`) {
		t.Errorf("untied config without lm_head.weight: %v", err)
	}
}
