// Package gpu records the GPUs a run used, through NVIDIA's management library (go-nvml):
// an inventory (name, UUID, memory, driver) for the environment record, and a sampler that
// runs during a profile (utilization, memory used and its high-water mark, power, and the
// energy that gives joules per output token: the total-energy counter's delta, or the power
// samples integrated where the counter did not move over the window).
//
// Machines without an NVIDIA driver (CI, laptops) are normal: the library then reports
// telemetry as unavailable with the reason, and nothing fails unless GPUs were required.
package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Device is one GPU of the inventory, or one MIG instance of a GPU with MIG enabled.
type Device struct {
	// Index is the GPU's NVML index (for a MIG instance: its GPU's).
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// MIGEnabled marks a GPU partitioned into MIG instances: CUDA sees the instances, never
	// the whole GPU, so a run hands out MIG (its instances), not the GPU (Units).
	MIGEnabled bool     `json:"mig_enabled,omitempty"`
	MIG        []Device `json:"mig,omitempty"`
	// Parent is a MIG instance's GPU UUID and MIGIndex its NVML MIG device index on that GPU
	// (nvidia-smi's "MIG ... Device N"); both are unset on a GPU.
	Parent   string `json:"parent_uuid,omitempty"`
	MIGIndex int    `json:"mig_index,omitempty"`
}

// Card is the UUID of the physical GPU d runs on: its own, or a MIG instance's parent's.
func (d Device) Card() string {
	if d.Parent != "" {
		return d.Parent
	}
	return d.UUID
}

// Inventory is what the machine has.
type Inventory struct {
	Available     bool     `json:"available"`
	Reason        string   `json:"reason,omitempty"` // why telemetry is unavailable
	DriverVersion string   `json:"driver_version,omitempty"`
	NVMLVersion   string   `json:"nvml_version,omitempty"`
	CUDAVersion   int      `json:"cuda_driver_version,omitempty"`
	Devices       []Device `json:"devices,omitempty"`
}

// ErrUnavailable is wrapped when GPUs were required but NVML cannot be used.
var ErrUnavailable = errors.New("GPU telemetry unavailable")

var (
	initMu    sync.Mutex
	initCount int
)

// initNVML loads and initialises NVML (reference counted, so samplers and inventories can
// overlap). Without libnvidia-ml.so it returns an error; it never panics.
func initNVML() (err error) {
	initMu.Lock()
	defer initMu.Unlock()
	defer func() {
		// Defensive: a broken driver install must not take the harness down.
		if r := recover(); r != nil {
			err = fmt.Errorf("NVML init panicked: %v", r)
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return errors.New("NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine")
		}
		return fmt.Errorf("NVML init: %s", nvml.ErrorString(ret))
	}
	initCount++
	return nil
}

func shutdownNVML() {
	initMu.Lock()
	defer initMu.Unlock()
	if initCount > 0 {
		initCount--
		_ = nvml.Shutdown()
	}
}

// Inspect returns the inventory; when NVML is unavailable it says why in Reason and
// Available is false. It never fails.
func Inspect() Inventory {
	if err := initNVML(); err != nil {
		return Inventory{Reason: err.Error()}
	}
	defer shutdownNVML()
	return inspect(nvmlPackage{})
}

// System is the part of NVML an inventory reads. go-nvml's nvml.Interface satisfies it, and
// so do its mock servers (pkg/nvml/mock/dgxh100 ...), which is how tests inspect machines of
// 2, 4 or 8 GPUs, with or without MIG, on a machine with none.
type System interface {
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetNVMLVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// nvmlPackage is the loaded NVML library (go-nvml's package-level functions).
type nvmlPackage struct{}

func (nvmlPackage) SystemGetDriverVersion() (string, nvml.Return) {
	return nvml.SystemGetDriverVersion()
}
func (nvmlPackage) SystemGetNVMLVersion() (string, nvml.Return) { return nvml.SystemGetNVMLVersion() }
func (nvmlPackage) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return nvml.SystemGetCudaDriverVersion()
}
func (nvmlPackage) DeviceGetCount() (int, nvml.Return) { return nvml.DeviceGetCount() }
func (nvmlPackage) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByIndex(i)
}

// InspectSystem is Inspect over sys, an initialised NVML (or a mock of one).
func InspectSystem(sys System) Inventory { return inspect(sys) }

func inspect(sys System) Inventory {
	inv := Inventory{Available: true}
	inv.DriverVersion, _ = str(sys.SystemGetDriverVersion())
	inv.NVMLVersion, _ = str(sys.SystemGetNVMLVersion())
	if v, ret := sys.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDAVersion = v
	}
	n, ret := sys.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Inventory{Reason: "NVML device count: " + nvml.ErrorString(ret)}
	}
	for i := 0; i < n; i++ {
		d, ret := sys.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		dev := Device{Index: i}
		dev.Name, _ = str(d.GetName())
		dev.UUID, _ = str(d.GetUUID())
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			dev.MemoryBytes = m.Total
		}
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
			dev.MIGEnabled = true
			dev.MIG = migInstances(d, dev)
		}
		inv.Devices = append(inv.Devices, dev)
	}
	if len(inv.Devices) == 0 {
		inv.Available = false
		inv.Reason = "NVML reports no GPUs"
	}
	return inv
}

