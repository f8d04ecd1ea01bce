package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// bundleTestRun runs a subcommand function and returns its exit code and output.
func bundleTestRun(f func([]string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := f(args, &out, &errb)
	return code, out.String(), errb.String()
}

func bundleTestBundle(args []string, o, e *bytes.Buffer) int   { return bundleMain(args, o, e) }
func bundleTestFixtures(args []string, o, e *bytes.Buffer) int { return fixturesMain(args, o, e) }

func TestBundleBuildInspectValidate(t *testing.T) {
	cache := t.TempDir()
	code, out, errs := bundleTestRun(bundleTestFixtures, "--cache", cache, "--name", fixtures.GPT2Tiny)
	if code != 0 {
		t.Fatalf("qual fixtures: %d %s", code, errs)
	}
	var rows []map[string]string
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || len(rows[0]["revision"]) != 40 {
		t.Fatalf("qual fixtures output %q: %v", out, err)
	}
	rev := rows[0]["revision"]

	mqb := filepath.Join(cache, "g.mqb")
	code, out, errs = bundleTestRun(bundleTestBundle, "build", "--hub-cache", rows[0]["hub_cache"], "--model", "modelqual-fixtures/gpt2-tiny",
		"--out", mqb, "--max-context", "512", "--max-batch", "4")
	if code != 0 {
		t.Fatalf("bundle build: %d %s", code, errs)
	}
	if !strings.Contains(out, `"revision": "`+rev+`"`) || !strings.Contains(out, `"bundle_digest"`) {
		t.Fatalf("bundle build output: %s", out)
	}

	code, out, errs = bundleTestRun(bundleTestBundle, "inspect", mqb)
	if code != 0 {
		t.Fatalf("bundle inspect: %d %s", code, errs)
	}
	var ins struct {
		Header struct {
			Family     string
			Provenance struct {
				Revision string
				Build    struct {
					MaxContext int `json:"max_context"`
					MaxBatch   int `json:"max_batch"`
				}
				Builder struct {
					SourceRevision string `json:"source_revision"`
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &ins); err != nil {
		t.Fatal(err)
	}
	h := ins.Header
	if h.Family != "gpt2" || h.Provenance.Revision != rev || h.Provenance.Build.MaxContext != 512 || h.Provenance.Build.MaxBatch != 4 || h.Provenance.Builder.SourceRevision == "" {
		t.Fatalf("inspect header: %+v", h)
	}

	manifest := func(revision string, maxCtx int) string {
		p := filepath.Join(t.TempDir(), "manifest.yaml")
		y := "family: gpt2\nnative_family: gpt2\nowner: t\ntasks: [text]\ncheckpoint:\n  id: modelqual-fixtures/gpt2-tiny\n  revision: " + revision +
			"\nbuild:\n  precision: fp32\n  max_context: " + bundleTestItoa(maxCtx) + "\n  backend: cpu\nserver:\n  workers: 1\n  startup_timeout: 60s\n  request_timeout: 30s\n"
		os.WriteFile(p, []byte(y), 0o644)
		return p
	}
	if code, _, errs := bundleTestRun(bundleTestBundle, "validate", mqb, "--manifest", manifest(rev, 512)); code != 0 {
		t.Fatalf("validate of a matching bundle: %d %s", code, errs)
	}
	code, _, errs = bundleTestRun(bundleTestBundle, "validate", "--manifest", manifest(strings.Repeat("a", 40), 512), mqb)
	if code != 1 || !strings.Contains(errs, "provenance.revision") {
		t.Fatalf("validate with another revision: %d %s", code, errs)
	}
	code, _, errs = bundleTestRun(bundleTestBundle, "validate", mqb, "--manifest", manifest(rev, 1024))
	if code != 1 || !strings.Contains(errs, "provenance.build.max_context") {
		t.Fatalf("validate with another max context: %d %s", code, errs)
	}
}

func TestBundleBuildErrors(t *testing.T) {
	cache := t.TempDir()
	snap, _, err := fixtures.Ensure(cache, fixtures.GPT2Tiny)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(cache, "x.mqb")
	code, _, errs := bundleTestRun(bundleTestBundle, "build", "--checkpoint", snap, "--model", "modelqual-fixtures/gpt2-tiny", "--revision", "main", "--out", out)
	if code != 1 || !strings.Contains(errs, `bundle: checkpoint revision "main" is not immutable; pass a 40-hex commit`) {
		t.Fatalf("branch revision: %d %s", code, errs)
	}
	if code, _, errs := bundleTestRun(bundleTestBundle, "frobnicate"); code != 2 || !strings.Contains(errs, "unknown subcommand") {
		t.Fatalf("unknown subcommand: %d %s", code, errs)
	}
	if code, _, _ := bundleTestRun(bundleTestBundle, "build", "--help"); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	bad := filepath.Join(cache, "bad.mqb")
	os.WriteFile(bad, []byte("MQBUNDLE"), 0o644)
	if code, _, errs := bundleTestRun(bundleTestBundle, "inspect", bad); code != 1 || !strings.Contains(errs, "bundle "+bad+": file is truncated") {
		t.Fatalf("inspect of a truncated bundle: %d %s", code, errs)
	}
}

func TestBundleBuildMock(t *testing.T) {
	cache := t.TempDir()
	out := filepath.Join(cache, "m.mqb")
	code, stdout, errs := bundleTestRun(bundleTestBundle, "build", "--mock", "--mock-step-delay", "5ms", "--cache", cache, "--out", out)
	if code != 0 || !strings.Contains(stdout, `"family": "mock"`) || !strings.Contains(stdout, `"mock_step_delay": "5ms"`) {
		t.Fatalf("mock build: %d %s %s", code, stdout, errs)
	}
}

func bundleTestItoa(n int) string { b, _ := json.Marshal(n); return string(b) }
