package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// ServerGPUs is how many units one qual-server runs on: the native runtime serves on one CUDA
// device (ordinal 0 of those made visible to it), so a process that holds more leaves the rest
// idle rather than letting another process's server onto them.
const ServerGPUs = 1

// Units returns what a run can hand out of inv: every GPU without MIG, and each MIG instance of
// a GPU with MIG enabled, never that GPU whole (CUDA on a MIG-enabled GPU sees only the
// instances named to it, and two servers on one such GPU would share it). A MIG-enabled GPU
// without instances gives nothing.
func Units(inv Inventory) []Device {
	var out []Device
	for _, d := range inv.Devices {
		if d.MIGEnabled {
			out = append(out, d.MIG...)
			continue
		}
		out = append(out, d)
	}
	return out
}

// Label names a unit as nvidia-smi -L does: "2=GPU-6097..." for a GPU, "1:0=MIG-1b2c..." for
// MIG device 0 of GPU 1.
func (d Device) Label() string {
	if d.Parent != "" {
		return fmt.Sprintf("%d:%d=%s", d.Index, d.MIGIndex, d.UUID)
	}
	return fmt.Sprintf("%d=%s", d.Index, d.UUID)
}

// Select returns the units of inv named by spec (MODELQUAL_GPUS): "" or "all" for every unit
// (Units), else a comma-separated list, in the order given and each unit once, of
//   - NVML indices ("0,2") or GPU UUIDs ("GPU-6097..."): that GPU, or every MIG instance of it
//     where MIG is enabled;
//   - MIG UUIDs ("MIG-1b2c...") or GPU:MIG index pairs ("1:0"): that MIG instance.
//
// A name the inventory does not hold, an empty entry ("0,,1"), an index written otherwise than
// plainly ("01", "+1"), or a MIG-enabled GPU without instances is an error naming it and what the
// machine has, so a typo never silently runs on another GPU.
func Select(inv Inventory, spec string) ([]Device, error) {
	if !inv.Available {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, inv.Reason)
	}
	spec = strings.TrimSpace(spec)
	if spec == "" || strings.EqualFold(spec, "all") {
		units := Units(inv)
		if len(units) == 0 {
			return nil, fmt.Errorf("no GPU to hand out: every GPU has MIG enabled without MIG instances (%s); create instances (nvidia-smi mig -cgi ... -C) or disable MIG", describe(inv))
		}
		return units, nil
	}
	var out []Device
	seen := map[string]bool{}
	for _, p := range strings.Split(spec, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("GPU list %q has an empty entry; write indices or UUIDs separated by single commas", spec)
		}
		units, err := find(inv, p)
		if err != nil {
			return nil, err
		}
		for _, u := range units {
			if !seen[u.UUID] {
				seen[u.UUID] = true
				out = append(out, u)
			}
		}
	}
	return out, nil
}

// find resolves one entry of a GPU list to its units.
func find(inv Inventory, name string) ([]Device, error) {
	notHere := func() error {
		return fmt.Errorf("GPU %q is not on this machine (it has %s); use NVML indices, GPU:MIG index pairs or UUIDs from nvidia-smi -L", name, describe(inv))
	}
	gpuUnits := func(d Device) ([]Device, error) {
		if !d.MIGEnabled {
			return []Device{d}, nil
		}
		if len(d.MIG) == 0 {
			return nil, fmt.Errorf("GPU %q (%s) has MIG enabled but no MIG instances: create them (nvidia-smi mig -cgi ... -C) or disable MIG", name, d.Label())
		}
		return d.MIG, nil
	}
	gpuAt, migAt, isPair := strings.Cut(name, ":")
	for _, d := range inv.Devices {
		if d.UUID == name {
			return gpuUnits(d)
		}
		for _, m := range d.MIG {
			if m.UUID == name {
				return []Device{m}, nil
			}
		}
	}
	g, ok := plainIndex(gpuAt)
	if !ok {
		return nil, notHere()
	}
	for _, d := range inv.Devices {
		if d.Index != g {
			continue
		}
		if !isPair {
			return gpuUnits(d)
		}
		m, ok := plainIndex(migAt)
		if !ok {
			return nil, notHere()
		}
		for _, inst := range d.MIG {
			if inst.MIGIndex == m {
				return []Device{inst}, nil
			}
		}
	}
	return nil, notHere()
}

// plainIndex parses a non-negative index written plainly (no sign, no leading zero).
func plainIndex(s string) (int, bool) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

