package reference

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/modelqual/modelqual/families/internal/golden"
	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/fixtures"
)

func loadTiny(t *testing.T) (*Model, string, string) {
	t.Helper()
	dir, rev, err := fixtures.Ensure("", fixtures.Qwen3MoeTiny)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m, dir, rev
}

// TestSparseLayers: qwen3moe-tiny's mlp_only_layers [1] makes layer 1 dense, 0 and 2 sparse,
// and a prompt's routing names k distinct experts per token whose weights sum to 1
// (norm_topk_prob), largest first.
func TestSparseLayers(t *testing.T) {
	m, _, _ := loadTiny(t)
	var sparse []int
	for l := range m.Config.NumHiddenLayers {
		if m.Config.Sparse(l) {
			sparse = append(sparse, l)
		}
	}
	if !slices.Equal(sparse, []int{0, 2}) {
		t.Fatalf("sparse layers %v, want [0 2]", sparse)
	}
	rs, err := m.Routes([]int32{9707, 1879, 11, 419, 374, 264, 1273, 13})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Layer != 0 || rs[1].Layer != 2 {
		t.Fatalf("routes of layers %v, want 0 and 2", rs)
	}
	used := map[int]bool{}
	for _, r := range rs {
		for i, es := range r.Experts {
			sum := 0.0
			for j, w := range r.Weights[i] {
				sum += w
				if j > 0 && w > r.Weights[i][j-1] {
					t.Errorf("layer %d token %d: weights %v not in descending order", r.Layer, i, r.Weights[i])
				}
			}
			if len(es) != 2 || es[0] == es[1] || math.Abs(sum-1) > 1e-12 {
				t.Errorf("layer %d token %d: experts %v weights %v", r.Layer, i, es, r.Weights[i])
			}
			for _, e := range es {
				used[e] = true
			}
		}
	}
	// A router that sends everything to the same experts would make the routing gate blind.
	if len(used) < 4 {
		t.Errorf("8 tokens over 2 layers use only experts %v", used)
	}
}

// TestIncremental: the key/value caches agree with full forward passes, and the full pass is
// causal.
func TestIncremental(t *testing.T) {
	m, _, _ := loadTiny(t)
	if err := numeric.CheckIncremental(m, []int32{9707, 1879, 11, 419}, 6, 1e-9); err != nil {
		t.Fatal(err)
	}
}

// TestFusedLayoutComputesTheSame: the checkpoint saved with transformers 5's fused experts
// (fixtures.Qwen3MoeFused: the same bytes in 3-D tensors) loads into the same model.
func TestFusedLayoutComputesTheSame(t *testing.T) {
	m, dir, _ := loadTiny(t)
	l, err := fixtures.Qwen3MoeFused(fixtures.Qwen3MoeTiny)
	if err != nil {
		t.Fatal(err)
	}
	fused := filepath.Join(t.TempDir(), "fused")
	if err := fixtures.RewriteCheckpoint(dir, fused, l); err != nil {
		t.Fatal(err)
	}
	f, err := Load(fused)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{15, 2000, 77, 31000, 5, 9}
	a, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("position %d: the fused layout computes other logits", i)
		}
	}
}

// TestAgainstTransformers compares this reference with Qwen3MoeForCausalLM's outputs on
// qwen3moe-tiny (fixtures/golden/qwen3moe-tiny.json): identical greedy tokens for every corpus
// prompt, top-5 logits within 1e-3, and for every prompt the same experts chosen by every
// sparse layer for every token, with routing weights within 1e-5.
func TestAgainstTransformers(t *testing.T) {
	m, _, rev := loadTiny(t)
	if err := golden.CheckFixture(m, fixtures.Qwen3MoeTiny, rev); err != nil {
		t.Fatal(err)
	}
	g, err := LoadRouterGolden(fixtures.Qwen3MoeTiny)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for _, p := range g.Prompts {
		rs, err := m.Routes(p.PromptIDs)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != len(p.Router) {
			t.Fatalf("prompt %q: %d sparse layers, transformers %d", p.Name, len(rs), len(p.Router))
		}
		for i, want := range p.Router {
			got := rs[i]
			if got.Layer != want.Layer {
				t.Fatalf("prompt %q: sparse layer %d, transformers %d", p.Name, got.Layer, want.Layer)
			}
			for tok := range want.Experts {
				if !slices.Equal(got.Experts[tok], want.Experts[tok]) {
					problems = append(problems, fmt.Sprintf("prompt %q layer %d token %d: experts %v, transformers %v", p.Name, want.Layer, tok, got.Experts[tok], want.Experts[tok]))
					continue
				}
				for j := range want.Weights[tok] {
					if d := math.Abs(got.Weights[tok][j] - want.Weights[tok][j]); d > 1e-5 {
						problems = append(problems, fmt.Sprintf("prompt %q layer %d token %d: weight %d off by %.3g", p.Name, want.Layer, tok, j, d))
					}
				}
			}
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%d routing disagreements with transformers, first: %v", len(problems), problems[:min(5, len(problems))])
	}
}

// RouterGolden is the router part of fixtures/golden/<fixture>.json (make_qwen3moe_golden.py).
type RouterGolden struct {
	Revision string `json:"revision"`
	Prompts  []struct {
		Name      string  `json:"name"`
		PromptIDs []int32 `json:"prompt_ids"`
		Router    []struct {
			Layer   int         `json:"layer"`
			Experts [][]int     `json:"experts"`
			Weights [][]float64 `json:"weights"`
		} `json:"router"`
	} `json:"prompts"`
}

// LoadRouterGolden reads the router choices transformers made for each golden prompt.
func LoadRouterGolden(fixture string) (*RouterGolden, error) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(fixtures.GoldenPath(root, fixture))
	if err != nil {
		return nil, err
	}
	var g RouterGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, err
	}
	return &g, nil
}
