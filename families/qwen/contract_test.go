package qwen_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

var _ = Describe("qwen context contract", suite.Labels(), spec.Task(spec.TaskText), spec.Premerge(), func() {
	spec.ContextContract(context.Background(), suite.ContextInput)
})
