package load_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/records"
)

// This file checks a real profile's exports field by field against AIPerf 0.13's metric
// definitions, written down here from AIPerf's metrics reference and exporters (and
// ../shared/METRICS.md) rather than taken from the code under test: every expected value is
// recomputed from the raw client records (client_records.jsonl) with the arithmetic below.

// aiperfMetric is one AIPerf metric as its reference documents it: header, display unit,
// whether it is per request (a distribution) or one run-level value, and whether AIPerf
// writes it as a whole number.
type aiperfMetric struct {
	header, unit      string
	perRequest, whole bool
	streamingOnly     bool
}

var aiperfMetrics = map[string]aiperfMetric{
	"time_to_first_token":              {"Time to First Token", "ms", true, false, true},
	"time_to_second_token":             {"Time to Second Token", "ms", true, false, true},
	"request_latency":                  {"Request Latency", "ms", true, false, false},
	"inter_token_latency":              {"Inter Token Latency", "ms", true, false, true},
	"inter_chunk_latency":              {"Inter Chunk Latency", "ms", true, false, true},
	"output_token_throughput_per_user": {"Output Token Throughput Per User", "tokens/sec/user", true, false, true},
	"output_sequence_length":           {"Output Sequence Length", "tokens", true, true, false},
	"output_token_count":               {"Output Token Count", "tokens", true, true, false},
	"input_sequence_length":            {"Input Sequence Length", "tokens", true, true, false},
	"error_isl":                        {"Error Input Sequence Length", "tokens", true, true, false},
	"request_count":                    {"Request Count", "requests", false, true, false},
	"error_request_count":              {"Error Request Count", "requests", false, true, false},
	"good_request_count":               {"Good Request Count", "requests", false, true, false},
	"total_output_tokens":              {"Total Output Tokens", "tokens", false, true, false},
	"total_osl":                        {"Total Output Sequence Length", "tokens", false, true, false},
	"total_isl":                        {"Total Input Sequence Length", "tokens", false, true, false},
	"total_error_isl":                  {"Total Error Input Sequence Length", "tokens", false, true, false},
	"min_request_timestamp":            {"Minimum Request Timestamp", "ns", false, true, false},
	"max_response_timestamp":           {"Maximum Response Timestamp", "ns", false, true, false},
	"benchmark_duration":               {"Benchmark Duration", "sec", false, false, false},
	"request_throughput":               {"Request Throughput", "requests/sec", false, false, false},
	"output_token_throughput":          {"Output Token Throughput", "tokens/sec", false, false, false},
	"goodput":                          {"Goodput", "requests/sec", false, false, false},
}

// r7 is numpy's default percentile (linear, R type 7) on a sorted copy of x.
func r7(x []float64, p float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	h := p / 100 * float64(len(s)-1)
	lo := math.Floor(h)
	if int(lo)+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[int(lo)] + (h-lo)*(s[int(lo)+1]-s[int(lo)])
}

func mean(x []float64) float64 {
	t := 0.0
	for _, v := range x {
		t += v
	}
	return t / float64(len(x))
}

// popStd divides by n, as np.std does (METRICS.md).
func popStd(x []float64) float64 {
	m, t := mean(x), 0.0
	for _, v := range x {
		t += (v - m) * (v - m)
	}
	return math.Sqrt(t / float64(len(x)))
}

func closeTo(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want))
}

// expectedPerRequest is what AIPerf's record metrics give for one client record.
func expectedPerRequest(r *records.Request) map[string][]float64 {
	out := map[string][]float64{}
	if r.Error != nil || r.Cancelled {
		out["error_isl"] = []float64{float64(r.InputTokens)}
		return out
	}
	osl := float64(r.OutputTokensServer) // the mock server reports usage
	out["input_sequence_length"] = []float64{float64(r.InputTokens)}
	out["output_sequence_length"] = []float64{osl}
	out["output_token_count"] = []float64{osl}
	last := r.EndNs
	if len(r.ChunkNs) > 0 {
		last = r.ChunkNs[len(r.ChunkNs)-1]
	}
	out["request_latency"] = []float64{float64(last) / 1e6}
	if !r.Stream || len(r.ChunkNs) == 0 {
		return out
	}
	first := r.ChunkNs[0]
	out["time_to_first_token"] = []float64{float64(first) / 1e6}
	if len(r.ChunkNs) >= 2 {
		out["time_to_second_token"] = []float64{float64(r.ChunkNs[1]-first) / 1e6}
		var icl []float64
		for i := 1; i < len(r.ChunkNs); i++ {
			icl = append(icl, float64(r.ChunkNs[i]-r.ChunkNs[i-1])/1e6)
		}
		out["inter_chunk_latency"] = icl
	}
	if osl >= 2 {
		itl := float64(last-first) / (osl - 1) / 1e6
		out["inter_token_latency"] = []float64{itl}
		if itl > 0 {
			out["output_token_throughput_per_user"] = []float64{1e3 / itl}
		}
	}
	return out
}

