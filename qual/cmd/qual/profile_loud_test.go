package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelqual/modelqual/qual/launch/launchtest"
)

// captureStderr runs f with os.Stderr redirected and returns what it printed.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	f()
	w.Close()
	os.Stderr = old
	return string(<-done)
}

// failingServer is an OpenAI-shaped server whose completions fail: every one with 400, or
// (half) every second one with 500. /health and /v1/models answer so the external launcher
// accepts it.
func failingServer(t *testing.T, half bool) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(200)
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			io.Copy(io.Discard, r.Body)
			if half && n.Add(1)%2 == 0 {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
				return
			}
			code, typ := 400, "invalid_request_error"
			if half {
				code, typ = 500, "server_error"
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, `{"error":{"message":"refused by the test server","type":"`+typ+`","param":null,"code":null}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runProfileExternal(t *testing.T, url, out string, extra ...string) (code int, stderr string) {
	args := append([]string{"--url", url, "--model", "m", "--tokenizer", launchtest.TokenizerDir(t, "gpt2"),
		"--input-tokens-mean", "8", "--num-prompts", "4", "--concurrency", "2", "--requests", "10",
		"--out", out, "--no-progress", "--source-root", "none"}, extra...)
	stderr = captureStderr(t, func() {
		captureStdout(t, func() { code = runProfile(args) })
	})
	return code, stderr
}

func TestProfileAllFailedExitsNonZero(t *testing.T) {
	srv := failingServer(t, false)
	code, stderr := runProfileExternal(t, srv.URL, t.TempDir())
	if code == 0 || !strings.Contains(stderr, "0 of 10 requests succeeded") || !strings.Contains(stderr, "400") {
		t.Fatalf("exit %d, stderr:\n%s\nwant non-zero with \"0 of 10 requests succeeded\" and the 400", code, stderr)
	}
}

func TestProfileMaxErrorRate(t *testing.T) {
	srv := failingServer(t, true)
	code, stderr := runProfileExternal(t, srv.URL, t.TempDir(), "--max-error-rate", "0.2")
	if code == 0 || !strings.Contains(stderr, "5 of 10 requests failed") || !strings.Contains(stderr, "--max-error-rate 0.2") {
		t.Fatalf("exit %d, stderr:\n%s\nwant non-zero naming 5 of 10 failed over --max-error-rate 0.2", code, stderr)
	}
	// The same run within a looser limit passes.
	if code, stderr := runProfileExternal(t, srv.URL, t.TempDir(), "--max-error-rate", "0.6"); code != 0 {
		t.Fatalf("exit %d within the limit: %s", code, stderr)
	}
}

func TestProfileDeadURLNamesIt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	code, stderr := runProfileExternal(t, dead, t.TempDir())
	if code == 0 || !strings.Contains(stderr, dead) || !strings.Contains(stderr, "nothing accepts connections") {
		t.Fatalf("exit %d, stderr:\n%s\nwant a failure naming %s", code, stderr, dead)
	}
}

func TestProfileRefusesExistingOut(t *testing.T) {
	srv := failingServer(t, true)
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "profile_export.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stderr := runProfileExternal(t, srv.URL, out)
	if code == 0 || !strings.Contains(stderr, "already holds a run") || !strings.Contains(stderr, "--overwrite") {
		t.Fatalf("exit %d, stderr:\n%s\nwant a refusal naming --overwrite", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "profile_export.jsonl")); string(b) != "{}\n" {
		t.Errorf("the existing run was touched: %q", b)
	}
	if code, stderr := runProfileExternal(t, srv.URL, out, "--overwrite"); code != 0 {
		t.Fatalf("--overwrite: exit %d: %s", code, stderr)
	}
}
