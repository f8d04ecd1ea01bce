package launchtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// The folders of ended test processes are removed when the next one makes its own; a live
// process's folder (this one's) is kept.
func TestProcessBinDirRemovesEndedProcesses(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no true(1) to make an ended process: %v", err)
	}
	parent := filepath.Join(os.TempDir(), "modelqual-test-bin")
	dead := filepath.Join(parent, strconv.Itoa(cmd.Process.Pid))
	live := filepath.Join(parent, strconv.Itoa(os.Getppid()))
	other := filepath.Join(parent, "not-a-pid")
	for _, d := range []string{dead, live, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := processBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(parent, strconv.Itoa(os.Getpid())); dir != want {
		t.Errorf("dir %s, want %s", dir, want)
	}
	for d, want := range map[string]bool{dead: false, live: true, other: true, dir: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", d, err == nil, want)
		}
	}
}