// migInstances lists the MIG instances of gpu d (slots without an instance are skipped).
func migInstances(d nvml.Device, parent Device) []Device {
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []Device
	for m := 0; m < n; m++ {
		md, ret := d.GetMigDeviceHandleByIndex(m)
		if ret != nvml.SUCCESS {
			continue
		}
		inst := Device{Index: parent.Index, Parent: parent.UUID, MIGIndex: m}
		inst.Name, _ = str(md.GetName())
		inst.UUID, _ = str(md.GetUUID())
		if mem, ret := md.GetMemoryInfo(); ret == nvml.SUCCESS {
			inst.MemoryBytes = mem.Total
		}
		out = append(out, inst)
	}
	return out
}

func str(s string, ret nvml.Return) (string, bool) {
	if ret != nvml.SUCCESS {
		return "", false
	}
	return s, true
}

// Require returns an error wrapping ErrUnavailable when inv has no usable GPU; callers use
// it when the run asked for GPUs, so a missing driver never turns into a silent CPU run.
func Require(inv Inventory) error {
	if inv.Available {
		return nil
	}
	return fmt.Errorf("%w: %s; GPUs were requested, so the run stops (run without --gpus for a CPU run)", ErrUnavailable, inv.Reason)
}

// DeviceStats are one device's figures over a sampler's window.
type DeviceStats struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// Utilization in percent (average and max over samples).
	UtilizationAvg float64 `json:"gpu_utilization_avg_pct"`
	UtilizationMax float64 `json:"gpu_utilization_max_pct"`
	// Memory used in bytes: the last sample and the high-water mark.
	MemoryUsedBytes      uint64 `json:"memory_used_bytes"`
	MemoryHighWaterBytes uint64 `json:"memory_high_water_bytes"`
	// Power in watts (average and max) as PowerReading reads it: "instant" (NVML's
	// FI_DEV_POWER_INSTANT field) where the driver has it, else "usage"
	// (nvmlDeviceGetPowerUsage, which on Ampere and newer GPUs except GA100 averages the last
	// second, so that a short window's readings partly describe the time before it).
	PowerAvgW    float64 `json:"power_avg_w"`
	PowerMaxW    float64 `json:"power_max_w"`
	PowerReading string  `json:"power_reading,omitempty"`
	// EnergyJ is the device's energy over the window, in joules, from EnergySource:
	// "counter" (the total-energy counter's delta), "power_samples" (the power samples
	// integrated over their times, where the counter is missing or did not move: on the H200 it
	// read 0 J over sub-second profile points), or "" (neither: 0).
	EnergyJ      float64 `json:"energy_j"`
	EnergySource string  `json:"energy_source,omitempty"`
	Samples      int     `json:"samples"`
}

// Telemetry is a sampler's result.
type Telemetry struct {
	Available bool          `json:"available"`
	Reason    string        `json:"reason,omitempty"`
	Interval  time.Duration `json:"interval_ns"`
	// WindowS is the time from the first sample to the last, in seconds.
	WindowS float64       `json:"window_s"`
	Devices []DeviceStats `json:"devices,omitempty"`
	// EnergyJ sums the devices' energy; JoulesPerOutputToken is set by the caller through
	// PerToken once the token count is known.
	EnergyJ              float64 `json:"energy_j"`
	JoulesPerOutputToken float64 `json:"joules_per_output_token,omitempty"`
	// Note says what to keep in mind reading these figures (a window shorter than NVML's own
	// averaging periods), or is empty.
	Note string `json:"note,omitempty"`
}

// utilizationPeriod is the longest period over which NVML averages a utilization reading (1/6 s
// to 1 s by product, per nvmlDeviceGetUtilizationRates' documentation): a shorter window's
// readings partly describe the time before it.
const utilizationPeriod = time.Second

// PerToken fills JoulesPerOutputToken from the run's output token count.
func (t *Telemetry) PerToken(outputTokens int) {
	if t.Available && outputTokens > 0 && t.EnergyJ > 0 {
		t.JoulesPerOutputToken = t.EnergyJ / float64(outputTokens)
	}
}

