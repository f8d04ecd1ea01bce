package fluxschnell_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// The CUDA pipeline's parity on schnell: diffusers' FluxPipeline as run in bf16 is the reference
// (fixtures/golden/flux-tiny-schnell-cuda-bf16.json, made by lab/flux/flux_diffusers.py golden
// through lab/flux/gpu_check.sh), per image within thresholds.yaml's gpu: bounds, through the
// suite's cuda server (--label-filter=gpu). Without a GPU the spec skips with NVML's reason, and
// without the golden it skips naming the file.
var _ = Describe("flux-schnell bf16 parity on GPU", fluxLabel, suite.Labels(), spec.GPU(), spec.Task(spec.TaskImage), spec.Gate(spec.GateParity), func() {
	BeforeEach(func() { suite.RequireGPU() })
	It("serves images within the gpu PSNR and SSIM bounds of diffusers' bf16 run on CUDA", func(ctx SpecContext) {
		path := filepath.Join(suite.State.RepoRoot, "fixtures", "golden", suite.Manifest.Checkpoint.Fixture+"-cuda-bf16.json")
		golden, err := spec.LoadImageGolden(path)
		if errors.Is(err, os.ErrNotExist) {
			Skip("NO GOLDEN: " + path + " (made on the GPU host: fixtures/PROVENANCE.md says how)")
		}
		Expect(err).NotTo(HaveOccurred())
		// diffusers' bf16 run keeps pixels only: no latents to compare (MaxLatentDiff 0).
		in, _ := imageInput()
		in.Golden, in.MaxLatentDiff = golden, 0
		figs, err := spec.CheckImageParity(ctx, in)
		for name, f := range figs {
			AddReportEntry("bf16 image parity "+name, fmt.Sprintf("PSNR %.2f dB, SSIM %.6f", f.PSNR, f.SSIM))
		}
		Expect(err).NotTo(HaveOccurred())
	})
})
