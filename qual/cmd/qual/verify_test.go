package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyVerifyRun copies a run of qual profile kept in qual/recount's testdata.
func copyVerifyRun(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("..", "..", "recount", "testdata", name)
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReportVerifyPassesOnRunsOfQualProfile(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"stream-cancel", "chat-rate", "vision", "images"} {
		d := copyVerifyRun(t, name)
		if err := os.Rename(d, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	if code := reportMain([]string{"verify", root}, &out, &errb); code != 0 {
		t.Fatalf("qual report verify %s: exit %d\n%s%s", root, code, out.String(), errb.String())
	}
	if n := strings.Count(out.String(), "all agree"); n != 4 {
		t.Errorf("want 4 runs verified (a folder of runs is verified whole), got %d:\n%s", n, out.String())
	}
}

func TestReportVerifyFailsNamingAHandEditedFigure(t *testing.T) {
	dir := copyVerifyRun(t, "stream-cancel")
	path := filepath.Join(dir, "summary.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The profiling phase's output token throughput, edited by hand.
	s := string(b)
	i := strings.Index(s, `"output_token_throughput": {`)
	j := strings.Index(s[i:], `"avg": `) + i + len(`"avg": `)
	k := strings.IndexAny(s[j:], ",\n}") + j
	was := s[j:k]
	s = s[:j] + "1234.5" + s[k:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := reportMain([]string{"verify", dir}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	want := "summary.json profiling output_token_throughput: reported 1234.5, the records give " + was
	if !strings.Contains(errb.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, errb.String())
	}
	if !strings.Contains(errb.String(), "records: ") {
		t.Errorf("stderr names no record:\n%s", errb.String())
	}
}

func TestReportVerifyRefusesAFolderWithoutRecords(t *testing.T) {
	var out, errb bytes.Buffer
	if code := reportMain([]string{"verify", t.TempDir()}, &out, &errb); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), "client_records.jsonl") {
		t.Errorf("stderr does not say what is missing:\n%s", errb.String())
	}
}
