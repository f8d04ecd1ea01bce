package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/modelqual/modelqual/server/envconfig"
)

// Paths and port inside the server image (server/container/build.sh).
const (
	containerBundlePath  = "/models/bundle.mqb"
	containerRecordsDir  = "/records"
	containerPort        = "8000/tcp"
	containerPortNumber  = "8000"
	preflightTimeout     = 30 * time.Second
	containerLogFileName = "server.container.log"
)

// ContainerLauncher runs the locally built qual-server image with testcontainers-go.
// Nothing is ever pulled (no registry is assumed): a missing image fails at once with the
// command that builds it. Ryuk, testcontainers' reaper, is an image from a registry too, so
// it is disabled and the Endpoint's Stop removes the container itself.
type ContainerLauncher struct{ opts []Option }

// Container returns the container launcher.
func Container(opts ...Option) *ContainerLauncher { return &ContainerLauncher{opts: opts} }

// disableRyuk turns testcontainers' reaper off unless the user chose otherwise. It must run
// before testcontainers reads its configuration (once per process).
var disableRyuk = sync.OnceFunc(func() {
	if _, set := envconfig.TestcontainersRyukDisabled.Lookup(); !set {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
})

// publishLocally points testcontainers at 127.0.0.1 for published ports when the Docker
// daemon runs on this machine (dockerd in our process table, reached through a local unix
// socket) and the user set no TESTCONTAINERS_HOST_OVERRIDE. testcontainers otherwise guesses
// the default gateway whenever /.dockerenv exists, which is wrong for a daemon inside the
// same container or VM (as on CI machines that run their own dockerd): the wait would time
// out on an address that does not answer.
var publishLocally = sync.OnceFunc(func() {
	if _, set := envconfig.TestcontainersHostOverride.Lookup(); set {
		return
	}
	if h := envconfig.DockerHost.Get(); h != "" && !strings.HasPrefix(h, "unix://") {
		return
	}
	if localDockerd() {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
})

// localDockerd reports whether a dockerd process is visible in this process namespace.
func localDockerd() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if c := e.Name()[0]; c < '0' || c > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(b)) == "dockerd" {
			return true
		}
	}
	return false
}

// DockerAvailable reports whether a Docker engine answers, with the reason when not; tests
// use it to skip with a printed reason where no engine exists.
func DockerAvailable(ctx context.Context) (bool, string) {
	disableRyuk()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return false, "docker client: " + err.Error()
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return false, "no Docker engine answers: " + err.Error()
	}
	return true, ""
}

// NVIDIARuntime reports whether the Docker engine can pass GPUs through (an "nvidia"
// runtime registered, or it being the default), and the runtimes it has.
func NVIDIARuntime(ctx context.Context, cli client.APIClient) (bool, []string, error) {
	res, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return false, nil, fmt.Errorf("docker info: %w", err)
	}
	var names []string
	has := false
	for name := range res.Info.Runtimes {
		names = append(names, name)
		if strings.Contains(name, "nvidia") {
			has = true
		}
	}
	if strings.Contains(res.Info.DefaultRuntime, "nvidia") {
		has = true
	}
	sort.Strings(names)
	return has, names, nil
}

