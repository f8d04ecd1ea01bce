package reports

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// synthRecords makes n profiling records (plus warmup ones) whose latencies are scale times a
// fixed random draw, so two runs made with the same seed and different scales have a known
// ratio. Request i starts 10 ms after request i−1; its body ends 2 ms after its last token
// (the final chunk and [DONE]), so the benchmark window, which ends at send + request
// latency, is told from one ending at the end of the body.
func synthRecords(n, warmup int, scale float64, seed uint64) []ExportRecord {
	rng := rand.New(rand.NewPCG(seed, 7))
	t0 := int64(1_800_000_000_000_000_000)
	var out []ExportRecord
	for i := 0; i < n+warmup; i++ {
		phase := PhaseProfiling
		if i < warmup {
			phase = PhaseWarmup
		}
		ttft := scale * (20 + 10*rng.Float64())
		itl := scale * (5 + rng.Float64())
		osl := 16.0
		lat := ttft + itl*(osl-1)
		start := t0 + int64(i)*10_000_000
		icl := make([]float64, int(osl)-1)
		for k := range icl {
			icl[k] = itl
		}
		rec := ExportRecord{
			Metadata: RecordMetadata{SessionNum: i, XRequestID: fmt.Sprintf("req-%d", i), XCorrelationID: fmt.Sprintf("req-%d", i),
				RequestStartNs: start, RequestAckNs: start + 1_000_000, RequestEndNs: start + int64(lat*1e6) + 2_000_000, WorkerID: "w0",
				RecordProcessorID: "test", BenchmarkPhase: phase},
			Metrics: map[string]MetricValue{
				TagTTFT:                 Scalar(ttft, "ms"),
				TagTTST:                 Scalar(itl, "ms"),
				TagRequestLatency:       Scalar(lat, "ms"),
				TagITL:                  Scalar(itl, "ms"),
				TagOutputTPSPerUser:     Scalar(1000/itl, "tokens/sec/user"),
				TagInterChunkLatency:    List(icl, "ms"),
				TagOutputSequenceLength: Scalar(osl, "tokens"),
				TagInputSequenceLength:  Scalar(32, "tokens"),
				TagResponseBytes:        Scalar(osl*50, "bytes"),
			},
		}
		if phase == PhaseWarmup {
			rec.Metrics[TagRequestLatency] = Scalar(5000, "ms") // a slow cold start
		}
		if i%17 == 5 && phase == PhaseProfiling {
			rec.Metrics = map[string]MetricValue{TagInputSequenceLength: Scalar(32, "tokens")}
			rec.Error = &ErrorDetails{Code: 503, Type: "overloaded", Message: "try again"}
		}
		out = append(out, rec)
	}
	return out
}

