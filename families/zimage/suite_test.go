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

// imageInput is the image gates' input with the family's bounds: PSNR >= 40 dB and
// SSIM >= 0.99 against diffusers' pixels (CPU fp32), on Z-Image's 16-pixel size grid
// (the VAE's 8x times the transformer's 2x2 patches).
func imageInput() spec.ImageInput {
	in := suite.ImageInput()
	in.MinPSNR, in.MinSSIM, in.SizeMultiple = 40, 0.99, 16
	return in
}
