package load_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/load"
)

func writeRunFile(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStageRetryAfterFailure: a failed run is kept beside --out as <out>.failed-<time> with
// a FAILED note saying why, --out stays free, and the retry into the same --out succeeds.
func TestStageRetryAfterFailure(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	st, err := load.StageRun(out, false)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(st.Dir) != filepath.Dir(out) || st.Dir == out {
		t.Fatalf("stage folder %s is not beside %s", st.Dir, out)
	}
	writeRunFile(t, st.Dir, "profile-c1/summary.json", "{}")
	failed, err := st.Finish(errors.New("profile-c1: 0 of 3 requests succeeded"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(failed), "run.failed-") {
		t.Errorf("failed run kept at %s, want run.failed-<time>", failed)
	}
	note, err := os.ReadFile(filepath.Join(failed, load.FailedFile))
	if err != nil || !strings.Contains(string(note), "0 of 3 requests succeeded") {
		t.Errorf("FAILED note %q (%v) does not say why", note, err)
	}
	if _, err := os.Stat(filepath.Join(failed, "profile-c1", "summary.json")); err != nil {
		t.Errorf("the failed run's files were not kept: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("--out %s exists after a failed run (%v)", out, err)
	}
	// The retry.
	st2, err := load.StageRun(out, false)
	if err != nil {
		t.Fatalf("retry into the same --out refused: %v", err)
	}
	writeRunFile(t, st2.Dir, "profile-c1/summary.json", `{"ok":true}`)
	final, err := st2.Finish(nil)
	if err != nil || final != out {
		t.Fatalf("Finish = %s, %v; want %s", final, err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "profile-c1", "summary.json")); string(b) != `{"ok":true}` {
		t.Errorf("--out holds %q, want the retry's run", b)
	}
	if got := st2.Path(filepath.Join(st2.Dir, "profile-c1")); got != filepath.Join(out, "profile-c1") {
		t.Errorf("Path maps the staged run dir to %s", got)
	}
	ents, _ := os.ReadDir(filepath.Dir(out))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".partial-") {
			t.Errorf("temporary folder %s left behind", e.Name())
		}
	}
	// A second Finish changes nothing.
	if again, err := st2.Finish(errors.New("late")); again != out || err != nil {
		t.Errorf("second Finish = %s, %v", again, err)
	}
}

// TestStageRefusesAndOverwrites: a finished run at --out is refused without overwrite and
// replaced, only once the new run is done, with it.
func TestStageRefusesAndOverwrites(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	writeRunFile(t, out, "profile-c1/summary.json", "old")
	if _, err := load.StageRun(out, false); err == nil || !strings.Contains(err.Error(), "already holds a run") {
		t.Fatalf("StageRun over a finished run: %v, want refused", err)
	}
	st, err := load.StageRun(out, true)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "profile-c1", "summary.json")); string(b) != "old" {
		t.Errorf("the old run was touched before the new one finished")
	}
	writeRunFile(t, st.Dir, "profile-c4/summary.json", "new")
	if _, err := st.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "profile-c1")); !os.IsNotExist(err) {
		t.Errorf("the old run's point is still in --out after --overwrite")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "profile-c4", "summary.json")); string(b) != "new" {
		t.Errorf("--out holds %q, want the new run", b)
	}
}