func writeSynthRun(t *testing.T, dir string, scale float64) *Summary {
	t.Helper()
	run := &Run{
		Name:         filepath.Base(dir),
		Records:      synthRecords(200, 5, scale, 42),
		SLOs:         []SLO{{Tag: TagTTFT, Threshold: 25, Unit: "ms", Spec: "ttft:25ms"}},
		Cost:         &ServingCost{FrontendCPUNs: 1_000_000, ClientCPUNs: 500_000},
		Sweep:        &SweepPoint{Parameter: "concurrency", Value: 8},
		InputConfig:  json.RawMessage(`{"endpoint":{"type":"completions","streaming":true},"loadgen":{"concurrency":8}}`),
		Environment:  json.RawMessage(`{"go_version":"go1.26"}`),
		GPUTelemetry: json.RawMessage(`{"available":false}`),
	}
	s, err := WriteRun(dir, run)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestExportsRecomputeFromJSONL writes a run, parses every export and checks its numbers
// against statistics recomputed from profile_export.jsonl alone.
func TestExportsRecomputeFromJSONL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	writeSynthRun(t, dir, 1)

	// Recompute independently from the JSONL: collect values per tag over valid profiling lines.
	f, err := os.Open(filepath.Join(dir, ProfileExportJSONL))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	dec := json.NewDecoder(f)
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 205 {
		t.Fatalf("profile_export.jsonl has %d lines, want 205", len(lines))
	}
	vals := map[string][]float64{}
	valid := 0
	for _, l := range lines {
		md := l["metadata"].(map[string]any)
		if md["benchmark_phase"] != PhaseProfiling || l["error"] != nil {
			continue
		}
		valid++
		for tag, mv := range l["metrics"].(map[string]any) {
			switch v := mv.(map[string]any)["value"].(type) {
			case float64:
				vals[tag] = append(vals[tag], v)
			case []any:
				for _, x := range v {
					vals[tag] = append(vals[tag], x.(float64))
				}
			}
		}
	}

	var aiperf map[string]json.RawMessage
	b, _ := os.ReadFile(filepath.Join(dir, AIPerfJSONFile))
	if err := json.Unmarshal(b, &aiperf); err != nil {
		t.Fatalf("%s does not parse: %v", AIPerfJSONFile, err)
	}
	for _, key := range []string{"input_config", "error_summary", "start_time", "end_time"} {
		if _, ok := aiperf[key]; !ok {
			t.Errorf("%s lacks %s", AIPerfJSONFile, key)
		}
	}
	for tag, vs := range vals {
		want, _ := Describe(vs)
		var got map[string]float64
		raw := aiperf[tag]
		var probe map[string]any
		json.Unmarshal(raw, &probe)
		delete(probe, "unit")
		bb, _ := json.Marshal(probe)
		if err := json.Unmarshal(bb, &got); err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		for _, st := range []string{"avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std"} {
			w, _ := want.Stat(st)
			if g, ok := got[st]; !ok || g != w {
				t.Errorf("%s.%s = %v (present %v), recomputed %v", tag, st, g, ok, w)
			}
		}
	}
	// Run-level values carry avg only; check the throughputs by hand from the lines.
	var tput struct {
		Unit string
		Avg  float64
		P50  *float64
	}
	json.Unmarshal(aiperf[TagRequestThroughput], &tput)
	minStart, maxEnd := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		md := l["metadata"].(map[string]any)
		if md["benchmark_phase"] != PhaseProfiling || l["error"] != nil {
			continue
		}
		s := md["request_start_ns"].(float64)
		lat := l["metrics"].(map[string]any)[TagRequestLatency].(map[string]any)["value"].(float64)
		minStart, maxEnd = math.Min(minStart, s), math.Max(maxEnd, s+lat*1e6)
	}
	wantTput := float64(valid) / ((maxEnd - minStart) / 1e9)
	if tput.Unit != "requests/sec" || tput.P50 != nil || math.Abs(tput.Avg-wantTput) > 1e-6*wantTput {
		t.Errorf("request_throughput = %+v, recomputed %v", tput, wantTput)
	}
	var errSum []ErrorGroup
	json.Unmarshal(aiperf["error_summary"], &errSum)
	if len(errSum) != 1 || errSum[0].Details.Code != 503 || errSum[0].Count != 200-valid {
		t.Errorf("error_summary = %+v, want one 503 group of %d", errSum, 200-valid)
	}

	// CSV: header, two-decimal rows matching the recomputation, blank line, Metric,Value rows.
	cb, _ := os.ReadFile(filepath.Join(dir, AIPerfCSVFile))
	parts := strings.SplitN(string(cb), "\n\n", 2)
	if len(parts) != 2 {
		t.Fatalf("CSV has no blank line between sections:\n%s", cb)
	}
	rows, err := csv.NewReader(strings.NewReader(parts[0])).ReadAll()
	if err != nil {
		t.Fatalf("CSV statistics section does not parse: %v", err)
	}
	if !reflect.DeepEqual(rows[0], CSVHeader) {
		t.Errorf("CSV header = %v", rows[0])
	}
	ttft, _ := Describe(vals[TagTTFT])
	found := false
	for _, r := range rows[1:] {
		if r[0] == "Time to First Token (ms)" {
			found = true
			if r[1] != fmt.Sprintf("%.2f", ttft.Avg) || r[12] != fmt.Sprintf("%.2f", ttft.P99) {
				t.Errorf("CSV TTFT row %v, recomputed avg %.2f p99 %.2f", r, ttft.Avg, ttft.P99)
			}
		}
	}
	if !found {
		t.Errorf("CSV lacks the row \"Time to First Token (ms)\"")
	}
	scal, err := csv.NewReader(strings.NewReader(parts[1])).ReadAll()
	if err != nil || scal[0][0] != "Metric" || scal[0][1] != "Value" {
		t.Fatalf("CSV Metric,Value section: %v %v", scal, err)
	}
	want := map[string]string{"Request Count": fmt.Sprint(valid), "Request Throughput (requests/sec)": fmt.Sprintf("%.2f", wantTput)}
	for _, r := range scal[1:] {
		if w, ok := want[r[0]]; ok && r[1] != w {
			t.Errorf("CSV %s = %s, want %s", r[0], r[1], w)
		}
		delete(want, r[0])
	}
	if len(want) > 0 {
		t.Errorf("CSV lacks rows %v", want)
	}
	// Every statistics row's columns are the recomputation's, in the header's order.
	for _, r := range rows[1:] {
		for tag, vs := range vals {
			if m, ok := LookupMetric(tag); !ok || r[0] != MetricLabel(tag, m.Unit) {
				continue
			}
			d, _ := Describe(vs)
			for k, st := range CSVHeader[1:] {
				w, _ := d.Stat(st)
				if got, _ := strconv.ParseFloat(r[k+1], 64); math.Abs(got-w) > 0.005+1e-9*math.Abs(w) {
					t.Errorf("CSV %s column %s = %s, recomputed %.4f", r[0], st, r[k+1], w)
				}
			}
		}
	}

	// Goodput with two SLOs counts the requests meeting both (not the last one alone).
	slos := []SLO{{Tag: TagTTFT, Threshold: 25, Unit: "ms"}, {Tag: TagRequestLatency, Threshold: 110, Unit: "ms"}}
	recs := synthRecords(200, 5, 1, 42)
	good, onlyLast := 0, 0
	for i := range recs {
		r := &recs[i]
		if r.Metadata.BenchmarkPhase != PhaseProfiling || r.Error != nil {
			continue
		}
		ttft, _ := r.Value(TagTTFT)
		lat, _ := r.Value(TagRequestLatency)
		if ttft <= 25 && lat <= 110 {
			good++
		}
		if lat <= 110 {
			onlyLast++
		}
	}
	if good == onlyLast {
		t.Fatalf("the synthetic run does not tell both SLOs from the last: %d good either way", good)
	}
	ps := Aggregate(recs, PhaseProfiling, slos, nil)
	if g, _ := ps.Stat(TagGoodRequestCount, "avg"); g != float64(good) {
		t.Errorf("good_request_count = %v, want %d (requests meeting both SLOs)", g, good)
	}
	if g, _ := ps.Stat(TagGoodput, "avg"); math.Abs(g-float64(good)/((maxEnd-minStart)/1e9)) > 1e-6*g {
		t.Errorf("goodput = %v, want %d / the window", g, good)
	}

	// ReadRun + Summarize reproduces summary.json exactly.
	run, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	again := Summarize(run)
	onDisk, err := ReadSummary(dir)
	if err != nil {
		t.Fatal(err)
	}
	ab, _ := json.Marshal(again)
	db, _ := json.Marshal(onDisk)
	if !bytes.Equal(ab, db) {
		t.Errorf("statistics recomputed from the run directory differ from summary.json:\n%s\n%s", ab, db)
	}
	var gpu bytes.Buffer
	json.Compact(&gpu, onDisk.GPUTelemetry)
	if gpu.String() != `{"available":false}` || onDisk.Warmup.Requests != 5 {
		t.Errorf("summary.json: gpu %s, warmup requests %d", gpu.String(), onDisk.Warmup.Requests)
	}
	md, _ := os.ReadFile(filepath.Join(dir, SummaryMDFile))
	for _, w := range []string{"| Metric | avg |", "| Time to First Token (ms) |", "| Goodput (requests/sec) |", "| 503 | overloaded |", "5 warmup requests"} {
		if !strings.Contains(string(md), w) {
			t.Errorf("summary.md lacks %q:\n%s", w, md)
		}
	}
}

func decodePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 200 {
		t.Errorf("%s is only %v", path, b)
	}
}

func TestPlotsArePNG(t *testing.T) {
	root := t.TempDir()
	var sums []*Summary
	for i, c := range []float64{1, 4, 16} {
		dir := filepath.Join(root, fmt.Sprintf("c%d", int(c)))
		s := writeSynthRun(t, dir, float64(i+1))
		s.Sweep.Value = c
		sums = append(sums, s)
	}
	decodePNG(t, filepath.Join(root, "c1", LatencyCDFPNG))
	decodePNG(t, filepath.Join(root, "c1", TTFTHistogramPNG))
	names, err := PlotSweep(root, sums)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		decodePNG(t, filepath.Join(root, n))
	}
	if len(names) != 3 {
		t.Errorf("PlotSweep wrote %v", names)
	}
	if out := os.Getenv("MQ_KEEP_PLOTS"); out != "" { // for looking at the plots by eye
		for _, p := range []string{"c1/" + LatencyCDFPNG, "c1/" + TTFTHistogramPNG, SweepThroughputPNG, SweepP99LatencyPNG, SweepTradeoffPNG} {
			b, _ := os.ReadFile(filepath.Join(root, p))
			os.WriteFile(filepath.Join(out, strings.ReplaceAll(p, "/", "_")), b, 0o644)
		}
	}
}

