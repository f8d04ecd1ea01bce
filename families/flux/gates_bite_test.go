package flux_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec starts a second server with a planted defect
// (MODELQUAL_FAULTS, read by the engine at start) and shows the gates' core checks fail: the
// served-equals-native gate (qual generate-image runs the unplanted pipeline) and, once the
// golden exists, the parity gate against diffusers (until then a report entry says "NO
// GOLDEN: <path>").
var _ = Describe("flux gates bite", suite.Labels(), spec.Premerge(), func() {
	for _, f := range []struct{ fault, what string }{
		{"flux.swap_text_image_ids", "the rotary table is built from [image ids, text ids] against the [text, image] tokens"},
		{"flux.drop_pooled", "CLIP's pooled output is zeroed before the conditioning"},
	} {
		It("image gates fail when "+f.what+" ("+f.fault+")", spec.Task(spec.TaskImage), spec.Gate(spec.GateParity), func(ctx SpecContext) {
			api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS="+f.fault)
			in, hasGolden := imageInput()
			in.API = api
			err := spec.CheckImageNative(ctx, in)
			Expect(err).To(HaveOccurred())
			AddReportEntry("served vs native's message", err.Error())
			Expect(err.Error()).To(ContainSubstring("differs from qual generate-image's"))
			if !hasGolden {
				AddReportEntry("parity half not run", "NO GOLDEN: "+goldenPath())
				return
			}
			_, err = spec.CheckImageParity(ctx, in)
			Expect(err).To(HaveOccurred())
			AddReportEntry("the parity gate's message", err.Error())
			Expect(err.Error()).To(ContainSubstring("PSNR"))
		})
	}
})
