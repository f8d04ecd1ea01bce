package qwen_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

// The same gates against the server image on the Docker engine: selected by
// --label-filter=container, which also makes the suite start its server with the container
// launcher (make image builds the image).
var _ = Describe("qwen in a container", suite.Labels(), spec.Container(), func() {
	ctx := context.Background()
	BeforeEach(func() { suite.RequireLauncher("container") })
	spec.BundleProvenance(ctx, suite.ProvenanceInput)
	spec.ParityGate(ctx, suite.ParityInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.ContextContract(ctx, suite.ContextInput)
	spec.ChatTemplateParity(ctx, func() spec.ChatTemplateInput { return suite.ChatTemplateInput("qwen3_chat") })
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(true) })
})
