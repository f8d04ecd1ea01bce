package native

/*
#include <stdlib.h>
#include "modelqual.h"
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"time"
	"unsafe"
)

// TorchRandn returns what torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed))
// draws (float32): the initial latents a diffusers pipeline makes for seed, flattened.
func TorchRandn(seed uint64, n int) ([]float32, error) {
	if n < 0 {
		return nil, fmt.Errorf("native.TorchRandn: n %d is negative", n)
	}
	out := make([]float32, n)
	if n == 0 {
		return out, nil
	}
	if st := C.mq_torch_randn(C.uint64_t(seed), (*C.float)(unsafe.Pointer(&out[0])), C.int64_t(n)); st != C.MQ_OK {
		return nil, fmt.Errorf("native.TorchRandn: status %d", int(st))
	}
	return out, nil
}

// TorchRandnBF16 returns what torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed),
// dtype=torch.bfloat16) draws, widened to float32: the initial latents of a pipeline that draws
// in bf16 (a diffusers pipeline whose text encoder runs in bf16), a stream unrelated to TorchRandn's.
func TorchRandnBF16(seed uint64, n int) ([]float32, error) {
	if n < 0 {
		return nil, fmt.Errorf("native.TorchRandnBF16: n %d is negative", n)
	}
	out := make([]float32, n)
	if n == 0 {
		return out, nil
	}
	if st := C.mq_torch_randn_bf16(C.uint64_t(seed), (*C.float)(unsafe.Pointer(&out[0])), C.int64_t(n)); st != C.MQ_OK {
		return nil, fmt.Errorf("native.TorchRandnBF16: status %d", int(st))
	}
	return out, nil
}

// ImageSpec is what a text-to-image engine accepts.
type ImageSpec struct {
	LatentChannels  int // latents are [LatentChannels, Height/VAEScale, Width/VAEScale]
	VAEScale        int
	SizeMultiple    int // width and height must be multiples of this
	MaxSize         int // the largest width or height
	MaxPromptTokens int // the text encoder's context
	MaxSteps        int
	TextHidden      int // width of the text encoder's embeddings (ImageResult.PromptEmbeds)
	PooledHidden    int // width of a pooled text embedding (ImageResult.PooledEmbeds); 0: none
}

// ImageRequest is one text-to-image generation. Prompt and Negative are token ids of the
// prompts as the pipeline formats them (ImagePrompt.IDs); Negative is used only when the
// pipeline guides with it (Guidance > 0 for classifier-free guidance, TrueCFG > 1 for a
// guidance-distilled pipeline). A pipeline with two text encoders takes the second one's ids in
// Prompt2 and Negative2 (ImagePrompt.Second).
type ImageRequest struct {
	Prompt, Negative   []int32
	Prompt2, Negative2 []int32
	// TrueCFG is FLUX's true_cfg_scale (0 elsewhere): above 1, with a negative prompt, real
	// classifier-free guidance besides the distilled Guidance.
	TrueCFG       float32
	Width, Height int
	Steps         int
	Guidance      float32
	Seed          uint64
	// Components (CPU pipelines) also returns the text encoder's embeddings and the
	// transformer's first outputs, for component checks against the reference's intermediates.
	Components bool
	// DecodeLatents (CPU pipelines), when set, runs the VAE stage alone on these latents (the
	// decoder's input, after the pipeline's scaling and shift) and returns the decoded image.
	DecodeLatents []float32
}

// ImageResult is the generated image and, when traced, what produced it.
type ImageResult struct {
	Width, Height int
	RGB           []byte    // Height*Width*3, row-major
	Image         []float32 // traced: the [0, 1] floats before rounding to 8 bits
	Latents       []float32 // traced: (Steps+1) latent tensors, the initial noise first
	// With ImageRequest.Components: the prompt's text embeddings (len(Prompt)×TextHidden) and
	// the transformer's first outputs (the prompt's, then with guidance the negative's).
	// With Prompt2 the embeddings are the second encoder's (len(Prompt2)×TextHidden), and
	// PooledEmbeds (PooledHidden floats) the first encoder's pooled output.
	PromptEmbeds, FirstVelocity, PooledEmbeds []float32
	PipelineTime                              time.Duration
}

// ImageSpec reports what the engine's text-to-image model accepts; an engine of another task
// answers an error.
func (e *Engine) ImageSpec() (ImageSpec, error) {
	if e.c == nil {
		return ImageSpec{}, ErrClosed
	}
	var s C.mq_image_spec
	if st, msg := call(func() C.mq_status { return C.mq_engine_image_spec(e.c, &s) }); st != C.MQ_OK {
		return ImageSpec{}, errors.New("native.ImageSpec: " + msg)
	}
	return ImageSpec{int(s.latent_channels), int(s.vae_scale), int(s.size_multiple), int(s.max_size), int(s.max_prompt_tokens), int(s.max_steps), int(s.text_hidden), int(s.pooled_hidden)}, nil
}

// cInts copies ids into C memory (the request struct passed to C must hold no Go pointers).
func cInts(ids []int32) *C.int32_t {
	if len(ids) == 0 {
		return nil
	}
	p := (*C.int32_t)(C.malloc(C.size_t(4 * len(ids))))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(p)), len(ids)), ids)
	return p
}

// GenerateImage runs the whole pipeline on the calling goroutine (the engine's one driver).
// With trace it also returns the float image and every step's latents. Invalid controls
// answer an error naming the field.
func (e *Engine) GenerateImage(r ImageRequest, trace bool) (*ImageResult, error) {
	if e.c == nil {
		return nil, ErrClosed
	}
	if r.Width <= 0 || r.Height <= 0 || r.Steps <= 0 {
		return nil, fmt.Errorf("native.GenerateImage: size %dx%d and steps %d must be positive", r.Width, r.Height, r.Steps)
	}
	spec, err := e.ImageSpec()
	if err != nil {
		return nil, err
	}
	if r.Width > spec.MaxSize || r.Height > spec.MaxSize || r.Steps > spec.MaxSteps {
		return nil, fmt.Errorf("native.GenerateImage: size %dx%d or steps %d beyond the model's %d and %d", r.Width, r.Height, r.Steps, spec.MaxSize, spec.MaxSteps)
	}
	var cr C.mq_image_request
	cr.prompt, cr.n_prompt = cInts(r.Prompt), C.int32_t(len(r.Prompt))
	cr.negative, cr.n_negative = cInts(r.Negative), C.int32_t(len(r.Negative))
	defer C.free(unsafe.Pointer(cr.prompt))
	defer C.free(unsafe.Pointer(cr.negative))
	cr.prompt_2, cr.n_prompt_2 = cInts(r.Prompt2), C.int32_t(len(r.Prompt2))
	cr.negative_2, cr.n_negative_2 = cInts(r.Negative2), C.int32_t(len(r.Negative2))
	defer C.free(unsafe.Pointer(cr.prompt_2))
	defer C.free(unsafe.Pointer(cr.negative_2))
	cr.true_cfg = C.float(r.TrueCFG)
	cr.width, cr.height, cr.steps = C.int32_t(r.Width), C.int32_t(r.Height), C.int32_t(r.Steps)
	cr.guidance, cr.seed = C.float(r.Guidance), C.uint64_t(r.Seed)
	px := r.Width * r.Height * 3
	var co C.mq_image_output
	co.rgb = (*C.uint8_t)(C.malloc(C.size_t(px)))
	defer C.free(unsafe.Pointer(co.rgb))
	nz := spec.LatentChannels * (r.Height / spec.VAEScale) * (r.Width / spec.VAEScale)
	if r.DecodeLatents != nil {
		if len(r.DecodeLatents) != nz {
			return nil, fmt.Errorf("native.GenerateImage: DecodeLatents has %d floats, want %d for %dx%d", len(r.DecodeLatents), nz, r.Width, r.Height)
		}
		cr.decode_latents = (*C.float)(C.malloc(C.size_t(4 * nz)))
		defer C.free(unsafe.Pointer(cr.decode_latents))
		copy(unsafe.Slice((*float32)(unsafe.Pointer(cr.decode_latents)), nz), r.DecodeLatents)
	}
	nemb, nvel := len(r.Prompt)*spec.TextHidden, 2*nz
	if len(r.Prompt2) > 0 {
		nemb = len(r.Prompt2) * spec.TextHidden
	}
	if r.Components && spec.PooledHidden > 0 {
		co.pooled_embeds = (*C.float)(C.malloc(C.size_t(4 * spec.PooledHidden)))
		defer C.free(unsafe.Pointer(co.pooled_embeds))
	}
	if r.Components {
		co.prompt_embeds = (*C.float)(C.malloc(C.size_t(4 * nemb)))
		defer C.free(unsafe.Pointer(co.prompt_embeds))
		co.first_velocity = (*C.float)(C.malloc(C.size_t(4 * nvel)))
		defer C.free(unsafe.Pointer(co.first_velocity))
	}
	nlat := 0
	if trace {
		co.image = (*C.float)(C.malloc(C.size_t(4 * px)))
		defer C.free(unsafe.Pointer(co.image))
		nlat = (r.Steps + 1) * spec.LatentChannels * (r.Height / spec.VAEScale) * (r.Width / spec.VAEScale)
		co.latents = (*C.float)(C.malloc(C.size_t(4 * nlat)))
		defer C.free(unsafe.Pointer(co.latents))
	}
	if st, msg := call(func() C.mq_status { return C.mq_engine_generate_image(e.c, &cr, &co) }); st != C.MQ_OK {
		return nil, errors.New(msg)
	}
	res := &ImageResult{Width: r.Width, Height: r.Height, RGB: C.GoBytes(unsafe.Pointer(co.rgb), C.int(px)), PipelineTime: time.Duration(co.pipeline_ns)}
	if trace {
		res.Image = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(co.image)), px)...)
		res.Latents = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(co.latents)), nlat)...)
	}
	if r.Components {
		if guided := r.Guidance > 0 && spec.PooledHidden == 0 || r.TrueCFG > 1 && len(r.Negative) > 0; !guided {
			nvel = nz // one transformer call per step without guidance
		}
		if spec.PooledHidden > 0 {
			res.PooledEmbeds = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(co.pooled_embeds)), spec.PooledHidden)...)
		}
		res.PromptEmbeds = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(co.prompt_embeds)), nemb)...)
		res.FirstVelocity = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(co.first_velocity)), nvel)...)
	}
	return res, nil
}

// EncodePNG encodes row-major RGB pixels as an 8-bit RGB PNG with Go's encoder at default
// compression: one function for the CLI and the server, so the same pixels give the same bytes.
func EncodePNG(rgb []byte, width, height int) ([]byte, error) {
	if width <= 0 || height <= 0 || len(rgb) != width*height*3 {
		return nil, fmt.Errorf("native.EncodePNG: %d bytes for %dx%d RGB", len(rgb), width, height)
	}
	img := image.NewNRGBA(image.Rect(0, 0, width, height))
	for i := 0; i < width*height; i++ {
		copy(img.Pix[4*i:4*i+3], rgb[3*i:3*i+3])
		img.Pix[4*i+3] = 255
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.DefaultCompression}).Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("native.EncodePNG: %w", err)
	}
	return buf.Bytes(), nil
}

// PromptTokenizer is what ImagePrompt.IDs needs of a tokenizer (server/tokenizer.Tokenizer).
type PromptTokenizer interface {
	ApplyChatTemplate(msgs []map[string]any, addGenerationPrompt bool, kwargs map[string]any) (string, error)
	Encode(text string) []int32
	// EncodePadded is tokenizer(text, padding="max_length", max_length=n, truncation=True).
	EncodePadded(text string, n int) (ids, mask []int32, err error)
}

// The prompt formats a text-to-image family may declare (its resolve step's "prompt.format").
const (
	// PromptChatTemplate: one user turn through the checkpoint's chat template, with the
	// generation prompt and the family's "prompt.chat_template_kwargs" (a JSON object).
	PromptChatTemplate = "chat_template"
	// PromptPlain: the prompt text as it is.
	PromptPlain = "plain"
)

// ImagePrompt is how a text-to-image family formats a prompt before its text encoder. The family
// declares it in its resolve step (native/models/<family>.cc), since it is a rule of the
// upstream pipeline, not of this runtime; the CLI and the server both apply it through IDs, so
// the same prompt gives the same ids (and image) on both paths.
type ImagePrompt struct {
	Family string // the declaring family, for error messages
	// Format is PromptChatTemplate or PromptPlain.
	Format string
	// TemplateKwargs are the chat template's extra variables (PromptChatTemplate only).
	TemplateKwargs map[string]any
	// MaxLength > 0 (PromptPlain only): the ids are padded and truncated to it, special tokens
	// included, as diffusers calls its tokenizers (the family's "prompt.max_length").
	MaxLength int
	// Second is the rule of a second text encoder's ids (ImageRequest.Prompt2), declared as
	// "prompt_2.*"; its Tokenizer is the bundle's folder it reads ("tokenizer_2"). Nil: one encoder.
	Second    *ImagePrompt
	Tokenizer string
	// GuidanceScale is how the request's guidance_scale is taken (the family's
	// "controls.guidance_scale"): GuidanceRequired (the default) or GuidanceZero (a checkpoint
	// without guidance, FLUX.1 schnell: 0 or absent). TrueCFG says the family takes
	// true_cfg_scale ("controls.true_cfg_scale" 1), with a negative prompt only when one is sent.
	GuidanceScale string
	TrueCFG       bool
}

// The ways a family takes guidance_scale (ImagePrompt.GuidanceScale).
const (
	GuidanceRequired = "required"
	GuidanceZero     = "zero"
)

// ImagePromptFor reads the prompt rule family declares for config (the bundle header's Family
// and Config). A family that declares none, or an unknown format, is an error naming the key.
func ImagePromptFor(family string, config json.RawMessage) (ImagePrompt, error) {
	hp, err := Resolve(family, config)
	if err != nil {
		return ImagePrompt{}, err
	}
	p, err := promptRule(family, hp, "prompt.")
	if err != nil {
		return ImagePrompt{}, err
	}
	if _, ok := hp["prompt_2.format"]; ok {
		s, err := promptRule(family, hp, "prompt_2.")
		if err != nil {
			return ImagePrompt{}, err
		}
		if s.Tokenizer, _ = hp["prompt_2.tokenizer"].(string); s.Tokenizer == "" {
			return ImagePrompt{}, fmt.Errorf("family %s declares prompt_2.format but no prompt_2.tokenizer (the pipeline folder of its tokenizer)", family)
		}
		p.Second = &s
	}
	p.GuidanceScale, _ = hp["controls.guidance_scale"].(string)
	switch p.GuidanceScale {
	case "":
		p.GuidanceScale = GuidanceRequired
	case GuidanceRequired, GuidanceZero:
	default:
		return ImagePrompt{}, fmt.Errorf("family %s: controls.guidance_scale %q is not %q or %q", family, p.GuidanceScale, GuidanceRequired, GuidanceZero)
	}
	p.TrueCFG = hp["controls.true_cfg_scale"] == 1.0
	return p, nil
}

// promptRule reads one encoder's rule under prefix ("prompt." or "prompt_2.").
func promptRule(family string, hp map[string]any, prefix string) (ImagePrompt, error) {
	p := ImagePrompt{Family: family}
	p.Format, _ = hp[prefix+"format"].(string)
	if n, ok := hp[prefix+"max_length"].(float64); ok {
		p.MaxLength = int(n)
	}
	switch p.Format {
	case PromptPlain:
	case PromptChatTemplate:
		if p.MaxLength > 0 {
			return ImagePrompt{}, fmt.Errorf("family %s: %smax_length is for the %q format only", family, prefix, PromptPlain)
		}
		if kw, ok := hp[prefix+"chat_template_kwargs"].(string); ok && kw != "" {
			if err := json.Unmarshal([]byte(kw), &p.TemplateKwargs); err != nil {
				return ImagePrompt{}, fmt.Errorf("family %s: %schat_template_kwargs %q is not a JSON object: %v", family, prefix, kw, err)
			}
		}
	case "":
		return ImagePrompt{}, fmt.Errorf("family %s declares no %sformat: its resolve step (native/models/%s.cc) must set it to %q or %q", family, prefix, family, PromptChatTemplate, PromptPlain)
	default:
		return ImagePrompt{}, fmt.Errorf("family %s: %sformat %q is not %q or %q", family, prefix, p.Format, PromptChatTemplate, PromptPlain)
	}
	return p, nil
}

// IDs formats prompt by the family's rule and tokenizes it.
func (p ImagePrompt) IDs(tok PromptTokenizer, prompt string) ([]int32, error) {
	switch p.Format {
	case PromptPlain:
		if p.MaxLength > 0 {
			ids, _, err := tok.EncodePadded(prompt, p.MaxLength)
			if err != nil {
				return nil, fmt.Errorf("prompt: %w", err)
			}
			return ids, nil
		}
		return tok.Encode(prompt), nil
	case PromptChatTemplate:
		text, err := tok.ApplyChatTemplate([]map[string]any{{"role": "user", "content": prompt}}, true, p.TemplateKwargs)
		if err != nil {
			return nil, fmt.Errorf("prompt: %w", err)
		}
		return tok.Encode(text), nil
	}
	return nil, fmt.Errorf("prompt: family %s's prompt format %q is unknown (make the rule with native.ImagePromptFor)", p.Family, p.Format)
}
