package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/server/envconfig"
)

// ProcessLauncher starts qual-server (ServerBin) as a child process on a free loopback port.
type ProcessLauncher struct{ opts []Option }

// Process returns the default launcher: a local qual-server process.
func Process(opts ...Option) *ProcessLauncher { return &ProcessLauncher{opts: opts} }

// ServerBin resolves the qual-server binary: the one next to the running executable (an
// installed or unpacked qual and qual-server sit together: make build, go install, make
// dist), else $MODELQUAL_BIN/qual-server, else qual-server on PATH, else <repo>/bin/qual-server
// of the checkout around the working directory (go test, go run). When none exists it
// returns the first place looked, and Start's error lists them all (ServerBinCandidates).
func ServerBin() string {
	cands := ServerBinCandidates()
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c
		}
	}
	if len(cands) == 0 {
		return "qual-server"
	}
	return cands[0]
}

// ServerBinCandidates lists where ServerBin looks, in order.
func ServerBinCandidates() []string {
	var out []string
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		out = append(out, filepath.Join(filepath.Dir(exe), "qual-server"))
	}
	if d := envconfig.Bin.Get(); d != "" {
		out = append(out, filepath.Join(d, "qual-server"))
	}
	if p, err := exec.LookPath("qual-server"); err == nil {
		out = append(out, p)
	}
	if root, err := fixtures.RepoRoot(); err == nil {
		out = append(out, filepath.Join(root, "bin", "qual-server"))
	}
	return out
}

// freePort asks the kernel for an unused loopback port. Another process could take it
// before the server binds; Start then fails with the server's own bind error in the log
// tail, which names the port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start launches the server and waits for /health to report ready.
func (p *ProcessLauncher) Start(ctx context.Context) (*Endpoint, error) {
	o, err := buildOptions(p.opts)
	if err != nil {
		return nil, err
	}
	if o.Bundle, err = checkBundle("process", o.Bundle); err != nil {
		return nil, err
	}
	bin := o.ServerBin
	if bin == "" {
		bin = ServerBin()
	}
	if _, err := os.Stat(bin); err != nil {
		where := bin
		if o.ServerBin == "" {
			where = strings.Join(ServerBinCandidates(), ", ")
		}
		return nil, fmt.Errorf("launch process: no qual-server binary (looked at %s: %w); put qual-server next to qual (make build, make dist), set MODELQUAL_BIN to its folder, or add it to PATH", where, err)
	}
	var gpuEnv []string
	if gpus := normalizeGPUs(o.GPUs); len(gpus) > 0 {
		// A GPU run without a driver must fail here, not fall back to the CPU engine.
		if err := gpu.Require(gpu.Inspect()); err != nil {
			return nil, fmt.Errorf("launch process: %w", err)
		}
		o.ExtraArgs = append([]string{"--device", "cuda"}, o.ExtraArgs...)
		if gpus[0] != "all" {
			gpuEnv = append(gpuEnv, "CUDA_VISIBLE_DEVICES="+strings.Join(gpus, ","))
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("launch process: find a free port: %w", err)
	}
	recordsPath := filepath.Join(o.RunDir, "server_records.jsonl")
	args := []string{"--bundle", o.Bundle, "--model-name", o.Model, "--host", "127.0.0.1",
		"--port", strconv.Itoa(port), "--records", recordsPath,
		"--startup-timeout", o.StartupTimeout.String()}
	args = append(args, o.ExtraArgs...)
	stdoutPath := filepath.Join(o.RunDir, "server.stdout.log")
	stderrPath := filepath.Join(o.RunDir, "server.stderr.log")
	stdout, err := os.Create(stdoutPath)
	if err != nil {
		return nil, fmt.Errorf("launch process: %w", err)
	}
	stderr, err := os.Create(stderrPath)
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("launch process: %w", err)
	}
	// The server must outlive ctx (which only bounds the start), so it is not tied to it.
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = append(append(os.Environ(), gpuEnv...), o.Env...)
	// Own process group, so a stop also reaches workers that ignored the parent's death.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Pdeathsig fires when the OS thread that started the child exits, not the process;
	// so the child is started from a goroutine locked to its thread until the child exits,
	// and the server dies with the harness but never because Go retired a thread.
	exited := make(chan struct{})
	started := make(chan error, 1)
	var waitErr error
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waitErr = cmd.Wait()
		stdout.Close()
		stderr.Close()
		close(exited)
	}()
	if err := <-started; err != nil {
		stdout.Close()
		stderr.Close()
		return nil, fmt.Errorf("launch process: start %s: %w", bin, err)
	}
	ep := &Endpoint{
		BaseURL:     "http://127.0.0.1:" + strconv.Itoa(port),
		Model:       o.Model,
		Kind:        "process",
		LogPaths:    []string{stdoutPath, stderrPath},
		RecordsPath: recordsPath,
		PID:         cmd.Process.Pid,
		Args:        append([]string{bin}, args...),
		Env:         append(gpuEnv, o.Env...),
	}
	ep.stop = func(ctx context.Context) error {
		return stopProcess(ctx, cmd.Process, exited, &waitErr, o.StopTimeout, stderrPath)
	}
	if err := waitReady(ctx, ep.BaseURL, o.StartupTimeout, exited, "", false); err != nil {
		if errors.Is(err, errExited) {
			<-exited
			err = fmt.Errorf("%w (%v)", err, waitErr)
		}
		return ep, fmt.Errorf("launch process: %s %s: %w\n--- server log tail (%s) ---\n%s",
			bin, strings.Join(args, " "), err, stderrPath, logTail(stderrPath, stdoutPath))
	}
	return ep, nil
}

