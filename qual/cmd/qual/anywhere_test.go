package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/reports"
)

// builtBinaries builds qual and qual-server from this checkout into one temporary folder, as
// make build, go install or an unpacked make dist archive leave them.
func builtBinaries(t *testing.T) string {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "./qual/cmd/qual", "./server/cmd/qual-server")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// outsideEnv is the environment of a user with the binaries and no checkout: no
// MODELQUAL_BIN, no qual-server on PATH, a cache of its own unless the caller shares one.
func outsideEnv(cache string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MODELQUAL_BIN=") || strings.HasPrefix(kv, "MODELQUAL_CACHE=") || strings.HasPrefix(kv, "PATH=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH=/usr/bin:/bin", "MODELQUAL_CACHE="+cache)
}

type cmdResult struct {
	stdout, stderr string
	code           int
}

func runIn(t *testing.T, dir string, env []string, bin string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return cmdResult{out.String(), errb.String(), code}
}

// TestBinariesRunOutsideACheckout runs the built binaries from a folder outside any
// checkout with no MODELQUAL_BIN: qual finds the qual-server next to it, serves and profiles
// a bundle, generates from one, reports on the run; help goes to stdout with exit 0; and
// the subcommands that need a checkout say so and what to do.
func TestBinariesRunOutsideACheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries")
	}
	mock := launchtest.MockBundle(t, 0)
	gpt2, err := fixtures.Bundle(fixtures.DefaultCacheDir(), fixtures.GPT2Tiny)
	if err != nil {
		t.Fatal(err)
	}
	bin := builtBinaries(t)
	qual := filepath.Join(bin, "qual")
	work := t.TempDir()
	t.Chdir(work)
	if _, outside := fixtures.RepoRoot(); outside == nil {
		t.Fatalf("%s is inside a modelqual checkout; the test needs a folder outside one", work)
	}
	env := outsideEnv(filepath.Join(work, "cache"))

	r := runIn(t, work, env, qual, "profile", "--bundle", mock, "--model", "mock", "--endpoint", "completions",
		"--concurrency", "2", "--requests", "6", "--output-tokens", "4", "--input-tokens-mean", "8", "--out", "out", "--no-progress")
	if r.code != 0 {
		t.Fatalf("qual profile --bundle outside a checkout: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	run, err := reports.ReadRun(filepath.Join(work, "out", "profile-c2"))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := reports.Summarize(run).Profiling.Stat(reports.TagRequestCount, "avg"); n != 6 {
		t.Errorf("profile recorded %v requests, want 6", n)
	}
	if r := runIn(t, work, env, qual, "report", "show", "out/profile-c2"); r.code != 0 || !strings.Contains(r.stdout, "Time to First Token") {
		t.Errorf("qual report show: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runIn(t, work, env, qual, "generate", "--bundle", gpt2, "--prompt", "Hello, world", "--max-tokens", "4", "--ignore-eos", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"ids"`) {
		t.Errorf("qual generate outside a checkout: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runIn(t, work, env, qual, "families"); r.code != 0 || !strings.Contains(r.stdout, "qwen3") {
		t.Errorf("qual families: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// What needs the checkout says so, and what to do.
	for _, args := range [][]string{{"qualify"}, {"mutants"}} {
		r := runIn(t, work, env, qual, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "checkout") || !strings.Contains(r.stderr, "git clone") {
			t.Errorf("qual %v outside a checkout: exit %d, stderr %q; want an error that says to run it in a checkout", args, r.code, r.stderr)
		}
	}
	// The fixtures' tokenizers are built into qual: a fixture and its bundle are made anywhere,
	// into a cache of the user's choosing.
	fixCache := t.TempDir()
	if r := runIn(t, work, append(env, "MODELQUAL_CACHE="+fixCache), qual, "fixtures", "--name", fixtures.GPT2Tiny, "--bundle"); r.code != 0 || !strings.Contains(r.stdout, fixCache) {
		t.Errorf("qual fixtures --bundle outside a checkout: exit %d, stdout %q, stderr %q; want the fixture and its bundle made under %s", r.code, r.stdout, r.stderr, fixCache)
	}

	// Help is the answer asked for: stdout, exit 0, for qual and every subcommand.
	if r := runIn(t, work, env, qual, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Commands:") || r.stderr != "" {
		t.Errorf("qual --help: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, name := range known() {
		for _, args := range [][]string{{name, "--help"}, {"help", name}} {
			if r := runIn(t, work, env, qual, args...); r.code != 0 || !strings.Contains(r.stdout, "Usage") || r.stderr != "" {
				t.Errorf("qual %v: exit %d, stdout %q, stderr %q; want the usage on stdout and exit 0", args, r.code, r.stdout, r.stderr)
			}
		}
	}
	if r := runIn(t, work, env, qual); r.code != 2 || !strings.Contains(r.stderr, "Commands:") {
		t.Errorf("qual without a command: exit %d, stderr %q; want the usage on stderr and exit 2", r.code, r.stderr)
	}
	// Flags after the positionals.
	if r := runIn(t, work, env, qual, "report", "show", "out/profile-c2", "--recompute"); r.code != 0 || !strings.Contains(r.stdout, "Time to First Token") {
		t.Errorf("qual report show DIR --recompute: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
