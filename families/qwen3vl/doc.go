// Package qwen3vl is the qwen3vl family's qualification suite (Qwen3VLForConditionalGeneration,
// chat with images): manifest.yaml, thresholds.yaml, corpus.jsonl (ten images in
// fixtures/images/qwen3vl with one question each), corpus-pairs.jsonl (two-image requests, text
// between the images in two of them) and the gates of qual/spec's vision.go against
// transformers 5.17's goldens (fixtures/golden/qwen3vl-tiny.json, and qwen3vl-tiny-pairs.json
// for the pairs, made by fixtures/golden/run_qwen3vl_pairs_golden.sh on the GPU host).
//
// pairs_test.go serves a two-image request through a server started with
// --max-images-per-request 2 (the record lists both images, both images' tokens counted, a
// third refused naming the flag) and holds the pairs to their golden, skipping with NO GOLDEN
// until it exists; planted two-image defects (qwen3vl.shared_image_start, qwen3vl.joint_vision)
// make that comparison fail.
//
// The model's own parity with transformers (logits within 1e-3, bit-exact processor) is held
// by the package tests of server/vision, which drive the engine directly; these gates hold the
// served route to the same goldens over HTTP.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=qwen3vl ./families/...`.
package qwen3vl
