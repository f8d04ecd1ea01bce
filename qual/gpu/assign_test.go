package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func fakeInventory(n int) Inventory {
	inv := Inventory{Available: true}
	for i := 0; i < n; i++ {
		inv.Devices = append(inv.Devices, Device{Index: i, Name: "H200", UUID: "GPU-" + strings.Repeat(string(rune('a'+i)), 8)})
	}
	return inv
}

// machine is a go-nvml mock server of n H100s; GPUs named in mig have MIG enabled with that
// many instances (MIG-<gpu>-<k>, in slots 0, 2, 4, ... so that the slot numbers, not the
// count, must be followed).
func machine(n int, mig map[int]int) *server.Server {
	s := dgxh100.NewWithGPUs(gpus.Multiple(n, gpus.H100_SXM5_80GB)...)
	for i, h := range s.Devices {
		d := h.(*server.Device)
		k, ok := mig[i]
		if !ok {
			continue
		}
		d.MigMode = nvml.DEVICE_MIG_ENABLE
		d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
		d.GetMigDeviceHandleByIndexFunc = func(m int) (nvml.Device, nvml.Return) {
			if m%2 != 0 || m/2 >= k {
				return nil, nvml.ERROR_NOT_FOUND
			}
			uuid := fmt.Sprintf("MIG-%d-%d", i, m)
			return &mock.Device{
				GetUUIDFunc:       func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
				GetNameFunc:       func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 1g.10gb", nvml.SUCCESS },
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 10 << 30}, nvml.SUCCESS },
			}, nvml.SUCCESS
		}
	}
	return s
}

// The inventory of a mock DGX: every GPU by index with its UUID and memory, a MIG-enabled GPU
// with its instances (and the empty slots skipped), and the units a run hands out: whole GPUs
// and MIG instances, never a MIG-enabled GPU whole.
func TestInspectSystemMIG(t *testing.T) {
	sys := machine(4, map[int]int{1: 3, 3: 0})
	inv := InspectSystem(sys)
	if !inv.Available || len(inv.Devices) != 4 || inv.DriverVersion != "550.54.15" || inv.CUDAVersion != 12040 {
		t.Fatalf("inventory %+v", inv)
	}
	uuid0 := sys.Devices[0].(*server.Device).UUID
	if d := inv.Devices[0]; d.UUID != uuid0 || d.MIGEnabled || d.MemoryBytes == 0 || !strings.Contains(d.Name, "H100") {
		t.Fatalf("GPU 0: %+v", d)
	}
	g1 := inv.Devices[1]
	if !g1.MIGEnabled || len(g1.MIG) != 3 || g1.MIG[2].UUID != "MIG-1-4" || g1.MIG[2].MIGIndex != 4 || g1.MIG[2].Index != 1 || g1.MIG[2].Parent != g1.UUID || g1.MIG[2].Card() != g1.UUID {
		t.Fatalf("GPU 1 (MIG, 3 instances in slots 0, 2, 4): %+v", g1)
	}
	var got []string
	for _, u := range Units(inv) {
		got = append(got, u.UUID)
	}
	want := []string{uuid0, "MIG-1-0", "MIG-1-2", "MIG-1-4", inv.Devices[2].UUID} // GPU 3: MIG, no instance
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("units %v, want %v", got, want)
	}
}

