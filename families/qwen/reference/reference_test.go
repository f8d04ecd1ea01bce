package reference

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/families/internal/safetensors"
)

// writeTiny writes a random Qwen3 checkpoint: vocab 60, width 8, 4 query heads sharing 2
// key/value heads of head_dim 4 (deliberately not width/heads, as in Qwen3-0.6B where
// head_dim 128 ≠ 1024/16), intermediate 12, 2 layers.
func writeTiny(t *testing.T, tied bool, cfgExtra map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{"vocab_size": 60, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-6,
		"rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": tied, "hidden_act": "silu"}
	for k, v := range cfgExtra {
		cfg[k] = v
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var ts []safetensors.Tensor
	add := func(name string, mean, scale float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		d := make([]float64, n)
		for i := range d {
			d[i] = mean + r.NormFloat64()*scale
		}
		ts = append(ts, safetensors.Tensor{Name: name, Shape: shape, Data: d})
	}
	add("model.embed_tokens.weight", 0, 0.5, 60, 8)
	if !tied {
		add("lm_head.weight", 0, 0.5, 60, 8)
	}
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", 1, 0.1, 8)
		add(p+"post_attention_layernorm.weight", 1, 0.1, 8)
		add(p+"self_attn.q_proj.weight", 0, 0.4, 16, 8)
		add(p+"self_attn.k_proj.weight", 0, 0.4, 8, 8)
		add(p+"self_attn.v_proj.weight", 0, 0.4, 8, 8)
		add(p+"self_attn.o_proj.weight", 0, 0.4, 8, 16)
		add(p+"self_attn.q_norm.weight", 1, 0.2, 4)
		add(p+"self_attn.k_norm.weight", 1, 0.2, 4)
		add(p+"mlp.gate_proj.weight", 0, 0.4, 12, 8)
		add(p+"mlp.up_proj.weight", 0, 0.4, 12, 8)
		add(p+"mlp.down_proj.weight", 0, 0.4, 8, 12)
	}
	add("model.norm.weight", 1, 0.1, 8)
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestIncrementalMatchesFullPass(t *testing.T) {
	for _, tied := range []bool{true, false} {
		m, err := Load(writeTiny(t, tied, nil))
		if err != nil {
			t.Fatalf("tied=%v: %v", tied, err)
		}
		if err := numeric.CheckIncremental(m, []int32{3, 14, 15, 9, 26, 5}, 12, 1e-9); err != nil {
			t.Errorf("tied=%v: %v", tied, err)
		}
	}
}

func TestRopeTheta(t *testing.T) {
	// transformers 5 writes rope_theta inside rope_parameters; both spellings must load the same
	// model, and a different theta must change the logits (position information flows through
	// RoPE only).
	a, err := Load(writeTiny(t, true, nil))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(writeTiny(t, true, map[string]any{"rope_theta": nil, "rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 10000.0}}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load(writeTiny(t, true, map[string]any{"rope_theta": 100000.0}))
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{1, 2, 3, 4, 5, 6, 7}
	la, _ := a.Logits(ids)
	lb, _ := b.Logits(ids)
	lc, _ := c.Logits(ids)
	last := len(ids) - 1
	if la[last][0] != lb[last][0] {
		t.Errorf("rope_parameters.rope_theta loaded a different model: %v vs %v", la[last][0], lb[last][0])
	}
	if la[0][0] != lc[0][0] {
		t.Errorf("position 0 depends on rope_theta (%v vs %v); RoPE at position 0 must be the identity", la[0][0], lc[0][0])
	}
	if la[last][0] == lc[last][0] {
		t.Error("rope_theta ×10 left the last position's logits unchanged; RoPE is not applied")
	}
	if _, err := Load(writeTiny(t, true, map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4}})); err == nil || !strings.Contains(err.Error(), `rope type "yarn"`) {
		t.Errorf("yarn scaling: %v, want a refusal naming the rope type", err)
	}
}

func TestRopeRotation(t *testing.T) {
	m := &Model{Config: Config{HeadDim: 4}, invFreq: []float64{1, 0.01}}
	// rotate_half pairs dimension j with j+2: at position 3, (x0, x2) turns by 3 rad and
	// (x1, x3) by 0.03 rad.
	row := []float64{1, 1, 0, 0}
	m.rope(row, 3)
	want := []float64{math.Cos(3), math.Cos(0.03), math.Sin(3), math.Sin(0.03)}
	for i := range want {
		if math.Abs(row[i]-want[i]) > 1e-12 {
			t.Errorf("rope[%d] = %v, want %v", i, row[i], want[i])
		}
	}
}

func TestRMSNorm(t *testing.T) {
	// [3,4]: mean square 12.5; per-head norm of width 1 normalizes each value to ±1.
	x := []float64{3, 4}
	rmsNorm(x, 2, []float64{1, 2}, 0)
	if math.Abs(x[0]-3/math.Sqrt(12.5)) > 1e-12 || math.Abs(x[1]-8/math.Sqrt(12.5)) > 1e-12 {
		t.Errorf("rmsNorm = %v", x)
	}
	y := []float64{-2, 5}
	rmsNorm(y, 1, []float64{1}, 0)
	if y[0] != -1 || y[1] != 1 {
		t.Errorf("per-chunk rmsNorm = %v, want [-1 1]", y)
	}
}

func TestQKNormMatters(t *testing.T) {
	dir := writeTiny(t, true, nil)
	a, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Load(dir)
	for i := range b.layers[0].qNorm {
		b.layers[0].qNorm[i] *= 3
	}
	ids := []int32{1, 2, 3, 4}
	la, _ := a.Logits(ids)
	lb, _ := b.Logits(ids)
	if la[3][0] == lb[3][0] {
		t.Error("scaling q_norm's weight left the logits unchanged; q_norm is not applied")
	}
}

func TestBadInput(t *testing.T) {
	m, err := Load(writeTiny(t, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Logits([]int32{1, -1}); err == nil || !strings.Contains(err.Error(), "token id -1 at position 1") {
		t.Errorf("negative id: %v", err)
	}
	if _, err := Load(writeTiny(t, false, map[string]any{"num_key_value_heads": 3})); err == nil || !strings.Contains(err.Error(), "num_key_value_heads 3") {
		t.Errorf("bad GQA config: %v", err)
	}
}
