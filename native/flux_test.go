package native

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

// openFlux opens a flux-tiny fixture's engine on two threads (the CI machine's cores).
func openFlux(t *testing.T, name string) *Engine {
	t.Helper()
	path, err := fixtures.Bundle(fixtures.DefaultCacheDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := bundle.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bd.Close() })
	e, err := Open(bd, Params{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// fluxIDs are CLIP's ids of "a cat" padded with <|endoftext|> to 77 and T5's with </s> then
// <pad> to n, as the pipeline's tokenizers make them (server/tokenizer's tests hold the ids).
func fluxIDs(n int) (clip, t5 []int32) {
	clip = make([]int32, 77)
	for i := range clip {
		clip[i] = 49407
	}
	copy(clip, []int32{49406, 320, 2368, 49407})
	t5 = make([]int32, n)
	copy(t5, []int32{3, 9, 1712, 1})
	return clip, t5
}

// TestFluxTinyRuns: both variants draw a 64x64 image in 4 steps, the same bytes twice, and
// seed, steps, guidance (dev), the pooled CLIP input and the T5 input each change the image;
// schnell refuses a guidance scale, both refuse ids off the vocabulary. The pipeline times are
// logged (the fixture's point is to be fast on two cores).
func TestFluxTinyRuns(t *testing.T) {
	for _, v := range []struct {
		name   string
		t5len  int
		guided bool
	}{{fixtures.FluxTinyDev, 512, true}, {fixtures.FluxTinySchnell, 256, false}} {
		t.Run(v.name, func(t *testing.T) {
			e := openFlux(t, v.name)
			clip, t5 := fluxIDs(v.t5len)
			g := float32(0)
			if v.guided {
				g = 3.5
			}
			base := ImageRequest{Prompt: clip, Prompt2: t5, Width: 64, Height: 64, Steps: 4, Guidance: g, Seed: 42}
			a, err := e.GenerateImage(base, false)
			if err != nil {
				t.Fatal(err)
			}
			b, err := e.GenerateImage(base, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: 64x64, 4 steps: %v then %v", v.name, a.PipelineTime, b.PipelineTime)
			if !bytes.Equal(a.RGB, b.RGB) {
				t.Fatal("the same request gave other pixels")
			}
			mods := map[string]func(*ImageRequest){
				"seed":  func(r *ImageRequest) { r.Seed++ },
				"steps": func(r *ImageRequest) { r.Steps++ },
				"clip":  func(r *ImageRequest) { r.Prompt = append([]int32{49406, 320, 1929, 49407}, r.Prompt[4:]...) },
				"t5":    func(r *ImageRequest) { r.Prompt2 = append([]int32{3, 9, 1782, 1}, r.Prompt2[4:]...) },
				"size":  func(r *ImageRequest) { r.Width = 96 },
				"truecf": func(r *ImageRequest) {
					r.TrueCFG, r.Negative, r.Negative2 = 2, clip, append([]int32{1}, make([]int32, len(t5)-1)...)
				},
			}
			if v.guided {
				mods["guidance"] = func(r *ImageRequest) { r.Guidance += 1.5 }
			}
			for name, mod := range mods {
				r := base
				mod(&r)
				c, err := e.GenerateImage(r, false)
				if err != nil {
					t.Fatalf("%s changed: %v", name, err)
				}
				if bytes.Equal(c.RGB, a.RGB) {
					t.Errorf("changing %s gave the same image", name)
				}
			}
			bad := base
			bad.Prompt2 = append([]int32{40000}, t5[1:]...)
			if _, err := e.GenerateImage(bad, false); err == nil || !strings.Contains(err.Error(), "prompt_2") {
				t.Errorf("a T5 id off the vocabulary: %v, want an error naming prompt_2", err)
			}
			if !v.guided {
				r := base
				r.Guidance = 1
				if _, err := e.GenerateImage(r, false); err == nil || !strings.Contains(err.Error(), "guidance_scale") {
					t.Errorf("schnell with guidance 1: %v, want an error naming guidance_scale", err)
				}
			}
		})
	}
}

// FLUX's own bounds where its values are larger than Z-Image's (zimage_test.go's bounds, for
// values below 1): T5's embeddings reach |3.7| on flux-tiny and the transformer's first
// outputs |4.8|, so fp32 summation-order differences from diffusers' CPU run grow with them.
// Measured against diffusers CPU fp32 (torch 2.11, 4 threads): T5 <= 7.15e-5 (the 512-token
// long prompt; 2.2e-5 of its range), first outputs <= 2.69e-5 (5.6e-6 of their range); the
// latents after every step stay within boundLatents and the pixels identical or >= 84 dB.
const (
	boundT5           = 1e-4
	boundFluxVelocity = 5e-5
)

// fluxGoldenCase is one case of fixtures/golden/flux-tiny-*.json (make_flux_golden.py).
type fluxGoldenCase struct {
	Name           string  `json:"name"`
	Width          int     `json:"width"`
	Height         int     `json:"height"`
	Steps          int     `json:"steps"`
	Guidance       float32 `json:"guidance"`
	TrueCFG        float32 `json:"true_cfg_scale"`
	Seed           uint64  `json:"seed"`
	CLIPIDs        []int32 `json:"clip_ids"`
	T5IDs          []int32 `json:"t5_ids"`
	NegCLIPIDs     []int32 `json:"negative_clip_ids"`
	NegT5IDs       []int32 `json:"negative_t5_ids"`
	InitialLatents string  `json:"initial_latents"`
	StepsLatents   []struct {
		Latents string `json:"latents"`
	} `json:"steps_latents"`
	PromptEmbeds string `json:"prompt_embeds"`
	Pooled       string `json:"pooled_prompt_embeds"`
	FirstCalls   []struct {
		Timestep []float32 `json:"timestep"`
		Out      string    `json:"out"`
	} `json:"first_calls"`
	VAEIn  string `json:"vae_in"`
	VAEOut string `json:"vae_out"`
	Image  string `json:"image"`
	Pixels string `json:"pixels"`
}

// packedToCHW turns the transformer's output [N, 4C] (2x2 packing) into [C, h, w].
func packedToCHW(p []float32, c, h, w int) []float32 {
	out := make([]float32, len(p))
	wp := w / 2
	for y := 0; y < h/2; y++ {
		for x := 0; x < wp; x++ {
			for ch := 0; ch < c; ch++ {
				for ph := 0; ph < 2; ph++ {
					for pw := 0; pw < 2; pw++ {
						out[(ch*h+2*y+ph)*w+2*x+pw] = p[(y*wp+x)*4*c+ch*4+ph*2+pw]
					}
				}
			}
		}
	}
	return out
}

// TestFluxMatchesDiffusers holds both variants to diffusers' FluxPipeline (CPU fp32) by
// component, case by case, as TestZImageMatchesDiffusers does: the ids the golden's tokenizers
// made, CLIP's pooled output, T5's embeddings, the first transformer outputs, every step's
// latents, the float image, the pixels, and the VAE alone on diffusers' input. Until the
// golden exists (fixtures/golden/run_flux_golden.sh on the GPU host) it skips saying so.
func TestFluxMatchesDiffusers(t *testing.T) {
	for _, name := range []string{fixtures.FluxTinyDev, fixtures.FluxTinySchnell} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("..", "fixtures", "golden", name+".json")
			b, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				t.Skipf("NO GOLDEN: %s (fixtures/golden/run_flux_golden.sh makes it)", path)
			}
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				Cases    []fluxGoldenCase `json:"cases"`
				CFGCases []fluxGoldenCase `json:"cfg_cases"`
			}
			if err := json.Unmarshal(b, &g); err != nil {
				t.Fatal(err)
			}
			e := openFlux(t, name)
			spec, err := e.ImageSpec()
			if err != nil {
				t.Fatal(err)
			}
			check := func(c, what string, got, want []float32, bound float64) {
				t.Helper()
				d := maxDiff(got, want)
				t.Logf("%s: %s max|diff| %.3g (bound %.0e)", c, what, d, bound)
				if d > bound {
					t.Errorf("%s: %s differ from diffusers' by %.3g (> %.0e)", c, what, d, bound)
				}
			}
			for _, c := range append(g.Cases, g.CFGCases...) {
				req := ImageRequest{Prompt: c.CLIPIDs, Prompt2: c.T5IDs, Negative: c.NegCLIPIDs, Negative2: c.NegT5IDs, Width: c.Width, Height: c.Height,
					Steps: c.Steps, Guidance: c.Guidance, TrueCFG: c.TrueCFG, Seed: c.Seed, Components: true}
				res, err := e.GenerateImage(req, true)
				if err != nil {
					t.Fatalf("%s: %v", c.Name, err)
				}
				check(c.Name, "CLIP pooled output", res.PooledEmbeds, decodeF32(t, c.Pooled), boundEmbeds)
				check(c.Name, "T5 embeddings", res.PromptEmbeds, decodeF32(t, c.PromptEmbeds), boundT5)
				lc, lh, lw := spec.LatentChannels, c.Height/spec.VAEScale, c.Width/spec.VAEScale
				// The golden keeps the transformer's first two calls: the first step's prompt and
				// negative calls with true CFG, else the first two steps'. The engine reports the
				// first step's calls, so those with the first call's timestep are compared.
				var wantVel []float32
				for _, o := range c.FirstCalls {
					if len(o.Timestep) == 0 || o.Timestep[0] != c.FirstCalls[0].Timestep[0] {
						continue
					}
					wantVel = append(wantVel, packedToCHW(decodeF32(t, o.Out), lc, lh, lw)...)
				}
				check(c.Name, "first transformer outputs", res.FirstVelocity, wantVel, boundFluxVelocity)
				n := len(res.Latents) / (c.Steps + 1)
				for i := 0; i <= c.Steps; i++ {
					want := decodeF32(t, c.InitialLatents)
					if i > 0 {
						want = decodeF32(t, c.StepsLatents[i-1].Latents)
					}
					check(c.Name, fmt.Sprintf("latents after step %d", i), res.Latents[i*n:(i+1)*n], want, boundLatents)
				}
				check(c.Name, "float image", res.Image, decodeF32(t, c.Image), boundImage)
				px, _ := base64.StdEncoding.DecodeString(c.Pixels)
				psnr := pixelPSNR(px, res.RGB)
				t.Logf("%s: pixels PSNR %.2f dB, pipeline %v", c.Name, psnr, res.PipelineTime)
				if psnr < minPSNR {
					t.Errorf("%s: PSNR %.2f dB against diffusers' pixels, want >= %.0f", c.Name, psnr, minPSNR)
				}
				vae, err := e.GenerateImage(ImageRequest{Width: c.Width, Height: c.Height, Steps: c.Steps, Seed: c.Seed, DecodeLatents: decodeF32(t, c.VAEIn)}, true)
				if err != nil {
					t.Fatalf("%s: VAE alone: %v", c.Name, err)
				}
				out, hw := decodeF32(t, c.VAEOut), c.Width*c.Height
				want := make([]float32, 3*hw)
				for ch := 0; ch < 3 && len(out) == 3*hw; ch++ {
					for p := 0; p < hw; p++ {
						want[p*3+ch] = min(1, max(0, out[ch*hw+p]/2+0.5))
					}
				}
				check(c.Name, "VAE decode of diffusers' latents", vae.Image, want, boundVAE)
			}
		})
	}
}
