package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/reports"
)

// captureStdout runs f with os.Stdout redirected and returns what it printed.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	f()
	w.Close()
	os.Stdout = old
	return string(<-done)
}

// profileMock runs `qual profile` against qual-server on the mock bundle with the given load
// flags, fails the test unless it exits 0, and returns its output folder and printed table.
func profileMock(t *testing.T, load ...string) (out, table string) {
	t.Helper()
	t.Setenv("MODELQUAL_BIN", filepath.Dir(launchtest.ServerBin(t)))
	bundle := launchtest.MockBundle(t, 0)
	out = t.TempDir()
	var code int
	table = captureStdout(t, func() {
		code = runProfile(append([]string{"--bundle", bundle, "--model", "mock", "--endpoint", "completions", "--stream",
			"--out", out, "--no-progress", "--source-root", "none"}, load...))
	})
	if code != 0 {
		t.Fatalf("exit %d; table:\n%s", code, table)
	}
	return out, table
}

func TestProfileCommandSweepsAndWritesRunDirs(t *testing.T) {
	out, table := profileMock(t, "--concurrency", "1,2", "--requests", "6", "--warmup", "1", "--input-tokens-mean", "16",
		"--input-tokens-stddev", "2", "--output-tokens", "4", "--slo", "ttft:5s", "--seed", "7")
	for _, want := range []string{"concurrency=1", "concurrency=2", "ok", "TTFT p50 ms"} {
		if !strings.Contains(table, want) {
			t.Errorf("summary table lacks %q:\n%s", want, table)
		}
	}
	for _, point := range []string{"profile-c1", "profile-c2"} {
		dir := filepath.Join(out, point)
		s, err := reports.ReadSummary(dir)
		if err != nil {
			t.Fatal(err)
		}
		if s.Profiling.Requests != 6 || s.Warmup.Requests != 1 {
			t.Errorf("%s: profiling %d warmup %d", point, s.Profiling.Requests, s.Warmup.Requests)
		}
		var cfg map[string]any
		if err := json.Unmarshal(s.InputConfig, &cfg); err != nil || !bytes.Contains(s.InputConfig, []byte(`"seed"`)) {
			t.Errorf("%s: input_config %s (%v)", point, s.InputConfig, err)
		}
		if _, err := os.Stat(filepath.Join(dir, load.JoinedRecordsFile)); err != nil {
			t.Error(err)
		}
	}
}

// --output-tokens-stddev gives the prompts lengths of their own, which the served requests
// then have (the mock model generates exactly max_tokens with ignore_eos).
func TestProfileCommandOutputLengthSpread(t *testing.T) {
	out, _ := profileMock(t, "--concurrency", "4", "--requests", "24", "--input-tokens-mean", "8", "--num-prompts", "12",
		"--output-tokens", "12", "--output-tokens-stddev", "5", "--seed", "3")
	s, err := reports.ReadSummary(filepath.Join(out, "profile-c4"))
	if err != nil {
		t.Fatal(err)
	}
	osl := s.Profiling.Metrics["output_sequence_length"].Dist
	if osl == nil || osl.Count != 24 || osl.Min == osl.Max || osl.Avg < 7 || osl.Avg > 17 {
		t.Fatalf("output_sequence_length %+v: want 24 requests of differing lengths around 12", osl)
	}
	var in struct {
		Config map[string]string `json:"mq_config"`
	}
	if err := json.Unmarshal(s.InputConfig, &in); err != nil || in.Config["output-tokens-stddev"] != "5" {
		t.Errorf("input_config does not record the stddev (%v): %s", err, s.InputConfig)
	}
}

func TestProfileCommandRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--model", "m", "--out", "x", "--concurrency", "1", "--requests", "1"},                                                                              // neither --url nor --bundle
		{"--url", "http://x", "--out", "x", "--concurrency", "1", "--requests", "1"},                                                                         // no --model
		{"--url", "http://x", "--model", "m", "--out", "x", "--requests", "1"},                                                                               // no load mode
		{"--url", "http://x", "--model", "m", "--out", "x", "--concurrency", "1"},                                                                            // no stop condition
		{"--url", "http://x", "--model", "m", "--out", "x", "--concurrency", "0", "--requests", "1"},                                                         // bad concurrency
		{"--url", "http://x", "--model", "m", "--out", "x", "--concurrency", "1", "--requests", "1", "--gpus", "0"},                                          // GPUs for an external URL
		{"--url", "http://x", "--model", "m", "--out", "x", "--concurrency", "1", "--requests", "1", "--output-tokens-stddev", "4"},                          // a spread without a mean
		{"--url", "http://x", "--model", "m", "--out", "x", "--concurrency", "1", "--requests", "1", "--output-tokens", "8", "--output-tokens-stddev", "-1"}, // negative spread
	} {
		if code := runProfile(args); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
