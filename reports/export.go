package reports

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// WriteExportJSONL writes profile_export.jsonl: one ExportRecord per line.
func WriteExportJSONL(w io.Writer, recs []ExportRecord) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			return fmt.Errorf("write profile_export.jsonl record %d (%s): %w", i, recs[i].Metadata.XRequestID, err)
		}
	}
	return bw.Flush()
}

// ReadExportJSONL reads profile_export.jsonl (ours or AIPerf's). A malformed line fails with
// its line number, and so does a line in another layout (an older AIPerf's, GenAI-Perf's):
// read as ours it would give a run without any metric, which compare and merge would then
// report as if it were one.
func ReadExportJSONL(r io.Reader) ([]ExportRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	var out []ExportRecord
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := checkRecordLayout(b); err != nil {
			return out, fmt.Errorf("profile_export.jsonl line %d: %w", line, err)
		}
		var rec ExportRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return out, fmt.Errorf("profile_export.jsonl line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// checkRecordLayout refuses a line that is not AIPerf's per-request record (0.2 and later,
// MetricRecordInfo: metadata with benchmark_phase and request_start_ns, metrics, error),
// naming the layout it looks like.
func checkRecordLayout(b []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return err
	}
	var md map[string]json.RawMessage
	_ = json.Unmarshal(top["metadata"], &md)
	_, hasMetrics := top["metrics"]
	_, hasPhase := md["benchmark_phase"]
	_, hasStart := md["request_start_ns"]
	if hasMetrics && hasPhase && hasStart {
		return nil
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	guess := "an unknown layout"
	switch {
	case top["experiments"] != nil || top["requests"] != nil:
		guess = "GenAI-Perf's profile export"
	case top["metadata"] != nil && !hasPhase:
		guess = "an older AIPerf per-request layout (metadata without benchmark_phase)"
	case top["start_perf_ns"] != nil || top["request"] != nil || top["responses"] != nil:
		guess = "AIPerf's raw records (profile_export_raw.jsonl), not its per-request metrics"
	}
	return fmt.Errorf("not AIPerf's per-request record layout (want metadata.benchmark_phase, metadata.request_start_ns and metrics; found keys %v): this looks like %s; re-export it with qual profile or AIPerf 0.2 or later", keys, guess)
}

// timeLayout is how start_time and end_time are written (UTC, RFC 3339 with nanoseconds).
const timeLayout = time.RFC3339Nano

// AIPerfJSON renders profile_export_aiperf.json: one object per metric tag of the profiling
// phase (AIPerf's layout; run-level values carry unit and avg only), then input_config,
// was_cancelled, error_summary, start_time and end_time.
func AIPerfJSON(s *Summary) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("{\n")
	for _, tag := range s.Profiling.Tags() {
		v, err := json.Marshal(s.Profiling.Metrics[tag])
		if err != nil {
			return nil, fmt.Errorf("marshal %s: %w", tag, err)
		}
		fmt.Fprintf(&b, "  %q: %s,\n", tag, v)
	}
	cfg := s.InputConfig
	if len(cfg) == 0 {
		cfg = json.RawMessage("{}")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, cfg); err != nil {
		return nil, fmt.Errorf("input_config is not valid JSON: %w", err)
	}
	fmt.Fprintf(&b, "  \"input_config\": %s,\n", compact.Bytes())
	fmt.Fprintf(&b, "  \"was_cancelled\": %t,\n", s.WasCancelled)
	errs := s.Profiling.Errors
	if errs == nil {
		errs = []ErrorGroup{}
	}
	e, err := json.Marshal(errs)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&b, "  \"error_summary\": %s,\n", e)
	fmt.Fprintf(&b, "  \"start_time\": %q,\n", s.StartTime.UTC().Format(timeLayout))
	fmt.Fprintf(&b, "  \"end_time\": %q\n}\n", s.EndTime.UTC().Format(timeLayout))
	return b.Bytes(), nil
}

// CSVHeader is the header row of the statistics section of profile_export_aiperf.csv.
var CSVHeader = []string{"Metric", "avg", "min", "max", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std"}

// MetricLabel is a metric's display name with unit, AIPerf's "<Header> (<unit>)" (AIPerf
// leaves the unit out when it is "requests" or "count": "Request Count"); unknown tags use
// the tag itself as header.
func MetricLabel(tag, unit string) string {
	h := tag
	if m, ok := LookupMetric(tag); ok {
		h = m.Header
	}
	if unit == "" || strings.EqualFold(unit, "requests") || strings.EqualFold(unit, "count") {
		return h
	}
	return h + " (" + unit + ")"
}

func two(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// whole writes v as AIPerf writes an integer (no decimals) when integer is set.
func whole(v float64, integer bool) string {
	if integer {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	}
	return two(v)
}

// scalar writes a run-level value: exactly when it is held as a whole number (Whole), as an
// integer for whole-number metrics, else with two decimals.
func scalar(tag string, m MetricStats) string {
	if m.Whole != nil {
		return strconv.FormatInt(*m.Whole, 10)
	}
	return whole(m.Avg, IntegerMetric(tag))
}

// WriteAIPerfCSV writes profile_export_aiperf.csv as AIPerf's CSV exporter does: the
// distributions of per-request metrics, a blank line, then Metric,Value rows for run-level
// values; each section sorted by metric tag; numbers with two decimals except whole-number
// values (counts, token sums, timestamps, and the min and max of token lengths), which are
// written as integers.
func WriteAIPerfCSV(w io.Writer, ps *PhaseStats) error {
	cw := csv.NewWriter(w)
	cw.Write(CSVHeader)
	var scalars []string
	tags := ps.Tags()
	sort.Strings(tags)
	for _, tag := range tags {
		m := ps.Metrics[tag]
		if m.Dist == nil {
			scalars = append(scalars, tag)
			continue
		}
		d := m.Dist
		in := IntegerMetric(tag)
		cw.Write([]string{MetricLabel(tag, m.Unit), two(d.Avg), whole(d.Min, in), whole(d.Max, in),
			two(d.P1), two(d.P5), two(d.P10), two(d.P25), two(d.P50), two(d.P75), two(d.P90), two(d.P95), two(d.P99), two(d.Std)})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	cw = csv.NewWriter(w)
	cw.Write([]string{"Metric", "Value"})
	for _, tag := range scalars {
		m := ps.Metrics[tag]
		cw.Write([]string{MetricLabel(tag, m.Unit), scalar(tag, m)})
	}
	cw.Flush()
	return cw.Error()
}

// writeFile writes data through fn to path, reporting the path on failure.
func writeFile(path string, fn func(w io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
