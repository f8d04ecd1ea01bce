package worker

import (
	"fmt"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/server/wire"
)

// ImageEngine is implemented by engines of text-to-image bundles: one request runs the whole
// pipeline and answers an encoded PNG (the worker encodes, so the frontend only forwards bytes).
type ImageEngine interface {
	Image(r wire.ImageRequest) wire.ImageAnswer
}

// Image runs the native pipeline and encodes its pixels with native.EncodePNG, the encoder
// `qual generate-image` uses, so both give the same bytes for the same controls.
func (n *nativeEngine) Image(r wire.ImageRequest) wire.ImageAnswer {
	res, err := n.e.GenerateImage(native.ImageRequest{Prompt: r.Prompt, Negative: r.Negative, Prompt2: r.Prompt2, Negative2: r.Negative2,
		Width: r.Width, Height: r.Height, Steps: r.Steps, Guidance: r.Guidance, TrueCFG: r.TrueCFG, Seed: r.Seed}, r.Latents)
	if err != nil {
		return wire.ImageAnswer{Err: err.Error()}
	}
	t0 := time.Now()
	png, err := native.EncodePNG(res.RGB, res.Width, res.Height)
	if err != nil {
		return wire.ImageAnswer{Err: err.Error()}
	}
	a := wire.ImageAnswer{PipelineNs: res.PipelineTime.Nanoseconds(), EncodeNs: time.Since(t0).Nanoseconds(), PNG: png}
	if r.Latents {
		// The trace holds the initial noise and every step's latents; the last are the ones
		// the VAE decodes.
		spec, err := n.e.ImageSpec()
		if err != nil {
			return wire.ImageAnswer{Err: err.Error()}
		}
		c, h, w := spec.LatentChannels, r.Height/spec.VAEScale, r.Width/spec.VAEScale
		if c*h*w == 0 || len(res.Latents) < c*h*w {
			return wire.ImageAnswer{Err: fmt.Sprintf("the pipeline traced %d latent values, want at least %dx%dx%d", len(res.Latents), c, h, w)}
		}
		a.Latents, a.LatentShape = res.Latents[len(res.Latents)-c*h*w:], []int{c, h, w}
	}
	return a
}

// image answers one Image command on the loop's goroutine (an image engine has no token
// sequences to step meanwhile).
func (l *loop) image(id uint64, r wire.ImageRequest) {
	ie, ok := l.eng.(ImageEngine)
	var a wire.ImageAnswer
	if !ok {
		a.Err = "this engine does not generate images"
	} else {
		a = ie.Image(r)
	}
	a.ID = id
	l.out.ImageResult(a)
}
