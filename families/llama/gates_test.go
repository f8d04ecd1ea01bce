package llama_test

import (
	"context"
	"path/filepath"

	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

// The llama family's gates, declared once: the premerge gate runs them on the CPU server, the
// container run against the server image, the GPU run on a cuda bundle (spec.Suite.Qualify).
// Chat covers TinyLlama's zephyr template: transformers' renderings and ids
// (fixtures/golden/llama-tiny-chat.json) and the corpus conversations, streamed; the tokenizer
// gate the SentencePiece-style byte-fallback tokenizer (fixtures/golden/llama-tiny-tokenizer.json).
// NaturalEOS runs the prompts after which transformers' greedy path reaches </s>
// (eos_corpus.jsonl, found by fixtures/golden/search_eos_prompts.py; golden llama-tiny-eos.json).
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.GoldenParity(ctx, suite.GoldenInput)
	spec.LogprobsParity(ctx, suite.LogprobsInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.ContextContract(ctx, suite.ContextInput)
	spec.ChatTemplateParity(ctx, chatTemplateInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(true) })
	spec.StopStrings(ctx, suite.StopInput)
	spec.NaturalEOS(ctx, suite.EOSInput)
	spec.TokenizerParity(ctx, tokenizerInput)
	spec.ConcurrentContent(ctx, suite.ConcurrentInput)
	spec.FailureRecords(ctx, suite.FailureRecordsInput)
	spec.ChatPromptTokens(ctx, func() spec.ChatUsageInput { return suite.ChatUsageInput(chatGolden, chatKey) })
	spec.GRPCParity(ctx, suite.GRPCParityInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})

// The llama goldens live in their own files (make_llama_golden.py writes them), not in the
// shared tokenizer_golden.json.
const (
	chatGolden      = "llama-tiny-chat.json"
	chatKey         = "llama_chat"
	tokenizerGolden = "llama-tiny-tokenizer.json"
)

func goldenPath(name string) string {
	return filepath.Join(suite.State.RepoRoot, "fixtures", "golden", name)
}

func chatTemplateInput() spec.ChatTemplateInput {
	gs, err := spec.LoadChatGoldens(goldenPath(chatGolden), chatKey)
	Expect(err).NotTo(HaveOccurred())
	return spec.ChatTemplateInput{API: suite.API, Goldens: gs}
}

func tokenizerInput() spec.TokenizerInput {
	return spec.TokenizerInput{API: suite.API, Path: goldenPath(tokenizerGolden), Key: "llama"}
}
