package fluxschnell_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// FLUX.1-schnell's gates, declared once (spec.Suite.Qualify): provenance, parity with diffusers'
// images, served bytes equal to qual generate-image's, determinism and control sensitivity
// (seed, steps, size; guidance 0 is no guidance), schnell's refusal contract, geometry and records.
var _ = Describe("FLUX.1-schnell", fluxLabel, func() {
	suite.Qualify(context.Background(), func(ctx context.Context) {
		spec.BundleProvenance(ctx, suite.ProvenanceInput)
		labels := func(g string) Labels { return append(spec.Task(spec.TaskImage), spec.Gate(g)...) }
		It("serves images within PSNR and SSIM of diffusers' FluxPipeline on the golden cases", labels(spec.GateParity), func(sctx SpecContext) {
			figs, err := spec.CheckImageParity(sctx, parityInput())
			for name, f := range figs {
				AddReportEntry("image parity "+name, f.String())
			}
			Expect(err).NotTo(HaveOccurred())
		})
		It("serves the PNG bytes qual generate-image writes", labels(spec.GateParity), func(sctx SpecContext) {
			in, _ := imageInput()
			Expect(spec.CheckImageNative(sctx, in)).To(Succeed())
		})
		It("is deterministic, follows seed, steps and size, and takes guidance 0 as none", labels(spec.GateContract), func(sctx SpecContext) {
			in, _ := imageInput()
			Expect(checkSchnellControls(sctx, in)).To(Succeed())
		})
		It("refuses a guidance scale and malformed controls with 400 naming the field, then serves 200", labels(spec.GateContract), func(sctx SpecContext) {
			in, _ := imageInput()
			Expect(checkSchnellContract(sctx, in)).To(Succeed())
		})
		It("answers exactly one RGB PNG of the asked non-square size", labels(spec.GateContract), func(sctx SpecContext) {
			in, _ := imageInput()
			Expect(spec.CheckImageGeometry(sctx, in)).To(Succeed())
		})
		spec.RecordsMatchResponses(ctx, recordCheckInput)
	})
})

// recordCheckInput is the suite's record-gate input (spec.Suite.RecordCheckInput, which takes
// the golden's first case) or, without the golden, the same for controlCases' first.
func recordCheckInput() spec.RecordCheckInput {
	if _, ok := imageInput(); ok {
		return suite.RecordCheckInput()
	}
	if suite.State.RecordsPath == "" {
		Skip(spec.NotCheckable + "the record gate reads the server's request records; this launcher has none")
	}
	r := controlCases[0].ImageRequest
	return spec.RecordCheckInput{API: suite.API, RecordsPath: suite.State.RecordsPath, MaxTokens: 8, Image: &r}
}

// checkSchnellControls: the same request twice gives the same bytes, and so does the request
// without guidance_scale (schnell has no guidance embedding: 0 and absent are the same
// request, as in FluxPipeline); another seed, step count or size gives another image. The
// shared spec.CheckImageControls also moves guidance_scale, which schnell refuses.
func checkSchnellControls(ctx context.Context, in spec.ImageInput) error {
	base := in.Golden[0].ImageRequest
	get := func(b map[string]any) (string, error) {
		ans, err := in.API.GenerateImage(ctx, b)
		if err != nil {
			return "", err
		}
		return string(ans.PNG), nil
	}
	a, err := get(base.Body(in.API.Model))
	if err != nil {
		return fmt.Errorf("controls: %w", err)
	}
	for _, same := range []struct {
		what string
		body map[string]any
	}{
		{"the same request", base.Body(in.API.Model)},
		{"the request without guidance_scale", spec.WithField(base.Body(in.API.Model), "guidance_scale", nil)},
	} {
		b, err := get(same.body)
		if err != nil {
			return fmt.Errorf("controls: %s: %w", same.what, err)
		}
		if b != a {
			return fmt.Errorf("controls: %s gave another image", same.what)
		}
	}
	for _, v := range []struct {
		field string
		mod   func(*spec.ImageRequest)
	}{
		{"seed", func(r *spec.ImageRequest) { r.Seed++ }},
		{"num_inference_steps", func(r *spec.ImageRequest) { r.Steps++ }},
		{"size", func(r *spec.ImageRequest) { r.Width += 2 * in.SizeMultiple }},
	} {
		r := base
		v.mod(&r)
		c, err := get(r.Body(in.API.Model))
		if err != nil {
			return fmt.Errorf("controls: %s changed: %w", v.field, err)
		}
		if c == a {
			return fmt.Errorf("controls: changing %s gave the same image: the control is ignored", v.field)
		}
	}
	return nil
}

// checkSchnellContract: the image route's refusals for a FLUX.1-schnell model, each a 400
// naming its field followed by a 200: any guidance_scale but 0 (schnell has no guidance
// embedding; FluxPipeline would ignore it, so the server refuses rather than silently drop it),
// the malformed and unsupported controls every image family refuses, a negative
// true_cfg_scale; and a prompt past CLIP's 77 tokens answered 200 (truncated, as FluxPipeline
// truncates it).
func checkSchnellContract(ctx context.Context, in spec.ImageInput) error {
	base := in.Golden[0].ImageRequest.Body(in.API.Model)
	with := func(k string, v any) map[string]any { return spec.WithField(base, k, v) }
	refusals := []spec.Refusal{
		{Field: "guidance_scale", Body: with("guidance_scale", 3.5)},
		{Field: "guidance_scale", Body: with("guidance_scale", 1)},
		{Field: "guidance_scale", Body: with("guidance_scale", "NaN")},
		{Field: "guidance_scale", Body: with("guidance_scale", -1)},
		{Field: "num_inference_steps", Body: with("num_inference_steps", nil)},
		{Field: "num_inference_steps", Body: with("num_inference_steps", 0)},
		{Field: "seed", Body: with("seed", nil)},
		{Field: "seed", Body: with("seed", -1)},
		{Field: "seed", Body: with("seed", json.Number("9223372036854775808"))},
		{Field: "n", Body: with("n", 2)},
		{Field: "stream", Body: with("stream", true)},
		{Field: "response_format", Body: with("response_format", "url")},
		{Field: "quality", Body: with("quality", "high")},
		{Field: "output_format", Body: with("output_format", "jpeg")},
		{Field: "num_frames", Body: with("num_frames", 16)},
		{Field: "size", Body: with("size", fmt.Sprintf("%dx%d", in.SizeMultiple+8, in.SizeMultiple))},
		{Field: "size", Body: with("size", "4096x4096")},
		{Field: "true_cfg_scale", Body: with("true_cfg_scale", -1)},
		{Field: "prompt", Body: with("prompt", 7)},
	}
	problems := spec.CheckRefusals(ctx, in.API, base, refusals)
	for _, ok := range []struct {
		what string
		body map[string]any
	}{
		{"no guidance_scale", with("guidance_scale", nil)},
		{"guidance_scale 0", with("guidance_scale", 0)},
		{"a prompt past CLIP's 77 tokens", with("prompt", strings.Repeat("fox ", 600))},
	} {
		if _, err := in.API.GenerateImage(ctx, ok.body); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v, want 200", ok.what, err))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("flux-schnell image contract: %s", strings.Join(problems, "; "))
	}
	return nil
}
