package gpu

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// script is one mock GPU's readings, sample by sample: the sampler reads utilization, memory
// and power once per sample, and the energy counter at the start and at the stop.
type script struct {
	util    []uint32
	memMiB  []uint64
	powerW  []float64
	energy  []uint64 // mJ: at the start, at the stop; nil: no counter
	instant bool     // power through the FI_DEV_POWER_INSTANT field (else only nvmlDeviceGetPowerUsage)
}

func (sc script) device(t *testing.T) *mock.Device {
	i, e := 0, 0
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-mock", nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: sc.util[i]}, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Used: sc.memMiB[i] << 20}, nvml.SUCCESS
		},
		GetFieldValuesFunc: func(fv []nvml.FieldValue) nvml.Return {
			if !sc.instant || len(fv) != 1 || fv[0].FieldId != nvml.FI_DEV_POWER_INSTANT {
				return nvml.ERROR_NOT_SUPPORTED
			}
			fv[0].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			fv[0].NvmlReturn = uint32(nvml.SUCCESS)
			binary.NativeEndian.PutUint32(fv[0].Value[:4], uint32(sc.powerW[i]*1000))
			i++ // power is the last reading of a sample
			return nvml.SUCCESS
		},
		GetPowerUsageFunc: func() (uint32, nvml.Return) {
			if sc.instant {
				t.Fatal("nvmlDeviceGetPowerUsage read where the instant field answered")
			}
			w := sc.powerW[i]
			i++
			return uint32(w * 1000), nvml.SUCCESS
		},
		GetTotalEnergyConsumptionFunc: func() (uint64, nvml.Return) {
			if sc.energy == nil {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if e >= len(sc.energy) {
				t.Fatalf("the energy counter read %d times", e+1)
			}
			e++
			return sc.energy[e-1], nvml.SUCCESS
		},
	}
}

// run samples one mock device at the given times (seconds) and returns the telemetry.
func run(t *testing.T, sc script, at []float64) Telemetry {
	t.Helper()
	t0 := time.Unix(1000, 0)
	var now time.Time
	released := false
	s := newSampler([]nvml.Device{sc.device(t)}, []int{3}, 0, func() time.Time { return now }, func() { released = true })
	for _, sec := range at {
		now = t0.Add(time.Duration(sec * float64(time.Second)))
		s.sample()
	}
	tel := s.Stop()
	if !released {
		t.Fatal("Stop did not release NVML")
	}
	return tel
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// The figures come from the samples: averages and maxima of utilization and power, memory's
// last value and high-water mark, and energy from the counter's delta where it moved.
func TestSamplerFigures(t *testing.T) {
	tel := run(t, script{
		util:   []uint32{10, 90, 50},
		memMiB: []uint64{100, 300, 200},
		powerW: []float64{100, 300, 200},
		energy: []uint64{5_000, 17_500},
	}, []float64{0, 1, 2})
	d := tel.Devices[0]
	if !tel.Available || d.Index != 3 || d.UUID != "GPU-mock" || d.Samples != 3 {
		t.Fatalf("telemetry %+v", tel)
	}
	if !near(d.UtilizationAvg, 50) || d.UtilizationMax != 90 || !near(d.PowerAvgW, 200) || d.PowerMaxW != 300 || d.PowerReading != "usage" {
		t.Fatalf("utilization %v/%v, power %v/%v (%q)", d.UtilizationAvg, d.UtilizationMax, d.PowerAvgW, d.PowerMaxW, d.PowerReading)
	}
	if d.MemoryUsedBytes != 200<<20 || d.MemoryHighWaterBytes != 300<<20 {
		t.Fatalf("memory %d, high-water %d", d.MemoryUsedBytes, d.MemoryHighWaterBytes)
	}
	if d.EnergySource != "counter" || !near(d.EnergyJ, 12.5) || !near(tel.EnergyJ, 12.5) || !near(tel.WindowS, 2) {
		t.Fatalf("energy %v J from %q (total %v), window %v s", d.EnergyJ, d.EnergySource, tel.EnergyJ, tel.WindowS)
	}
	if tel.Note != "" {
		t.Fatalf("a 2 s window needs no note: %q", tel.Note)
	}
	tel.PerToken(25)
	if !near(tel.JoulesPerOutputToken, 0.5) {
		t.Fatalf("J per token %v", tel.JoulesPerOutputToken)
	}
}

// Where the counter did not move (a window shorter than it updates) or is missing, the
// energy is the power samples' trapezoids over their times, said so, and a window shorter
// than NVML's utilization period gets a note.
func TestSamplerShortWindowEnergy(t *testing.T) {
	sc := script{
		util:   []uint32{0, 0, 0, 0},
		memMiB: []uint64{1, 1, 1, 1},
		powerW: []float64{100, 300, 300, 100},
		energy: []uint64{9_000, 9_000},
	}
	at := []float64{0, 0.1, 0.2, 0.4} // trapezoids: 20 + 30 + 40 = 90 W s
	noCounter := script{util: sc.util, memMiB: sc.memMiB, powerW: sc.powerW}
	instant := sc
	instant.instant = true
	for _, sc := range []script{sc, noCounter, instant} {
		tel := run(t, sc, at)
		d := tel.Devices[0]
		want := map[bool]string{true: "instant", false: "usage"}[sc.instant]
		if d.EnergySource != "power_samples" || !near(d.EnergyJ, 90) || !near(tel.EnergyJ, 90) || d.PowerReading != want {
			t.Fatalf("counter %v: energy %v J from %q, power read %q (want %q)", sc.energy, d.EnergyJ, d.EnergySource, d.PowerReading, want)
		}
		if !near(tel.WindowS, 0.4) || !strings.Contains(tel.Note, "0.40 s") || !strings.Contains(tel.Note, "energy is coarse") {
			t.Fatalf("window %v s, note %q", tel.WindowS, tel.Note)
		}
	}
	// One sample spans no time: no energy, and none claimed.
	tel := run(t, script{util: []uint32{5}, memMiB: []uint64{1}, powerW: []float64{100}, energy: []uint64{7, 7}}, []float64{0})
	if d := tel.Devices[0]; d.EnergyJ != 0 || d.EnergySource != "" {
		t.Fatalf("one sample: energy %v J from %q", d.EnergyJ, d.EnergySource)
	}
}
