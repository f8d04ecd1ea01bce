package qwen_test

import (
	"context"

	"github.com/modelqual/modelqual/qual/spec"
)

// The qwen family's gates, declared once: the premerge gate runs them on the CPU server, the
// container run against the server image, the GPU run on a cuda bundle (spec.Suite.Qualify).
// Chat covers Qwen3's template with enable_thinking false and true: the transformers renderings
// (tokenizer_golden.json's qwen3_chat holds both) and the corpus conversations, streamed.
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.GoldenParity(ctx, suite.GoldenInput)
	spec.LogprobsParity(ctx, suite.LogprobsInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.ContextContract(ctx, suite.ContextInput)
	spec.ChatTemplateParity(ctx, func() spec.ChatTemplateInput { return suite.ChatTemplateInput("qwen3_chat") })
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(true) })
	spec.NaturalEOS(ctx, suite.EOSInput)
	spec.StopStrings(ctx, suite.StopInput)
	spec.StopStringInclusion(ctx, suite.StopInput)
	spec.TokenizerParity(ctx, func() spec.TokenizerInput { return suite.TokenizerInput("qwen3") })
	spec.ConcurrentContent(ctx, suite.ConcurrentInput)
	spec.FailureRecords(ctx, suite.FailureRecordsInput)
	spec.ChatPromptTokens(ctx, func() spec.ChatUsageInput { return suite.ChatUsageInput("qwen3-chat-usage.json", "qwen3_chat") })
	spec.GRPCParity(ctx, suite.GRPCParityInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})
