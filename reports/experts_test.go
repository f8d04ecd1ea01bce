package reports

import (
	"strings"
	"testing"
)

// TestExpertImbalance: a layer whose router sent every token to one of 4 experts has
// imbalance 4 (collapsed), a balanced one 1; a dense layer (no row) and an expert no token
// chose (missing from a row) are handled; summary.md shows the figure.
func TestExpertImbalance(t *testing.T) {
	e := EngineSteps{Decode: StepStats{Steps: 2, Seconds: 1, Tokens: 2},
		Experts: [][]float64{{12}, nil, {3, 3, 3, 3}}}
	worst, layer, mean, ok := e.ExpertImbalance()
	if !ok || worst != 4 || layer != 0 || mean != 2.5 {
		t.Fatalf("imbalance %v at layer %d, mean %v, ok %v; want 4 at layer 0, mean 2.5", worst, layer, mean, ok)
	}
	if _, _, _, ok := (EngineSteps{}).ExpertImbalance(); ok {
		t.Error("a dense model has an imbalance figure")
	}
	var b strings.Builder
	stepsMarkdown(&b, &e)
	if !strings.Contains(b.String(), "Expert load (busiest expert over the mean, 1 = balanced, 4 = collapsed): worst layer 0 4") {
		t.Errorf("summary.md lacks the expert load line:\n%s", b.String())
	}
	later := EngineSteps{Decode: e.Decode, Experts: [][]float64{{20, 1}, nil, {4, 3, 3, 3}}}
	d, err := later.Since(e)
	if err != nil || d.Experts[0][0] != 8 || d.Experts[0][1] != 1 || d.Experts[2][0] != 1 {
		t.Fatalf("Since: %v %v", d, err)
	}
	if _, err := e.Since(later); err == nil {
		t.Error("routing totals that went down were accepted")
	}
}
