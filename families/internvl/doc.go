// Package internvl is the internvl family's qualification suite (InternVLForConditionalGeneration,
// chat with one image cut into 448-pixel tiles): manifest.yaml, thresholds.yaml, corpus.jsonl
// (fourteen images in fixtures/images/internvl with one question each: one tile, the maximum of
// six tiles plus a thumbnail, extreme aspect ratios both ways, both sides of the grid tie rule,
// grayscale, RGBA, paletted, 1x1, PNG and JPEG), corpus-pairs.jsonl (two-image requests, for
// when the server takes several images), and the gates of qual/spec's vision.go against
// transformers 5.17's goldens (fixtures/golden/internvl-tiny.json). Without that golden the
// gates fail; they never pass on nothing.
//
// pairs_test.go runs the two-image requests through a second server started with
// --max-images-per-request 2 and shows the corpus gate failing on a planted pixel-shuffle
// defect.
//
// The model's own parity with transformers (processor tiles exact, logits within 1e-3) is held
// by the package tests of server/vision (internvl_native_test.go), which drive the engine
// directly; these gates hold the served route to the same goldens over HTTP.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=internvl ./families/...`.
package internvl
