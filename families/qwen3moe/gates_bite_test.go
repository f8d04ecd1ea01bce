package qwen3moe_test

import (
	"slices"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/qwen3moe"
	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec here starts a second server with a planted
// defect (MODELQUAL_FAULTS, read by the engine at open) and shows that the gate fails with a
// message pointing at the defect.
var _ = Describe("qwen3moe gates bite", suite.Labels(), spec.Premerge(), func() {
	It("the routing gate fails when the engine routes to the wrong experts (qwen3moe.route_wrong_expert)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=qwen3moe.route_wrong_expert")
		in := routingInput(api)
		in.Prompts = slices.DeleteFunc(in.Prompts, func(p qwen3moe.RoutingPrompt) bool { return p.Name != "short-story" && p.Name != "code-python" })
		Expect(in.Prompts).To(HaveLen(2))
		err := qwen3moe.CheckRouting(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(And(
			ContainSubstring("routing gate: 0 of 2 prompts route as the reference does"),
			MatchRegexp(`prompt "short-story" \(\d+ tokens\): \d+ \(layer, expert\) counts differ: layer [02] expert \d served \d+ tokens, the reference routes \d+`),
		))
	})

	It("ParityGate fails when the engine routes to the wrong experts (qwen3moe.route_wrong_expert)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=qwen3moe.route_wrong_expert")
		in := suite.ParityInput()
		in.API = api
		in.Corpus = slices.DeleteFunc(slices.Clone(in.Corpus), func(p spec.Prompt) bool { return p.Name != "short-story" })
		in.Thresholds.CorpusMinPass = len(in.Corpus)
		_, err := spec.CheckParity(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// Layer 0 routes position 0 too: the logits part from the first position.
		Expect(err.Error()).To(And(
			ContainSubstring("parity gate: 0 of 1 corpus prompts pass"),
			MatchRegexp(`prompt "short-story" \(\d+ tokens\): .*logits beyond max_abs_logit_diff 0\.0001 from position 0 of`),
		))
	})
})
