package flux_test

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

// The flux family's gates, declared once (spec.Suite.Qualify): provenance, parity with
// diffusers' images, served bytes equal to qual generate-image's, determinism and control
// sensitivity (seed, steps, guidance, size), the refusal contract, geometry and records.
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
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
	It("is deterministic and follows seed, steps, guidance and size", labels(spec.GateContract), func(sctx SpecContext) {
		in, _ := imageInput()
		Expect(spec.CheckImageControls(sctx, in)).To(Succeed())
		Expect(checkSizeChanges(sctx, in)).To(Succeed())
	})
	It("refuses unsupported and missing controls with 400 naming the field, then serves 200", labels(spec.GateContract), func(sctx SpecContext) {
		in, _ := imageInput()
		Expect(checkFluxContract(sctx, in)).To(Succeed())
	})
	It("answers exactly one RGB PNG of the asked non-square size", labels(spec.GateContract), func(sctx SpecContext) {
		in, _ := imageInput()
		Expect(spec.CheckImageGeometry(sctx, in)).To(Succeed())
	})
	spec.RecordsMatchResponses(ctx, recordCheckInput)
})

// recordCheckInput is the suite's record-gate input (spec.Suite.RecordCheckInput, which takes
// the golden's first case) or, until the golden exists, the same for controlCases' first.
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

// body is the request of r as the image gates send it.
func body(model string, r spec.ImageRequest) map[string]any { return r.Body(model) }

// checkSizeChanges: another size gives another image (the image ids and the schedule's shift
// follow the size), and the same request still the same bytes.
func checkSizeChanges(ctx context.Context, in spec.ImageInput) error {
	r := in.Golden[0].ImageRequest
	a, err := in.API.GenerateImage(ctx, body(in.API.Model, r))
	if err != nil {
		return err
	}
	r.Width += 2 * in.SizeMultiple
	b, err := in.API.GenerateImage(ctx, body(in.API.Model, r))
	if err != nil {
		return err
	}
	if string(a.PNG) == string(b.PNG) {
		return errors.New("controls: changing size gave the same image")
	}
	return nil
}

// checkFluxContract: the image route's refusals for a FLUX.1 dev model, each a 400 naming its
// field followed by a 200 (the shared list of spec's image contract, with FLUX's own: a missing
// guidance_scale is refused because dev's guidance embedding needs it, a negative
// true_cfg_scale is refused, and a prompt past CLIP's 77 tokens is truncated as FluxPipeline
// truncates it, so it is answered 200, not refused).
func checkFluxContract(ctx context.Context, in spec.ImageInput) error {
	base := body(in.API.Model, in.Golden[0].ImageRequest)
	with := func(k string, v any) map[string]any { return spec.WithField(base, k, v) }
	refusals := []spec.Refusal{
		{Field: "num_inference_steps", Body: with("num_inference_steps", nil)},
		{Field: "guidance_scale", Body: with("guidance_scale", nil)},
		{Field: "seed", Body: with("seed", nil)},
		{Field: "n", Body: with("n", 2)},
		{Field: "stream", Body: with("stream", true)},
		{Field: "response_format", Body: with("response_format", "url")},
		{Field: "quality", Body: with("quality", "high")},
		{Field: "output_format", Body: with("output_format", "jpeg")},
		{Field: "num_frames", Body: with("num_frames", 16)},
		{Field: "size", Body: with("size", fmt.Sprintf("%dx%d", in.SizeMultiple+8, in.SizeMultiple))},
		{Field: "size", Body: with("size", "4096x4096")},
		{Field: "num_inference_steps", Body: with("num_inference_steps", 0)},
		{Field: "guidance_scale", Body: with("guidance_scale", "NaN")},
		{Field: "guidance_scale", Body: with("guidance_scale", -1)},
		{Field: "true_cfg_scale", Body: with("true_cfg_scale", -1)},
		{Field: "seed", Body: with("seed", -1)},
		{Field: "seed", Body: with("seed", json.Number("9223372036854775808"))},
		{Field: "prompt", Body: with("prompt", 7)},
	}
	problems := spec.CheckRefusals(ctx, in.API, base, refusals)
	if _, err := in.API.GenerateImage(ctx, with("prompt", strings.Repeat("fox ", 600))); err != nil {
		problems = append(problems, fmt.Sprintf("a prompt past CLIP's 77 tokens: %v, want 200 (truncated as FluxPipeline does)", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("flux image contract: %s", strings.Join(problems, "; "))
	}
	return nil
}