// stopProcess sends SIGTERM to the server, waits up to grace (or ctx), then SIGKILLs the
// whole process group. A server that exits non-zero after SIGTERM is reported, because the
// SIGTERM drain is part of what is qualified.
func stopProcess(ctx context.Context, p *os.Process, exited chan struct{}, waitErr *error, grace time.Duration, logPath string) error {
	select {
	case <-exited:
		return exitError(*waitErr, logPath)
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
		// Reap workers that might be left in the group.
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		return exitError(*waitErr, logPath)
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	<-exited
	return fmt.Errorf("stop server pid %d: no exit within %v of SIGTERM; killed (log: %s)", p.Pid, grace, logPath)
}

func exitError(err error, logPath string) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("server exited on signal %v (log: %s)", ws.Signal(), logPath)
		}
	}
	return fmt.Errorf("server exited: %w (log: %s)", err, logPath)
}

var errExited = errors.New("server exited before it was ready")

// waitReady polls /health until it reports ready (or, with allowModels, /v1/models answers
// 200, for servers without /health), the process exits, or the timeout passes.
func waitReady(ctx context.Context, base string, timeout time.Duration, exited <-chan struct{}, apiKey string, allowModels bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	last := "no answer yet"
	delay := 10 * time.Millisecond
	for {
		ready, why := probe(ctx, hc, base, apiKey, allowModels)
		if ready {
			return nil
		}
		last = why
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("%w after %v at %s (last: %s); raise the startup timeout or check the log", ErrNotReady, timeout, base, last)
		case <-time.After(delay):
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}

func probe(ctx context.Context, hc *http.Client, base, apiKey string, allowModels bool) (bool, string) {
	get := func(path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return 0, nil, err
		}
		if apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, b, nil
	}
	code, body, err := get("/health")
	if err != nil {
		return false, "GET /health: " + err.Error()
	}
	if code == http.StatusOK {
		var h struct {
			Status string `json:"status"`
		}
		// qual-server says {"status":"ready"}; other servers answer 200 with anything.
		if json.Unmarshal(body, &h) != nil || h.Status == "" || h.Status == "ready" || h.Status == "ok" {
			return true, ""
		}
		return false, fmt.Sprintf("GET /health: 200 %s", bytes.TrimSpace(body))
	}
	why := fmt.Sprintf("GET /health: %d %s", code, bytes.TrimSpace(body))
	if allowModels && code == http.StatusNotFound {
		mc, mb, err := get("/v1/models")
		if err == nil && mc == http.StatusOK {
			return true, ""
		}
		if err != nil {
			why += "; GET /v1/models: " + err.Error()
		} else {
			why += fmt.Sprintf("; GET /v1/models: %d %s", mc, bytes.TrimSpace(mb))
		}
	}
	return false, why
}

// logTail returns the last lines of the first non-empty log.
func logTail(paths ...string) string {
	const maxBytes = 4096
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if len(b) > maxBytes {
			b = b[len(b)-maxBytes:]
		}
		return string(b)
	}
	return "(server logs are empty)"
}
