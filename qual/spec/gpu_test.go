package spec

import (
	"testing"

	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/envconfig"
)

// Only a filter that selects gpu specs alone turns the suite into a GPU run; premerge (the
// CPU pull-request gate) and unfiltered runs keep the CPU server.
func TestGPURunFromLabelFilter(t *testing.T) {
	for filter, want := range map[string]bool{
		"":                       false,
		"gpu":                    true,
		"gpu && qwen":            true,
		"gpu && gpt2":            false,
		"gpu && parity":          true,
		"parity":                 false,
		"gpu && !load":           true,
		"premerge":               false,
		"premerge && !container": false,
		"gpu || premerge":        false,
		"!container":             false,
		"container":              false,
	} {
		if got := labelFilterSelectsOnly(filter, PlacementGPU, []string{"qwen", "owner:qwen-owners"}); got != want {
			t.Errorf("label filter %q: GPU run %v, want %v", filter, got, want)
		}
	}
}

// A GPU run builds its bundle for the cuda backend at the GPU precision and picks the gpu
// tolerances; a CPU run keeps the manifest as written.
func TestGPURunBuildAndThresholds(t *testing.T) {
	gpuT := &manifest.Thresholds{MaxAbsLogitDiff: 0.05, GreedySteps: 16}
	s := &Suite{Manifest: &manifest.Manifest{}, Thresholds: &manifest.Thresholds{MaxAbsLogitDiff: 1e-4, GreedySteps: 32, GPU: gpuT}}
	s.Manifest.Build.Backend, s.Manifest.Build.Precision = "cpu", "fp32"
	if m := s.buildManifest(State{}); m != s.Manifest {
		t.Fatal("a CPU run must build the manifest as written")
	}
	if got := s.Threshold(); got.MaxAbsLogitDiff != 1e-4 {
		t.Fatalf("CPU run thresholds %+v", got)
	}
	s.State = State{Device: "cuda", Precision: "bf16"}
	m := s.buildManifest(s.State)
	if m.Build.Backend != "cuda" || m.Build.Precision != "bf16" || s.Manifest.Build.Backend != "cpu" {
		t.Fatalf("GPU build %+v (manifest left %+v)", m.Build, s.Manifest.Build)
	}
	if got := s.Threshold(); got.MaxAbsLogitDiff != 0.05 || got.GreedySteps != 16 {
		t.Fatalf("GPU run thresholds %+v, want the gpu section", got)
	}
	t.Setenv(envconfig.GPUPrecision.Name, "int4")
	if _, err := gpuPrecision(); err == nil {
		t.Fatal("an unknown precision must be refused")
	}
}
