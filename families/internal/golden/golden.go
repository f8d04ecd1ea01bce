// Package golden compares a family reference against the transformers golden outputs
// (fixtures/golden/<fixture>.json, format spec.Golden): the reference and the upstream
// implementation must choose identical greedy tokens and agree on the top-5 logits of every
// step.
package golden

import (
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"math"
	"strings"

	"github.com/modelqual/modelqual/qual/spec"
)

// Greedy is what the comparison needs from a reference.
type Greedy interface {
	GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error)
}

// Compare runs ref on every golden prompt and returns one line per disagreement: a greedy
// token that differs (the first differing step, since later steps follow different
// prefixes) or a top-5 logit further than tol from the golden value.
func Compare(ref Greedy, g *spec.Golden, tol float64) ([]string, error) {
	var problems []string
	for _, p := range g.Prompts {
		ids, rows, err := ref.GreedyLogits(p.PromptIDs, len(p.GreedyIDs))
		if err != nil {
			return nil, fmt.Errorf("golden %s: prompt %q: %w", g.Fixture, p.Name, err)
		}
		worst, worstStep, worstID := 0.0, -1, int32(-1)
		for s := range p.GreedyIDs {
			for k, id := range p.Steps[s].Top5IDs {
				if d := math.Abs(rows[s][id] - p.Steps[s].Top5Logits[k]); d > worst || math.IsNaN(d) {
					worst, worstStep, worstID = d, s, id
				}
			}
			if ids[s] != p.GreedyIDs[s] {
				problems = append(problems, fmt.Sprintf("prompt %q: greedy step %d: reference chose %d, transformers %d (reference %v, golden %v)",
					p.Name, s, ids[s], p.GreedyIDs[s], ids[:s+1], p.GreedyIDs[:s+1]))
				break
			}
		}
		if worst > tol || math.IsNaN(worst) {
			problems = append(problems, fmt.Sprintf("prompt %q: step %d token %d: |reference − transformers| logit %.3g > %.3g",
				p.Name, worstStep, worstID, worst, tol))
		}
	}
	return problems, nil
}

// CheckFixture is the whole golden test of one family reference: it loads the golden of
// fixture, checks it was made from the same fixture revision as the checkpoint the reference
// loaded, and compares. The tolerance 1e-3 absorbs float32 (transformers) against float64
// (reference) rounding over a two-layer model while still catching any wrong formula.
func CheckFixture(ref Greedy, fixture, revision string) error {
	root, err := fixtures.RepoRoot()
	if err != nil {
		return err
	}
	g, err := spec.LoadGolden(spec.GoldenPath(root, fixture))
	if err != nil {
		return err
	}
	if g.Revision != revision {
		return fmt.Errorf("golden %s was made from revision %s, the fixture generator now makes %s; rerun fixtures/golden/make_golden.py", fixture, g.Revision, revision)
	}
	problems, err := Compare(ref, g, 1e-3)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("reference disagrees with transformers %s on %d of %d prompts:\n%s", g.TransformersVersion, len(problems), len(g.Prompts), strings.Join(problems, "\n"))
	}
	return nil
}
