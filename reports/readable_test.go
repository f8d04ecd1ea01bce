package reports

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/plot"
)

// oddStartRecords are synthRecords shifted to start at an odd nanosecond, which a float64
// (53-bit mantissa) cannot hold at epoch-ns magnitudes: it rounds 1.8e18+1 to a multiple of 256.
func oddStartRecords() ([]ExportRecord, int64) {
	recs := synthRecords(40, 2, 1, 42)
	const shift = 123_456_789
	for i := range recs {
		recs[i].Metadata.RequestStartNs += shift
		recs[i].Metadata.RequestAckNs += shift
		recs[i].Metadata.RequestEndNs += shift
	}
	first := int64(1<<63 - 1)
	for _, r := range recs {
		if r.Metadata.BenchmarkPhase == PhaseProfiling && r.Valid() {
			first = min(first, r.Metadata.RequestStartNs)
		}
	}
	return recs, first
}

// TestTimestampsExact: min_request_timestamp is the first valid request's start to the
// nanosecond in summary.json, profile_export_aiperf.json, the CSV and summary.md, and reads
// back exactly, not rounded through a float64.
func TestTimestampsExact(t *testing.T) {
	recs, first := oddStartRecords()
	if float64(first) == float64(first+1) && int64(float64(first)) == first {
		t.Fatalf("test premise: %d is exact in a float64", first)
	}
	dir := filepath.Join(t.TempDir(), "run")
	if _, err := WriteRun(dir, &Run{Name: "run", Records: recs}); err != nil {
		t.Fatal(err)
	}
	want := strconv.FormatInt(first, 10)
	for _, f := range []string{SummaryJSONFile, AIPerfJSONFile, AIPerfCSVFile, SummaryMDFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks the exact first start %s", f, want)
		}
	}
	s, err := ReadSummary(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := s.Profiling.Metrics[TagMinRequestTimestamp]
	if m.Whole == nil || *m.Whole != first {
		t.Errorf("min_request_timestamp read back as %v (Whole %v), want %d", m.Avg, m.Whole, first)
	}
}

// TestMarkdownIntegersAsIntegers: counts and token sums print as integers, not "40.00".
func TestMarkdownIntegersAsIntegers(t *testing.T) {
	recs, _ := oddStartRecords()
	s := Summarize(&Run{Name: "run", Records: recs})
	md := Markdown(s)
	n, _ := s.Profiling.Stat(TagRequestCount, "avg")
	for _, want := range []string{
		"| Request Count | " + strconv.Itoa(int(n)) + " |",
		"| Error Request Count | " + strconv.Itoa(40-int(n)) + " |",
		"| Total Input Sequence Length (tokens) | " + strconv.Itoa(32*int(n)) + " |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary.md lacks %q", want)
		}
	}
	// Token lengths: min and max whole, the mean with decimals.
	if !strings.Contains(md, "| Output Sequence Length (tokens) | 16.00 | 16.00 | 16.00 | 16.00 | 16 | 16 | 0.00 |") {
		t.Errorf("summary.md's output sequence length row is not min/max whole:\n%s", md)
	}
}

