package zimage_test

import (
	"context"

	"github.com/modelqual/modelqual/qual/spec"
)

// The zimage family's gates, declared once (spec.Suite.Qualify): provenance, parity with
// diffusers' images, served bytes equal to qual generate-image's, determinism and control
// sensitivity, the refusal contract and geometry.
var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ImageGates(ctx, imageInput)
	spec.RecordsMatchResponses(ctx, suite.RecordCheckInput)
})