// TestCompareKnownRatio: the candidate's latencies are exactly 2× the base's (same draw,
// scale 2), so every latency ratio is 2 and its bootstrap interval must contain 2; per-user
// throughput (1/ITL) halves.
func TestCompareKnownRatio(t *testing.T) {
	base := &Run{Name: "base", Records: synthRecords(300, 0, 1, 9)}
	cand := &Run{Name: "cand", Records: synthRecords(300, 0, 2, 9)}
	cmps := Compare(base, cand, CompareOptions{Iterations: 400})
	for _, tc := range []struct {
		tag, stat string
		want      float64
	}{{TagTTFT, "avg", 2}, {TagTTFT, "p99", 2}, {TagRequestLatency, "p50", 2}, {TagOutputTPSPerUser, "avg", 0.5}} {
		c, ok := FindComparison(cmps, tc.tag, tc.stat)
		if !ok {
			t.Fatalf("no comparison for %s %s", tc.tag, tc.stat)
		}
		if math.Abs(c.Ratio-tc.want) > 1e-9 || !c.HasCI || c.Lo > tc.want || c.Hi < tc.want || c.Hi-c.Lo > 0.3*tc.want {
			t.Errorf("%s %s: ratio %v CI [%v, %v], want %v inside a narrow interval", tc.tag, tc.stat, c.Ratio, c.Lo, c.Hi, tc.want)
		}
	}
	// Same inputs and seed: same interval.
	again := Compare(base, cand, CompareOptions{Iterations: 400})
	if !reflect.DeepEqual(cmps, again) {
		t.Error("Compare is not deterministic for a fixed seed")
	}
	// Identical runs: ratio 1, interval contains 1, verdict "same".
	same := Compare(base, base, CompareOptions{Iterations: 200})
	c, _ := FindComparison(same, TagRequestLatency, "avg")
	if c.Ratio != 1 || c.Lo > 1 || c.Hi < 1 {
		t.Errorf("self-compare: %+v", c)
	}
	var out bytes.Buffer
	WriteComparison(&out, "base", "cand", cmps)
	if !strings.Contains(out.String(), "Time to First Token (ms)") || !strings.Contains(out.String(), "worse") {
		t.Errorf("comparison table:\n%s", out.String())
	}
}

