package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// Select returns the devices of inv named by spec: "" or "all" for every device, else a
// comma-separated list of NVML indices ("0,2") or UUIDs ("GPU-6097..."), in the order given.
// A name the inventory does not hold is an error naming it and what the machine has, so a
// typo in MODELQUAL_GPUS never silently runs on another GPU.
func Select(inv Inventory, spec string) ([]Device, error) {
	if !inv.Available {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, inv.Reason)
	}
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return append([]Device(nil), inv.Devices...), nil
	}
	var out []Device
	seen := map[string]bool{}
	for _, p := range strings.Split(spec, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		d, ok := find(inv, p)
		if !ok {
			return nil, fmt.Errorf("GPU %q is not on this machine (it has %s); use NVML indices or UUIDs from nvidia-smi -L", p, describe(inv))
		}
		if !seen[d.UUID] {
			seen[d.UUID] = true
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("GPU list %q names no device; use all, indices (0,1) or UUIDs", spec)
	}
	return out, nil
}

func find(inv Inventory, name string) (Device, bool) {
	for _, d := range inv.Devices {
		if d.UUID == name {
			return d, true
		}
	}
	if i, err := strconv.Atoi(name); err == nil {
		for _, d := range inv.Devices {
			if d.Index == i {
				return d, true
			}
		}
	}
	return Device{}, false
}

func describe(inv Inventory) string {
	if len(inv.Devices) == 0 {
		return "none"
	}
	parts := make([]string, len(inv.Devices))
	for i, d := range inv.Devices {
		parts[i] = fmt.Sprintf("%d=%s", d.Index, d.UUID)
	}
	return strings.Join(parts, ", ")
}

// ForProcess splits devs among the parallel processes of a test run (Ginkgo's
// GinkgoParallelProcess(), 1-based, of processes): with at least as many devices as
// processes each process gets its own disjoint set (devices j with j mod processes ==
// process-1), so two servers never share a GPU; with fewer devices, process p shares device
// (p-1) mod len(devs) with the others mapped to it. It returns nil when devs is empty.
func ForProcess(devs []Device, process, processes int) []Device {
	if len(devs) == 0 {
		return nil
	}
	if processes < 1 {
		processes = 1
	}
	if process < 1 || process > processes {
		process = 1
	}
	if len(devs) < processes {
		return []Device{devs[(process-1)%len(devs)]}
	}
	var out []Device
	for j, d := range devs {
		if j%processes == process-1 {
			out = append(out, d)
		}
	}
	return out
}

// UUIDs returns the devices' UUIDs: what the container launcher passes as DeviceIDs and the
// process launcher as CUDA_VISIBLE_DEVICES (CUDA accepts UUIDs there too, which stay right
// whatever the enumeration order).
func UUIDs(devs []Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.UUID
	}
	return out
}

// Indices returns the devices' NVML indices, for the telemetry sampler.
func Indices(devs []Device) []int {
	out := make([]int, len(devs))
	for i, d := range devs {
		out[i] = d.Index
	}
	return out
}
