package spec

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/envconfig"
)

// GPU runs: when a run selects the gpu specs alone (`ginkgo --label-filter=gpu`, or
// MODELQUAL_GPU=1), the suite builds the manifest's checkpoint into a cuda bundle of reduced
// precision and every parallel Ginkgo process starts its own server with --device cuda on
// its own GPU set; the gpu specs then run the CPU gates against it with thresholds.yaml's gpu
// tolerances. Where no GPU is present (no NVIDIA driver, NVML reports none) nothing is built
// or started and every gpu spec skips, saying why.
//
// Four variables (server/envconfig) steer it: MODELQUAL_GPU forces the GPU run on ("1") or off
// ("0") whatever the label filter says; MODELQUAL_GPUS restricts the GPUs the run may use ("all"
// or empty: every one, MIG instances in place of MIG-enabled GPUs; else indices, GPU:MIG pairs or
// UUIDs), split among the parallel processes (gpu.Place) so that no two processes share one;
// MODELQUAL_GPU_SHORTAGE says whether a process left without a GPU (more processes than GPUs)
// skips its gpu specs, saying why, or fails; MODELQUAL_GPU_PRECISION is the precision of the GPU
// bundle (bf16, fp16 or fp32).

// gpuRun reports whether this run qualifies the family on GPUs: MODELQUAL_GPU when set,
// else whether the label filter selects the family's gpu specs and none of its CPU ones (so
// `--label-filter=premerge` and a plain `go test` keep the CPU server).
func (s *Suite) gpuRun() bool {
	switch strings.ToLower(envconfig.GPU.Get()) {
	case "1", "true", "yes":
		return true
	case "0", "false", "no":
		return false
	}
	return labelFilterSelectsOnly(ginkgo.GinkgoLabelFilter(), PlacementGPU, s.Labels())
}

// labelFilterSelectsOnly reports whether filter matches some spec labelled label and no
// spec without it (unlabelled by placement, or premerge), where a spec carries the suite's
// labels base plus at most one task or gate label. Ginkgo cannot list the specs a filter
// selects before they run, so this checks the label sets family specs actually carry.
func labelFilterSelectsOnly(filter, label string, base []string) bool {
	if filter == "" {
		return false
	}
	match, err := types.ParseLabelFilter(filter)
	if err != nil {
		return false
	}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	selected := false
	for _, extra := range append([]string{""}, append(append([]string{}, tasks...), gates...)...) {
		set := with()
		if extra != "" {
			set = with(extra)
		}
		if match(set) || match(append(set, PlacementPremerge)) {
			return false
		}
		if match(append(set, label)) {
			selected = true
		}
	}
	return selected
}

// gpuPrecision is the GPU bundle's precision: MODELQUAL_GPU_PRECISION where set, else the
// family's thresholds.yaml gpu.precision (owned, its reason beside it), else bf16.
func gpuPrecision(owned string) (string, error) {
	p, set := envconfig.GPUPrecision.Lookup()
	if !set || p == "" {
		p = envconfig.GPUPrecision.Get()
		if owned != "" {
			p = owned
		}
	}
	switch p {
	case "bf16", "fp16", "fp32":
		return p, nil
	}
	return "", fmt.Errorf("spec: %s=%q: use bf16, fp16 or fp32", envconfig.GPUPrecision.Name, p)
}

// buildManifest is the manifest the suite's bundle is built and checked against: the
// family's own, or for a GPU run a copy whose build section asks for the cuda backend at the
// state's precision (the bundle's provenance then records both).
func (s *Suite) buildManifest(st State) *manifest.Manifest {
	if st.Device != "cuda" {
		return s.Manifest
	}
	m := *s.Manifest
	m.Build.Backend = "cuda"
	m.Build.Precision = st.Precision
	return &m
}

// placeProcess is process (of processes) of a GPU run's share of the GPUs of inv named by
// filter (MODELQUAL_GPUS): gpu.Place over gpu.Select, so that no two processes share a unit. It
// also returns the run's units. Its inputs are explicit so that tests place processes on fake
// machines.
func placeProcess(inv gpu.Inventory, filter string, process, processes int) (gpu.Placement, []gpu.Device, error) {
	units, err := gpu.Select(inv, filter)
	if err != nil {
		return gpu.Placement{}, nil, fmt.Errorf("spec: GPUs for this run (%s=%q): %w", envconfig.GPUs.Name, filter, err)
	}
	pl, err := gpu.Place(units, process, processes, gpu.ServerGPUs)
	if err != nil {
		return gpu.Placement{}, nil, fmt.Errorf("spec: %w", err)
	}
	return pl, units, nil
}