// Sampler samples GPUs periodically between Start and Stop.
type Sampler struct {
	interval time.Duration
	reason   string
	now      func() time.Time
	release  func() // NVML's shutdown, once the sampler is done with it
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	devs     []nvml.Device
	stats    []DeviceStats
	energy0  []uint64 // the counter at the start, mJ (0: no counter)
	utilSum  []float64
	powerSum []float64
	powerJ   []float64   // the power samples integrated (trapezoids), J
	lastW    []float64   // the last power sample, W
	lastT    []time.Time // when it was read (zero: none yet)
	first    time.Time
	last     time.Time
	ok       bool
}

// StartSampler begins sampling the devices with the given indices (nil: all) every
// interval (default 100 ms). Without NVML the sampler records the reason and Stop returns
// unavailable telemetry; required turns that into an error here instead.
func StartSampler(indices []int, interval time.Duration, required bool) (*Sampler, error) {
	return startSampler(interval, required, func() ([]nvml.Device, []int, error) {
		n, ret := nvml.DeviceGetCount()
		if ret != nvml.SUCCESS || n == 0 {
			return nil, nil, errNoGPUs
		}
		if indices == nil {
			for i := 0; i < n; i++ {
				indices = append(indices, i)
			}
		}
		var devs []nvml.Device
		for _, i := range indices {
			d, ret := nvml.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				return nil, nil, fmt.Errorf("gpu sampler: device %d: %s", i, nvml.ErrorString(ret))
			}
			devs = append(devs, d)
		}
		return devs, indices, nil
	})
}

// StartDeviceSampler is StartSampler for the units a process holds (Place): GPUs found by
// UUID, so the readings follow the card whatever the enumeration order, and MIG instances
// through their GPU. NVML reads memory per MIG instance but utilization, power and energy per
// GPU only: a MIG instance's telemetry has memory alone, and its energy stays 0, unclaimed.
func StartDeviceSampler(units []Device, interval time.Duration, required bool) (*Sampler, error) {
	return startSampler(interval, required, func() ([]nvml.Device, []int, error) {
		devs, err := Handles(nvmlHandles{}, units)
		return devs, Indices(units), err
	})
}

// errNoGPUs is the reason a sampler gives when NVML lists no device.
var errNoGPUs = errors.New("NVML reports no GPUs")

// startSampler initialises NVML, resolves the handles to sample and starts the loop.
func startSampler(interval time.Duration, required bool, resolve func() ([]nvml.Device, []int, error)) (*Sampler, error) {
	interval = orDefault(interval)
	unavailable := func(reason string) (*Sampler, error) {
		if required {
			return offline(interval, reason), fmt.Errorf("%w: %s; GPUs were requested", ErrUnavailable, reason)
		}
		return offline(interval, reason), nil
	}
	if err := initNVML(); err != nil {
		return unavailable(err.Error())
	}
	devs, indices, err := resolve()
	if errors.Is(err, errNoGPUs) {
		shutdownNVML()
		return unavailable(err.Error())
	}
	if err != nil {
		shutdownNVML()
		return offline(interval, err.Error()), err
	}
	s := newSampler(devs, indices, interval, time.Now, shutdownNVML)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.loop(ctx)
	return s, nil
}

// HandleSource finds a GPU by UUID: nvml.Interface and go-nvml's mock servers have it.
type HandleSource interface {
	DeviceGetHandleByUUID(string) (nvml.Device, nvml.Return)
}

type nvmlHandles struct{}

func (nvmlHandles) DeviceGetHandleByUUID(u string) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByUUID(u)
}

// Handles resolves units to NVML handles: a GPU by its UUID, a MIG instance as MIG device
// MIGIndex of its parent GPU, checked against its UUID (a MIG layout changed since the
// inventory is an error, not another instance's readings).
func Handles(src HandleSource, units []Device) ([]nvml.Device, error) {
	var out []nvml.Device
	for _, u := range units {
		d, ret := src.DeviceGetHandleByUUID(u.Card())
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu sampler: GPU %s: %s", u.Card(), nvml.ErrorString(ret))
		}
		if u.Parent != "" {
			md, ret := d.GetMigDeviceHandleByIndex(u.MIGIndex)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("gpu sampler: MIG device %d of GPU %s: %s", u.MIGIndex, u.Parent, nvml.ErrorString(ret))
			}
			if got, _ := str(md.GetUUID()); got != u.UUID {
				return nil, fmt.Errorf("gpu sampler: MIG device %d of GPU %s is %s now, not %s: the MIG layout changed during the run", u.MIGIndex, u.Parent, got, u.UUID)
			}
			d = md
		}
		out = append(out, d)
	}
	return out, nil
}

// orDefault is the sampling interval asked for, or 100 ms.
func orDefault(interval time.Duration) time.Duration {
	if interval <= 0 {
		return 100 * time.Millisecond
	}
	return interval
}

// offline is a sampler that takes no samples: its Stop returns unavailable telemetry with reason.
func offline(interval time.Duration, reason string) *Sampler {
	s := &Sampler{interval: interval, reason: reason, done: make(chan struct{})}
	close(s.done)
	return s
}

