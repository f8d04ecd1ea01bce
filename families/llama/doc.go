// Package llama is the llama family's qualification suite: LlamaForCausalLM (TinyLlama, Llama
// 2/3.x and their fine-tunes) and MistralForCausalLM, with SentencePiece-style tokenizers. It
// holds the spec files (one per gate, each calling qual/spec), manifest.yaml, thresholds.yaml,
// corpus.jsonl and the family-owned reference forward pass (llama/reference, float64), whose
// tests also check the rope scaling types and the llama-tiny-llama3 and mistral-tiny fixtures
// against transformers.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=llama ./families/...`.
package llama
