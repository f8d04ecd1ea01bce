package spec

import "testing"

// TestLogprobsDiffByTokenID: named by id (return_tokens_as_token_ids, namedByID), byte pieces
// that all read "\ufffd" stay apart, so a path that merged or lost any alternative fails, and
// the completions dict may add only the chosen token.
func TestLogprobsDiffByTokenID(t *testing.T) {
	grpc := namedByID([]TokenLogprob{{Token: "a", Logprob: -1, ID: 7, Top: []TopLogprob{
		{Token: "a", Logprob: -1, ID: 7}, {Token: "\ufffd", Logprob: -2, ID: 3}, {Token: "\ufffd", Logprob: -2.5, ID: 4},
		{Token: "\ufffd", Logprob: -3, ID: 5}, {Token: "b", Logprob: -4, ID: 9}}}})
	http := []TokenLogprob{{Token: "token_id:7", Logprob: -1, Top: []TopLogprob{
		{Token: "token_id:7", Logprob: -1}, {Token: "token_id:3", Logprob: -2}, {Token: "token_id:4", Logprob: -2.5},
		{Token: "token_id:5", Logprob: -3}, {Token: "token_id:9", Logprob: -4}}}}
	if d := logprobsDiff(http, grpc); d != "" {
		t.Errorf("the same alternatives by id: %s", d)
	}
	merged := []TokenLogprob{{Token: "token_id:7", Logprob: -1, Top: []TopLogprob{
		{Token: "token_id:7", Logprob: -1}, {Token: "token_id:5", Logprob: -3}, {Token: "token_id:9", Logprob: -4}}}}
	if d := logprobsDiff(merged, grpc); d == "" {
		t.Error("a path that merged three byte pieces into one passed")
	}
	swapped := []TokenLogprob{{Token: "token_id:7", Logprob: -1, Top: []TopLogprob{
		{Token: "token_id:7", Logprob: -1}, {Token: "token_id:4", Logprob: -2}, {Token: "token_id:3", Logprob: -2.5},
		{Token: "token_id:5", Logprob: -3}, {Token: "token_id:9", Logprob: -4}}}}
	if d := logprobsDiff(swapped, grpc); d == "" {
		t.Error("two byte pieces' logprobs swapped passed")
	}
}