func TestAIPerfExportsFieldByField(t *testing.T) {
	tok := gpt2(t)
	bundle := launchtest.MockBundle(t, 2*time.Millisecond)
	ep := launchtest.Start(t, bundle)
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			out := t.TempDir()
			res, err := load.Profile(context.Background(), load.ProfileInput{
				Endpoint: ep,
				Load: load.Config{Endpoint: client.Completions, Stream: stream, Requests: 40, Warmup: 4,
					Prompts: synthetic(t, tok, 24), OutputTokens: 6, Tokenizer: tok, Seed: 11,
					CancelRate: 0.15, CancelDelay: 7 * time.Millisecond},
				Concurrencies: []int{4},
				OutDir:        out,
				SLOs:          "request_latency:60ms",
			})
			if err != nil {
				t.Fatal(err)
			}
			checkAIPerfRun(t, res.Points[0].Dir, ep.Model, stream, 60)
		})
	}
}

func checkAIPerfRun(t *testing.T, dir, model string, stream bool, sloLatencyMs float64) {
	raw, err := records.ReadJSONL[records.Request](filepath.Join(dir, load.ClientRecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*records.Request{}
	for i := range raw {
		byID[raw[i].RequestID] = &raw[i]
	}

	// profile_export.jsonl: every line, every field.
	b, err := os.ReadFile(filepath.Join(dir, "profile_export.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) != len(raw) {
		t.Fatalf("profile_export.jsonl has %d lines for %d requests", len(lines), len(raw))
	}
	type line struct {
		Metadata map[string]json.RawMessage `json:"metadata"`
		Metrics  map[string]struct {
			Value json.RawMessage `json:"value"`
			Unit  string          `json:"unit"`
		} `json:"metrics"`
		Error *struct {
			Code    int    `json:"code"`
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	// Pooled values of the profiling phase, recomputed from the raw records.
	pooled := map[string][]float64{}
	var (
		valid, failed, good, cancelled int
		sumOSL, sumISL, sumErrISL      float64
		minStart, maxEnd               int64 = math.MaxInt64, math.MinInt64
		errorCodes                           = map[int]int{}
	)
	for n, l := range lines {
		var got line
		if err := json.Unmarshal(l, &got); err != nil {
			t.Fatalf("line %d: %v", n+1, err)
		}
		for _, k := range []string{"session_num", "x_request_id", "x_correlation_id", "conversation_id", "turn_index",
			"request_start_ns", "request_ack_ns", "request_end_ns", "worker_id", "record_processor_id",
			"benchmark_phase", "was_cancelled", "cancellation_time_ns"} {
			if _, ok := got.Metadata[k]; !ok {
				t.Errorf("line %d: metadata lacks %s", n+1, k)
			}
		}
		var id string
		json.Unmarshal(got.Metadata["x_request_id"], &id)
		r := byID[id]
		if r == nil {
			t.Fatalf("line %d: x_request_id %q is no client request", n+1, id)
		}
		var startNs, endNs int64
		var phase string
		var wasCancelled bool
		json.Unmarshal(got.Metadata["request_start_ns"], &startNs)
		json.Unmarshal(got.Metadata["request_end_ns"], &endNs)
		json.Unmarshal(got.Metadata["benchmark_phase"], &phase)
		json.Unmarshal(got.Metadata["was_cancelled"], &wasCancelled)
		if startNs != r.StartUnixNs || endNs != r.StartUnixNs+r.EndNs || phase != r.Phase || wasCancelled != r.Cancelled {
			t.Errorf("%s: metadata start %d end %d phase %s cancelled %v; raw %d %d %s %v", id, startNs, endNs, phase, wasCancelled,
				r.StartUnixNs, r.StartUnixNs+r.EndNs, r.Phase, r.Cancelled)
		}
		if r.Cancelled {
			var ct int64
			json.Unmarshal(got.Metadata["cancellation_time_ns"], &ct)
			if ct != r.StartUnixNs+r.CancelNs || got.Error == nil || got.Error.Code != 499 {
				t.Errorf("%s: cancelled request: cancellation_time_ns %d (want %d), error %+v, want code 499", id, ct, r.StartUnixNs+r.CancelNs, got.Error)
			}
		}
		want := expectedPerRequest(r)
		for tag, w := range want {
			m, ok := got.Metrics[tag]
			if !ok {
				t.Errorf("%s: metrics lack %s", id, tag)
				continue
			}
			if m.Unit != aiperfMetrics[tag].unit {
				t.Errorf("%s: %s unit %q, want %q", id, tag, m.Unit, aiperfMetrics[tag].unit)
			}
			var vals []float64
			if tag == "inter_chunk_latency" {
				json.Unmarshal(m.Value, &vals)
			} else {
				var v float64
				json.Unmarshal(m.Value, &v)
				vals = []float64{v}
			}
			if len(vals) != len(w) {
				t.Errorf("%s: %s = %v, want %v", id, tag, vals, w)
				continue
			}
			for i := range w {
				if !closeTo(vals[i], w[i]) {
					t.Errorf("%s: %s = %v, want %v", id, tag, vals, w)
					break
				}
			}
		}
		// No AIPerf metric beyond what its definitions give (streaming ones on a
		// non-streaming request, latencies on an error).
		for tag := range got.Metrics {
			if _, known := aiperfMetrics[tag]; known {
				if _, ok := want[tag]; !ok {
					t.Errorf("%s: has %s, which AIPerf does not define for this request (stream %v, failed %v)", id, tag, r.Stream, r.Error != nil || r.Cancelled)
				}
			} else if !strings.HasPrefix(tag, "mq_") {
				t.Errorf("%s: metric %s is neither AIPerf's nor prefixed mq_", id, tag)
			}
		}
		if r.Phase != records.PhaseProfiling {
			continue
		}
		for tag, w := range want {
			pooled[tag] = append(pooled[tag], w...)
		}
		if r.Error != nil || r.Cancelled {
			failed++
			sumErrISL += float64(r.InputTokens)
			if r.Cancelled {
				cancelled++
				errorCodes[499]++
			} else {
				errorCodes[r.Error.Code]++
			}
			continue
		}
		valid++
		sumOSL += want["output_sequence_length"][0]
		sumISL += want["input_sequence_length"][0]
		lat := want["request_latency"][0]
		if lat <= sloLatencyMs {
			good++
		}
		minStart = min(minStart, r.StartUnixNs)
		maxEnd = max(maxEnd, r.StartUnixNs+int64(math.Round(lat*1e6)))
	}
	if valid == 0 || cancelled == 0 {
		t.Fatalf("the run needs valid and cancelled requests to check both kinds: valid %d cancelled %d", valid, cancelled)
	}

	// profile_export_aiperf.json.
	b, err = os.ReadFile(filepath.Join(dir, "profile_export_aiperf.json"))
	if err != nil {
		t.Fatal(err)
	}
	var agg map[string]json.RawMessage
	if err := json.Unmarshal(b, &agg); err != nil {
		t.Fatal(err)
	}
	type stats struct {
		Unit  string   `json:"unit"`
		Avg   *float64 `json:"avg"`
		Min   *float64 `json:"min"`
		Max   *float64 `json:"max"`
		P1    *float64 `json:"p1"`
		P5    *float64 `json:"p5"`
		P10   *float64 `json:"p10"`
		P25   *float64 `json:"p25"`
		P50   *float64 `json:"p50"`
		P75   *float64 `json:"p75"`
		P90   *float64 `json:"p90"`
		P95   *float64 `json:"p95"`
		P99   *float64 `json:"p99"`
		Std   *float64 `json:"std"`
		Count *int     `json:"count"`
	}
	readStats := func(tag string) (stats, bool) {
		var s stats
		rawS, ok := agg[tag]
		if !ok {
			return s, false
		}
		if err := json.Unmarshal(rawS, &s); err != nil {
			t.Errorf("%s: %v", tag, err)
		}
		return s, true
	}
	durSec := float64(maxEnd-minStart) / 1e9
	scalars := map[string]float64{
		"request_count":           float64(valid),
		"error_request_count":     float64(failed),
		"good_request_count":      float64(good),
		"total_output_tokens":     sumOSL,
		"total_osl":               sumOSL,
		"total_isl":               sumISL,
		"total_error_isl":         sumErrISL,
		"min_request_timestamp":   float64(minStart),
		"max_response_timestamp":  float64(maxEnd),
		"benchmark_duration":      durSec,
		"request_throughput":      float64(valid) / durSec,
		"output_token_throughput": sumOSL / durSec,
		"goodput":                 float64(good) / durSec,
	}
	for tag, want := range scalars {
		s, ok := readStats(tag)
		switch {
		case !ok:
			t.Errorf("profile_export_aiperf.json lacks %s", tag)
		case s.Unit != aiperfMetrics[tag].unit || s.Avg == nil:
			t.Errorf("%s: unit %q avg %v, want unit %q", tag, s.Unit, s.Avg, aiperfMetrics[tag].unit)
		case s.P50 != nil || s.Count != nil:
			t.Errorf("%s: a run-level value carries percentiles or a count", tag)
		case tag == "min_request_timestamp" || tag == "max_response_timestamp":
			if math.Abs(*s.Avg-want) > 512 { // a float64 holds epoch ns to 256 ns
				t.Errorf("%s = %v, want %v", tag, *s.Avg, want)
			}
		case !closeTo(*s.Avg, want):
			t.Errorf("%s = %v, want %v", tag, *s.Avg, want)
		}
	}
	for tag, vals := range pooled {
		s, ok := readStats(tag)
		if !ok {
			t.Errorf("profile_export_aiperf.json lacks %s", tag)
			continue
		}
		want := map[string]float64{"avg": mean(vals), "std": popStd(vals), "min": r7(vals, 0), "max": r7(vals, 100)}
		for _, p := range []float64{1, 5, 10, 25, 50, 75, 90, 95, 99} {
			want["p"+strconv.Itoa(int(p))] = r7(vals, p)
		}
		got := map[string]*float64{"avg": s.Avg, "std": s.Std, "min": s.Min, "max": s.Max, "p1": s.P1, "p5": s.P5, "p10": s.P10,
			"p25": s.P25, "p50": s.P50, "p75": s.P75, "p90": s.P90, "p95": s.P95, "p99": s.P99}
		for k, w := range want {
			if got[k] == nil || !closeTo(*got[k], w) {
				t.Errorf("%s.%s = %v, want %v", tag, k, got[k], w)
			}
		}
		if s.Count == nil || *s.Count != len(vals) || s.Unit != aiperfMetrics[tag].unit {
			t.Errorf("%s: count %v unit %q, want %d %q", tag, s.Count, s.Unit, len(vals), aiperfMetrics[tag].unit)
		}
	}
	for tag, m := range aiperfMetrics {
		if _, ok := agg[tag]; ok && m.streamingOnly && !stream {
			t.Errorf("non-streaming run exports %s", tag)
		}
	}
	var top struct {
		InputConfig struct {
			Endpoint struct {
				ModelNames []string `json:"model_names"`
				Type       string   `json:"type"`
				Streaming  bool     `json:"streaming"`
			} `json:"endpoint"`
			Loadgen struct {
				Concurrency        int `json:"concurrency"`
				RequestCount       int `json:"request_count"`
				WarmupRequestCount int `json:"warmup_request_count"`
			} `json:"loadgen"`
		} `json:"input_config"`
		WasCancelled *bool `json:"was_cancelled"`
		ErrorSummary []struct {
			ErrorDetails struct {
				Code int `json:"code"`
			} `json:"error_details"`
			Count int `json:"count"`
		} `json:"error_summary"`
		StartTime string `json:"start_time"`
		EndTime   string `json:"end_time"`
	}
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	ic := top.InputConfig
	if len(ic.Endpoint.ModelNames) != 1 || ic.Endpoint.ModelNames[0] != model || ic.Endpoint.Type != "completions" ||
		ic.Endpoint.Streaming != stream || ic.Loadgen.Concurrency != 4 || ic.Loadgen.RequestCount != 40 || ic.Loadgen.WarmupRequestCount != 4 {
		t.Errorf("input_config = %+v, want model_names [%s], type completions, streaming %v, concurrency 4, 40 requests, 4 warmup", ic, model, stream)
	}
	if top.WasCancelled == nil || *top.WasCancelled {
		t.Errorf("was_cancelled = %v, want false (the run finished)", top.WasCancelled)
	}
	gotCodes := map[int]int{}
	for _, e := range top.ErrorSummary {
		gotCodes[e.ErrorDetails.Code] += e.Count
	}
	if fmt.Sprint(gotCodes) != fmt.Sprint(errorCodes) {
		t.Errorf("error_summary codes %v, want %v", gotCodes, errorCodes)
	}
	if _, err := time.Parse(time.RFC3339Nano, top.StartTime); err != nil {
		t.Errorf("start_time %q: %v", top.StartTime, err)
	}

	// profile_export_aiperf.csv: AIPerf's two sections, each sorted by tag, "<Header> (<unit>)"
	// without the unit for requests, two decimals but whole numbers for integer values.
	b, err = os.ReadFile(filepath.Join(dir, "profile_export_aiperf.csv"))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.SplitN(string(b), "\r\n\r\n", 2)
	if len(parts) != 2 {
		parts = strings.SplitN(string(b), "\n\n", 2)
	}
	if len(parts) != 2 {
		t.Fatalf("CSV has no blank line between its sections:\n%s", b)
	}
	label := func(tag string) string {
		m := aiperfMetrics[tag]
		if m.unit == "requests" {
			return m.header
		}
		return m.header + " (" + m.unit + ")"
	}
	num := func(tag string, v float64, whole bool) string {
		if whole && aiperfMetrics[tag].whole {
			return strconv.FormatInt(int64(math.Round(v)), 10)
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	dist, err := csv.NewReader(strings.NewReader(parts[0])).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(dist[0], ",") != "Metric,avg,min,max,p1,p5,p10,p25,p50,p75,p90,p95,p99,std" {
		t.Errorf("CSV header %v", dist[0])
	}
	rows := map[string][]string{}
	var order []string
	for _, r := range dist[1:] {
		rows[r[0]] = r
		order = append(order, r[0])
	}
	var wantOrder []string
	var tags []string
	for tag := range pooled {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	for _, tag := range tags {
		wantOrder = append(wantOrder, label(tag))
		vals := pooled[tag]
		r, ok := rows[label(tag)]
		if !ok {
			t.Errorf("CSV lacks row %q", label(tag))
			continue
		}
		want := []string{label(tag), num(tag, mean(vals), false), num(tag, r7(vals, 0), true), num(tag, r7(vals, 100), true)}
		for _, p := range []float64{1, 5, 10, 25, 50, 75, 90, 95, 99} {
			want = append(want, num(tag, r7(vals, p), false))
		}
		want = append(want, num(tag, popStd(vals), false))
		if strings.Join(r, ",") != strings.Join(want, ",") {
			t.Errorf("CSV row\n got %v\nwant %v", r, want)
		}
	}
	var aiperfOrder []string
	for _, l := range order {
		for _, w := range wantOrder {
			if l == w {
				aiperfOrder = append(aiperfOrder, l)
			}
		}
	}
	if strings.Join(aiperfOrder, "|") != strings.Join(wantOrder, "|") {
		t.Errorf("CSV rows not in tag order:\n got %v\nwant %v", aiperfOrder, wantOrder)
	}
	sc, err := csv.NewReader(strings.NewReader(parts[1])).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(sc[0], ",") != "Metric,Value" {
		t.Errorf("CSV second header %v", sc[0])
	}
	srows := map[string]string{}
	for _, r := range sc[1:] {
		srows[r[0]] = r[1]
	}
	for tag, v := range scalars {
		if tag == "min_request_timestamp" || tag == "max_response_timestamp" {
			if _, ok := srows[label(tag)]; !ok {
				t.Errorf("CSV lacks %q", label(tag))
			}
			continue
		}
		if got, want := srows[label(tag)], num(tag, v, true); got != want {
			t.Errorf("CSV %q = %q, want %q", label(tag), got, want)
		}
	}
}
