package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/gpu/gputest"
	"github.com/modelqual/modelqual/server/envconfig"
)

func slotsOf(p campaignPlan) string {
	var parts []string
	for _, s := range p.Slots {
		parts = append(parts, "["+strings.Join(gpu.UUIDs(s), " ")+"]")
	}
	return strings.Join(parts, "")
}

// The campaign's slots: disjoint GPU sets of at least --procs units, fewer slots than asked
// when the GPUs do not allow (said so, or an error with MODELQUAL_GPU_SHORTAGE=fail), none on
// a CPU campaign, typos in MODELQUAL_GPUS refused.
func TestPlanCampaign(t *testing.T) {
	t.Setenv(envconfig.GPUShortage.Name, "")
	for _, c := range []struct {
		name            string
		inv             gpu.Inventory
		filter          string
		parallel, procs int
		want, note      string
	}{
		{"4 GPUs, 2 families of 2 processes", gputest.Machine(4, nil), "", 2, 2, "[GPU-0 GPU-1][GPU-2 GPU-3]", ""},
		{"8 GPUs, 3 families (uneven)", gputest.Machine(8, nil), "", 3, 1, "[GPU-0 GPU-1 GPU-2][GPU-3 GPU-4 GPU-5][GPU-6 GPU-7]", ""},
		{"2 GPUs, 4 families: 2 at a time", gputest.Machine(2, nil), "", 4, 1, "[GPU-0][GPU-1]", "running 2 families at a time"},
		{"4 GPUs, 2 families of 3 processes: 1 at a time", gputest.Machine(4, nil), "", 2, 3, "[GPU-0 GPU-1 GPU-2 GPU-3]", "running 1 families at a time"},
		{"2 GPUs, 1 family of 4 processes", gputest.Machine(2, nil), "", 1, 4, "[GPU-0 GPU-1]", "processes without a GPU skip"},
		{"filter", gputest.Machine(4, nil), "3,1", 2, 1, "[GPU-3][GPU-1]", ""},
		{"MIG", gputest.Machine(2, map[int]int{0: 2}), "", 3, 1, "[MIG-0-0][MIG-0-1][GPU-1]", ""},
	} {
		plan, err := planCampaign(c.inv, c.filter, true, c.parallel, c.procs)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		notes := strings.Join(plan.Notes, "; ")
		if got := slotsOf(plan); got != c.want || (c.note == "") != (notes == "") || !strings.Contains(notes, c.note) {
			t.Errorf("%s: slots %s (notes %q), want %s (%q)", c.name, got, notes, c.want, c.note)
		}
	}
	cpu, err := planCampaign(gputest.Machine(4, nil), "", false, 3, 2)
	if err != nil || len(cpu.Slots) != 3 || slotsOf(cpu) != "[][][]" {
		t.Fatalf("CPU campaign: %+v %v", cpu, err)
	}
	none, err := planCampaign(gpu.Inventory{Reason: "no driver"}, "", true, 2, 1)
	if err != nil || len(none.Slots) != 2 || !strings.Contains(strings.Join(none.Notes, ""), "no driver") {
		t.Fatalf("GPU campaign without GPUs: %+v %v", none, err)
	}
	if _, err := planCampaign(gputest.Machine(2, nil), "0,2", true, 1, 1); err == nil || !strings.Contains(err.Error(), "MODELQUAL_GPUS") || !strings.Contains(err.Error(), `"2" is not on this machine`) {
		t.Fatalf("a typo in MODELQUAL_GPUS: %v", err)
	}
	if _, err := planCampaign(gputest.Machine(2, nil), "", true, 0, 1); err == nil {
		t.Fatal("--parallel 0 must be refused")
	}
	t.Setenv(envconfig.GPUShortage.Name, "fail")
	if _, err := planCampaign(gputest.Machine(2, nil), "", true, 3, 1); err == nil || !strings.Contains(err.Error(), "needs 3 GPU unit(s); the machine has 2") {
		t.Fatalf("shortage=fail: %v", err)
	}
}

func TestGPUCampaign(t *testing.T) {
	t.Setenv(envconfig.GPU.Name, "")
	fams := []familyName{{Canonical: "qwen3", Folder: "qwen"}, {Canonical: "gpt2", Folder: "gpt2"}}
	for filter, want := range map[string]bool{
		"gpu": true, "gpu && qwen": true, "gpu && load": true, "gpu && stream": true, "gpu && llama": false,
		"!gpu && !container": false, "container": false, "premerge": false,
	} {
		if got := gpuCampaign(filter, fams); got != want {
			t.Errorf("label filter %q: GPU campaign %v, want %v", filter, got, want)
		}
	}
	t.Setenv(envconfig.GPU.Name, "1")
	if !gpuCampaign("premerge", fams) {
		t.Error("MODELQUAL_GPU=1 must make a GPU campaign")
	}
}

