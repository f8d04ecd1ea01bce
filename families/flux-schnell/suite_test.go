package fluxschnell_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

func TestFluxSchnell(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "flux-schnell family")
}

// suite is the one server, checkpoint and bundle every spec here uses. The reference is
// diffusers' goldens, not a forward pass of ours, so there is no text reference.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "flux-schnell",
	Reference: func(string) (spec.Reference, error) {
		return nil, errors.New("flux-schnell's reference is diffusers' goldens (fixtures/golden/flux-tiny-schnell.json), not a logits forward pass")
	},
})

// fluxLabel puts every spec of this folder under the flux label too: FLUX.1-schnell is the flux
// family's second variant, so `-label-filter=flux` qualifies both.
var fluxLabel = Label("flux")

// goldenPath is diffusers' golden of the suite's fixture.
func goldenPath() string {
	return filepath.Join(suite.State.RepoRoot, "fixtures", "golden", suite.Manifest.Checkpoint.Fixture+".json")
}

// controlCases are the requests the non-parity gates send when there is no golden: the
// golden's first cases' controls (make_flux_golden.py's schnell cases: no guidance).
var controlCases = []spec.ImageGoldenCase{
	{Name: "fox-64x64", ImageRequest: spec.ImageRequest{Prompt: "a red fox in the snow", Width: 64, Height: 64, Steps: 4, Seed: 42}},
	{Name: "fox-96x64", ImageRequest: spec.ImageRequest{Prompt: "a red fox in the snow", Width: 96, Height: 64, Steps: 4, Seed: 42}},
}

// imageInput is the image gates' input with the bounds from thresholds.yaml (its gpu: block on
// a GPU run), on FLUX's 16-pixel size grid. Golden holds diffusers' cases when the golden file
// exists (hasGolden), else controlCases.
func imageInput() (in spec.ImageInput, hasGolden bool) {
	t := suite.Threshold()
	in = spec.ImageInput{API: suite.API, Bundle: suite.State.Bundle, Device: suite.State.Device,
		QualBin: suite.QualBin(), SizeMultiple: 16,
		MinPSNR: t.PSNRMinDB, MinSSIM: t.SSIMMin, MaxLatentDiff: t.MaxAbsLatentDiff}
	g, err := spec.LoadImageGolden(goldenPath())
	if errors.Is(err, os.ErrNotExist) {
		in.Golden = controlCases
		return in, false
	}
	Expect(err).NotTo(HaveOccurred())
	in.Golden = g
	return in, true
}

// parityInput is imageInput for the CPU fp32 parity spec: it skips, naming the file, until the
// golden exists, and on a GPU run, whose pipeline is diffusers' bf16 one; gpu_test.go holds that
// run to diffusers' bf16 golden.
func parityInput() spec.ImageInput {
	if suite.State.Device == "cuda" {
		Skip("on a GPU the reference is diffusers' bf16 run, not the fp32 golden: the gpu spec \"flux-schnell bf16 parity on GPU\" holds it")
	}
	in, ok := imageInput()
	if !ok {
		Skip("NO GOLDEN: " + goldenPath() + " (fixtures/golden/run_flux_golden.sh makes it)")
	}
	return in
}
