// Package launch starts the serving stack under qualification and hands back an Endpoint
// (base URL, model, logs, records, Stop). Three launchers share one interface: a local
// qual-server process (the default, needs nothing), a testcontainers-go container built from
// the local image (GPUs passed through by device ID), and an external URL (any
// OpenAI-compatible server). The harness talks to what it launched only over HTTP.
//
// Every launcher returns the partly built Endpoint together with its error, in the style of
// testcontainers-go, so a caller can register cleanup the moment anything started:
//
//	ep, err := launcher.Start(ctx)
//	if ep != nil {
//		DeferCleanup(ep.Stop)
//	}
//	if err != nil { ... }
package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Launcher starts a server and returns where it listens. On error the returned Endpoint,
// when not nil, still owns whatever was started and must be stopped by the caller.
type Launcher interface {
	Start(ctx context.Context) (*Endpoint, error)
}

// Endpoint is a started (or reached) server.
type Endpoint struct {
	// BaseURL is the server root without a trailing slash, e.g. http://127.0.0.1:40123;
	// OpenAI routes live under BaseURL+"/v1".
	BaseURL string
	// Model is the model name to send in requests.
	Model string
	// Kind is the launcher that made it: "process", "container" or "external".
	Kind string
	// LogPaths are the files holding the server's output (stdout, stderr or container logs),
	// kept as run artifacts. Empty for external servers.
	LogPaths []string
	// RecordsPath is the server's JSONL request-records file, or "" when the server does not
	// write records the harness can read (external servers).
	RecordsPath string
	// PID is the server process id for the process launcher (for /proc CPU accounting), else 0.
	PID int
	// ContainerID is the Docker container id for the container launcher, else "".
	ContainerID string
	// Args are the server flags used, recorded in the run's environment record.
	Args []string
	// Env are the extra environment variables passed to the server (KEY=VALUE).
	Env []string

	stopOnce sync.Once
	stopErr  error
	stop     func(ctx context.Context) error
}

// Stop shuts the server down (gracefully first) and releases everything the launcher made.
// It is safe to call more than once and on a nil Endpoint; later calls return the first
// result. For an external server it does nothing.
func (e *Endpoint) Stop(ctx context.Context) error {
	if e == nil {
		return nil
	}
	e.stopOnce.Do(func() {
		if e.stop != nil {
			e.stopErr = e.stop(ctx)
		}
	})
	return e.stopErr
}

// Options configure every launcher. Zero values take the documented defaults.
type Options struct {
	// Bundle is the .mqb file to serve (process and container launchers).
	Bundle string
	// Model is the served model name (--model-name); default "model".
	Model string
	// RunDir receives logs and the records file; default a new temporary directory.
	RunDir string
	// StartupTimeout bounds the wait for /health to report ready; default 60s.
	StartupTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL; default 10s.
	StopTimeout time.Duration
	// ServerBin is the qual-server binary; default ServerBin(): next to the running
	// executable, else in $MODELQUAL_BIN, else on PATH, else <repo>/bin.
	ServerBin string
	// ExtraArgs are appended to the server flags (e.g. --workers 2, --max-batch 64).
	ExtraArgs []string
	// Env are extra KEY=VALUE variables for the server, e.g. MODELQUAL_FAULTS=server.drop_record.
	Env []string
	// Image is the container image; default modelqual/qual-server:dev.
	Image string
	// GPUs selects GPUs: nil for none, []string{"all"} for all, or device IDs ("0", "1" or
	// UUIDs). The container launcher passes them through by device ID (an engine without the
	// NVIDIA runtime is an error); the process launcher sets CUDA_VISIBLE_DEVICES and
	// --device cuda (a machine without an NVIDIA driver is an error). Never a silent CPU run.
	GPUs []string
	// URL is the external server's base URL (external launcher).
	URL string
	// APIKey is sent as a bearer token when waiting on an external server.
	APIKey string
	// MemoryLimit caps the container's memory in bytes (docker run --memory); 0: no cap.
	MemoryLimit int64
	// PidsLimit caps the container's processes and threads (docker run --pids-limit); default
	// DefaultPidsLimit, -1: no cap.
	PidsLimit int64
}

// DefaultPidsLimit is the container's default process-and-thread cap: qual-server's frontend
// and workers with their engine threads need some hundreds on a large machine; a fork bomb or
// thread leak stops here instead of at the host's limit.
const DefaultPidsLimit = 4096

