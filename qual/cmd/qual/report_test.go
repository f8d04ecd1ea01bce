package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/metrics"
	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
)

// writeReportRun writes a run directory of n streaming requests whose chunk times are scale
// times a fixed pattern, so two runs of scales 1 and 3 have latency ratio exactly 3.
func writeReportRun(t *testing.T, dir string, n int, scale int64, concurrency float64) {
	t.Helper()
	const ms = int64(1_000_000)
	var reqs []records.Request
	for i := 0; i < n; i++ {
		jitter := int64(i%7) * ms // 0..6 ms so the sample has spread
		first := scale * (10*ms + jitter)
		chunks := []int64{first, first + scale*5*ms, first + scale*10*ms}
		reqs = append(reqs, records.Request{RequestID: fmt.Sprintf("%s-%d", filepath.Base(dir), i), Phase: records.PhaseProfiling,
			SessionNum: i, Stream: true, StartUnixNs: 1_800_000_000_000_000_000 + int64(i)*20*ms, EndNs: chunks[2],
			ChunkNs: chunks, HTTPStatus: 200, InputTokens: 8, OutputTokensServer: 3})
	}
	recs := metrics.Export(reqs, nil, metrics.Options{})
	if _, err := reports.WriteRun(dir, &reports.Run{Name: filepath.Base(dir), Records: recs,
		Sweep: &reports.SweepPoint{Parameter: "concurrency", Value: concurrency}}); err != nil {
		t.Fatal(err)
	}
}

