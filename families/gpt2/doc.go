// Package gpt2 is the gpt2 family's qualification suite: the spec files (one per gate, each
// calling qual/spec), manifest.yaml, thresholds.yaml, corpus.jsonl and the family-owned
// reference forward pass (gpt2/reference, GPT2LMHeadModel in float64).
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=gpt2 ./families/...`.
package gpt2
