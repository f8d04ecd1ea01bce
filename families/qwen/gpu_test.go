package qwen_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

// The CPU gates again on a GPU runner: `ginkgo --label-filter=gpu ./families/...` builds a
// cuda bundle (bf16 unless MODELQUAL_GPU_PRECISION says otherwise) and starts one
// `qual-server --device cuda` per Ginkgo process on that process's GPUs; the tolerances are
// thresholds.yaml's gpu section and the load profiles carry go-nvml telemetry. Without a GPU
// every spec here skips with the reason (NVML's).
var _ = Describe("qwen on GPU", suite.Labels(), spec.GPU(), spec.Task(spec.TaskText), func() {
	ctx := context.Background()
	BeforeEach(func() { suite.RequireGPU() })
	spec.ParityGate(ctx, suite.ParityInput)
	spec.GoldenParity(ctx, suite.GoldenInput)
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(false) })
	spec.StreamingParity(ctx, func() spec.StreamingInput { return suite.StreamingInput(true) })
	suite.GPULoadProfiles(ctx)
})
