package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/server/envconfig"
)

// The tests run the real qual-server binary (frontend and worker processes over the native
// engine), built once by TestMain, against the mock bundle and the qwen3-tiny fixture bundle.
var (
	raceBuild bool // set by race_test.go under -race
	serverBin string
	cacheDir  string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "qual-server-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	serverBin = filepath.Join(dir, "qual-server")
	// modelqual_hashtrace: each hashing pass over a bundle is a line on stderr (counted by
	// TestBundleHashedOncePerStart); nothing else differs from the production binary.
	args := []string{"build", "-tags", "modelqual_hashtrace", "-o", serverBin}
	if raceBuild {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "github.com/modelqual/modelqual/server/cmd/qual-server")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build qual-server: %v\n", err)
		return 1
	}
	cacheDir = envconfig.Cache.Get()
	if cacheDir == "" {
		cacheDir = fixtures.DefaultCacheDir()
	}
	code := m.Run()
	stopSharedServers()
	return code
}

var bundleMu sync.Mutex

func mockBundle(t testing.TB, delay time.Duration) string {
	t.Helper()
	bundleMu.Lock()
	defer bundleMu.Unlock()
	p, err := fixtures.MockBundle(cacheDir, delay)
	if err != nil {
		t.Fatalf("mock bundle: %v", err)
	}
	return p
}

func qwenBundle(t testing.TB) string {
	t.Helper()
	bundleMu.Lock()
	defer bundleMu.Unlock()
	p, err := fixtures.Bundle(cacheDir, fixtures.Qwen3Tiny)
	if err != nil {
		t.Fatalf("qwen3-tiny bundle: %v", err)
	}
	return p
}

// syncBuffer collects a process's log for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testServer struct {
	t       testing.TB
	url     string
	model   string
	cmd     *exec.Cmd
	log     *syncBuffer
	records string
	exited  chan struct{}
	exitErr error
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServer runs qual-server on bundle and waits for /health to say ready.
func startServer(t testing.TB, bundlePath string, args ...string) *testServer {
	t.Helper()
	port := freePort(t)
	s := &testServer{t: t, model: "test-model", log: &syncBuffer{}, exited: make(chan struct{}),
		url: fmt.Sprintf("http://127.0.0.1:%d", port), records: filepath.Join(t.TempDir(), "records.jsonl")}
	full := append([]string{"--bundle", bundlePath, "--model-name", s.model, "--port", strconv.Itoa(port),
		"--records", s.records, "--threads", "1"}, args...)
	s.cmd = exec.Command(serverBin, full...)
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	// A test binary that dies (timeout, ^C) takes its servers with it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start qual-server: %v", err)
	}
	go func() { s.exitErr = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.stop()
		if strings.Contains(s.log.String(), "WARNING: DATA RACE") {
			t.Error("qual-server reported a data race")
		}
		if t.Failed() {
			t.Logf("qual-server log:\n%s", s.log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.url + "/health")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.Contains(string(body), `"ready"`) {
				return s
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("qual-server exited before ready: %v\n%s", s.exitErr, s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("qual-server not ready after 60 s\n%s", s.log.String())
		}
	}
}

// stop sends SIGTERM and waits for exit (killing after 20 s).
func (s *testServer) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// post sends a JSON body and returns status, headers and body.
func (s *testServer) post(path, body string, hdr ...string) (int, http.Header, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("POST %s: read body: %v", path, err)
	}
	return resp.StatusCode, resp.Header, b
}

var metricLine = regexp.MustCompile(`(?m)^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$`)

// metric reads one series (name plus optional exact label set) from /metrics.
func (s *testServer) metric(name, labels string) float64 {
	s.t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		s.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, m := range metricLine.FindAllStringSubmatch(string(b), -1) {
		if m[1] == name && m[2] == labels {
			v, _ := strconv.ParseFloat(m[3], 64)
			return v
		}
	}
	return 0
}

// eventually polls cond (server state, not elapsed time, is what tests assert on).
func eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type serverRecord struct {
	RequestID    string `json:"request_id"`
	TTFTNs       int64  `json:"ttft_ns"`
	Route        string `json:"route"`
	Status       int    `json:"status"`
	Stream       bool   `json:"stream"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	FinishReason string `json:"finish_reason"`
	ErrorType    string `json:"error_type"`
	TaskWallNs   int64  `json:"task_wall_ns"`
	TaskTTFTNs   int64  `json:"task_ttft_ns"`
	QueueWaitNs  int64  `json:"queue_wait_ns"`
	HTTPLatency  int64  `json:"http_latency_ns"`
	PromptSHA    string `json:"prompt_sha256"`
	OutputSHA    string `json:"output_sha256"`
	OutputBytes  int    `json:"output_bytes"`
	WorkerID     int    `json:"worker_id"`
}

func (s *testServer) readRecords() []serverRecord {
	s.t.Helper()
	f, err := os.Open(s.records)
	if err != nil {
		s.t.Fatalf("records: %v", err)
	}
	defer f.Close()
	var out []serverRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r serverRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			s.t.Fatalf("record line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// sseEvents reads an SSE body into the data payloads of its events, checking the framing:
// every event is "data: <payload>" followed by a blank line.
func sseEvents(t testing.TB, r io.Reader) []string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return parseSSE(t, string(b))
}

func parseSSE(t testing.TB, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", tail(body))
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed SSE event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

func tail(s string) string {
	if len(s) > 200 {
		return "..." + s[len(s)-200:]
	}
	return s
}

// openStream starts a streaming request and returns the response once headers arrived.
func (s *testServer) openStream(ctx context.Context, path, body string, hdr ...string) *http.Response {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// readEvent reads one SSE event's data from r.
func readEvent(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	blank, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if blank != "\n" {
		return "", fmt.Errorf("event %q not followed by a blank line", line)
	}
	return strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n"), nil
}
