// Package internvl is the internvl family's qualification suite (InternVLForConditionalGeneration,
// chat with one image cut into 448-pixel tiles): manifest.yaml, thresholds.yaml, corpus.jsonl
// (fourteen images in fixtures/images/internvl with one question each: one tile, the maximum of
// six tiles plus a thumbnail, extreme aspect ratios both ways, both sides of the grid tie rule,
// grayscale, RGBA, paletted, 1x1, PNG and JPEG), corpus-pairs.jsonl (two-image requests, for
// through --max-images-per-request), and the gates of qual/spec's vision.go against
// transformers 5.17's goldens (fixtures/golden/internvl-tiny.json, made by
// fixtures/golden/run_internvl_golden.sh). Until that golden exists the specs that compare with
// it skip, each saying so; they never pass on nothing.
//
// pairs_test.go runs the two-image requests through a second server started with
// --max-images-per-request 2, shows the corpus gate failing on a planted pixel-shuffle defect,
// and, while no golden exists, runs the image refusal contract with the corpus images sized by
// the served /tokenize (the contract needs no transformers output).
//
// The model's own parity with transformers (processor tiles exact, logits within 1e-3) is held
// by the package tests of server/vision (internvl_native_test.go), which drive the engine
// directly; these gates hold the served route to the same goldens over HTTP.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=internvl ./families/...`.
package internvl