// Start checks the image and (when GPUs are requested) the NVIDIA runtime, then runs the
// container and waits for /health within the startup timeout.
func (c *ContainerLauncher) Start(ctx context.Context) (*Endpoint, error) {
	o, err := buildOptions(c.opts)
	if err != nil {
		return nil, err
	}
	bundle, err := checkBundle("container", o.Bundle)
	if err != nil {
		return nil, err
	}
	disableRyuk()
	publishLocally()

	pre, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(pre)
	if err != nil {
		return nil, fmt.Errorf("launch container: connect to the Docker engine: %w", err)
	}
	defer cli.Close()
	gpus := normalizeGPUs(o.GPUs)
	if err := checkNVIDIARuntime(pre, cli, gpus); err != nil {
		return nil, err
	}

	if _, err := cli.ImageInspect(pre, o.Image); err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("launch container: image %s not found; run make image", o.Image)
		}
		return nil, fmt.Errorf("launch container: inspect image %s: %w", o.Image, err)
	}
	// The records file lives in a host folder mounted writable, 0750: the container's user
	// owns it. As root the folder is given to the image's unprivileged user; otherwise the
	// container runs as this process's user, who owns the folder already.
	recDir := filepath.Join(o.RunDir, "server-records")
	if err := os.MkdirAll(recDir, 0o750); err != nil {
		return nil, fmt.Errorf("launch container: %w", err)
	}
	if err := os.Chmod(recDir, 0o750); err != nil {
		return nil, fmt.Errorf("launch container: %w", err)
	}
	user := ""
	if os.Getuid() == 0 {
		if err := os.Chown(recDir, imageUID, imageUID); err != nil {
			return nil, fmt.Errorf("launch container: give the records folder to the image's user: %w", err)
		}
	} else {
		user = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	}
	logPath := filepath.Join(o.RunDir, containerLogFileName)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("launch container: %w", err)
	}
	logs := &fileConsumer{f: logFile}

	args := []string{"--bundle", containerBundlePath, "--model-name", o.Model, "--host", "0.0.0.0",
		"--port", containerPortNumber, "--records", containerRecordsDir + "/server_records.jsonl",
		"--startup-timeout", o.StartupTimeout.String()}
	if len(gpus) > 0 {
		args = append(args, "--device", "cuda")
	}
	args = append(args, o.ExtraArgs...)
	env := map[string]string{}
	for _, kv := range o.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}

	// Forced IPv4: "localhost" may resolve to ::1, where Docker's IPv6 port proxy can accept
	// and then drop connections (moby/moby#42442), so the wait would never see ready.
	health := wait.ForHTTP("/health").WithPort(containerPort).WithForcedIPv4LocalHost().
		WithStatusCodeMatcher(func(s int) bool { return s == http.StatusOK }).
		WithPollInterval(50 * time.Millisecond)
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithCmd(args...),
		testcontainers.WithExposedPorts(containerPort),
		testcontainers.WithEnv(env),
		testcontainers.WithLogConsumerConfig(&testcontainers.LogConsumerConfig{Consumers: []testcontainers.LogConsumer{logs}}),
		testcontainers.WithHostConfigModifier(hostConfigModifier(bundle, recDir, gpus, limits{memory: o.MemoryLimit, pids: o.PidsLimit}, localDaemon())),
		testcontainers.WithConfigModifier(func(c *container.Config) {
			if user != "" {
				c.User = user
			}
		}),
		testcontainers.WithWaitStrategyAndDeadline(o.StartupTimeout, health),
	}
	// Bound the whole start: the wait strategy has its deadline, and the context covers
	// creating and starting the container.
	startCtx, cancelStart := context.WithTimeout(ctx, o.StartupTimeout+preflightTimeout)
	defer cancelStart()
	ctr, runErr := testcontainers.Run(startCtx, o.Image, opts...)
	ep := &Endpoint{
		Model:       o.Model,
		Kind:        "container",
		LogPaths:    []string{logPath},
		RecordsPath: filepath.Join(recDir, "server_records.jsonl"),
		Args:        append([]string{o.Image}, args...),
		Env:         o.Env,
	}
	ep.stop = func(ctx context.Context) error {
		var errs []error
		if ctr != nil {
			grace := o.StopTimeout
			if err := ctr.Stop(ctx, &grace); err != nil {
				errs = append(errs, fmt.Errorf("stop container: %w", err))
			}
			// The consumer may miss the last lines at exit: keep the engine's full log when it
			// holds more than the consumer wrote.
			logs.close()
			if rc, err := ctr.Logs(ctx); err == nil {
				full, _ := io.ReadAll(io.LimitReader(rc, 64<<20))
				rc.Close()
				if st, err := os.Stat(logPath); err == nil && int64(len(full)) > st.Size() {
					_ = os.WriteFile(logPath, full, 0o644)
				}
			}
			if err := ctr.Terminate(ctx); err != nil {
				errs = append(errs, fmt.Errorf("remove container: %w", err))
			}
		}
		logs.close()
		return errors.Join(errs...)
	}
	if ctr != nil {
		ep.ContainerID = ctr.GetContainerID()
	}
	if runErr != nil {
		tail := ""
		if ctr != nil {
			if rc, err := ctr.Logs(ctx); err == nil {
				b, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
				rc.Close()
				if len(b) > 4096 {
					b = b[len(b)-4096:]
				}
				tail = string(b)
			}
		}
		return ep, fmt.Errorf("launch container: run %s: %w\n--- container log tail ---\n%s", o.Image, runErr, tail)
	}
	ep.BaseURL, err = ctr.PortEndpoint(ctx, containerPort, "http")
	if err != nil {
		return ep, fmt.Errorf("launch container: mapped port of %s: %w", containerPort, err)
	}
	ep.BaseURL = strings.Replace(ep.BaseURL, "://localhost:", "://127.0.0.1:", 1)
	return ep, nil
}

