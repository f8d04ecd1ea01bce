package spec

import (
	"context"

	"github.com/onsi/ginkgo/v2"
)

// Qualify declares a family's gates once and runs them three ways, so a family lists its gates
// in one place:
//
//   - "<family> gates": on the suite's CPU server, in the premerge gate;
//   - "<family> in a container": against the server image (selected by --label-filter=container,
//     which also makes the suite start its server with the container launcher);
//   - "<family> on GPU": on a GPU runner (--label-filter=gpu builds a cuda bundle and starts one
//     server per Ginkgo process on its GPUs; thresholds.yaml's gpu: tolerances apply), followed
//     by the manifest's premerge load profiles with GPU telemetry. Without a GPU every spec
//     there skips with NVML's reason.
//
// gates calls the reusable gates of this package (ParityGate, StreamingParity, ...); each adds
// its own gate and task labels. It returns true so a spec file can call it at package level
// (var _ = suite.Qualify(...)), as Ginkgo's Describe.
func (s *Suite) Qualify(ctx context.Context, gates func(ctx context.Context)) bool {
	ginkgo.Describe(s.Family+" gates", s.Labels(), Premerge(), func() {
		gates(ctx)
	})
	ginkgo.Describe(s.Family+" in a container", s.Labels(), Container(), func() {
		ginkgo.BeforeEach(func() { s.RequireLauncher("container") })
		gates(ctx)
	})
	ginkgo.Describe(s.Family+" on GPU", s.Labels(), GPU(), func() {
		ginkgo.BeforeEach(func() { s.RequireGPU() })
		gates(ctx)
		s.GPULoadProfiles(ctx)
	})
	return true
}
