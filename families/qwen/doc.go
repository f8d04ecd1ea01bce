// Package qwen is the qwen family's qualification suite: the spec files (one per gate, each
// calling qual/spec), manifest.yaml, thresholds.yaml, corpus.jsonl and the family-owned
// reference forward pass (qwen/reference, Qwen3ForCausalLM in float64).
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=qwen ./families/...`.
package qwen
