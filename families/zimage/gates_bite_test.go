package zimage_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec starts a second server with a planted defect
// (MODELQUAL_FAULTS, read by the engine at start) and shows the gate's core check fails.
var _ = Describe("zimage gates bite", suite.Labels(), spec.Premerge(), func() {
	It("image parity fails when the image tokens' h and w RoPE positions are swapped (zimage.rope_swap_hw)", spec.Task(spec.TaskImage), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=zimage.rope_swap_hw")
		in := imageInput()
		in.API = api
		_, err := spec.CheckImageParity(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(ContainSubstring(`case "fox": PSNR`))
	})

	It("the controls gate fails when the engine ignores guidance (zimage.drop_cfg)", spec.Task(spec.TaskImage), spec.Gate(spec.GateContract), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=zimage.drop_cfg")
		in := imageInput()
		in.API = api
		err := spec.CheckImageControls(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(ContainSubstring("changing guidance_scale gave the same image"))
		_, err = spec.CheckImageParity(ctx, in)
		Expect(err).To(MatchError(ContainSubstring(`case "fox": PSNR`)))
	})
})
