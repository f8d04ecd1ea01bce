package zimage_test

import (
	"fmt"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// The CUDA pipeline's own bound: bf16 parity with diffusers run in bf16 on a CUDA GPU
// (fixtures/golden/zimage-tiny-cuda-bf16.json, made by make_zimage_gpu_golden.py on the same
// checkpoint and cases as the CPU golden), PSNR >= 30 dB and SSIM >= 0.95 per image, through
// the suite's cuda server (--label-filter=gpu). Both sides run in bf16, each rounding its own
// way, so the bound is looser than the CPU fp32 gate's; without a GPU the spec skips with
// NVML's reason.
const (
	gpuMinPSNR = 30
	gpuMinSSIM = 0.95
)

var _ = Describe("zimage bf16 parity on GPU", suite.Labels(), spec.GPU(), spec.Task(spec.TaskImage), spec.Gate(spec.GateParity), func() {
	BeforeEach(func() { suite.RequireGPU() })
	It("serves images within 30 dB PSNR and 0.95 SSIM of diffusers' bf16 run on CUDA", func(ctx SpecContext) {
		golden, err := spec.LoadImageGolden(filepath.Join(suite.State.RepoRoot, "fixtures", "golden", "zimage-tiny-cuda-bf16.json"))
		Expect(err).NotTo(HaveOccurred())
		in := suite.ImageInput()
		// diffusers' bf16 run keeps pixels only: no latents to compare (MaxLatentDiff 0).
		in.Golden, in.MinPSNR, in.MinSSIM, in.MaxLatentDiff = golden, gpuMinPSNR, gpuMinSSIM, 0
		figs, err := spec.CheckImageParity(ctx, in)
		for name, f := range figs {
			AddReportEntry("bf16 image parity "+name, fmt.Sprintf("PSNR %.2f dB, SSIM %.6f", f.PSNR, f.SSIM))
		}
		Expect(err).NotTo(HaveOccurred())
	})
})
