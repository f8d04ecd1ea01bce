package gpt2_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

var _ = Describe("gpt2 parity", suite.Labels(), spec.Task(spec.TaskText), spec.Premerge(), func() {
	spec.ParityGate(context.Background(), suite.ParityInput)
	spec.GoldenParity(context.Background(), suite.GoldenInput)
})
