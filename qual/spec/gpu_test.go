package spec

import (
	"errors"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/gpu/gputest"
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
	t.Setenv(envconfig.GPUPrecision.Name, "")
	for _, c := range []struct{ owned, want string }{{"", "bf16"}, {"fp32", "fp32"}} {
		if got, err := gpuPrecision(c.owned); err != nil || got != c.want {
			t.Errorf("MODELQUAL_GPU_PRECISION unset, thresholds gpu.precision %q: %q, %v; want %q", c.owned, got, err, c.want)
		}
	}
	t.Setenv(envconfig.GPUPrecision.Name, "fp16")
	if got, err := gpuPrecision("fp32"); err != nil || got != "fp16" {
		t.Errorf("MODELQUAL_GPU_PRECISION=fp16 over thresholds' fp32: %q, %v; want the variable's", got, err)
	}
	t.Setenv(envconfig.GPUPrecision.Name, "int4")
	if _, err := gpuPrecision(""); err == nil {
		t.Fatal("an unknown precision must be refused")
	}
}

// What each Ginkgo process's server gets on runners of 2, 4 and 8 GPUs, with MIG, with
// MODELQUAL_GPUS filters, with more processes than GPUs, and with a typo: one unit each, never
// one another process has, a shortage where none is left, an error for a typo.
func TestPlaceProcess(t *testing.T) {
	server := func(inv gpu.Inventory, filter string, procs int) []string {
		t.Helper()
		var out []string
		for p := 1; p <= procs; p++ {
			pl, _, err := placeProcess(inv, filter, p, procs)
			if err != nil {
				t.Fatalf("%s, process %d of %d: %v", filter, p, procs, err)
			}
			if pl.Shortage != "" {
				out = append(out, "-")
				continue
			}
			out = append(out, strings.Join(gpu.UUIDs(pl.Server), "+"))
		}
		return out
	}
	for _, c := range []struct {
		name   string
		inv    gpu.Inventory
		filter string
		procs  int
		want   string
	}{
		{"2 GPUs, 2 processes", gputest.Machine(2, nil), "", 2, "GPU-0 GPU-1"},
		{"4 GPUs, 4 processes", gputest.Machine(4, nil), "all", 4, "GPU-0 GPU-1 GPU-2 GPU-3"},
		{"8 GPUs, 3 processes (uneven: 3, 3, 2 held)", gputest.Machine(8, nil), "", 3, "GPU-0 GPU-3 GPU-6"},
		{"4 GPUs, 1 process", gputest.Machine(4, nil), "", 1, "GPU-0"},
		{"2 GPUs, 4 processes", gputest.Machine(2, nil), "", 4, "GPU-0 GPU-1 - -"},
		{"indices", gputest.Machine(4, nil), "3,1", 2, "GPU-3 GPU-1"},
		{"UUIDs", gputest.Machine(4, nil), "GPU-2,GPU-0", 2, "GPU-2 GPU-0"},
		{"one GPU named, 2 processes", gputest.Machine(4, nil), "2", 2, "GPU-2 -"},
		{"MIG instances stand for their GPU", gputest.Machine(2, map[int]int{1: 3}), "", 4, "GPU-0 MIG-1-0 MIG-1-1 MIG-1-2"},
		{"a MIG pair", gputest.Machine(2, map[int]int{1: 3}), "1:2", 1, "MIG-1-2"},
	} {
		if got := strings.Join(server(c.inv, c.filter, c.procs), " "); got != c.want {
			t.Errorf("%s: servers on %q, want %q", c.name, got, c.want)
		}
	}
	for filter, want := range map[string]string{"4": `"4" is not on this machine`, "0,,1": "empty entry", "GPU-O": `"GPU-O"`} {
		if _, _, err := placeProcess(gputest.Machine(2, nil), filter, 1, 1); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "MODELQUAL_GPUS") {
			t.Errorf("MODELQUAL_GPUS=%q: %v, want an error naming the variable and %q", filter, err, want)
		}
	}
	if _, _, err := placeProcess(gpu.Inventory{Reason: "no driver"}, "", 1, 1); !errors.Is(err, gpu.ErrUnavailable) {
		t.Fatalf("no NVML: %v", err)
	}
}

// A shortage skips with the reason and the way out by default, fails with
// MODELQUAL_GPU_SHORTAGE=fail, and a mistyped policy is an error, not a silent skip.
func TestGPUShortagePolicy(t *testing.T) {
	t.Setenv(envconfig.GPUShortage.Name, "")
	skip, err := shortage("process 3 of 3 holds 0 GPU unit(s)", "run ginkgo with --procs=2 or fewer")
	if err != nil || !strings.Contains(skip, "process 3 of 3 holds 0") || !strings.Contains(skip, "--procs=2") || !strings.Contains(skip, "MODELQUAL_GPU_SHORTAGE=fail") {
		t.Fatalf("default: %q %v", skip, err)
	}
	t.Setenv(envconfig.GPUShortage.Name, "FAIL")
	if skip, err := shortage("process 3 of 3 holds 0 GPU unit(s)", "run ginkgo with --procs=2 or fewer"); err == nil || skip != "" || !strings.Contains(err.Error(), "--procs=2") {
		t.Fatalf("fail: %q %v", skip, err)
	}
	t.Setenv(envconfig.GPUShortage.Name, "share")
	if _, err := shortage("x", "y"); err == nil || !strings.Contains(err.Error(), `MODELQUAL_GPU_SHORTAGE: GPU shortage policy "share": use skip or fail`) {
		t.Fatalf("a mistyped policy: %v", err)
	}
}
