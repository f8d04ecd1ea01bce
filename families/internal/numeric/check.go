package numeric

import (
	"fmt"
	"math"
)

// Model is what the consistency check needs from a reference.
type Model interface {
	Logits(ids []int32) ([][]float64, error)
	GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error)
}

// CheckIncremental verifies that a reference's incremental decode (key/value caches, one token
// per step) agrees with one full forward pass over prompt+generated, and that the full pass is
// causal: the logits of a prefix do not change when tokens are appended. Both are properties
// of any correct causal LM, so a cache or mask bug fails here without a golden file.
func CheckIncremental(m Model, prompt []int32, steps int, tol float64) error {
	ids, rows, err := m.GreedyLogits(prompt, steps)
	if err != nil {
		return err
	}
	full, err := m.Logits(append(append([]int32(nil), prompt...), ids...))
	if err != nil {
		return err
	}
	for s := range ids {
		row := full[len(prompt)-1+s]
		if got := int32(Argmax(row)); got != ids[s] {
			return fmt.Errorf("step %d: incremental decode chose %d, full pass argmax %d", s, ids[s], got)
		}
		for j := range row {
			if d := math.Abs(row[j] - rows[s][j]); d > tol {
				return fmt.Errorf("step %d vocab %d: incremental %v vs full %v (|Δ| %.3g > %.3g)", s, j, rows[s][j], row[j], d, tol)
			}
		}
	}
	prefix, err := m.Logits(prompt)
	if err != nil {
		return err
	}
	for p := range prefix {
		for j := range prefix[p] {
			if d := math.Abs(prefix[p][j] - full[p][j]); d > tol {
				return fmt.Errorf("position %d vocab %d changed when later tokens were appended (|Δ| %.3g): the attention is not causal", p, j, d)
			}
		}
	}
	return nil
}
