package native

import (
	"fmt"
	"math"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// goldenTolerance is the native-vs-transformers bound on |Δlogit| (fp32 both sides;
// the slack covers different summation orders).
const goldenTolerance = 1e-3

// TestGoldenParity compares the engine with transformers: identical greedy ids for every
// step (EOS ignored, as the golden run used min_new_tokens), and each step's top-5 logits
// within goldenTolerance. A missing golden file is a failure, not a skip: parity must not
// pass silently.
func TestGoldenParity(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		t.Run(name, func(t *testing.T) {
			path := fixtures.GoldenPath("..", name)
			g, err := fixtures.LoadGolden(path) // a missing file is an error naming the script
			if err != nil {
				t.Fatal(err)
			}
			_, rev, err := fixtures.Ensure(fixtures.DefaultCacheDir(), name)
			if err != nil {
				t.Fatal(err)
			}
			if g.Revision != rev {
				t.Fatalf("%s was made from fixture revision %s but the generator now yields %s: regenerate it with make_golden.py", path, g.Revision, rev)
			}
			if len(g.Prompts) == 0 {
				t.Fatalf("%s holds no prompts", path)
			}
			e := openEngine(t, name, Params{})
			V := e.Info().VocabSize
			for _, p := range g.Prompts {
				steps := len(p.GreedyIDs)
				if steps == 0 || len(p.Steps) != steps {
					t.Fatalf("%s prompt %q: %d greedy ids and %d steps", path, p.Name, steps, len(p.Steps))
				}
				r := generate(t, e, p.PromptIDs, Sampling{MaxNewTokens: steps, IgnoreEOS: true})
				for i := range p.GreedyIDs {
					if i >= len(r.tokens) || r.tokens[i] != p.GreedyIDs[i] {
						t.Errorf("prompt %q: greedy ids diverge at step %d:\nnative:       %v\ntransformers: %v", p.Name, i, r.tokens, p.GreedyIDs)
						break
					}
				}
				// Logits of every step's distribution, from the golden continuation so a token
				// mismatch above does not cascade into every later step.
				all := append(append([]int32{}, p.PromptIDs...), p.GreedyIDs[:steps-1]...)
				lg, err := e.Logits(all)
				if err != nil {
					t.Fatal(err)
				}
				var worst float64
				bad, first := 0, ""
				for s, st := range p.Steps {
					pos := len(p.PromptIDs) - 1 + s
					for j, id := range st.Top5IDs {
						d := math.Abs(float64(lg[pos*V+int(id)]) - st.Top5Logits[j])
						worst = math.Max(worst, d)
						if d > goldenTolerance {
							if bad == 0 {
								first = fmt.Sprintf("step %d token %d: native %.6f, transformers %.6f", s, id, lg[pos*V+int(id)], st.Top5Logits[j])
							}
							bad++
						}
					}
				}
				if bad > 0 {
					t.Errorf("prompt %q: %d top-5 logits differ by more than %g (max |Δ| %.3g); first: %s", p.Name, bad, goldenTolerance, worst, first)
				} else {
					t.Logf("prompt %q: %d steps, max |Δlogit| on top-5 = %.3g", p.Name, steps, worst)
				}
			}
		})
	}
}
