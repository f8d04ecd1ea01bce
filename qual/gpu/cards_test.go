package gpu

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Handles finds a GPU by UUID and a MIG instance through its GPU's slot, and refuses an
// instance whose slot now holds another.
func TestHandles(t *testing.T) {
	sys := machine(2, map[int]int{1: 2})
	inv := InspectSystem(sys)
	units := Units(inv) // GPU 0, MIG-1-0, MIG-1-2
	hs, err := Handles(sys, units)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Handles: %v %v", hs, err)
	}
	for i, h := range hs {
		if u, _ := h.GetUUID(); u != units[i].UUID {
			t.Fatalf("handle %d is %s, want %s", i, u, units[i].UUID)
		}
	}
	moved := units[2]
	moved.UUID = "MIG-other"
	if _, err := Handles(sys, []Device{moved}); err == nil || !strings.Contains(err.Error(), "MIG layout changed") {
		t.Fatalf("a changed MIG layout: %v", err)
	}
	if _, err := Handles(sys, []Device{{UUID: "GPU-gone"}}); err == nil || !strings.Contains(err.Error(), "GPU-gone") {
		t.Fatalf("a GPU that left: %v", err)
	}
}

// A MIG instance sampled through its own handle: memory is read (NVML has it per instance);
// utilization, power and energy answer NOT_SUPPORTED, so its energy stays 0 and unclaimed.
func TestSamplerMIGInstance(t *testing.T) {
	notSupported := func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	mem := uint64(0)
	md := &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return "MIG-1-0", nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			mem += 100 << 20
			return nvml.Memory{Used: mem}, nvml.SUCCESS
		},
		GetFieldValuesFunc:            func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED },
		GetPowerUsageFunc:             func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		GetTotalEnergyConsumptionFunc: notSupported,
	}
	now := time.Unix(0, 0)
	s := newSampler([]nvml.Device{md}, []int{1}, 0, func() time.Time { return now }, nil)
	for i := 0; i < 3; i++ {
		now = now.Add(time.Second)
		s.sample()
	}
	tel := s.Stop()
	d := tel.Devices[0]
	if d.UUID != "MIG-1-0" || d.MemoryHighWaterBytes != 300<<20 || d.EnergyJ != 0 || d.EnergySource != "" || d.PowerAvgW != 0 {
		t.Fatalf("MIG instance: %+v", d)
	}
}

func near2(a, b float64) bool { return math.Abs(a-b) <= 1e-9 }

// The campaign merge: every card of the runner gets one row (an idle one too), the energy of
// every process that held it summed and its share of the campaign's, the held time over the
// wall time, the memory high-water the largest seen; a card without readings and a MIG card
// say why their energy is not counted.
func TestMergeCards(t *testing.T) {
	inv := InspectSystem(machine(4, map[int]int{3: 2}))
	units := Units(inv) // GPUs 0, 1, 2 and MIG-3-0, MIG-3-2
	g := func(i int) Device { return units[i] }
	tel := func(window float64, stats ...DeviceStats) Telemetry {
		return Telemetry{Available: true, WindowS: window, Devices: stats}
	}
	var usage []CardUsage
	// qwen ran on GPUs 0 and 1 (processes 1 and 2), then gpt2 on GPU 0 (the same slot later).
	usage = append(usage, Usage("qwen", 1, []Device{g(0)}, tel(100, DeviceStats{EnergyJ: 30000, EnergySource: "counter", MemoryHighWaterBytes: 2 << 30, Samples: 500}))...)
	usage = append(usage, Usage("qwen", 2, []Device{g(1)}, tel(90, DeviceStats{EnergyJ: 20000, EnergySource: "counter", MemoryHighWaterBytes: 3 << 30, Samples: 450}))...)
	usage = append(usage, Usage("gpt2", 1, []Device{g(0)}, tel(50, DeviceStats{EnergyJ: 10000, EnergySource: "counter", MemoryHighWaterBytes: 1 << 30, Samples: 250}))...)
	// zimage's process on MIG instance 3:0 has memory only; a process on GPU 2 had no NVML.
	usage = append(usage, Usage("zimage", 1, []Device{g(3)}, tel(40, DeviceStats{MemoryHighWaterBytes: 5 << 30, Samples: 200}))...)
	usage = append(usage, Usage("gpt2", 2, []Device{g(2)}, Telemetry{Reason: "NVML init: driver/library version mismatch"})...)

	shares := MergeCards(units, usage, 200)
	if len(shares) != 4 {
		t.Fatalf("%d rows, want one per card (4): %+v", len(shares), shares)
	}
	c0, c1, c2, c3 := shares[0], shares[1], shares[2], shares[3]
	if c0.Card != g(0).UUID || strings.Join(c0.Users, ",") != "qwen p1,gpt2 p1" || !near2(c0.EnergyJ, 40000) || !near2(c0.HeldS, 150) ||
		!near2(c0.HeldShare, 0.75) || !near2(c0.EnergyShare, 40000.0/60000) || c0.MemoryHighWaterBytes != 2<<30 || c0.Note != "" {
		t.Fatalf("card 0: %+v", c0)
	}
	if !near2(c1.EnergyShare, 20000.0/60000) || c1.MemoryHighWaterBytes != 3<<30 {
		t.Fatalf("card 1: %+v", c1)
	}
	if c2.EnergyJ != 0 || c2.HeldS != 0 || !strings.Contains(c2.Note, "no readings: NVML init") {
		t.Fatalf("card 2 without readings: %+v", c2)
	}
	if c3.Card != inv.Devices[3].UUID || !c3.MIG || c3.EnergyJ != 0 || c3.MemoryHighWaterBytes != 5<<30 || !strings.Contains(c3.Note, "not per instance") {
		t.Fatalf("MIG card 3: %+v", c3)
	}
	var b bytes.Buffer
	WriteCards(&b, shares)
	out := b.String()
	for _, want := range []string{"qwen p1, gpt2 p1", "40000.0", "66.7%", "33.3%", "75%", "2048", "Total GPU energy 60000.0 J over 4 card(s)."} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	// An idle card is listed as idle.
	idle := MergeCards(units[:2], usage[:1], 0)
	if len(idle) != 2 || idle[1].Note != "idle: no server ran on it" || idle[0].HeldShare != 0 {
		t.Fatalf("idle card: %+v", idle)
	}
}
