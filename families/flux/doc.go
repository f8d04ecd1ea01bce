// Package flux is the flux family's qualification suite: text-to-image as diffusers'
// FluxPipeline runs FLUX.1 (CLIP-L's pooled output and T5's embeddings, the MMDiT double- and
// single-stream transformer over 2x2-packed latents with three-axis rotary positions, dev's
// guidance embedding, the resolution-shifted flow-match schedule, the 16-channel AutoencoderKL),
// served on /v1/images/generations. The suite qualifies the flux-tiny-dev fixture; FLUX.1-schnell
// has its own folder, families/flux-schnell (its specs carry the flux label too). The reference
// is diffusers itself: on CPU its fp32 golden (fixtures/golden/flux-tiny-dev.json, made by
// fixtures/golden/make_flux_golden.py on the same checkpoint folder); on a GPU its bf16 run
// (fixtures/golden/flux-tiny-dev-cuda-bf16.json, gpu_test.go), since the CUDA pipeline is
// diffusers' bf16 pipeline (bf16 noise for a seed, bf16 timesteps and latents). A parity spec
// whose golden is missing skips with "NO GOLDEN: <path>".
//
// Run both variants with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=flux ./families/...`.
package flux