// shortageFails reads MODELQUAL_GPU_SHORTAGE (gpu.ShortageFails).
func shortageFails() (bool, error) {
	fail, err := gpu.ShortageFails(envconfig.GPUShortage.Get())
	if err != nil {
		return false, fmt.Errorf("spec: %s: %w", envconfig.GPUShortage.Name, err)
	}
	return fail, nil
}

// shortage turns a process or spec short of GPUs into a skip reason, or into an error where
// MODELQUAL_GPU_SHORTAGE=fail (or the variable is mistyped); what says what is short and
// advice what to do about it.
func shortage(what, advice string) (skip string, err error) {
	fail, err := shortageFails()
	if err != nil {
		return "", err
	}
	if fail {
		return "", fmt.Errorf("spec: %s (%s=fail); %s", what, envconfig.GPUShortage.Name, advice)
	}
	return fmt.Sprintf("%s; %s (%s=fail makes this an error)", what, advice, envconfig.GPUShortage.Name), nil
}

// startGPUServer starts this process's server of a GPU run on the first unit of this
// process's share (placeProcess), passed by UUID (CUDA_VISIBLE_DEVICES for a process,
// DeviceIDs for a container), and samples the server's units until the suite ends, leaving
// their figures (gpu.CardUsage) in the report under gpu.CardsEntry and in the run folder. A
// process left without a GPU (more processes than GPUs) starts nothing and its gpu specs skip
// with the reason, or setup fails where MODELQUAL_GPU_SHORTAGE=fail.
func (s *Suite) startGPUServer(ctx context.Context, st *State) error {
	cfg, _ := ginkgo.GinkgoConfiguration()
	process := ginkgo.GinkgoParallelProcess()
	pl, units, err := placeProcess(gpu.Inspect(), envconfig.GPUs.Get(), process, max(cfg.ParallelTotal, 1))
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "modelqual %s: GPU placement: %s\n", s.Family, pl)
	if pl.Shortage != "" {
		skip, err := shortage(pl.Shortage, fmt.Sprintf("run ginkgo with --procs=%d or fewer, or give the run more GPUs (%s)",
			max(len(units)/gpu.ServerGPUs, 1), envconfig.GPUs.Name))
		if err != nil {
			return err
		}
		st.GPUSkip = skip
		return nil
	}
	s.GPUs = pl.Server
	runDir := filepath.Join(st.Artifacts, fmt.Sprintf("server-p%d", process))
	opts := append(s.serverOptions(runDir), launch.WithBundle(st.Bundle),
		launch.WithServerBin(filepath.Join(binDir(st.RepoRoot), "qual-server")), launch.WithGPUs(gpu.UUIDs(pl.Server)...))
	ep, err := s.start(ctx, *st, opts)
	if err != nil {
		return err
	}
	st.setEndpoint(ep)
	sampler, _ := gpu.StartDeviceSampler(pl.Server, cardSampleInterval, false) // unavailable: the usage says why
	// Registered after the server's stop, so it runs before it (DeferCleanup is LIFO): the
	// window is the server's life on the card.
	ginkgo.DeferCleanup(func() {
		usage := gpu.Usage(s.Family, process, pl.Server, sampler.Stop())
		ginkgo.AddReportEntry(gpu.CardsEntry, usage, ginkgo.ReportEntryVisibilityNever)
		if b, err := json.MarshalIndent(usage, "", "  "); err == nil {
			_ = os.WriteFile(filepath.Join(runDir, "gpu_cards.json"), append(b, '\n'), 0o644)
		}
	})
	return nil
}

// cardSampleInterval is how often a process samples its GPUs over the whole suite: coarser than
// a load point's sampler (100 ms), since the energy counter carries the total and the memory
// high-water of a suite-long run moves slowly.
const cardSampleInterval = 250 * time.Millisecond

