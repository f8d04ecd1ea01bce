package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfileRetryAfterFailedRun: a failed run does not block the retry into the same --out:
// it is kept beside it as OUT.failed-<time> with FAILED saying why, and the retry, against a
// server that answers, writes --out.
func TestProfileRetryAfterFailedRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	code, stderr := runProfileExternal(t, failingServer(t, false).URL, out)
	if code == 0 {
		t.Fatalf("a run whose requests all failed exited 0:\n%s", stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("--out %s exists after the failed run (%v)", out, err)
	}
	failed, _ := filepath.Glob(out + ".failed-*")
	if len(failed) != 1 {
		t.Fatalf("failed runs kept: %v, want one %s.failed-<time>", failed, out)
	}
	note, err := os.ReadFile(filepath.Join(failed[0], "FAILED"))
	if err != nil || !strings.Contains(string(note), "0 of 10 requests succeeded") {
		t.Errorf("FAILED = %q (%v), want why the run failed", note, err)
	}
	if !strings.Contains(stderr, failed[0]) {
		t.Errorf("stderr does not say where the failed run is kept:\n%s", stderr)
	}
	code, stderr = runProfileExternal(t, failingServer(t, true).URL, out, "--max-error-rate", "0.6")
	if code != 0 {
		t.Fatalf("the retry into the same --out: exit %d:\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "profile-c2", "summary.json")); err != nil {
		t.Errorf("the retry's run is not in --out: %v", err)
	}
	if partial, _ := filepath.Glob(out + ".partial-*"); len(partial) != 0 {
		t.Errorf("temporary folders left: %v", partial)
	}
}
