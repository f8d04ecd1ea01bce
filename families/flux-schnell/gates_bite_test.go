package fluxschnell_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec starts a second server with a planted defect
// (MODELQUAL_FAULTS, read by the flux engine at start) and shows the gates' core checks fail on
// schnell too: the served-equals-native gate (qual generate-image runs the unplanted pipeline)
// and the parity gate against diffusers.
var _ = Describe("flux-schnell gates bite", fluxLabel, suite.Labels(), spec.Premerge(), func() {
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

// The two schnell-only gates against a server that answers every image request 200 with the
// same PNG (a pipeline that would take a guidance scale it has no embedding for, and ignore
// its controls): the contract gate must name guidance_scale, the controls gate the seed.
var _ = Describe("flux-schnell contract gates bite", fluxLabel, suite.Labels(), spec.Premerge(), spec.Task(spec.TaskImage), spec.Gate(spec.GateContract), func() {
	It("fail against a server that takes any guidance_scale and ignores seed, steps and size", func(ctx SpecContext) {
		var buf bytes.Buffer
		Expect(png.Encode(&buf, image.NewRGBA(image.Rect(0, 0, 64, 64)))).To(Succeed())
		answer, err := json.Marshal(map[string]any{"created": 1, "data": []map[string]string{{"b64_json": base64.StdEncoding.EncodeToString(buf.Bytes())}}})
		Expect(err).NotTo(HaveOccurred())
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer)
		}))
		defer srv.Close()
		in, _ := imageInput()
		in.API = spec.NewAPI(srv.URL, "flux-schnell", "", 10*time.Second)
		err = checkSchnellContract(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the contract gate's message", err.Error())
		Expect(err.Error()).To(ContainSubstring("guidance_scale 3.5: the request was answered 200, want 400"))
		err = checkSchnellControls(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the controls gate's message", err.Error())
		Expect(err.Error()).To(ContainSubstring("changing seed gave the same image"))
	})
})
