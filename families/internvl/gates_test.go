package internvl_test

import (
	"context"

	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/spec"
)

// The internvl family's gates, the same contracts as qwen3vl's (spec.VisionGates is generic
// over the image processor): the served bundle, the tiled image corpus against transformers
// (greedy tokens, prompt tokens with <img>/<IMG_CONTEXT>/</img>, first-step logits, corpus
// files fingerprinted before and after), image sensitivity, streaming, the image refusal
// contract and the text context contract. Without the golden the vision gates skip, naming the
// script that makes it (goldenPath).
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.VisionGates(ctx, func() spec.VisionInput {
		root := suite.State.RepoRoot
		g, err := fixtures.LoadVisionGolden(goldenPath())
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		return spec.VisionInput{API: suite.API, Golden: g, Root: root, Tokenizer: suite.Tokenizer, MaxContext: suite.Manifest.Build.MaxContext,
			Tolerance: suite.Threshold().MaxAbsLogitDiff}
	})
	spec.ContextContract(ctx, suite.ContextInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})
