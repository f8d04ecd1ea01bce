package gpu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func fakeInventory(n int) Inventory {
	inv := Inventory{Available: true}
	for i := 0; i < n; i++ {
		inv.Devices = append(inv.Devices, Device{Index: i, Name: "H200", UUID: "GPU-" + strings.Repeat(string(rune('a'+i)), 8)})
	}
	return inv
}

func TestSelect(t *testing.T) {
	inv := fakeInventory(4)
	all, err := Select(inv, "")
	if err != nil || len(all) != 4 {
		t.Fatalf("Select all: %v %v", all, err)
	}
	got, err := Select(inv, "2, GPU-aaaaaaaa,2")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"GPU-cccccccc", "GPU-aaaaaaaa"}; !reflect.DeepEqual(UUIDs(got), want) {
		t.Fatalf("Select by index and UUID = %v, want %v (in order, no duplicates)", UUIDs(got), want)
	}
	if _, err := Select(inv, "7"); err == nil || !strings.Contains(err.Error(), `"7" is not on this machine`) || !strings.Contains(err.Error(), "0=GPU-aaaaaaaa") {
		t.Fatalf("unknown GPU: %v", err)
	}
	if _, err := Select(Inventory{Reason: "no driver"}, "0"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no NVML: %v, want ErrUnavailable", err)
	}
}

func TestForProcess(t *testing.T) {
	devs := fakeInventory(4).Devices
	// 2 processes over 4 GPUs: disjoint sets covering every GPU.
	p1, p2 := Indices(ForProcess(devs, 1, 2)), Indices(ForProcess(devs, 2, 2))
	if !reflect.DeepEqual(p1, []int{0, 2}) || !reflect.DeepEqual(p2, []int{1, 3}) {
		t.Fatalf("2 processes over 4 GPUs: %v %v", p1, p2)
	}
	// 4 processes over 4 GPUs: one each.
	for p := 1; p <= 4; p++ {
		if got := Indices(ForProcess(devs, p, 4)); !reflect.DeepEqual(got, []int{p - 1}) {
			t.Fatalf("process %d of 4: %v", p, got)
		}
	}
	// 3 processes over 2 GPUs: (p-1) mod 2, one GPU each, shared.
	for p, want := range map[int]int{1: 0, 2: 1, 3: 0} {
		if got := Indices(ForProcess(devs[:2], p, 3)); !reflect.DeepEqual(got, []int{want}) {
			t.Fatalf("process %d of 3 over 2 GPUs: %v, want [%d]", p, got, want)
		}
	}
	if ForProcess(nil, 1, 1) != nil {
		t.Fatal("no devices must give nil")
	}
}
