package flux_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

func TestFlux(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "flux family")
}

// suite is the one server, checkpoint and bundle every flux spec uses. The family's reference
// is diffusers' goldens, not a forward pass of ours, so there is no text reference.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "flux",
	Reference: func(string) (spec.Reference, error) {
		return nil, errors.New("flux's reference is diffusers' goldens (fixtures/golden/flux-tiny-dev.json), not a logits forward pass")
	},
})

// goldenPath is diffusers' golden of the suite's fixture.
func goldenPath() string {
	return filepath.Join(suite.State.RepoRoot, "fixtures", "golden", suite.Manifest.Checkpoint.Fixture+".json")
}

// controlCases are the requests the non-parity gates send when there is no golden yet: the
// golden's first cases' controls (make_flux_golden.py), so the gates run the same either way.
var controlCases = []spec.ImageGoldenCase{
	{Name: "fox-64x64", ImageRequest: spec.ImageRequest{Prompt: "a red fox in the snow", Width: 64, Height: 64, Steps: 4, Guidance: 3.5, Seed: 42}},
	{Name: "fox-96x64", ImageRequest: spec.ImageRequest{Prompt: "a red fox in the snow", Width: 96, Height: 64, Steps: 4, Guidance: 3.5, Seed: 42}},
}

// imageInput is the image gates' input with the family's bounds from thresholds.yaml, on
// FLUX's 16-pixel size grid (the VAE's 8x times the 2x2 packing). Golden holds diffusers' cases
// when the golden file exists (hasGolden), else controlCases.
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
// golden exists, and on a GPU run, whose pipeline is diffusers' bf16 one (bf16 noise for the seed,
// bf16 timesteps and latents: 24 dB from the fp32 images on dev, as diffusers' own bf16 run is);
// gpu_test.go holds that run to diffusers' bf16 golden.
func parityInput() spec.ImageInput {
	if suite.State.Device == "cuda" {
		Skip("on a GPU the reference is diffusers' bf16 run, not the fp32 golden: the gpu spec \"flux bf16 parity on GPU\" holds it")
	}
	in, ok := imageInput()
	if !ok {
		Skip("NO GOLDEN: " + goldenPath() + " (fixtures/golden/run_flux_golden.sh makes it on the GPU host)")
	}
	return in
}
