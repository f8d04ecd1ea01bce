package provenance

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func gitRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed: " + err.Error())
	}
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.email=t@example.com", "-c", "user.name=t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "-q")
	write(t, dir, "main.go", "package main\n")
	write(t, dir, ".gitignore", "ignored/\n")
	run("add", ".")
	run("commit", "-q", "-m", "init")
	return dir
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSourceFingerprintsIncludeDirtyAndUntracked(t *testing.T) {
	dir := gitRepo(t)
	write(t, dir, "untracked.go", "package main // new\n")
	write(t, dir, "ignored/big.bin", "ignored")
	write(t, dir, "out/run/x.json", "{}")
	ctx := context.Background()
	spec := Spec{SourceRoot: dir, Exclude: []string{filepath.Join(dir, "out")}}
	before, err := Take(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range before.Files {
		rel, _ := filepath.Rel(dir, f.Path)
		names = append(names, rel)
	}
	if strings.Join(names, ",") != ".gitignore,main.go,untracked.go" {
		t.Fatalf("fingerprinted %v; want tracked and untracked-but-not-ignored files, run output excluded", names)
	}
	// Output written during the run and ignored files do not count as changes.
	write(t, dir, "out/run/y.json", "{}")
	write(t, dir, "ignored/big.bin", "changed")
	after, _ := Take(ctx, spec)
	if err := Compare(before, after); err != nil {
		t.Fatalf("unexpected change: %v", err)
	}
	// A dirty edit does.
	write(t, dir, "main.go", "package main // edited during the run\n")
	after, _ = Take(ctx, spec)
	err = Compare(before, after)
	var ce *ChangedError
	if !errors.As(err, &ce) || len(ce.Changes) != 1 || !strings.Contains(err.Error(), filepath.Join(dir, "main.go")+" modified") {
		t.Fatalf("err = %v", err)
	}
	// A new untracked file and a deleted tracked file too.
	write(t, dir, "added.go", "package main\n")
	os.Remove(filepath.Join(dir, "untracked.go"))
	after, _ = Take(ctx, spec)
	err = Compare(before, after)
	if err == nil || !strings.Contains(err.Error(), "added.go added") || !strings.Contains(err.Error(), "untracked.go removed") {
		t.Fatalf("err = %v", err)
	}
}

func TestBundleInputTokenizerRoles(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "b.mqb", "bundle")
	write(t, dir, "in.jsonl", "{}")
	write(t, dir, "tok/tokenizer.json", "{}")
	spec := Spec{Bundle: filepath.Join(dir, "b.mqb"), Inputs: []string{filepath.Join(dir, "in.jsonl")}, TokenizerDir: filepath.Join(dir, "tok")}
	before, err := Take(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Files) != 3 {
		t.Fatalf("files %+v", before.Files)
	}
	write(t, dir, "b.mqb", "bundle, altered")
	after, _ := Take(context.Background(), spec)
	err = Compare(before, after)
	if err == nil || !strings.Contains(err.Error(), "bundle file "+filepath.Join(dir, "b.mqb")+" modified") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Take(context.Background(), Spec{Bundle: filepath.Join(dir, "missing.mqb")}); err == nil || !strings.Contains(err.Error(), "missing.mqb") {
		t.Fatalf("missing bundle: %v", err)
	}
}

func TestEnv(t *testing.T) {
	dir := gitRepo(t)
	e := Env(context.Background(), dir, "process", []string{"qual-server", "--workers", "1"}, nil)
	if len(e.SourceRevision) != 40 || e.Dirty || e.GoVersion == "" || e.CPUModel == "" || e.NumCPU < 1 {
		t.Fatalf("clean env %+v", e)
	}
	write(t, dir, "main.go", "package main // dirty\n")
	d1 := Env(context.Background(), dir, "process", nil, nil)
	write(t, dir, "main.go", "package main // dirty differently\n")
	d2 := Env(context.Background(), dir, "process", nil, nil)
	if !d1.Dirty || d1.DirtyDiffSHA256 == "" || d1.DirtyDiffSHA256 == d2.DirtyDiffSHA256 {
		t.Fatalf("dirty envs %+v %+v", d1, d2)
	}
}

// TestChangedAndChangedBack: a file changed to B and back to A during a run is caught,
// whether it was rewritten in place with its mtime put back (the change time gives it away),
// replaced by a copy (another inode), or swapped and restored between the fingerprints while
// a Watcher looked (the change it saw is kept though the last fingerprints match the first).
func TestChangedAndChangedBack(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "input.jsonl")
	write(t, dir, "input.jsonl", "A\n")
	spec := Spec{Inputs: []string{path}}
	take := func() *Fingerprints {
		t.Helper()
		f, err := Take(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	before := take()
	if err := Compare(before, take()); err != nil {
		t.Fatalf("nothing changed, yet: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	// In place, mtime restored. The kernel stamps ctime from a coarse clock; rewrite until
	// it has moved past the first fingerprint's (within one tick nothing on disk differs).
	first := before.Files[0].CtimeNs
	for {
		write(t, dir, "input.jsonl", "B\n")
		write(t, dir, "input.jsonl", "A\n")
		if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
		if cur, err := statPath(path, RoleInput); err != nil || cur.CtimeNs != first {
			break
		}
	}
	var ce *ChangedError
	if err := Compare(before, take()); !errors.As(err, &ce) || ce.Changes[0].Kind != "rewritten" || !strings.Contains(err.Error(), "ctime changed") {
		t.Fatalf("A->B->A in place: %v, want a rewritten file with its change time named", err)
	}

	// Replaced by a copy of A.
	before = take()
	write(t, dir, "copy", "A\n")
	if err := os.Rename(filepath.Join(dir, "copy"), path); err != nil {
		t.Fatal(err)
	}
	if err := Compare(before, take()); !errors.As(err, &ce) || !strings.Contains(err.Error(), "(replaced)") {
		t.Fatalf("A replaced by a copy of A: %v, want the new inode named", err)
	}

	// Seen by a Watcher while it held B. The Watcher's own ticker is set far beyond the test;
	// Check runs its pass now.
	before = take()
	w := Watch(before, time.Hour)
	write(t, dir, "input.jsonl", "B\n")
	w.Check()
	write(t, dir, "input.jsonl", "A\n")
	err = w.Stop()
	if !errors.As(err, &ce) || len(ce.Changes) < 1 || ce.Changes[0].Kind != "changed during the run" ||
		!strings.Contains(ce.Changes[0].Detail, "sha256 ") {
		t.Fatalf("watched A->B->A: %v, want the change to B named", err)
	}

	// A Watcher over files nobody touches reports nothing.
	quiet := Watch(take(), time.Millisecond)
	quiet.Check()
	if err := quiet.Stop(); err != nil {
		t.Fatalf("untouched files: %v", err)
	}
}
