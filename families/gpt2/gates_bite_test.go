package gpt2_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec here plants a defect (a server started with
// MODELQUAL_FAULTS, or the load generator's own planted option) and shows that the gate's core
// check fails with a message pointing at it.
var _ = Describe("gpt2 gates bite", suite.Labels(), spec.Premerge(), func() {
	// A small closed-loop profile: 10 measured requests after 3 warmups, 8 tokens each.
	small := func() manifest.Profile {
		return manifest.Profile{Name: "bite", Endpoint: "completions", Concurrency: []int{2}, Requests: 10, Warmup: 3,
			InputTokensMean: 16, OutputTokens: 8}
	}

	It("StreamingParity fails when the server drops the last content delta (server.swallow_final_delta)", spec.Task(spec.TaskStream), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=server.swallow_final_delta")
		in := suite.StreamingInput(false)
		in.API = api
		in.Corpus = in.Corpus[:2]
		err := spec.CheckStreaming(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(MatchRegexp(`prompt "short-hello": streamed deltas \(\d+ of them\) concatenate to \d+ bytes, the non-streaming answer has \d+ bytes; the stream lacks the answer's tail ".+" \(a swallowed final delta\?\)`))
	})

	It("LoadProfile fails when the server loses request records (server.drop_record): the join names the unmatched request IDs", spec.Gate(spec.GateLoad), func(ctx SpecContext) {
		_, ep := suite.StartServer(ctx, "MODELQUAL_FAULTS=server.drop_record")
		in := suite.LoadInput("completions-closed")
		in.Endpoint, in.Profile, in.OutDir = ep, small(), suite.ArtifactDir("bite-drop-record")
		_, err := spec.CheckLoad(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(MatchRegexp(`bite-c2: join client and server records \(13 client, \d+ server\): \d+ client request IDs? without a server record: `))
	})

	It("LoadProfile fails when warmup requests are mixed into measurement", spec.Gate(spec.GateLoad), func(ctx SpecContext) {
		in := suite.LoadInput("completions-closed")
		in.Profile, in.OutDir = small(), suite.ArtifactDir("bite-warmup")
		in.MixWarmupIntoMeasurement = true
		_, err := spec.CheckLoad(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(And(
			ContainSubstring("concurrency=2: 0 requests recorded as warmup, the profile asks for 3: warmup is mixed into measurement"),
			ContainSubstring("concurrency=2: 13 requests measured, the profile asks for 10 (plus 3 warmup)"),
		))
	})
})
