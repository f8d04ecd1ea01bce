package gpt2_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

// The same gates against the server image on the Docker engine: selected by
// --label-filter=container, which also makes the suite start its server with the container
// launcher (make image builds the image).
var _ = Describe("gpt2 in a container", suite.Labels(), spec.Container(), func() {
	ctx := context.Background()
	BeforeEach(func() { suite.RequireLauncher("container") })
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.ContextContract(ctx, suite.ContextInput)
})
