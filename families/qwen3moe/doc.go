// Package qwen3moe is the qwen3moe family's qualification suite (Qwen3MoeForCausalLM): the
// spec files, manifest.yaml, thresholds.yaml, corpus.jsonl, the routing gate (routing.go:
// the server's per-layer expert counts against the family reference's router choices) and
// the family-owned reference forward pass (qwen3moe/reference, float64, both expert layouts).
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=qwen3moe ./families/qwen3moe`.
package qwen3moe