// Option changes Options; the constructors apply defaults first, then options.
type Option func(*Options)

// WithBundle sets the bundle file to serve.
func WithBundle(path string) Option { return func(o *Options) { o.Bundle = path } }

// WithModel sets the served model name.
func WithModel(name string) Option { return func(o *Options) { o.Model = name } }

// WithRunDir sets where logs and records go.
func WithRunDir(dir string) Option { return func(o *Options) { o.RunDir = dir } }

// WithStartupTimeout bounds the wait for readiness (from the family manifest).
func WithStartupTimeout(d time.Duration) Option { return func(o *Options) { o.StartupTimeout = d } }

// WithStopTimeout sets the SIGTERM grace period before SIGKILL.
func WithStopTimeout(d time.Duration) Option { return func(o *Options) { o.StopTimeout = d } }

// WithServerBin sets the qual-server binary path.
func WithServerBin(path string) Option { return func(o *Options) { o.ServerBin = path } }

// WithArgs appends server flags.
func WithArgs(args ...string) Option {
	return func(o *Options) { o.ExtraArgs = append(o.ExtraArgs, args...) }
}

// WithEnv adds KEY=VALUE environment variables for the server.
func WithEnv(kv ...string) Option { return func(o *Options) { o.Env = append(o.Env, kv...) } }

// WithFaults passes MODELQUAL_FAULTS (comma-separated fault names) to the server.
func WithFaults(faults string) Option {
	return func(o *Options) {
		if faults != "" {
			o.Env = append(o.Env, "MODELQUAL_FAULTS="+faults)
		}
	}
}

// WithImage sets the container image.
func WithImage(image string) Option { return func(o *Options) { o.Image = image } }

// WithGPUs requests GPUs for the container launcher ("all" or device IDs).
func WithGPUs(ids ...string) Option { return func(o *Options) { o.GPUs = append(o.GPUs, ids...) } }

// WithURL sets the external server URL.
func WithURL(url string) Option { return func(o *Options) { o.URL = url } }

// WithMemoryLimit caps the container's memory in bytes (container launcher).
func WithMemoryLimit(bytes int64) Option { return func(o *Options) { o.MemoryLimit = bytes } }

// WithPidsLimit caps the container's processes and threads (container launcher); -1: none.
func WithPidsLimit(n int64) Option { return func(o *Options) { o.PidsLimit = n } }

// WithAPIKey sets the bearer token for an external server.
func WithAPIKey(key string) Option { return func(o *Options) { o.APIKey = key } }

// DefaultImage is the locally built server image (make image).
const DefaultImage = "modelqual/qual-server:dev"

func buildOptions(opts []Option) (Options, error) {
	o := Options{
		Model:          "model",
		StartupTimeout: 60 * time.Second,
		StopTimeout:    10 * time.Second,
		Image:          DefaultImage,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.RunDir == "" {
		d, err := os.MkdirTemp("", "modelqual-run-")
		if err != nil {
			return o, fmt.Errorf("launch: create run directory: %w", err)
		}
		o.RunDir = d
	}
	if err := os.MkdirAll(o.RunDir, 0o755); err != nil {
		return o, fmt.Errorf("launch: create run directory %s: %w", o.RunDir, err)
	}
	abs, err := filepath.Abs(o.RunDir)
	if err != nil {
		return o, fmt.Errorf("launch: run directory %s: %w", o.RunDir, err)
	}
	o.RunDir = abs
	return o, nil
}

// New returns the launcher of the given kind: "process" (default when kind is ""),
// "container" or "external".
func New(kind string, opts ...Option) (Launcher, error) {
	switch kind {
	case "", "process":
		return Process(opts...), nil
	case "container":
		return Container(opts...), nil
	case "external":
		return External(opts...), nil
	}
	return nil, fmt.Errorf("launch: unknown launcher %q; use process, container or external", kind)
}

// checkBundle resolves the bundle path for the launcher kind, with an error saying what to do.
func checkBundle(kind, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("launch %s: no bundle; pass WithBundle (qual profile --bundle FILE)", kind)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("launch %s: bundle %s: %w", kind, path, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("launch %s: bundle: %w; build one with qual bundle build", kind, err)
	}
	return abs, nil
}

// ErrNotReady is wrapped by start errors when the server never reported ready in time.
var ErrNotReady = errors.New("server not ready")