// runCampaign runs every family once, at most len(slots) at a time, never two at once on one
// slot, and keeps the families' order in its results.
func TestRunCampaign(t *testing.T) {
	var fams []familyName
	for i := 0; i < 7; i++ {
		fams = append(fams, familyName{Canonical: fmt.Sprintf("f%d", i), Folder: fmt.Sprintf("f%d", i)})
	}
	slots := gpu.Split(gputest.Machine(4, nil).Devices, 2)
	var mu sync.Mutex
	busy := map[string]bool{}
	running, peak := 0, 0
	release, both := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		<-both // nothing ends before two families run side by side
		for range fams {
			release <- struct{}{}
		}
	}()
	results := runCampaign(fams, slots, func(f familyName, slot []gpu.Device) familyResult {
		mu.Lock()
		for _, u := range slot {
			if busy[u.UUID] {
				t.Errorf("%s started on %s while another family held it", f.Folder, u.UUID)
			}
			busy[u.UUID] = true
		}
		running++
		peak = max(peak, running)
		if running == 2 {
			once.Do(func() { close(both) })
		}
		mu.Unlock()
		<-release
		mu.Lock()
		for _, u := range slot {
			busy[u.UUID] = false
		}
		running--
		mu.Unlock()
		return familyResult{Family: f.Canonical, GPUs: gpu.UUIDs(slot)}
	}, func() bool { return false })
	if len(results) != 7 {
		t.Fatalf("%d results", len(results))
	}
	for i, r := range results {
		if r.Family != fams[i].Canonical || len(r.GPUs) != 2 {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if peak != 2 {
		t.Fatalf("peak concurrency %d, want 2 (one per slot)", peak)
	}
}

// The gpu cards entries of a family's Ginkgo report (one per process's cleanup node) reach the
// family's result, and the campaign table lists every card with its share.
func TestCampaignCardsFromReports(t *testing.T) {
	units := gputest.Machine(2, nil).Devices
	entry := func(process int, u gpu.Device, energy float64) types.SpecReport {
		us := gpu.Usage("qwen", process, []gpu.Device{u}, gpu.Telemetry{Available: true, WindowS: 60,
			Devices: []gpu.DeviceStats{{EnergyJ: energy, EnergySource: "counter", MemoryHighWaterBytes: 1 << 30, Samples: 240}}})
		return types.SpecReport{LeafNodeType: types.NodeTypeCleanupAfterSuite, ParallelProcess: process, State: types.SpecStatePassed,
			ReportEntries: types.ReportEntries{{Name: gpu.CardsEntry, Value: types.WrapEntryValue(us)}}}
	}
	rep := []types.Report{{SpecReports: types.SpecReports{entry(1, units[0], 3000), entry(2, units[1], 1000),
		{LeafNodeType: types.NodeTypeIt, State: types.SpecStatePassed, LeafNodeLabels: []string{"gpu", "parity"}}}}}
	dir := t.TempDir()
	b, _ := json.Marshal(rep)
	r := familyResult{Family: "qwen3", JSONReport: filepath.Join(dir, "qwen.json"), GPUs: gpu.UUIDs(units)}
	if err := os.WriteFile(r.JSONReport, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readGinkgoReport(&r, nil); err != nil {
		t.Fatal(err)
	}
	if len(r.Cards) != 2 || r.Passed != 1 || r.Failed != 0 {
		t.Fatalf("cards %+v, passed %d failed %d", r.Cards, r.Passed, r.Failed)
	}
	plan := campaignPlan{GPURun: true, Units: units, Slots: [][]gpu.Device{units}}
	shares := gpu.MergeCards(plan.Units, r.Cards, (2 * time.Minute).Seconds())
	var out strings.Builder
	printCampaignCards(&out, plan, []familyResult{r}, shares)
	for _, want := range []string{"qwen3: MODELQUAL_GPUS=GPU-0,GPU-1", "qwen p1", "qwen p2", "75.0%", "25.0%", "50%", "Total GPU energy 4000.0 J over 2 card(s)."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("campaign table lacks %q:\n%s", want, out.String())
		}
	}
}
