// Package fluxschnell is FLUX.1-schnell's qualification suite: the flux runtime family
// (native/models/flux.cc, flux.cu) as diffusers' FluxPipeline runs the timestep-distilled
// variant (no guidance embedding: guidance_scale absent or 0, any other value refused; T5
// truncated at 256 tokens; few steps), served on /v1/images/generations, on the
// flux-tiny-schnell fixture. families/flux qualifies dev; this folder holds what differs:
// schnell's goldens (fixtures/golden/flux-tiny-schnell.json on CPU fp32,
// flux-tiny-schnell-cuda-bf16.json on a GPU), its request contract and its controls. Its specs
// also carry the flux label, so `ginkgo -label-filter=flux ./families/...` runs both variants.
//
// Run it alone with `go run github.com/onsi/ginkgo/v2/ginkgo -label-filter=flux-schnell ./families/...`.
package fluxschnell
