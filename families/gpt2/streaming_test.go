package gpt2_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

var _ = Describe("gpt2 streaming", suite.Labels(), spec.Task(spec.TaskText), spec.Premerge(), func() {
	spec.StreamingParity(context.Background(), func() spec.StreamingInput { return suite.StreamingInput(false) })
})