// newSampler prepares a sampler of devs (their indices alongside) that reads the time from
// now and calls release when it stops; the caller starts its loop (StartSampler), or a test
// calls sample itself.
func newSampler(devs []nvml.Device, indices []int, interval time.Duration, now func() time.Time, release func()) *Sampler {
	s := &Sampler{interval: orDefault(interval), now: now, release: release, done: make(chan struct{}), devs: devs, ok: true}
	for k, d := range devs {
		st := DeviceStats{Index: indices[k]}
		st.UUID, _ = str(d.GetUUID())
		s.stats = append(s.stats, st)
		e, ret := d.GetTotalEnergyConsumption()
		if ret != nvml.SUCCESS {
			e = 0
		}
		s.energy0 = append(s.energy0, e)
	}
	s.utilSum = make([]float64, len(devs))
	s.powerSum = make([]float64, len(devs))
	s.powerJ = make([]float64, len(devs))
	s.lastW = make([]float64, len(devs))
	s.lastT = make([]time.Time, len(devs))
	return s
}

func (s *Sampler) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	s.sample()
	for {
		select {
		case <-ctx.Done():
			s.sample()
			return
		case <-t.C:
			s.sample()
		}
	}
}

func (s *Sampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.first.IsZero() {
		s.first = now
	}
	s.last = now
	for k, d := range s.devs {
		st := &s.stats[k]
		st.Samples++
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			s.utilSum[k] += float64(u.Gpu)
			st.UtilizationMax = max(st.UtilizationMax, float64(u.Gpu))
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			st.MemoryUsedBytes = m.Used
			st.MemoryHighWaterBytes = max(st.MemoryHighWaterBytes, m.Used)
		}
		if w, how, ok := powerW(d); ok {
			st.PowerReading = how
			s.powerSum[k] += w
			st.PowerMaxW = max(st.PowerMaxW, w)
			if !s.lastT[k].IsZero() {
				s.powerJ[k] += (s.lastW[k] + w) / 2 * now.Sub(s.lastT[k]).Seconds()
			}
			s.lastW[k], s.lastT[k] = w, now
		}
	}
}

// powerW reads d's power draw in watts and says how (DeviceStats.PowerReading).
func powerW(d nvml.Device) (float64, string, bool) {
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_POWER_INSTANT}}
	if d.GetFieldValues(fv) == nvml.SUCCESS && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		if mw, ok := fieldUint(fv[0]); ok {
			return float64(mw) / 1000, "instant", true
		}
	}
	if mw, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
		return float64(mw) / 1000, "usage", true
	}
	return 0, "", false
}

// fieldUint is an NVML field's value where it is an unsigned integer.
func fieldUint(f nvml.FieldValue) (uint64, bool) {
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(f.Value[:4])), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(f.Value[:]), true
	}
	return 0, false
}

// Stop ends sampling and returns the telemetry.
func (s *Sampler) Stop() Telemetry {
	if !s.ok {
		<-s.done
		return Telemetry{Reason: s.reason, Interval: s.interval}
	}
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	return s.result()
}

// result makes the telemetry of the samples taken and releases NVML.
func (s *Sampler) result() Telemetry {
	s.mu.Lock()
	defer s.mu.Unlock()
	tel := Telemetry{Available: true, Interval: s.interval, WindowS: s.last.Sub(s.first).Seconds()}
	for k, d := range s.devs {
		st := s.stats[k]
		if st.Samples > 0 {
			st.UtilizationAvg = s.utilSum[k] / float64(st.Samples)
			st.PowerAvgW = s.powerSum[k] / float64(st.Samples)
		}
		if e, ret := d.GetTotalEnergyConsumption(); ret == nvml.SUCCESS && s.energy0[k] > 0 && e > s.energy0[k] {
			st.EnergyJ, st.EnergySource = float64(e-s.energy0[k])/1000, "counter" // mJ -> J
		} else if s.powerJ[k] > 0 {
			st.EnergyJ, st.EnergySource = s.powerJ[k], "power_samples"
		}
		tel.EnergyJ += st.EnergyJ
		tel.Devices = append(tel.Devices, st)
	}
	if tel.WindowS < utilizationPeriod.Seconds() {
		// The energy counter and the power readings move in steps too: about every 100 ms on an
		// H200 (native/cuda/NOTES.md run 126), so a window of a few of them has a coarse energy.
		tel.Note = fmt.Sprintf("the window (%.2f s) is shorter than NVML's utilization period (up to %v): "+
			"utilization partly describes the time before it, and the energy is coarse (NVML's energy "+
			"counter and power readings move in steps of about 100 ms)", tel.WindowS, utilizationPeriod)
	}
	s.ok = false
	if s.release != nil {
		s.release()
	}
	return tel
}
