package qwen3vl_test

import (
	"context"

	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/spec"
)

// The qwen3vl family's gates, declared once (spec.Suite.Qualify): the served bundle, the image
// corpus against transformers, image sensitivity, streaming, the image refusal contract and the
// text context contract.
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.VisionGates(ctx, func() spec.VisionInput {
		root := suite.State.RepoRoot
		g, err := fixtures.LoadVisionGolden(fixtures.VisionGoldenPath(root, suite.Manifest.Checkpoint.Fixture))
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		return spec.VisionInput{API: suite.API, Golden: g, Root: root, Tokenizer: suite.Tokenizer, MaxContext: suite.Manifest.Build.MaxContext,
			Tolerance: suite.Threshold().MaxAbsLogitDiff}
	})
	spec.ContextContract(ctx, suite.ContextInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})