func TestMerge(t *testing.T) {
	a := &Run{Name: "a", Records: synthRecords(50, 2, 1, 1), Cost: &ServingCost{FrontendCPUNs: 100}}
	b := &Run{Name: "b", Records: synthRecords(70, 2, 1, 2), Cost: &ServingCost{FrontendCPUNs: 300}}
	m, err := Merge([]*Run{a, b}, []string{"host-a", "host-b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Records) != 124 || m.Records[0].Metadata.ShardID != "host-a" || m.Records[123].Metadata.ShardID != "host-b" {
		t.Fatalf("merged %d records, shards %q..%q", len(m.Records), m.Records[0].Metadata.ShardID, m.Records[123].Metadata.ShardID)
	}
	s := Summarize(m)
	sa, sb := Summarize(a), Summarize(b)
	ca, _ := sa.Profiling.Stat(TagRequestCount, "avg")
	cb, _ := sb.Profiling.Stat(TagRequestCount, "avg")
	cm, _ := s.Profiling.Stat(TagRequestCount, "avg")
	if cm != ca+cb || s.Warmup.Requests != 4 {
		t.Errorf("merged request count %v (want %v), warmup %d", cm, ca+cb, s.Warmup.Requests)
	}
	// The merged p99 is the p99 of the pooled values, not an average of p99s.
	var pooled []float64
	pooled = append(pooled, recordValues(a.Records, PhaseProfiling, TagTTFT)...)
	pooled = append(pooled, recordValues(b.Records, PhaseProfiling, TagTTFT)...)
	d, _ := Describe(pooled)
	if got, _ := s.Profiling.Stat(TagTTFT, "p99"); got != d.P99 {
		t.Errorf("merged TTFT p99 %v, pooled %v", got, d.P99)
	}
	if m.Cost.FrontendCPUNs != 400 {
		t.Errorf("merged frontend CPU %d, want 400", m.Cost.FrontendCPUNs)
	}
	b.SLOs = []SLO{{Tag: TagTTFT, Threshold: 1}}
	if _, err := Merge([]*Run{a, b}, []string{"a", "b"}); err == nil {
		t.Error("Merge accepted runs with different SLOs")
	}
}

func TestMergeJUnit(t *testing.T) {
	dir := t.TempDir()
	j1 := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" disabled="0" errors="0" failures="1" time="1.5">
  <testsuite name="qwen" tests="2" disabled="0" skipped="0" errors="0" failures="1" time="1.5">
    <testcase name="parity" classname="qwen" status="failed" time="1"><failure message="x">boom &amp; more</failure></testcase>
    <testcase name="load" classname="qwen" status="passed" time="0.5"></testcase>
  </testsuite>
</testsuites>`
	j2 := `<testsuite name="gpt2" tests="1" disabled="0" skipped="1" errors="0" failures="0" time="0.25">
    <testcase name="parity" classname="gpt2" status="skipped" time="0"><skipped message="no gpu"></skipped></testcase>
</testsuite>`
	p1, p2, out := filepath.Join(dir, "a.xml"), filepath.Join(dir, "b.xml"), filepath.Join(dir, "junit.xml")
	os.WriteFile(p1, []byte(j1), 0o644)
	os.WriteFile(p2, []byte(j2), 0o644)
	if err := MergeJUnit(out, []string{p1, p2}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	var got junitRoot
	if err := xml.Unmarshal(b, &got); err != nil {
		t.Fatalf("merged JUnit does not parse: %v\n%s", err, b)
	}
	attrs := map[string]string{}
	for _, a := range got.Attrs {
		attrs[a.Name.Local] = a.Value
	}
	if len(got.Suites) != 2 || attrs["tests"] != "3" || attrs["failures"] != "1" || attrs["skipped"] != "1" || attrs["time"] != "1.75" {
		t.Errorf("merged root %v with %d suites:\n%s", attrs, len(got.Suites), b)
	}
	if !strings.Contains(string(b), "boom &amp; more") || !strings.Contains(string(b), `<skipped message="no gpu">`) {
		t.Errorf("suite bodies not kept verbatim:\n%s", b)
	}
}

func TestStartEndTimes(t *testing.T) {
	recs := synthRecords(3, 0, 1, 1)
	s := Summarize(&Run{Records: recs})
	if s.StartTime.UnixNano() != recs[0].Metadata.RequestStartNs || s.EndTime.Before(s.StartTime) || s.EndTime.Location() != time.UTC {
		t.Errorf("start %v end %v", s.StartTime, s.EndTime)
	}
}

// TestWriteRunAllFailed: a run where every request failed still writes parseable exports
// with the errors and no latency statistics (and no plots).
func TestWriteRunAllFailed(t *testing.T) {
	recs := synthRecords(4, 0, 1, 3)
	for i := range recs {
		recs[i].Metrics = map[string]MetricValue{}
		recs[i].Error = &ErrorDetails{Code: 0, Type: "connection", Message: "connection refused"}
	}
	dir := t.TempDir()
	s, err := WriteRun(dir, &Run{Name: "down", Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Profiling.Metrics[TagRequestLatency]; ok {
		t.Error("all-failed run has a request latency")
	}
	if n, _ := s.Profiling.Stat(TagErrorRequestCount, "avg"); n != 4 {
		t.Errorf("error count %v, want 4", n)
	}
	var a map[string]json.RawMessage
	b, _ := os.ReadFile(filepath.Join(dir, AIPerfJSONFile))
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %v\n%s", AIPerfJSONFile, err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, LatencyCDFPNG)); err == nil {
		t.Error("latency CDF written without any valid request")
	}
}

// TestReadRunRefusesOtherLayouts: an older AIPerf layout, GenAI-Perf's export or an empty
// file are refused by name rather than read as a run without metrics.
func TestReadRunRefusesOtherLayouts(t *testing.T) {
	for name, tc := range map[string]struct{ file, body, want string }{
		"old aiperf": {ProfileExportJSONL, `{"metadata":{"x_request_id":"a","timestamp_ns":1},"metrics":{"request_latency":{"value":1,"unit":"ms"}}}` + "\n", "older AIPerf"},
		"raw":        {ProfileExportJSONL, `{"start_perf_ns":1,"request":{},"responses":[]}` + "\n", "raw records"},
		"unknown":    {ProfileExportJSONL, `{"latency":3}` + "\n", "unknown layout"},
		"empty":      {ProfileExportJSONL, "\n", "holds no request"},
		"genai-perf": {"profile_export.json", `{"experiments":[]}`, "GenAI-Perf"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ReadRun error %v, want one naming %q", name, err, tc.want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, SummaryJSONFile), []byte(`{"schema_version": 99}`), 0o644)
	if _, err := ReadSummary(dir); err == nil || !strings.Contains(err.Error(), "schema_version 99") {
		t.Errorf("summary.json of schema 99: %v", err)
	}
}

// TestMergeKeepsShardWindows: two shards one after another (a 10 s gap between them) are
// measured over the union of their windows, not the wall-clock span with the gap.
func TestMergeKeepsShardWindows(t *testing.T) {
	a := synthRecords(50, 0, 1, 3)
	b := synthRecords(50, 0, 1, 4)
	spanA := Aggregate(a, PhaseProfiling, nil, nil)
	durA, _ := spanA.Stat(TagBenchmarkDuration, "avg")
	shift := spanA.Metrics[TagMaxResponseTimestamp].Avg - spanA.Metrics[TagMinRequestTimestamp].Avg + 10e9
	for i := range b {
		b[i].Metadata.RequestStartNs += int64(shift)
		b[i].Metadata.RequestEndNs += int64(shift)
	}
	spanB := Aggregate(b, PhaseProfiling, nil, nil)
	durB, _ := spanB.Stat(TagBenchmarkDuration, "avg")
	m, err := Merge([]*Run{{Name: "a", Records: a}, {Name: "b", Records: b}}, []string{"gpu-a", "gpu-b"})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(m)
	dur, _ := s.Profiling.Stat(TagBenchmarkDuration, "avg")
	if math.Abs(dur-(durA+durB)) > 1e-6 || len(s.Profiling.Shards) != 2 || math.Abs(s.Profiling.ShardGapSec-10) > 1e-3 {
		t.Errorf("merged duration %v (want %v + %v), shards %+v, gap %v (want 10 s)", dur, durA, durB, s.Profiling.Shards, s.Profiling.ShardGapSec)
	}
	if md := Markdown(s); !strings.Contains(md, "do not all overlap") || !strings.Contains(md, "gpu-b") {
		t.Errorf("summary.md does not say the windows are apart:\n%s", md)
	}
}

// seriesPixels counts, per palette colour, the pixels of that colour in the PNG at path and
// how many lie within edge pixels of the image's border (drawn on the edge: clipped).
func seriesPixels(t *testing.T, path string, edge int) (count, onEdge map[int]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	count, onEdge = map[int]int{}, map[int]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			for i, c := range palette {
				pr, pg, pb, _ := c.RGBA()
				near := func(a, b uint32) bool { return a>>8 >= b>>8-6 && a>>8 <= b>>8+6 }
				if near(r, pr) && near(g, pg) && near(bl, pb) {
					count[i]++
					if x-b.Min.X < edge || b.Max.X-1-x < edge || y-b.Min.Y < edge || b.Max.Y-1-y < edge {
						onEdge[i]++
					}
				}
			}
		}
	}
	return count, onEdge
}

// TestPlotsShowEverySeriesUnclipped: every plotted series is drawn (its colour covers a
// line's worth of pixels, legend included) and none of it touches the image's border, where
// gonum's exact data range used to cut the last point, the top of a line and the legend.
func TestPlotsShowEverySeriesUnclipped(t *testing.T) {
	root := t.TempDir()
	var sums []*Summary
	for i, c := range []float64{1, 4, 16} {
		s := writeSynthRun(t, filepath.Join(root, fmt.Sprintf("c%d", int(c))), float64(i+1))
		s.Sweep.Value = c
		sums = append(sums, s)
	}
	if _, err := PlotSweep(root, sums); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		series int
	}{
		{filepath.Join(root, "c1", LatencyCDFPNG), 2}, // request latency, TTFT (no task time in synthetic runs)
		{filepath.Join(root, "c1", TTFTHistogramPNG), 1},
		{filepath.Join(root, SweepThroughputPNG), 1},
		{filepath.Join(root, SweepP99LatencyPNG), 2},
	} {
		count, onEdge := seriesPixels(t, tc.path, 3)
		for i := 0; i < tc.series; i++ {
			if count[i] < 200 {
				t.Errorf("%s: series %d has %d pixels; is it drawn?", filepath.Base(tc.path), i, count[i])
			}
			if onEdge[i] > 0 {
				t.Errorf("%s: series %d has %d pixels on the image's border (clipped)", filepath.Base(tc.path), i, onEdge[i])
			}
		}
	}
}