// RequireGPU skips the calling spec, with the reason, unless this process's server runs on
// GPUs: no GPU on the machine (the reason NVML gave), this process holds none (more Ginkgo
// processes than GPUs), or a run that did not select the gpu specs alone (their CPU server
// would make a GPU gate meaningless).
func (s *Suite) RequireGPU() {
	ginkgo.GinkgoHelper()
	switch {
	case s.State.GPUSkip != "":
		ginkgo.Skip("no GPU: " + s.State.GPUSkip)
	case s.State.Device != "cuda":
		ginkgo.Skip(fmt.Sprintf("needs the suite's server on a GPU; this run's server is on %s (select the gpu specs alone with --label-filter=gpu, or set %s=1)",
			orDefault(s.State.Device, "cpu"), envconfig.GPU.Name))
	}
}

// RequireGPUs is RequireGPU for a spec that needs its server on n GPUs: where this process's
// server runs on fewer, the spec skips saying so, or fails where MODELQUAL_GPU_SHORTAGE=fail. A
// spec never borrows another process's GPU.
func (s *Suite) RequireGPUs(n int) {
	ginkgo.GinkgoHelper()
	s.RequireGPU()
	if len(s.GPUs) >= n {
		return
	}
	skip, err := shortage(fmt.Sprintf("this spec needs %d GPUs; the server of Ginkgo process %d runs on %d (%s)",
		n, ginkgo.GinkgoParallelProcess(), len(s.GPUs), strings.Join(gpu.UUIDs(s.GPUs), ", ")),
		fmt.Sprintf("a server runs on %d GPU(s) today", gpu.ServerGPUs))
	if err != nil {
		ginkgo.Fail(err.Error())
	}
	ginkgo.Skip(skip)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// GPULoadProfiles declares, for a GPU run, one LoadProfile per premerge profile of the
// manifest, named "gpu-<profile>", whose run directories carry the go-nvml figures of this
// process's GPUs and which fails when that telemetry is unavailable.
func (s *Suite) GPULoadProfiles(ctx context.Context) {
	for _, p := range s.Manifest.Profiles {
		if !p.Premerge {
			continue
		}
		name := p.Name
		LoadProfile(ctx, "gpu-"+name, func() LoadInput { return s.LoadInput(name) })
	}
}

// gpuFigures reads a sweep point's go-nvml telemetry from its summary and turns it into
// figures: memory high-water, utilization, power, energy and energy per output token (the
// energy counter's delta over the point, warmup included, over all output tokens of the
// point). It returns a problem when the telemetry is missing or unavailable.
func gpuFigures(profile, label string, pt load.PointResult) ([]Figure, string) {
	if pt.Summary == nil || len(pt.Summary.GPUTelemetry) == 0 {
		return nil, fmt.Sprintf("%s: no GPU telemetry in %s", label, filepath.Join(pt.Dir, "summary.json"))
	}
	var tel gpu.Telemetry
	if err := json.Unmarshal(pt.Summary.GPUTelemetry, &tel); err != nil {
		return nil, fmt.Sprintf("%s: GPU telemetry in %s: %v", label, pt.Dir, err)
	}
	if !tel.Available || len(tel.Devices) == 0 {
		return nil, fmt.Sprintf("%s: GPU telemetry unavailable on a GPU run: %s", label, tel.Reason)
	}
	outTokens := 0
	if pt.Load != nil {
		for _, r := range pt.Load.Records {
			outTokens += r.OutputTokens()
		}
	}
	tel.PerToken(outTokens)
	return append(telemetryFigures(profile, label, tel),
		Figure{Profile: profile, Point: label, Name: "gpu.joules_per_output_token", Value: tel.JoulesPerOutputToken, Unit: "J/token"}), ""
}

// telemetryFigures are the figures every GPU profile reports from its go-nvml telemetry:
// memory high-water (the largest device's), utilization (the devices' mean), power (summed)
// and energy.
func telemetryFigures(profile, point string, tel gpu.Telemetry) []Figure {
	var hw uint64
	var util, power float64
	for _, d := range tel.Devices {
		hw = max(hw, d.MemoryHighWaterBytes)
		util += d.UtilizationAvg / float64(len(tel.Devices))
		power += d.PowerAvgW
	}
	fig := func(name string, v float64, unit string) Figure {
		return Figure{Profile: profile, Point: point, Name: name, Value: v, Unit: unit}
	}
	return []Figure{
		fig("gpu.memory_high_water", float64(hw)/(1<<20), "MiB"),
		fig("gpu.utilization_avg", util, "%"),
		fig("gpu.power_avg", power, "W"),
		fig("gpu.energy", tel.EnergyJ, "J"),
	}
}
