package flux_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// The CUDA pipeline's parity: it is diffusers' FluxPipeline as run in bf16 (the seed's noise
// drawn in bf16, timesteps, guidance and latents rounded to bf16 as that pipeline rounds them),
// so its reference is diffusers' own bf16 run on a CUDA GPU (fixtures/golden/<fixture>-cuda-bf16.json,
// made by lab/flux/flux_diffusers.py golden through lab/flux/gpu_check.sh on the CPU golden's
// plain cases), per image within thresholds.yaml's gpu: bounds, through the suite's cuda server
// (--label-filter=gpu). Both sides run in bf16, each rounding its products its own way, so the
// bound is looser than the CPU fp32 gate's; without a GPU the spec skips with NVML's reason, and
// without the golden it skips naming the file.
var _ = Describe("flux bf16 parity on GPU", suite.Labels(), spec.GPU(), spec.Task(spec.TaskImage), spec.Gate(spec.GateParity), func() {
	BeforeEach(func() { suite.RequireGPU() })
	It("serves images within the gpu PSNR and SSIM bounds of diffusers' bf16 run on CUDA", func(ctx SpecContext) {
		path := filepath.Join(suite.State.RepoRoot, "fixtures", "golden", suite.Manifest.Checkpoint.Fixture+"-cuda-bf16.json")
		golden, err := spec.LoadImageGolden(path)
		if errors.Is(err, os.ErrNotExist) {
			Skip("NO GOLDEN: " + path + " (made on the GPU host: fixtures/PROVENANCE.md says how)")
		}
		Expect(err).NotTo(HaveOccurred())
		// imageInput() reads thresholds.yaml's gpu: block on a GPU run. diffusers' bf16 run keeps
		// pixels only: no latents to compare (MaxLatentDiff 0).
		in, _ := imageInput()
		in.Golden, in.MaxLatentDiff = golden, 0
		figs, err := spec.CheckImageParity(ctx, in)
		for name, f := range figs {
			AddReportEntry("bf16 image parity "+name, fmt.Sprintf("PSNR %.2f dB, SSIM %.6f", f.PSNR, f.SSIM))
		}
		Expect(err).NotTo(HaveOccurred())
	})
})
