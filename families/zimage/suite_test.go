package zimage_test

import (
	"errors"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

func TestZImage(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "zimage family")
}

// suite is the one server, checkpoint and bundle every zimage spec uses. The family's
// reference is diffusers' goldens, not a forward pass of ours, so there is no text reference.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "zimage",
	Reference: func(string) (spec.Reference, error) {
		return nil, errors.New("zimage's reference is diffusers' goldens (fixtures/golden/zimage-tiny.json), not a logits forward pass")
	},
})

// imageInput is the image gates' input with the family's bounds from thresholds.yaml
// (psnr_min_db, ssim_min, max_abs_latent_diff; the gpu: block on a GPU run), on Z-Image's
// 16-pixel size grid (the VAE's 8x times the transformer's 2x2 patches).
func imageInput() spec.ImageInput {
	in := suite.ImageInput()
	t := suite.Threshold()
	in.MinPSNR, in.MinSSIM, in.MaxLatentDiff, in.SizeMultiple = t.PSNRMinDB, t.SSIMMin, t.MaxAbsLatentDiff, 16
	return in
}
