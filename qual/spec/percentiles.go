package spec

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The load gate's check of the reported statistics, written apart from package reports: every
// percentile of profile_export_aiperf.json is recomputed from the raw per-request values of
// profile_export.jsonl (profiling phase, valid requests, list metrics flattened, as AIPerf
// does) with numpy's default "linear" definition (Hyndman & Fan type 7, METRICS.md).

// percentileKeys are AIPerf's percentile fields and their p.
var percentileKeys = []struct {
	key string
	p   float64
}{{"p1", 1}, {"p5", 5}, {"p10", 10}, {"p25", 25}, {"p50", 50}, {"p75", 75}, {"p90", 90}, {"p95", 95}, {"p99", 99}}

// numpyLinear is numpy.percentile(x, p) with method="linear": with x sorted ascending and the
// 0-based rank h = p/100·(n−1), x[⌊h⌋] + (h−⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]). x must be sorted and
// non-empty.
func numpyLinear(x []float64, p float64) float64 {
	h := p / 100 * float64(len(x)-1)
	lo := int(math.Floor(h))
	if lo >= len(x)-1 {
		return x[len(x)-1]
	}
	return x[lo] + (h-float64(lo))*(x[lo+1]-x[lo])
}

// checkExportPercentiles recomputes the percentiles of a run directory's AIPerf JSON from its
// profile_export.jsonl and returns one line per disagreement.
func checkExportPercentiles(dir string) []string {
	values, err := rawProfilingValues(filepath.Join(dir, "profile_export.jsonl"))
	if err != nil {
		return []string{err.Error()}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "profile_export_aiperf.json"))
	if err != nil {
		return []string{fmt.Sprintf("percentile check: %v", err)}
	}
	var summary map[string]json.RawMessage
	if err := json.Unmarshal(raw, &summary); err != nil {
		return []string{fmt.Sprintf("percentile check: profile_export_aiperf.json: %v", err)}
	}
	var out []string
	checked := 0
	for tag, body := range summary {
		var stats map[string]any
		if json.Unmarshal(body, &stats) != nil {
			continue // input_config, error_summary, times
		}
		if _, ok := stats["p50"]; !ok {
			continue // run-level values carry avg only
		}
		x := values[tag]
		if len(x) == 0 {
			out = append(out, fmt.Sprintf("percentile check: %s has percentiles in profile_export_aiperf.json but no raw values in profile_export.jsonl", tag))
			continue
		}
		sort.Float64s(x)
		for _, pk := range percentileKeys {
			got, ok := stats[pk.key].(float64)
			want := numpyLinear(x, pk.p)
			if !ok || math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
				out = append(out, fmt.Sprintf("percentile check: %s.%s is %v in profile_export_aiperf.json, numpy's linear percentile of the %d raw values is %.12g",
					tag, pk.key, stats[pk.key], len(x), want))
			}
		}
		checked++
	}
	if checked == 0 {
		out = append(out, "percentile check: profile_export_aiperf.json has no metric with percentiles")
	}
	sort.Strings(out)
	return out
}

// rawProfilingValues reads every metric value of the profiling requests of a
// profile_export.jsonl, list metrics flattened: the error metrics of failed requests, the
// others of valid ones, as reports.Aggregate computes them.
func rawProfilingValues(path string) (map[string][]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("percentile check: %w", err)
	}
	defer f.Close()
	values := map[string][]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var rec struct {
			Metadata struct {
				Phase string `json:"benchmark_phase"`
			} `json:"metadata"`
			Metrics map[string]struct {
				Value json.RawMessage `json:"value"`
			} `json:"metrics"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("percentile check: %s line %d: %w", path, n, err)
		}
		if rec.Metadata.Phase != "profiling" {
			continue
		}
		// A failed request enters only the error metrics (error_isl: AIPerf's input lengths
		// of failed requests); a valid one every other metric.
		failed := len(rec.Error) > 0 && string(rec.Error) != "null"
		for tag, m := range rec.Metrics {
			if failed != strings.HasPrefix(tag, "error_") {
				continue
			}
			var one float64
			var many []float64
			switch {
			case json.Unmarshal(m.Value, &one) == nil:
				values[tag] = append(values[tag], one)
			case json.Unmarshal(m.Value, &many) == nil:
				values[tag] = append(values[tag], many...)
			}
		}
	}
	return values, sc.Err()
}