// TestSummaryNamesSeedAndDigest: the seed used and the sweep's base seed, and the bundle's
// digest under the one name bundle_digest, in summary.json and summary.md.
func TestSummaryNamesSeedAndDigest(t *testing.T) {
	recs, _ := oddStartRecords()
	dir := filepath.Join(t.TempDir(), "run")
	run := &Run{Name: "run", Records: recs, Seed: &SeedUse{Base: 7, Used: 8},
		Target: &Target{Server: "qual-server (process)", URL: "http://x", Model: "m", Bundle: "b.mqb", BundleDigest: "abc123"}}
	if _, err := WriteRun(dir, run); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, SummaryJSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Seed   map[string]uint64 `json:"seed"`
		Target map[string]any    `json:"target"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Seed["base"] != 7 || raw.Seed["used"] != 8 {
		t.Errorf("summary.json seed = %v, want base 7, used 8", raw.Seed)
	}
	if raw.Target["bundle_digest"] != "abc123" || raw.Target["bundle_sha256"] != nil {
		t.Errorf("summary.json target = %v, want bundle_digest abc123 and no other bundle hash", raw.Target)
	}
	md, _ := os.ReadFile(filepath.Join(dir, SummaryMDFile))
	for _, want := range []string{"seed 8 (the sweep's seed 7 + this point's index 1)", "bundle_digest `abc123`"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}
}

// TestLatencyCDFAxes: the fraction axis runs 0 to 1 (not to 1.25 for a legend's headroom),
// both axes carry enough labelled ticks to read a value off, and the title names the run,
// its endpoint and its concurrency.
func TestLatencyCDFAxes(t *testing.T) {
	recs, _ := oddStartRecords()
	run := &Run{Name: "profile-c4", Records: recs, Sweep: &SweepPoint{Parameter: "concurrency", Value: 4},
		InputConfig: json.RawMessage(`{"endpoint":{"type":"chat","streaming":true}}`)}
	p, err := latencyCDF(recs, runAbout(run))
	if err != nil {
		t.Fatal(err)
	}
	if p.Y.Min != 0 || p.Y.Max != 1 {
		t.Errorf("CDF fraction axis runs %v..%v, want 0..1", p.Y.Min, p.Y.Max)
	}
	labelled := func(ax plot.Axis) (n int, last string) {
		for _, tk := range ax.Tick.Marker.Ticks(ax.Min, ax.Max) {
			if tk.Label != "" {
				n, last = n+1, tk.Label
			}
		}
		return n, last
	}
	if n, last := labelled(p.Y); n != 11 || last != "1.0" {
		t.Errorf("CDF fraction axis has %d labelled ticks ending at %q, want 11 ending at 1.0", n, last)
	}
	if n, _ := labelled(p.X); n < 6 {
		t.Errorf("CDF latency axis has %d labelled ticks, want at least 6", n)
	}
	for _, w := range []string{"profile-c4", "chat", "concurrency 4"} {
		if !strings.Contains(p.Title.Text, w) {
			t.Errorf("CDF title %q does not name %q", p.Title.Text, w)
		}
	}
}

// TestSweepPlotsLogAxis: a sweep's plots are written with the throughput-latency trade-off
// among them, and their concurrency axis is logarithmic, labelled at the swept values.
func TestSweepPlotsLogAxis(t *testing.T) {
	root := t.TempDir()
	var sums []*Summary
	for i, c := range []float64{1, 2, 4, 8, 16, 32} {
		s := writeSynthRun(t, filepath.Join(root, "profile-c"+strconv.Itoa(int(c))), float64(i+1))
		s.Sweep.Value = c
		sums = append(sums, s)
	}
	names, err := PlotSweep(root, sums)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 3 || names[2] != SweepTradeoffPNG {
		t.Fatalf("PlotSweep wrote %v, want the throughput, p99 and trade-off plots", names)
	}
	for _, n := range names {
		decodePNG(t, filepath.Join(root, n))
	}
	ticks := valueTicks([]float64{1, 2, 4, 8, 16, 32}).Ticks(0.8, 40)
	var labels []string
	for _, tk := range ticks {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if strings.Join(labels, ",") != "1,2,4,8,16,32" {
		t.Errorf("log concurrency axis labels %v, want the swept values", labels)
	}
	if got := sweepAbout(sums); !strings.HasPrefix(got, "profile: completions, streamed") {
		t.Errorf("sweep plot titles name %q, want the sweep's name and endpoint", got)
	}
}

// TestMergeKeepsNotes: a shard's note (e.g. client-side metrics only) holds for the merged
// figures, once however many shards carry it.
func TestMergeKeepsNotes(t *testing.T) {
	recs, _ := oddStartRecords()
	a := &Run{Name: "a", Records: recs, Notes: []string{"client-side metrics only"}}
	b := &Run{Name: "b", Records: recs, Notes: []string{"client-side metrics only"}}
	m, err := Merge([]*Run{a, b}, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Notes) != 1 || m.Notes[0] != "client-side metrics only" {
		t.Errorf("merged notes %q, want the shards' one note once", m.Notes)
	}
	if md := Markdown(Summarize(m)); !strings.Contains(md, "Note: client-side metrics only.") {
		t.Errorf("merged summary.md lacks the note:\n%s", md)
	}
}