func TestSelect(t *testing.T) {
	inv := fakeInventory(4)
	all, err := Select(inv, "")
	if err != nil || len(all) != 4 {
		t.Fatalf("Select all: %v %v", all, err)
	}
	if all2, err := Select(inv, " ALL "); err != nil || !reflect.DeepEqual(all2, all) {
		t.Fatalf("Select ALL: %v %v", all2, err)
	}
	got, err := Select(inv, "2, GPU-aaaaaaaa,2")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"GPU-cccccccc", "GPU-aaaaaaaa"}; !reflect.DeepEqual(UUIDs(got), want) {
		t.Fatalf("Select by index and UUID = %v, want %v (in order, no duplicates)", UUIDs(got), want)
	}
	// Typos are errors that name the entry and list the machine, never another GPU.
	for spec, want := range map[string]string{
		"7":            `"7" is not on this machine`,
		"-1":           `"-1" is not on this machine`,
		"01":           `"01" is not on this machine`,
		"+1":           `"+1" is not on this machine`,
		"1x":           `"1x" is not on this machine`,
		"GPU-aaaaaaa":  `"GPU-aaaaaaa" is not on this machine`,
		"0,,1":         "empty entry",
		"0,1,":         "empty entry",
		"1:0":          `"1:0" is not on this machine`,
		"MIG-whatever": `"MIG-whatever" is not on this machine`,
	} {
		_, err := Select(inv, spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Select(%q) = %v, want an error with %q", spec, err, want)
		}
		if err != nil && want != "empty entry" && !strings.Contains(err.Error(), "0=GPU-aaaaaaaa, 1=GPU-bbbbbbbb") {
			t.Errorf("Select(%q): %v does not list the machine's GPUs", spec, err)
		}
	}
	if _, err := Select(Inventory{Reason: "no driver"}, "0"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no NVML: %v, want ErrUnavailable", err)
	}
}

// With MIG, an index or GPU UUID names every instance of a MIG-enabled GPU, a MIG UUID or a
// GPU:MIG pair one instance, and a MIG-enabled GPU without instances is an error.
func TestSelectMIG(t *testing.T) {
	inv := InspectSystem(machine(3, map[int]int{1: 2, 2: 0}))
	g0 := inv.Devices[0].UUID
	for spec, want := range map[string][]string{
		"":                   {g0, "MIG-1-0", "MIG-1-2"},
		"1":                  {"MIG-1-0", "MIG-1-2"},
		inv.Devices[1].UUID:  {"MIG-1-0", "MIG-1-2"},
		"1:2,0":              {"MIG-1-2", g0},
		"MIG-1-0,1":          {"MIG-1-0", "MIG-1-2"},
		"MIG-1-2, 1:2, 1:2 ": {"MIG-1-2"},
	} {
		got, err := Select(inv, spec)
		if err != nil || !reflect.DeepEqual(UUIDs(got), want) {
			t.Errorf("Select(%q) = %v, %v; want %v", spec, UUIDs(got), err, want)
		}
	}
	for spec, want := range map[string]string{
		"2":   "has MIG enabled but no MIG instances",
		"1:1": `"1:1" is not on this machine`, // slot 1 holds no instance
		"0:0": `"0:0" is not on this machine`, // GPU 0 has no MIG
		"1:":  `"1:" is not on this machine`,
	} {
		if _, err := Select(inv, spec); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "1:0=MIG-1-0") && !strings.Contains(err.Error(), "no MIG instances") {
			t.Errorf("Select(%q) = %v, want %q and the machine's MIG instances", spec, err, want)
		}
	}
	if _, err := Select(InspectSystem(machine(1, map[int]int{0: 0})), ""); err == nil || !strings.Contains(err.Error(), "no GPU to hand out") {
		t.Fatalf("only a MIG GPU without instances: %v", err)
	}
}

func TestSplit(t *testing.T) {
	units := fakeInventory(5).Devices
	sizes := func(parts [][]Device) (out []string) {
		for _, p := range parts {
			out = append(out, fmt.Sprint(Indices(p)))
		}
		return out
	}
	for _, c := range []struct {
		n, parts int
		want     []string
	}{
		{5, 2, []string{"[0 1 2]", "[3 4]"}},
		{4, 4, []string{"[0]", "[1]", "[2]", "[3]"}},
		{2, 3, []string{"[0]", "[1]", "[]"}},
		{4, 1, []string{"[0 1 2 3]"}},
		{3, 0, []string{"[0 1 2]"}},
		{0, 2, []string{"[]", "[]"}},
	} {
		if got := sizes(Split(units[:c.n], c.parts)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Split(%d units, %d) = %v, want %v", c.n, c.parts, got, c.want)
		}
	}
}