func runReport(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := reportMain(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestReportCompareShowMergeSweep(t *testing.T) {
	root := t.TempDir()
	base, cand := filepath.Join(root, "base"), filepath.Join(root, "cand")
	writeReportRun(t, base, 60, 1, 1)
	writeReportRun(t, cand, 60, 3, 4)

	// Concurrency 1 against 4 is not one configuration: refused, naming the field.
	_, errs, code := runReport(t, "compare", base, cand)
	if code != 1 || !strings.Contains(errs, "concurrency 1 vs 4") || !strings.Contains(errs, "--ignore concurrency") {
		t.Errorf("compare of concurrency 1 with 4: exit %d, %s", code, errs)
	}
	out, errs, code := runReport(t, "compare", "--json", "--iterations", "200", "--ignore", "concurrency", base, cand)
	if code != 0 {
		t.Fatalf("compare exit %d: %s", code, errs)
	}
	var sc reports.SweepComparison
	if err := json.Unmarshal([]byte(out), &sc); err != nil || len(sc.Points) != 1 {
		t.Fatalf("compare --json output does not parse into one point: %v\n%s", err, out)
	}
	c, ok := findCompareRow(sc.Points[0].Rows, reports.TagRequestLatency, "p50")
	if !ok || c.Ratio < 3-1e-9 || c.Ratio > 3+1e-9 || c.Lo > 3 || c.Hi < 3 {
		t.Errorf("request latency p50 comparison = %+v, want ratio 3 inside its interval", c)
	}
	out, _, code = runReport(t, "compare", "--ignore", "concurrency", base, cand)
	if code != 0 || !strings.Contains(out, "Request Latency (ms)") || !strings.Contains(out, "worse") || !strings.Contains(out, "differs:   concurrency 1 vs 4") {
		t.Errorf("compare table (exit %d):\n%s", code, out)
	}

	out, _, code = runReport(t, "show", base)
	if code != 0 || !strings.Contains(out, "| Time to First Token (ms) |") {
		t.Errorf("show (exit %d):\n%s", code, out)
	}

	junit := `<testsuites tests="1" failures="0"><testsuite name="s" tests="1" failures="0" time="1"><testcase name="c"></testcase></testsuite></testsuites>`
	os.WriteFile(filepath.Join(base, "junit.xml"), []byte(junit), 0o644)
	os.WriteFile(filepath.Join(cand, "junit.xml"), []byte(junit), 0o644)
	merged := filepath.Join(root, "merged")
	out, errs, code = runReport(t, "merge", "--out", merged, base, cand)
	if code != 0 {
		t.Fatalf("merge exit %d: %s", code, errs)
	}
	run, err := reports.ReadRun(merged)
	if err != nil {
		t.Fatal(err)
	}
	s := reports.Summarize(run)
	if n, _ := s.Profiling.Stat(reports.TagRequestCount, "avg"); n != 120 || len(s.Shards) != 2 {
		t.Errorf("merged request count %v, shards %v", n, s.Shards)
	}
	if run.Records[0].Metadata.ShardID != "base" || run.Records[119].Metadata.ShardID != "cand" {
		t.Errorf("shard IDs %q %q", run.Records[0].Metadata.ShardID, run.Records[119].Metadata.ShardID)
	}
	if b, err := os.ReadFile(filepath.Join(merged, "junit.xml")); err != nil || !strings.Contains(string(b), `tests="2"`) {
		t.Errorf("merged junit.xml: %v\n%s", err, b)
	}

	sweep := filepath.Join(root, "sweep")
	out, errs, code = runReport(t, "sweep", "--out", sweep, base, cand)
	if code != 0 || !strings.Contains(out, reports.SweepThroughputPNG) {
		t.Errorf("sweep exit %d: %s %s", code, out, errs)
	}

	if _, _, code := runReport(t, "compare", base); code != 2 {
		t.Errorf("compare with one run: exit %d, want 2", code)
	}
	if _, errs, code := runReport(t, "compare", base, filepath.Join(root, "missing")); code != 1 || !strings.Contains(errs, "missing") {
		t.Errorf("compare with a missing run: exit %d, %s", code, errs)
	}
	if _, _, code := runReport(t, "merge", "--help"); code != 0 {
		t.Errorf("merge --help: exit %d", code)
	}
}

func findCompareRow(rows []reports.RunComparison, tag, stat string) (reports.RunComparison, bool) {
	for _, r := range rows {
		if r.Tag == tag && r.Stat == stat {
			return r, true
		}
	}
	return reports.RunComparison{}, false
}

// TestReportCompareSweeps: two concurrency sweeps given as folders are compared point by
// point. The old compare took a folder's runs as repeats of one configuration, pooled
// concurrency 1 with 4 and printed "no change" with an interval of [0.000, 1.07e154].
func TestReportCompareSweeps(t *testing.T) {
	root := t.TempDir()
	for _, c := range []struct {
		side  string
		conc  float64
		scale int64
	}{{"base", 1, 1}, {"base", 4, 2}, {"cand", 1, 3}, {"cand", 4, 6}} {
		for k := 1; k <= 2; k++ { // with repeats
			writeReportRun(t, filepath.Join(root, c.side+"-rep", fmt.Sprintf("profile-c%v-rep%d", c.conc, k)), 30, c.scale, c.conc)
		}
		writeReportRun(t, filepath.Join(root, c.side, fmt.Sprintf("profile-c%v", c.conc)), 30, c.scale, c.conc)
	}
	for _, dirs := range [][2]string{{"base", "cand"}, {"base-rep", "cand-rep"}} {
		out, errs, code := runReport(t, "compare", "--iterations", "200", filepath.Join(root, dirs[0]), filepath.Join(root, dirs[1]))
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", dirs, code, errs)
		}
		if !strings.Contains(out, "== concurrency=1:") || !strings.Contains(out, "== concurrency=4:") {
			t.Errorf("%v: not compared point by point:\n%s", dirs, out)
		}
		if strings.Contains(out, "e+") || strings.Contains(out, "[0, ") {
			t.Errorf("%v: a pooled interval or verdict:\n%s", dirs, out)
		}
		lat := 0
		for _, l := range strings.Split(out, "\n") {
			if len([]rune(l)) > 120 {
				t.Errorf("%v: line of %d columns: %s", dirs, len([]rune(l)), l)
			}
			if strings.HasPrefix(l, "Request Latency (ms)") {
				lat++
				if !strings.Contains(l, " 3.00 ") || !strings.Contains(l, "worse") {
					t.Errorf("%v: latency 3x not called worse: %s", dirs, l)
				}
			}
		}
		if lat != 6 { // avg, p50, p99 at two points
			t.Errorf("%v: %d request latency rows, want 6:\n%s", dirs, lat, out)
		}
	}
}

// TestReportCompareRepeats: groups of repeats, given as a comma list or as a folder of runs,
// are compared over runs; the columns name the groups.
func TestReportCompareRepeats(t *testing.T) {
	root := t.TempDir()
	var bases, cands []string
	for k := 1; k <= 3; k++ {
		b := filepath.Join(root, "base", fmt.Sprintf("profile-c1-rep%d", k))
		c := filepath.Join(root, fmt.Sprintf("cand-rep%d", k))
		writeReportRun(t, b, 30, 1, 1)
		writeReportRun(t, c, 30, 3, 1)
		bases, cands = append(bases, b), append(cands, c)
	}
	out, errs, code := runReport(t, "compare", filepath.Join(root, "base"), strings.Join(cands, ","))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "base:      3 runs") || !strings.Contains(out, "candidate: 3 runs") || !strings.Contains(out, "over runs") {
		t.Errorf("columns do not name the groups:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Request Latency (ms)") && !strings.Contains(l, "worse") {
			t.Errorf("latency 3x not called worse: %s", l)
		}
	}
	out, _, code = runReport(t, "compare", strings.Join(bases, ","), filepath.Join(root, "base"))
	if code != 0 || strings.Contains(out, "worse") || strings.Contains(out, "better") || !strings.Contains(out, "no change") {
		t.Errorf("A/A over runs (exit %d):\n%s", code, out)
	}
}
