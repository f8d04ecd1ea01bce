package reference

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelqual/modelqual/families/internal/golden"
	"github.com/modelqual/modelqual/fixtures"
)

// TestAgainstTransformers compares this reference with transformers' LlamaForCausalLM and
// MistralForCausalLM on the three llama fixtures (fixtures/golden/<fixture>.json, made by
// make_llama_golden.py): identical greedy tokens for every corpus prompt and top-5 logits within
// 1e-3 at every step. llama-tiny is TinyLlama's layout; llama-tiny-llama3 adds rope type llama3,
// attention and MLP biases, a head_dim override and a tied head; mistral-tiny a sliding window
// of 6 and yarn scaling.
func TestAgainstTransformers(t *testing.T) {
	for _, name := range []string{fixtures.LlamaTiny, fixtures.LlamaTinyLlama3, fixtures.MistralTiny} {
		t.Run(name, func(t *testing.T) {
			dir, rev, err := fixtures.Ensure("", name)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := golden.CheckFixture(m, name, rev); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// ropeGolden is fixtures/golden/llama-rope-golden.json (make_llama_golden.py): per config, the
// inverse frequencies and attention scaling transformers' LlamaRotaryEmbedding computes.
type ropeGolden struct {
	TransformersVersion string `json:"transformers_version"`
	Cases               []struct {
		Name             string          `json:"name"`
		Config           json.RawMessage `json:"config"`
		RopeType         string          `json:"rope_type"`
		InvFreq          []float64       `json:"inv_freq"`
		AttentionScaling float64         `json:"attention_scaling"`
		Error            string          `json:"error"`
	} `json:"cases"`
}

// LoadRopeGolden reads the rope golden of the checkout.
func loadRopeGolden(t *testing.T) ropeGolden {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "fixtures", "golden", "llama-rope-golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g ropeGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("llama-rope-golden.json holds no cases")
	}
	return g
}

// TestRotaryFrequenciesAgainstTransformers checks RotaryFrequencies for every rope type and both
// config forms against transformers' float32 values: relative error within 2e-6 (a few float32
// ulps: transformers computes in float32, this reference in float64).
func TestRotaryFrequenciesAgainstTransformers(t *testing.T) {
	g := loadRopeGolden(t)
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Error != "" {
				t.Skipf("transformers %s refused this config: %s", g.TransformersVersion, c.Error)
			}
			cfg, err := ParseConfig(c.Config)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Rope.RopeType != c.RopeType {
				t.Errorf("rope type %q, transformers %q", cfg.Rope.RopeType, c.RopeType)
			}
			inv, att, err := RotaryFrequencies(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv) != len(c.InvFreq) {
				t.Fatalf("%d frequencies, transformers %d", len(inv), len(c.InvFreq))
			}
			for i := range inv {
				if d := math.Abs(inv[i]-c.InvFreq[i]) / c.InvFreq[i]; d > 2e-6 {
					t.Errorf("inv_freq[%d] = %.9g, transformers %.9g (relative %.2g)", i, inv[i], c.InvFreq[i], d)
				}
			}
			if math.Abs(att-c.AttentionScaling) > 1e-6 {
				t.Errorf("attention scaling %.9g, transformers %.9g", att, c.AttentionScaling)
			}
		})
	}
}
