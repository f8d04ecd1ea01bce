// Package qwen3vl is the qwen3vl family's qualification suite (Qwen3VLForConditionalGeneration,
// chat with one image): manifest.yaml, thresholds.yaml, corpus.jsonl (ten images in
// fixtures/images/qwen3vl with one question each) and the gates of qual/spec's vision.go against
// transformers 5.17's goldens (fixtures/golden/qwen3vl-tiny.json).
//
// The model's own parity with transformers (logits within 1e-3, bit-exact processor) is held
// by the package tests of server/vision, which drive the engine directly; these gates hold the
// served route to the same goldens over HTTP.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=qwen3vl ./families/...`.
package qwen3vl
