package golden

import (
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/spec"
)

// fake chooses token (last id + 1) mod 4 with logits [0 1 2 3] rotated so that token wins.
type fake struct{ bias float64 }

func (f fake) GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error) {
	var out []int32
	var rows [][]float64
	last := ids[len(ids)-1]
	for range steps {
		tok := (last + 1) % 4
		row := make([]float64, 4)
		row[tok] = 10 + f.bias
		out, rows, last = append(out, tok), append(rows, row), tok
	}
	return out, rows, nil
}

func goldenOf(ids ...int32) *spec.Golden {
	p := spec.GoldenPrompt{Name: "p", PromptIDs: []int32{0}}
	for _, id := range ids {
		p.GreedyIDs = append(p.GreedyIDs, id)
		p.Steps = append(p.Steps, spec.GoldenStep{Top5IDs: []int32{id}, Top5Logits: []float64{10}})
	}
	return &spec.Golden{Fixture: "f", Prompts: []spec.GoldenPrompt{p}}
}

func TestCompare(t *testing.T) {
	if probs, err := Compare(fake{}, goldenOf(1, 2, 3), 1e-3); err != nil || len(probs) != 0 {
		t.Errorf("agreeing reference: %v %v", probs, err)
	}
	probs, _ := Compare(fake{}, goldenOf(1, 3, 3), 1e-3)
	if len(probs) == 0 || !strings.Contains(probs[0], "greedy step 1: reference chose 2, transformers 3") {
		t.Errorf("token mismatch not reported at step 1: %v", probs)
	}
	probs, _ = Compare(fake{bias: 0.01}, goldenOf(1, 2), 1e-3)
	if len(probs) != 1 || !strings.Contains(probs[0], "logit 0.01 > 0.001") {
		t.Errorf("logit drift not reported: %v", probs)
	}
}
