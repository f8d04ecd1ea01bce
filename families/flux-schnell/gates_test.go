package fluxschnell_test

import (
	"context"
	"encoding/json"
	"errors"
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
	refusals := []struct {
		field string
		body  map[string]any
	}{
		{"guidance_scale", with("guidance_scale", 3.5)},
		{"guidance_scale", with("guidance_scale", 1)},
		{"guidance_scale", with("guidance_scale", "NaN")},
		{"guidance_scale", with("guidance_scale", -1)},
		{"num_inference_steps", with("num_inference_steps", nil)},
		{"num_inference_steps", with("num_inference_steps", 0)},
		{"seed", with("seed", nil)},
		{"seed", with("seed", -1)},
		{"seed", with("seed", json.Number("9223372036854775808"))},
		{"n", with("n", 2)},
		{"stream", with("stream", true)},
		{"response_format", with("response_format", "url")},
		{"quality", with("quality", "high")},
		{"output_format", with("output_format", "jpeg")},
		{"num_frames", with("num_frames", 16)},
		{"size", with("size", fmt.Sprintf("%dx%d", in.SizeMultiple+8, in.SizeMultiple))},
		{"size", with("size", "4096x4096")},
		{"true_cfg_scale", with("true_cfg_scale", -1)},
		{"prompt", with("prompt", 7)},
	}
	var problems []string
	for _, r := range refusals {
		_, err := in.API.GenerateImage(ctx, r.body)
		var ae *spec.APIError
		switch {
		case err == nil:
			val := "absent"
			if v, ok := r.body[r.field]; ok {
				val = fmt.Sprint(v)
			}
			problems = append(problems, fmt.Sprintf("%s %s: the request was answered 200, want 400", r.field, val))
		case !errors.As(err, &ae):
			problems = append(problems, fmt.Sprintf("%s: %v", r.field, err))
		case ae.Status != 400 || ae.Param != r.field || !strings.Contains(ae.Message, r.field):
			problems = append(problems, fmt.Sprintf("%s: HTTP %d param %q %q, want 400 naming %s", r.field, ae.Status, ae.Param, ae.Message, r.field))
		}
		if _, err := in.API.GenerateImage(ctx, base); err != nil {
			problems = append(problems, fmt.Sprintf("the valid request after the %s refusal failed: %v", r.field, err))
		}
	}
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
