// Package launchtest gives harness tests what they need to run against a real qual-server:
// the server binary (built once per test process from this checkout, into a per-process folder
// that later processes remove once it has ended, unless MODELQUAL_BIN holds one) and the
// fixture bundles (mock, qwen3-tiny) from the content-keyed cache.
// It is imported only by tests.
package launchtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/server/envconfig"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// ServerBin returns a qual-server binary: $MODELQUAL_BIN/qual-server when that variable is
// set (make test builds it first), else one built from this checkout into a temporary
// folder, once per test process, so tests never run a stale binary.
func ServerBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if d := envconfig.Bin.Get(); d != "" {
			binPath = filepath.Join(d, "qual-server")
			if _, err := os.Stat(binPath); err != nil {
				binErr = fmt.Errorf("MODELQUAL_BIN=%s but %v; run make build", d, err)
			}
			return
		}
		root, err := fixtures.RepoRoot()
		if err != nil {
			binErr = err
			return
		}
		dir, err := processBinDir()
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "qual-server")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "./server/cmd/qual-server")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./server/cmd/qual-server: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("qual-server binary: %v", binErr)
	}
	return binPath
}

// processBinDir returns this test process's folder for built binaries,
// $TMPDIR/modelqual-test-bin/<pid>, after removing the folders of processes that have ended:
// a test process has no exit hook to remove its own, and each holds a 20+ MB binary.
func processBinDir() (string, error) {
	parent := filepath.Join(os.TempDir(), "modelqual-test-bin")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		os.RemoveAll(filepath.Join(parent, e.Name()))
	}
	dir := filepath.Join(parent, strconv.Itoa(os.Getpid()))
	return dir, os.MkdirAll(dir, 0o755)
}

// alive reports whether process pid exists (signal 0 delivers nothing; where signals do not
// exist the answer is yes, so nothing is removed).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	switch err = p.Signal(syscall.Signal(0)); {
	case err == nil:
		return true
	case errors.Is(err, os.ErrProcessDone), errors.Is(err, syscall.ESRCH):
		return false
	default: // EPERM (someone else's process), or no signals here
		return true
	}
}

// MockBundle returns the mock bundle with the given per-step delay.
func MockBundle(t testing.TB, stepDelay time.Duration) string {
	t.Helper()
	p, err := fixtures.MockBundle("", stepDelay)
	if err != nil {
		t.Fatalf("mock bundle: %v", err)
	}
	return p
}

// Bundle returns the bundle of a fixture (e.g. "qwen3-tiny").
func Bundle(t testing.TB, name string) string {
	t.Helper()
	p, err := fixtures.Bundle("", name)
	if err != nil {
		t.Fatalf("bundle %s: %v", name, err)
	}
	return p
}

// TokenizerDir is the fixture tokenizer folder of a family ("gpt2", "qwen3").
func TokenizerDir(t testing.TB, family string) string {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "fixtures", "tokenizers", family)
}

// Start launches a qual-server process on bundle and registers its Stop (which must
// succeed: a clean SIGTERM drain) as test cleanup the moment it started.
func Start(t testing.TB, bundle string, opts ...launch.Option) *launch.Endpoint {
	t.Helper()
	all := append([]launch.Option{launch.WithBundle(bundle), launch.WithServerBin(ServerBin(t)),
		launch.WithModel("mock"), launch.WithRunDir(t.TempDir()), launch.WithStartupTimeout(60 * time.Second)}, opts...)
	ep, err := launch.Process(all...).Start(context.Background())
	if ep != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := ep.Stop(ctx); err != nil {
				t.Errorf("stop server: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start qual-server: %v", err)
	}
	return ep
}
