package spec

import (
	"math"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/reports"
)

// METRICS.md's worked example, which numpy.percentile reproduces.
func TestNumpyLinearWorkedExample(t *testing.T) {
	x := []float64{100, 110, 120, 130, 140, 150, 160, 180, 200, 400}
	for p, want := range map[float64]float64{0: 100, 50: 145, 90: 220, 95: 310, 99: 382, 100: 400} {
		if got := numpyLinear(x, p); math.Abs(got-want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if got := numpyLinear([]float64{7}, 99); got != 7 {
		t.Errorf("one value: p99 = %v, want 7", got)
	}
}

// TestExportPercentilesWithFailedRequest: a run with a failed request reports error_isl over
// the failed requests' input lengths; the check reads them from the failed requests too,
// instead of saying "error_isl has percentiles ... but no raw values".
func TestExportPercentilesWithFailedRequest(t *testing.T) {
	rec := func(isl float64, failed bool) reports.ExportRecord {
		r := reports.ExportRecord{Metadata: reports.RecordMetadata{BenchmarkPhase: reports.PhaseProfiling, RequestStartNs: 1e9, RequestEndNs: 1e9 + 5e6}}
		if failed {
			r.Error = &reports.ErrorDetails{Code: 500, Type: "server_error", Message: "x"}
			r.Metrics = map[string]reports.MetricValue{reports.TagErrorISL: {Value: isl, Unit: "tokens"}}
			return r
		}
		r.Metrics = map[string]reports.MetricValue{reports.TagRequestLatency: {Value: 5 + isl, Unit: "ms"},
			reports.TagInputSequenceLength: {Value: isl, Unit: "tokens"}}
		return r
	}
	for _, recs := range [][]reports.ExportRecord{
		{rec(10, false), rec(12, false), rec(7, true)},
		{rec(7, true), rec(9, true)}, // error only
	} {
		dir := t.TempDir()
		if _, err := reports.WriteRun(dir, &reports.Run{Name: "r", Records: recs}); err != nil {
			t.Fatal(err)
		}
		if got := checkExportPercentiles(dir); len(got) != 0 && !(len(got) == 1 && strings.Contains(got[0], "no metric with percentiles") && len(recs) == 2) {
			t.Errorf("%d records: %q", len(recs), got)
		}
	}
}
