package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
)

// copyBundle copies a cached fixture bundle into the test's temp dir, so the test may change
// it without touching the cache other tests share.
func copyBundle(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "served.mqb")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// servedSHA256 is what /mq/v1/bundle says the server serves.
func (s *testServer) servedSHA256() string {
	s.t.Helper()
	resp, err := http.Get(s.url + "/mq/v1/bundle")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var bi struct {
		SHA string `json:"bundle_digest"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&bi); err != nil {
		s.t.Fatal(err)
	}
	return bi.SHA
}

// fileDigest computes a bundle's digest as its format defines it (native/bundle's package doc):
// the sha256 of the 56-byte prefix, which holds the header's sha256.
func fileDigest(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b[:56])
	return hex.EncodeToString(s[:])
}

// killWorker kills one worker and waits until its replacement said hello or gave up.
func (s *testServer) killWorker(t *testing.T, restarts float64) {
	t.Helper()
	pids := s.workerPIDs(t)
	if len(pids) == 0 {
		t.Fatal("no worker to kill")
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker's replacement", 30*time.Second, func() bool {
		return s.metric("qual_server_worker_restarts_total", "") == restarts
	})
}

// hashPasses counts the hashing passes over path that the server's processes reported (the
// test binary is built with the modelqual_hashtrace tag).
func (s *testServer) hashPasses(path string) int {
	return strings.Count(s.log.String(), "hashed bundle "+path+" (")
}

// TestBundleHashedOncePerStart: the frontend hashes the bundle once; every worker, the
// replacement of a killed one included, maps it on the frontend's word. (Before, the frontend
// hashed the file and every worker hashed it twice: five passes for this start.)
func TestBundleHashedOncePerStart(t *testing.T) {
	path := mockBundle(t, 0)
	s := startServer(t, path, "--workers", "2")
	if n := s.hashPasses(path); n != 1 {
		t.Errorf("a start with two workers hashed the bundle %d times, want once", n)
	}
	s.killWorker(t, 1)
	eventually(t, "two workers ready", 30*time.Second, func() bool { return s.metric("qual_server_workers_ready", "") == 2 })
	if n := s.hashPasses(path); n != 1 {
		t.Errorf("after a worker's replacement the bundle was hashed %d times, want once", n)
	}
	if n := strings.Count(s.log.String(), "mapped bundle "+path+" without hashing it"); n != 3 {
		t.Errorf("%d worker starts mapped the bundle without hashing it, want 3 (two workers and a replacement)", n)
	}
	if got, want := s.servedSHA256(), fileDigest(t, path); got != want {
		t.Errorf("/mq/v1/bundle serves digest %s, the file's is %s", got, want)
	}
}

// TestBundleChangedWhileServing: a replacement worker does not take the frontend's word for a
// file that changed since start. Touched only, it hashes the file, finds the same digest and
// serves; replaced by another bundle, it is refused with a message saying to restart.
func TestBundleChangedWhileServing(t *testing.T) {
	path := copyBundle(t, mockBundle(t, 0))
	s := startServer(t, path)
	sum := s.servedSHA256()

	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	s.killWorker(t, 1)
	eventually(t, "the replacement of a worker on a touched bundle", 30*time.Second, func() bool {
		return s.metric("qual_server_workers_ready", "") == 1
	})
	if log := s.log.String(); !strings.Contains(log, "bundle "+path+": file changed since it was verified") || s.hashPasses(path) != 2 {
		t.Errorf("the replacement did not hash the touched bundle again (%d passes in all); log:\n%s", s.hashPasses(path), log)
	}
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hello","max_tokens":2}`); st != 200 || s.servedSHA256() != sum {
		t.Fatalf("after the replacement: status %d %s, serving %s (was %s)", st, body, s.servedSHA256(), sum)
	}

	other, err := os.ReadFile(mockBundle(t, time.Millisecond)) // a valid bundle with another digest
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, other, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	s.killWorker(t, 2)
	want := "the file was replaced; restart qual-server to serve the new file"
	eventually(t, "the refusal of a worker on a replaced bundle", 30*time.Second, func() bool {
		return strings.Contains(s.log.String(), want)
	})
	if n := s.metric("qual_server_workers_ready", ""); n != 0 {
		t.Errorf("%v workers ready on a replaced bundle, want 0", n)
	}
}

// TestCorruptBundleRefusedAtStart: a bundle whose content does not match its recorded digests
// stops qual-server before it is ready, with an error naming the file, the field and what to do.
func TestCorruptBundleRefusedAtStart(t *testing.T) {
	cases := []struct {
		name   string
		bundle string
		at     func(h *bundle.Header) int64
		field  string
	}{
		// The mock bundle has no tensor data; qwen3-tiny's last tensor byte is flipped.
		{"tensor data", qwenBundle(t), func(h *bundle.Header) int64 { return h.TensorData.Offset + h.TensorData.Size - 1 },
			"header.data.chunk_sha256["},
		{"tokenizer section", mockBundle(t, 0), func(h *bundle.Header) int64 { return h.Sections[0].Offset + 10 },
			`header.data.chunk_sha256[0] mismatch`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := os.ReadFile(c.bundle)
			if err != nil {
				t.Fatal(err)
			}
			h, err := bundle.ReadHeader(bytes.NewReader(b), int64(len(b)), c.bundle)
			if err != nil {
				t.Fatal(err)
			}
			b[c.at(h)] ^= 0x01
			path := filepath.Join(t.TempDir(), "corrupt.mqb")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, serverBin, "--bundle", path, "--model-name", "m",
				"--port", strconv.Itoa(freePort(t)), "--threads", "1").CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("qual-server on a corrupt bundle: %v (context %v)\n%s", err, ctx.Err(), out)
			}
			for _, want := range []string{"bundle " + path + ": " + c.field, "the file is corrupted", "rebuild the bundle with qual bundle build"} {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if bytes.Contains(out, []byte("worker 0 ready")) {
				t.Errorf("a worker started on a corrupt bundle:\n%s", out)
			}
		})
	}
}
