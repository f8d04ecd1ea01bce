package llama_test

import (
	"slices"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// A gate that cannot fail is a defect. Each spec here starts a second server with a planted
// defect (MODELQUAL_FAULTS, read by the engine or the server at start) and shows that the
// gate's core check fails with a message pointing at the defect.
var _ = Describe("llama gates bite", suite.Labels(), spec.Premerge(), func() {
	// Two prompts keep these fast: a short prose prompt and a chat conversation.
	parityOn := func(ctx SpecContext, api *spec.API) error {
		in := suite.ParityInput()
		in.API = api
		in.Corpus = slices.DeleteFunc(slices.Clone(in.Corpus), func(p spec.Prompt) bool {
			return p.Name != "short-story" && p.Name != "chat-system"
		})
		Expect(in.Corpus).To(HaveLen(2))
		in.Thresholds.CorpusMinPass = len(in.Corpus)
		_, err := spec.CheckParity(ctx, in)
		return err
	}

	It("ParityGate fails when the engine uses rope_theta ×10 (llama.rope_theta_x10)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=llama.rope_theta_x10")
		err := parityOn(ctx, api)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// RoPE is the identity at position 0, so the logits part from position 1 on.
		Expect(err.Error()).To(And(
			ContainSubstring("parity gate: 0 of 2 corpus prompts pass"),
			MatchRegexp(`prompt "short-story" \(\d+ tokens\): .*logits beyond max_abs_logit_diff 0\.0005 from position 1 of`),
		))
	})

	It("ParityGate fails when the engine swaps KV heads (llama.kv_head_swap)", spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=llama.kv_head_swap")
		err := parityOn(ctx, api)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// With one key every query head reads its one value row: position 0 may still agree,
		// but llama-tiny's two KV heads carry different values, so outputs part at once.
		Expect(err.Error()).To(And(
			ContainSubstring("parity gate: 0 of 2 corpus prompts pass"),
			MatchRegexp(`prompt "chat-system" \(\d+ tokens\): .*logits beyond max_abs_logit_diff 0\.0005 from position \d+ of`),
		))
	})

	It("ChatTemplateParity fails when the server renders chat without the generation prompt (server.template_no_generation_prompt)", spec.Task(spec.TaskChat), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=server.template_no_generation_prompt")
		in := chatTemplateInput()
		in.API = api
		err := spec.CheckChatTemplate(ctx, in)
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		// TinyLlama's zephyr template ends a generation prompt with "<|assistant|>" and the
		// newline after its expression (trim_blocks trims only after block tags).
		Expect(err.Error()).To(ContainSubstring(`served rendering stops where the golden continues with "<|assistant|>\n" (the generation prompt is missing?)`))
	})
})
