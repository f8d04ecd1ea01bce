// Package zimage is the zimage family's qualification suite: text-to-image as diffusers'
// ZImagePipeline runs it (Qwen3 text encoder, Z-Image transformer, flow-match Euler, CFG,
// AutoencoderKL), served on /v1/images/generations. The reference is diffusers itself: its
// goldens (fixtures/golden/zimage-tiny.json, made by fixtures/golden/make_zimage_golden.py on
// the same checkpoint folder) are what the served images are compared with.
//
// Run it with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=zimage ./families/...`.
package zimage
