package launch

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
)

// The GPU request the container launcher sends, inspected without Docker or GPUs: one device
// request with capability "gpu" naming the UUIDs, beside the bundle and records mounts.
func TestContainerHostConfigPassesGPUsByUUID(t *testing.T) {
	uuids := []string{"GPU-609700ca-3e42-3022-5e98-9d8afe699b51", "GPU-11111111-2222-3333-4444-555555555555"}
	hc := &container.HostConfig{}
	hostConfigModifier("/b/bundle.mqb", "/r", normalizeGPUs([]string{strings.Join(uuids, ",")}), limits{}, true)(hc)
	if len(hc.DeviceRequests) != 1 {
		t.Fatalf("DeviceRequests = %+v, want one", hc.DeviceRequests)
	}
	dr := hc.DeviceRequests[0]
	if !reflect.DeepEqual(dr.DeviceIDs, uuids) || dr.Count != 0 {
		t.Fatalf("DeviceIDs %v Count %d, want %v and 0", dr.DeviceIDs, dr.Count, uuids)
	}
	if !reflect.DeepEqual(dr.Capabilities, [][]string{{"gpu"}}) {
		t.Fatalf("Capabilities = %v, want [[gpu]]", dr.Capabilities)
	}
	if len(hc.Mounts) != 2 || hc.Mounts[0].Source != "/b/bundle.mqb" || !hc.Mounts[0].ReadOnly || hc.Mounts[1].Target != containerRecordsDir || !hc.ReadonlyRootfs {
		t.Fatalf("mounts %+v readonly rootfs %v", hc.Mounts, hc.ReadonlyRootfs)
	}

	all := &container.HostConfig{}
	hostConfigModifier("/b", "/r", normalizeGPUs([]string{"0", "all"}), limits{}, true)(all)
	if len(all.DeviceRequests) != 1 || all.DeviceRequests[0].Count != -1 || all.DeviceRequests[0].DeviceIDs != nil {
		t.Fatalf("all: %+v, want Count -1 and no IDs", all.DeviceRequests)
	}

	none := &container.HostConfig{}
	hostConfigModifier("/b", "/r", normalizeGPUs(nil), limits{}, true)(none)
	if len(none.DeviceRequests) != 0 {
		t.Fatalf("no GPUs requested, yet %+v", none.DeviceRequests)
	}
}

// fakeEngine answers docker info with the given runtimes; every other call panics (the
// embedded nil interface), proving the check asks nothing else.
type fakeEngine struct {
	client.APIClient
	runtimes       []string
	defaultRuntime string
}

func (f fakeEngine) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	rs := map[string]system.RuntimeWithStatus{}
	for _, r := range f.runtimes {
		rs[r] = system.RuntimeWithStatus{}
	}
	return client.SystemInfoResult{Info: system.Info{Runtimes: rs, DefaultRuntime: f.defaultRuntime}}, nil
}

func TestContainerGPUsNeedTheNVIDIARuntime(t *testing.T) {
	ctx := context.Background()
	err := checkNVIDIARuntime(ctx, fakeEngine{runtimes: []string{"runc", "io.containerd.runc.v2"}, defaultRuntime: "runc"}, []string{"GPU-aaaa"})
	if err == nil || !strings.Contains(err.Error(), "GPUs GPU-aaaa requested but the Docker engine has no NVIDIA runtime (runtimes: io.containerd.runc.v2, runc)") ||
		!strings.Contains(err.Error(), "nvidia-ctk runtime configure") {
		t.Fatalf("engine without the NVIDIA runtime: %v", err)
	}
	if err := checkNVIDIARuntime(ctx, fakeEngine{runtimes: []string{"nvidia", "runc"}}, []string{"GPU-aaaa"}); err != nil {
		t.Fatalf("engine with the nvidia runtime: %v", err)
	}
	if err := checkNVIDIARuntime(ctx, fakeEngine{runtimes: []string{"runc"}, defaultRuntime: "nvidia"}, []string{"all"}); err != nil {
		t.Fatalf("nvidia as the default runtime: %v", err)
	}
	// No GPUs: nothing to check, whatever the engine has.
	if err := checkNVIDIARuntime(ctx, fakeEngine{}, nil); err != nil {
		t.Fatal(err)
	}
}
