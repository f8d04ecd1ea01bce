package spec

import "testing"

// TestLogprobsDiffCountsDistinctTexts: the completions dict keys alternatives by text, so byte
// pieces that all read "\ufffd" arrive there as one; the comparison accepts that, and still
// refuses a path that lost alternatives of different texts.
func TestLogprobsDiffCountsDistinctTexts(t *testing.T) {
	grpc := []TokenLogprob{{Token: "a", Logprob: -1, Top: []TopLogprob{
		{Token: "a", Logprob: -1}, {Token: "\ufffd", Logprob: -2}, {Token: "\ufffd", Logprob: -2.5}, {Token: "\ufffd", Logprob: -3}, {Token: "b", Logprob: -4}}}}
	dict := []TokenLogprob{{Token: "a", Logprob: -1, Top: []TopLogprob{
		{Token: "a", Logprob: -1}, {Token: "\ufffd", Logprob: -3}, {Token: "b", Logprob: -4}}}}
	if d := logprobsDiff(dict, grpc); d != "" {
		t.Errorf("a dict that merged three byte pieces: %s", d)
	}
	lost := []TokenLogprob{{Token: "a", Logprob: -1, Top: []TopLogprob{{Token: "a", Logprob: -1}}}}
	if d := logprobsDiff(lost, grpc); d == "" {
		t.Error("a path with one alternative of three distinct texts passed")
	}
}
