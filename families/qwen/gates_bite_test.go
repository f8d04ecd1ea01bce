package qwen_test

import (
	"slices"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec here starts a second server with a planted
// defect (MODELQUAL_FAULTS, read by the engine or the server at start) and shows that the
// gate's core check fails with a message pointing at the defect.
var _ = Describe("qwen gates bite", suite.Labels(), spec.Premerge(), func() {
	// Two prompts keep these fast: a short prose prompt and a code prompt of 60 tokens.
	parityOn := func(ctx SpecContext, api *spec.API) error {
		in := suite.ParityInput()
		in.API = api
		in.Corpus = slices.DeleteFunc(slices.Clone(in.Corpus), func(p spec.Prompt) bool {
			return p.Name != "short-story" && p.Name != "code-python"
		})
		Expect(in.Corpus).To(HaveLen(2))
		in.Thresholds.CorpusMinPass = len(in.Corpus)
		_, err := spec.CheckParity(ctx, in)
		return err
	}

	It("ParityGate fails when the engine uses rope_theta ×10 (qwen3.rope_theta_x10)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=qwen3.rope_theta_x10")
		err := parityOn(ctx, api)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// RoPE is the identity at position 0, so the logits part from position 1 on.
		Expect(err.Error()).To(And(
			ContainSubstring("parity gate: 0 of 2 corpus prompts pass"),
			MatchRegexp(`prompt "code-python" \(\d+ tokens\): .*logits beyond max_abs_logit_diff 0\.0001 from position 1 of`),
		))
	})

	It("ParityGate fails when the engine skips q_norm (qwen3.drop_q_norm)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=qwen3.drop_q_norm")
		err := parityOn(ctx, api)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// With one key, attention ignores the query: position 0 still agrees.
		Expect(err.Error()).To(And(
			ContainSubstring("parity gate: 0 of 2 corpus prompts pass"),
			MatchRegexp(`prompt "short-story" \(\d+ tokens\): .*logits beyond max_abs_logit_diff 0\.0001 from position 1 of`),
		))
	})

	It("LogprobsParity fails when the engine's logprobs are not normalised (engine.logprobs_unnormalised)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=engine.logprobs_unnormalised")
		in := suite.LogprobsInput()
		in.API = api
		g, err := spec.LoadGolden(in.Path)
		Expect(err).NotTo(HaveOccurred())
		in.Golden = g
		// Before the golden records top5_logprobs, the checks that need only top5_logits run.
		in.TokensOnly, _ = spec.GoldenHasLogprobs(g)
		in.TokensOnly = !in.TokensOnly
		err = spec.CheckLogprobs(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(ContainSubstring("not a normalised distribution"))
	})

	It("ChatTemplateParity fails when the server renders chat without the generation prompt (server.template_no_generation_prompt)", spec.Task(spec.TaskChat), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=server.template_no_generation_prompt")
		in := suite.ChatTemplateInput("qwen3_chat")
		in.API = api
		err := spec.CheckChatTemplate(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(err.Error()).To(And(
			ContainSubstring(`enable_thinking false): served rendering stops where the golden continues with "<|im_start|>assistant\n<think>\n\n</think>\n\n" (the generation prompt is missing?)`),
			ContainSubstring(`enable_thinking true): served rendering stops where the golden continues with "<|im_start|>assistant\n"`),
		))
	})
})
