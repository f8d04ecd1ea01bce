package launch_test

import (
	"context"
	"github.com/modelqual/modelqual/fixtures"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
)

// needDocker skips, saying why, only where no Docker engine exists.
func needDocker(t *testing.T) {
	t.Helper()
	if ok, why := launch.DockerAvailable(context.Background()); !ok {
		t.Skipf("container launcher tests need a Docker engine: %s", why)
	}
}

func TestContainerMissingImageFailsFast(t *testing.T) {
	needDocker(t)
	start := time.Now()
	ep, err := launch.Container(launch.WithBundle(launchtest.MockBundle(t, 0)), launch.WithImage("modelqual/qual-server:no-such-tag"),
		launch.WithRunDir(t.TempDir())).Start(context.Background())
	if ep != nil {
		defer ep.Stop(context.Background())
	}
	if err == nil || !strings.Contains(err.Error(), "image modelqual/qual-server:no-such-tag not found; run make image") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("missing image took %v to report; nothing may be pulled", d)
	}
}

func TestContainerGPUsWithoutNVIDIARuntime(t *testing.T) {
	needDocker(t)
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	has, runtimes, err := launch.NVIDIARuntime(context.Background(), cli)
	if err != nil {
		t.Fatal(err)
	}
	if has {
		t.Skipf("this engine has an NVIDIA runtime (%v); the refusal cannot be shown here", runtimes)
	}
	_, err = launch.Container(launch.WithBundle(launchtest.MockBundle(t, 0)), launch.WithGPUs("0,1"),
		launch.WithRunDir(t.TempDir())).Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "GPUs 0,1 requested but the Docker engine has no NVIDIA runtime") ||
		!strings.Contains(err.Error(), "refusing to run on CPU silently") {
		t.Fatalf("err = %v", err)
	}
}

// ensureImage builds the server image the way make image does when it is missing.
func ensureImage(t *testing.T) {
	t.Helper()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.ImageInspect(context.Background(), launch.DefaultImage); err == nil {
		return
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "server", "container", "build.sh")
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("image %s is missing and %s cannot build it: %v", launch.DefaultImage, script, err)
	}
	bin := launchtest.ServerBin(t)
	cmd := exec.Command(script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "MODELQUAL_BIN="+filepath.Dir(bin))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

func TestContainerLauncherServesImage(t *testing.T) {
	needDocker(t)
	ensureImage(t)
	dir := t.TempDir()
	ep, err := launch.Container(launch.WithBundle(launchtest.MockBundle(t, 0)), launch.WithModel("mock"),
		launch.WithRunDir(dir), launch.WithStartupTimeout(60*time.Second),
		launch.WithMemoryLimit(1<<30), launch.WithPidsLimit(512)).Start(context.Background())
	if ep != nil {
		t.Cleanup(func() {
			if err := ep.Stop(context.Background()); err != nil {
				t.Errorf("stop container: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if ep.Kind != "container" || ep.ContainerID == "" {
		t.Fatalf("endpoint %+v", ep)
	}
	checkHardened(t, ep, 1<<30, 512)
	if code, body := get(t, ep.BaseURL+"/v1/models"); code != 200 || !strings.Contains(body, `"mock"`) {
		t.Fatalf("/v1/models %d %s", code, body)
	}
	resp, err := httpPost(ep.BaseURL+"/v1/completions", `{"model":"mock","prompt":"hi","max_tokens":4,"ignore_eos":true}`, "ctr-req-1")
	if err != nil || resp != 200 {
		t.Fatalf("completion: %d %v", resp, err)
	}
	if err := ep.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := os.ReadFile(ep.RecordsPath)
	if err != nil || !strings.Contains(string(recs), "ctr-req-1") {
		t.Fatalf("records from the writable mount: %v %s", err, recs)
	}
	if b, err := os.ReadFile(ep.LogPaths[0]); err != nil || len(b) == 0 {
		t.Errorf("container log not captured: %v", err)
	}
}

// checkHardened inspects the running container: published on 127.0.0.1 only, every
// capability dropped, no new privileges, read-only root, the memory and pids caps asked for,
// and the records folder 0750.
func checkHardened(t *testing.T, ep *launch.Endpoint, memory, pids int64) {
	t.Helper()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	res, err := cli.ContainerInspect(context.Background(), ep.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hc := res.Container.HostConfig
	if hc == nil {
		t.Fatal("container has no host config")
	}
	if !reflect.DeepEqual(hc.CapDrop, []string{"ALL"}) || !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || !hc.ReadonlyRootfs {
		t.Errorf("cap-drop %v, security-opt %v, read-only root %v; want ALL, no-new-privileges, true", hc.CapDrop, hc.SecurityOpt, hc.ReadonlyRootfs)
	}
	if hc.Memory != memory || hc.PidsLimit == nil || *hc.PidsLimit != pids {
		t.Errorf("memory %d, pids limit %v; want %d and %d", hc.Memory, hc.PidsLimit, memory, pids)
	}
	for port, binds := range hc.PortBindings {
		for _, b := range binds {
			if b.HostIP.String() != "127.0.0.1" {
				t.Errorf("port %v published on %q, want 127.0.0.1 only", port, b.HostIP)
			}
		}
	}
	if len(hc.PortBindings) == 0 {
		t.Error("no port published")
	}
	fi, err := os.Stat(filepath.Dir(ep.RecordsPath))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("records folder: %v, mode %v; want 0750", err, fi.Mode().Perm())
	}
}
