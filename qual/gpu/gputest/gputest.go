// Package gputest makes GPU inventories for tests of GPU placement on machines this one is not
// (2, 4 or 8 GPUs, MIG), without NVML.
package gputest

import (
	"fmt"

	"github.com/modelqual/modelqual/qual/gpu"
)

// Machine is an inventory of n GPUs with NVML indices 0..n-1 and UUIDs GPU-0 ... GPU-<n-1>; each
// GPU m with an entry k in mig has MIG enabled with k instances, MIG-m-0 ... MIG-m-<k-1>, in
// MIG slots 0..k-1.
func Machine(n int, mig map[int]int) gpu.Inventory {
	inv := gpu.Inventory{Available: true, DriverVersion: "550.54.15"}
	for i := 0; i < n; i++ {
		d := gpu.Device{Index: i, Name: "NVIDIA H100 80GB HBM3", UUID: fmt.Sprintf("GPU-%d", i), MemoryBytes: 80 << 30}
		if k, ok := mig[i]; ok {
			d.MIGEnabled = true
			for m := 0; m < k; m++ {
				d.MIG = append(d.MIG, gpu.Device{Index: i, MIGIndex: m, Parent: d.UUID, UUID: fmt.Sprintf("MIG-%d-%d", i, m), MemoryBytes: 10 << 30})
			}
		}
		inv.Devices = append(inv.Devices, d)
	}
	return inv
}
