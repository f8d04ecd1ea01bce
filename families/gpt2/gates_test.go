package gpt2_test

import (
	"context"

	"github.com/modelqual/modelqual/qual/spec"
)

// The gpt2 family's gates, declared once: the premerge gate runs them on the CPU server, the
// container run against the server image, the GPU run on a cuda bundle (spec.Suite.Qualify).
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.GoldenParity(ctx, suite.GoldenInput)
	spec.LogprobsParity(ctx, suite.LogprobsInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.NaturalEOS(ctx, suite.EOSInput)
	spec.ContextContract(ctx, suite.ContextInput)
	spec.StopStrings(ctx, suite.StopInput)
	spec.StopStringInclusion(ctx, suite.StopInput)
	spec.TokenizerParity(ctx, func() spec.TokenizerInput { return suite.TokenizerInput("gpt2") })
	spec.ConcurrentContent(ctx, suite.ConcurrentInput)
	spec.FailureRecords(ctx, suite.FailureRecordsInput)
	spec.GRPCParity(ctx, suite.GRPCParityInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})
