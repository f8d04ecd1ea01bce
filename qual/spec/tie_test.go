package spec

import "testing"

// TestNearTieRules: a greedy divergence is accepted only at a reference near-tie within the
// margin, never with margin 0 (CPU runs), and never for a token outside the reference's top 5.
func TestNearTieRules(t *testing.T) {
	st := GoldenStep{Top5IDs: []int32{7, 3, 9, 1, 2}, Top5Logits: []float64{10.0, 9.8, 9.0, 8.0, 7.0}}
	cases := []struct {
		chosen int32
		margin float64
		want   bool
	}{
		{7, 0.5, true},  // runner-up 0.2 below
		{7, 0.1, false}, // runner-up beyond the margin
		{7, 0, false},   // exact comparison (CPU)
		{42, 5, false},  // not among the top 5
	}
	for _, c := range cases {
		if got := nearTie(st, c.chosen, c.margin); got != c.want {
			t.Errorf("nearTie(chosen %d, margin %g) = %v, want %v", c.chosen, c.margin, got, c.want)
		}
	}
	a := &Answer{Logprobs: []TokenLogprob{
		{Token: "x", Logprob: -0.1},
		{Token: "y", Logprob: -0.5, Top: []TopLogprob{{Token: "y", Logprob: -0.5}, {Token: "z", Logprob: -0.7}, {Token: "w", Logprob: -3}}},
	}}
	split := func(tok string) *Answer {
		return &Answer{Logprobs: []TokenLogprob{{Token: "x", Logprob: -0.1}, {Token: tok}}}
	}
	if !tieSplit(a, split("z"), 0.5) {
		t.Error("a split onto a token 0.2 below the single answer's choice was refused at margin 0.5")
	}
	if tieSplit(a, split("w"), 0.5) {
		t.Error("a split onto a token 2.5 below was accepted at margin 0.5")
	}
	if tieSplit(a, split("q"), 0.5) || tieSplit(a, split("z"), 0) {
		t.Error("a split onto a token outside the top logprobs, or at margin 0, was accepted")
	}
	if b := (&Answer{Logprobs: []TokenLogprob{{Token: "v"}, {Token: "z"}}}); tieSplit(a, b, 0.5) {
		t.Error("answers that differ before the near-tie were accepted")
	}
}