// placeAll places every process of a run and checks what every placement must keep: no unit
// held twice, every unit held by someone, and a server on exactly ServerGPUs held units or a
// shortage saying why.
func placeAll(t *testing.T, units []Device, procs int) []Placement {
	t.Helper()
	held := map[string]int{}
	var out []Placement
	for p := 1; p <= procs; p++ {
		pl, err := Place(units, p, procs, ServerGPUs)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range pl.Held {
			if q, ok := held[u.UUID]; ok {
				t.Fatalf("%d units, %d processes: %s held by processes %d and %d", len(units), procs, u.UUID, q, p)
			}
			held[u.UUID] = p
		}
		switch {
		case pl.Shortage == "" && (len(pl.Server) != ServerGPUs || pl.Server[0].UUID != pl.Held[0].UUID):
			t.Fatalf("process %d: server on %v of %v", p, UUIDs(pl.Server), UUIDs(pl.Held))
		case pl.Shortage != "" && (pl.Server != nil || len(pl.Held) >= ServerGPUs):
			t.Fatalf("process %d: shortage %q with %d held", p, pl.Shortage, len(pl.Held))
		}
		out = append(out, pl)
	}
	if len(held) != len(units) {
		t.Fatalf("%d units, %d processes: only %d held", len(units), procs, len(held))
	}
	return out
}

// Ginkgo's N processes on machines of 2, 4 and 8 GPUs (and MIG): disjoint shares, one server
// unit each; a process left without a GPU has a shortage, never a shared card.
func TestPlace(t *testing.T) {
	for _, g := range []int{2, 4, 8} {
		units := Units(InspectSystem(machine(g, nil)))
		for _, n := range []int{1, 2, 3, 4, 8, 9} {
			pls := placeAll(t, units, n)
			short := 0
			for _, pl := range pls {
				if pl.Shortage != "" {
					short++
				}
			}
			if want := max(0, n-g); short != want {
				t.Errorf("%d GPUs, %d processes: %d without a GPU, want %d", g, n, short, want)
			}
		}
	}
	units := fakeInventory(4).Devices
	// 2 processes over 4 GPUs: GPUs 0,1 and 2,3, servers on 0 and 2, the others idle and said so.
	pl, _ := Place(units, 2, 2, 1)
	if !reflect.DeepEqual(Indices(pl.Held), []int{2, 3}) || !reflect.DeepEqual(Indices(pl.Server), []int{2}) ||
		!strings.Contains(pl.String(), "3=GPU-dddddddd stay(s) idle") {
		t.Fatalf("process 2 of 2 over 4 GPUs: %+v %q", pl, pl.String())
	}
	// 3 processes over 2 GPUs: the third holds none.
	pl, _ = Place(units[:2], 3, 3, 1)
	if pl.Held != nil || pl.Server != nil || !strings.Contains(pl.Shortage, "process 3 of 3 holds 0 GPU unit(s)") || !strings.Contains(pl.String(), "the run has 2 for 3 processes (0=GPU-aaaaaaaa, 1=GPU-bbbbbbbb)") {
		t.Fatalf("process 3 of 3 over 2 GPUs: %+v", pl)
	}
	// A server needing 2 units on a process holding 1 (4 units, 3 processes: 2, 1, 1).
	if pl, _ := Place(units, 2, 3, 2); pl.Shortage == "" || len(pl.Held) != 1 {
		t.Fatalf("need 2, hold 1: %+v", pl)
	}
	// MIG: 2 instances of GPU 1 and GPU 0 whole make 3 units for 3 processes.
	mig := Units(InspectSystem(machine(2, map[int]int{1: 2})))
	pls := placeAll(t, mig, 3)
	if got := []string{pls[1].Server[0].UUID, pls[2].Server[0].UUID}; !reflect.DeepEqual(got, []string{"MIG-1-0", "MIG-1-2"}) {
		t.Fatalf("MIG servers %v", got)
	}
	for _, bad := range [][3]int{{0, 2, 1}, {3, 2, 1}, {1, 0, 1}, {1, 2, 0}} {
		if _, err := Place(units, bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("Place(process %d of %d, need %d) must be an error", bad[0], bad[1], bad[2])
		}
	}
}
