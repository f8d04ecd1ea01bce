package models_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
)

// ropeGolden is fixtures/golden/llama-rope-golden.json (make_llama_golden.py): per config.json,
// the inverse frequencies and attention scaling transformers' LlamaRotaryEmbedding computes.
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

// TestLlamaRopeAgainstTransformers: the llama family's resolve computes, for every rope type
// (default, linear, dynamic, llama3, yarn) and both config forms (rope_theta + rope_scaling,
// rope_parameters), the inverse frequencies transformers does, to within one float32 rounding
// (relative 2.4e-7: both compute in float32; where torch's pow and libm's differ by an ulp the
// result may too), and the same attention scaling.
func TestLlamaRopeAgainstTransformers(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "fixtures", "golden", "llama-rope-golden.json"))
	if err != nil {
		t.Fatalf("%v: generate it with fixtures/golden/make_llama_golden.py (PROVENANCE.md)", err)
	}
	var g ropeGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("llama-rope-golden.json holds no cases")
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Error != "" {
				t.Skipf("transformers %s refused this config: %s", g.TransformersVersion, c.Error)
			}
			hp, err := native.Resolve("llama", c.Config)
			if err != nil {
				t.Fatal(err)
			}
			if hp["rope_type"] != c.RopeType {
				t.Errorf("rope_type %v, transformers %q", hp["rope_type"], c.RopeType)
			}
			for i, want := range c.InvFreq {
				got, ok := hp[fmt.Sprintf("rope_inv_freq.%d", i)].(float64)
				if !ok {
					t.Fatalf("rope_inv_freq.%d missing from the resolved hyper-parameters", i)
				}
				if d := math.Abs(got-want) / want; d > 2.4e-7 {
					t.Errorf("inv_freq[%d] = %.9g, transformers %.9g (relative %.2g)", i, got, want, d)
				}
			}
			if _, extra := hp[fmt.Sprintf("rope_inv_freq.%d", len(c.InvFreq))]; extra {
				t.Errorf("more than transformers' %d frequencies", len(c.InvFreq))
			}
			if got := hp["rope_attention_scaling"].(float64); math.Abs(got-c.AttentionScaling) > 1e-7 {
				t.Errorf("attention scaling %.9g, transformers %.9g", got, c.AttentionScaling)
			}
		})
	}
}

// TestLlamaGoldenParity runs the llama runtime on the three llama fixtures against transformers
// (fixtures/golden/<fixture>.json): identical greedy ids for 32 steps on every corpus prompt and
// top-5 logits within 1e-3 (fp32 both sides, different summation orders). llama-tiny-llama3
// checks rope type llama3, biases, head_dim 24 and the tied head; mistral-tiny the sliding
// window and yarn scaling.
func TestLlamaGoldenParity(t *testing.T) {
	for _, name := range []string{fixtures.LlamaTiny, fixtures.LlamaTinyLlama3, fixtures.MistralTiny} {
		t.Run(name, func(t *testing.T) {
			path := fixtures.GoldenPath(filepath.Join("..", ".."), name)
			g, err := fixtures.LoadGolden(path)
			if err != nil {
				t.Fatal(err)
			}
			_, rev, err := fixtures.Ensure(fixtures.DefaultCacheDir(), name)
			if err != nil {
				t.Fatal(err)
			}
			if g.Revision != rev {
				t.Fatalf("%s was made from fixture revision %s but the generator now yields %s: regenerate it with make_llama_golden.py", path, g.Revision, rev)
			}
			bp, err := fixtures.Bundle(fixtures.DefaultCacheDir(), name)
			if err != nil {
				t.Fatal(err)
			}
			b, err := bundle.Open(bp)
			if err != nil {
				t.Fatal(err)
			}
			e, err := native.Open(b, native.Params{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			V := e.Info().VocabSize
			for _, p := range g.Prompts {
				steps := len(p.GreedyIDs)
				id, err := e.Add(p.PromptIDs, native.Sampling{MaxNewTokens: steps, IgnoreEOS: true})
				if err != nil {
					t.Fatal(err)
				}
				var got []int32
				for e.Active() > 0 {
					if _, err := e.Step(func(ev native.Event) {
						if ev.Seq == id && ev.Token >= 0 {
							got = append(got, ev.Token)
						}
					}); err != nil {
						t.Fatal(err)
					}
				}
				for i := range p.GreedyIDs {
					if i >= len(got) || got[i] != p.GreedyIDs[i] {
						t.Errorf("prompt %q: greedy ids diverge at step %d:\nnative:       %v\ntransformers: %v", p.Name, i, got, p.GreedyIDs)
						break
					}
				}
				all := append(append([]int32{}, p.PromptIDs...), p.GreedyIDs[:steps-1]...)
				lg, err := e.Logits(all)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for s, st := range p.Steps {
					pos := len(p.PromptIDs) - 1 + s
					for j, tok := range st.Top5IDs {
						worst = math.Max(worst, math.Abs(float64(lg[pos*V+int(tok)])-st.Top5Logits[j]))
					}
				}
				if worst > 1e-3 {
					t.Errorf("prompt %q: top-5 logits differ from transformers by up to %.3g (> 1e-3)", p.Name, worst)
				}
			}
		})
	}
}