func describe(inv Inventory) string {
	if len(inv.Devices) == 0 {
		return "none"
	}
	parts := make([]string, len(inv.Devices))
	for i, d := range inv.Devices {
		parts[i] = d.Label()
		if d.MIGEnabled {
			var ms []string
			for _, m := range d.MIG {
				ms = append(ms, m.Label())
			}
			parts[i] += " with MIG [" + strings.Join(ms, ", ") + "]"
		}
	}
	return strings.Join(parts, ", ")
}

// Split divides units into parts disjoint runs of consecutive units whose sizes differ by at
// most one, the first parts taking the extra ones: 5 units in 2 parts are [0 1 2] [3 4].
// Consecutive units keep a part's GPUs near each other (NVML orders GPUs by PCI bus). A part
// beyond len(units) is empty. parts below 1 counts as 1.
func Split(units []Device, parts int) [][]Device {
	if parts < 1 {
		parts = 1
	}
	out := make([][]Device, parts)
	base, extra := len(units)/parts, len(units)%parts
	at := 0
	for p := range out {
		n := base
		if p < extra {
			n++
		}
		if n > 0 {
			out[p] = append([]Device(nil), units[at:at+n]...)
		}
		at += n
	}
	return out
}

// ShortageFails parses a shortage policy (MODELQUAL_GPU_SHORTAGE): what a run does where a
// process, or a family run of a campaign, holds fewer GPUs than it needs. "skip" (or empty):
// its gpu specs skip, saying why; "fail": it fails. Anything else is an error, so a typo never
// silently turns a failing gate into a skipped one.
func ShortageFails(policy string) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(policy)); v {
	case "", "skip":
		return false, nil
	case "fail":
		return true, nil
	default:
		return false, fmt.Errorf("GPU shortage policy %q: use skip or fail", v)
	}
}

// Placement is one parallel process's share of a run's GPUs.
type Placement struct {
	Process, Processes int
	// Held is the process's part of the run's units (Split): no other process holds any.
	Held []Device
	// Server is what its server runs on: the first need units of Held; nil on a shortage.
	Server []Device
	// Shortage says, when Held has fewer units than the server needs, what the run has and
	// how it was split; "" when the server fits.
	Shortage string
}

// Place gives process (1-based, Ginkgo's GinkgoParallelProcess()) of processes its part of
// units for a server that runs on need units. Two processes never share a unit: with fewer
// units than processes the last processes hold none and Shortage says so (the caller skips or
// fails, never shares).
func Place(units []Device, process, processes, need int) (Placement, error) {
	if processes < 1 || process < 1 || process > processes {
		return Placement{}, fmt.Errorf("gpu: process %d of %d: processes are numbered 1..N", process, processes)
	}
	if need < 1 {
		return Placement{}, fmt.Errorf("gpu: a server needs at least one GPU, not %d", need)
	}
	pl := Placement{Process: process, Processes: processes, Held: Split(units, processes)[process-1]}
	if len(pl.Held) < need {
		pl.Shortage = fmt.Sprintf("process %d of %d holds %d GPU unit(s) and its server needs %d: the run has %d for %d processes (%s)",
			process, processes, len(pl.Held), need, len(units), processes, labels(units))
		return pl, nil
	}
	pl.Server = pl.Held[:need]
	return pl, nil
}

// String says what the process holds and runs on, and what stays idle.
func (pl Placement) String() string {
	if pl.Shortage != "" {
		return pl.Shortage
	}
	s := fmt.Sprintf("process %d of %d holds %s; its server runs on %s", pl.Process, pl.Processes, labels(pl.Held), labels(pl.Server))
	if idle := pl.Held[len(pl.Server):]; len(idle) > 0 {
		s += fmt.Sprintf("; %s stay(s) idle (a server runs on %d)", labels(idle), len(pl.Server))
	}
	return s
}

func labels(ds []Device) string {
	if len(ds) == 0 {
		return "none"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Label()
	}
	return strings.Join(parts, ", ")
}

// UUIDs returns the devices' UUIDs: what the container launcher passes as DeviceIDs and the
// process launcher as CUDA_VISIBLE_DEVICES (CUDA accepts GPU and MIG UUIDs there, which stay
// right whatever the enumeration order).
func UUIDs(devs []Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.UUID
	}
	return out
}

// Indices returns the devices' NVML indices, for the telemetry sampler (a MIG instance's is
// its GPU's: NVML reads power and energy per GPU).
func Indices(devs []Device) []int {
	out := make([]int, len(devs))
	for i, d := range devs {
		out[i] = d.Index
	}
	return out
}
