package qwen3moe_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/qwen3moe"
	"github.com/modelqual/modelqual/families/qwen3moe/reference"
	"github.com/modelqual/modelqual/qual/spec"
)

// The qwen3moe family's gates, declared once (spec.Suite.Qualify: premerge on the CPU server,
// the container run, the GPU run on a cuda bundle): the served bundle, corpus parity against
// the family reference (N of M, with its table) and against transformers, streaming equal to
// non-streaming, the chat route's rendered ids equal transformers', refused controls and
// context overflow, records that match the responses, and the routing gate.
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.GoldenParity(ctx, suite.GoldenInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(true) })
	spec.ChatTemplateParity(ctx, func() spec.ChatTemplateInput { return suite.ChatTemplateInput("qwen3_chat") })
	spec.ChatPromptTokens(ctx, func() spec.ChatUsageInput { return suite.ChatUsageInput("qwen3-chat-usage.json", "qwen3_chat") })
	spec.ContextContract(ctx, suite.ContextInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
	RoutingGate(ctx, func() qwen3moe.RoutingInput { return routingInput(suite.API) })
})

// RoutingGate declares the routing gate's spec. Serial: it reads the server's routing
// counters around each request, so no other spec may send requests meanwhile.
func RoutingGate(ctx context.Context, in func() qwen3moe.RoutingInput) {
	It("routes every token of the corpus to the experts the family reference chooses", Serial, spec.Task(spec.TaskText), spec.Gate(spec.GateParity), func(sctx SpecContext) {
		err := qwen3moe.CheckRouting(sctx, in())
		if err != nil {
			AddReportEntry("routing gate", err.Error())
		}
		Expect(err).NotTo(HaveOccurred())
	})
}

// routingInput routes the corpus's text prompts through api and the family reference.
func routingInput(api *spec.API) qwen3moe.RoutingInput {
	ref, err := suite.Reference()
	Expect(err).NotTo(HaveOccurred(), "load the qwen3moe reference")
	var ps []qwen3moe.RoutingPrompt
	for _, p := range suite.Corpus {
		if !p.IsChat() {
			ps = append(ps, qwen3moe.RoutingPrompt{Name: p.Name, IDs: suite.Tokenizer.Encode(p.Prompt)})
		}
	}
	return qwen3moe.RoutingInput{API: api, Reference: ref.(*reference.Model), Prompts: ps}
}