// checkNVIDIARuntime refuses a GPU request (gpus not empty) on an engine without the NVIDIA
// runtime, with what to do; without it Docker would reject the device request with a terse
// "could not select device driver" or, worse, a CPU image would start.
func checkNVIDIARuntime(ctx context.Context, cli client.APIClient, gpus []string) error {
	if len(gpus) == 0 {
		return nil
	}
	ok, runtimes, err := NVIDIARuntime(ctx, cli)
	if err != nil {
		return fmt.Errorf("launch container: check for the NVIDIA runtime: %w", err)
	}
	if !ok {
		return fmt.Errorf("launch container: GPUs %s requested but the Docker engine has no NVIDIA runtime (runtimes: %s); "+
			"install the NVIDIA Container Toolkit and configure Docker (nvidia-ctk runtime configure), or run without --gpus; "+
			"refusing to run on CPU silently", strings.Join(gpus, ","), strings.Join(runtimes, ", "))
	}
	return nil
}

// limits are the container's resource caps; 0 memory: none; pids: 0 the default, -1 none.
type limits struct{ memory, pids int64 }

// hostConfigModifier is the container's host configuration: the bundle mounted read-only,
// the records folder writable, a read-only root file system, every capability dropped, no
// privilege gained through setuid binaries, memory and process caps, the port published on
// 127.0.0.1 only when the Docker daemon is local (it answers this machine alone), and, when
// GPUs are requested, one device request with capability "gpu" naming the devices by ID
// (UUIDs from the go-nvml inventory, so the container gets exactly the GPUs this test process
// owns whatever the enumeration order) or Count -1 for "all".
func hostConfigModifier(bundle, recDir string, gpus []string, lim limits, loopback bool) func(*container.HostConfig) {
	return func(hc *container.HostConfig) {
		hc.Mounts = append(hc.Mounts,
			mount.Mount{Type: mount.TypeBind, Source: bundle, Target: containerBundlePath, ReadOnly: true},
			mount.Mount{Type: mount.TypeBind, Source: recDir, Target: containerRecordsDir},
		)
		hc.ReadonlyRootfs = true
		hc.CapDrop = []string{"ALL"}
		hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
		pids := lim.pids
		if pids == 0 {
			pids = DefaultPidsLimit
		}
		hc.PidsLimit = &pids
		if lim.memory > 0 {
			hc.Memory = lim.memory
			hc.MemorySwap = lim.memory // no swap beyond the cap
		}
		if loopback {
			// testcontainers keeps bindings given here for exposed ports (HostPort "" becomes
			// an ephemeral port).
			hc.PortBindings = network.PortMap{network.MustParsePort(containerPort): {{HostIP: netip.MustParseAddr("127.0.0.1")}}}
		}
		if len(gpus) > 0 {
			dr := container.DeviceRequest{Capabilities: [][]string{{"gpu"}}} // as docker run --gpus builds it
			if len(gpus) == 1 && gpus[0] == "all" {
				dr.Count = -1
			} else {
				dr.DeviceIDs = append([]string(nil), gpus...)
			}
			hc.DeviceRequests = append(hc.DeviceRequests, dr)
		}
	}
}

// imageUID is the unprivileged user the server image runs as (server/container/Dockerfile).
const imageUID = 65532

// localDaemon reports whether the Docker daemon is reached through a local unix socket, so a
// port it publishes on 127.0.0.1 is this machine's loopback.
func localDaemon() bool {
	h := envconfig.DockerHost.Get()
	return h == "" || strings.HasPrefix(h, "unix://")
}

// normalizeGPUs splits comma lists and drops empties; "all" stands alone.
func normalizeGPUs(in []string) []string {
	var out []string
	for _, g := range in {
		for _, p := range strings.Split(g, ",") {
			if p = strings.TrimSpace(p); p != "" {
				if p == "all" {
					return []string{"all"}
				}
				out = append(out, p)
			}
		}
	}
	return out
}

// fileConsumer writes container log lines to a file as they arrive.
type fileConsumer struct {
	mu sync.Mutex
	f  *os.File
}

func (c *fileConsumer) Accept(l testcontainers.Log) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		_, _ = c.f.Write(l.Content)
	}
}

func (c *fileConsumer) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}
