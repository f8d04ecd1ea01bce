package reports

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// A find-max search (qual profile --find-max) profiles one load setting at points chosen as
// it goes, to find the highest request rate or concurrency at which every SLO holds. Its
// points are ordinary runs (one run directory each); what the search adds is written beside
// them, in the sweep's folder, as summary.json and summary.md (WriteFindMax).

// FindMaxSLO is one objective of a search: a per-request metric, a statistic of it over a
// point's measured requests (a percentile, the mean or the maximum) and a threshold.
// "ttft_p99:200ms" is the 99th percentile of time_to_first_token at most 200 ms.
type FindMaxSLO struct {
	// SLO is the per-request threshold; the points' goodput counts the requests meeting
	// every one (METRICS.md).
	SLO
	// Stat is "p<N>" (0 < N <= 100), "avg" or "max"; Percentile is N for a percentile.
	Stat       string  `json:"stat"`
	Percentile float64 `json:"percentile,omitempty"`
}

// Name is the objective as the summary prints it: "time_to_first_token p99 <= 200 ms".
func (s FindMaxSLO) Name() string {
	op := "<="
	if s.LargerIsBetter {
		op = ">="
	}
	return fmt.Sprintf("%s %s %s %s %s", s.Tag, s.Stat, op, strconv.FormatFloat(s.Threshold, 'g', -1, 64), s.Unit)
}

// Measure computes the objective's statistic over the measured (profiling) requests of recs,
// with every failed request and every request lacking the metric counted as missing the
// threshold by as far as can be (+Inf for smaller-is-better metrics, −Inf otherwise), so that
// failures push a percentile the wrong way instead of leaving the sample; planned
// cancellations (code 499) are left out. For larger-is-better metrics a percentile p is read
// from the low end (p99 of output_token_throughput_per_user: 99 % of requests do at least
// that well). n is the number of requests the statistic is over; with none it is NaN.
func (s FindMaxSLO) Measure(recs []ExportRecord) (v float64, n int) {
	worst := math.Inf(1)
	if s.LargerIsBetter {
		worst = math.Inf(-1)
	}
	var x []float64
	for i := range recs {
		r := &recs[i]
		if r.Metadata.BenchmarkPhase != PhaseProfiling {
			continue
		}
		if !r.Valid() {
			if r.Error.Code == CancelledCode || r.Metadata.WasCancelled {
				continue
			}
			x = append(x, worst)
			continue
		}
		if val, ok := r.Value(s.Tag); ok {
			x = append(x, val)
		} else {
			x = append(x, worst)
		}
	}
	if len(x) == 0 {
		return math.NaN(), 0
	}
	sort.Float64s(x)
	switch {
	case s.Stat == "avg":
		sum := 0.0
		for _, f := range x {
			sum += f
		}
		return sum / float64(len(x)), len(x)
	case s.Stat == "max" && s.LargerIsBetter:
		return x[0], len(x) // the worst
	case s.Stat == "max":
		return x[len(x)-1], len(x)
	}
	p := s.Percentile
	if s.LargerIsBetter {
		p = 100 - p
	}
	return percentileInf(x, p), len(x)
}

// percentileInf is Percentile over a sorted sample that may hold infinities: between two
// equal neighbours, or at an exact rank, it takes the neighbour, never computing Inf − Inf.
func percentileInf(sorted []float64, p float64) float64 {
	h := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(h))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	frac := h - float64(lo)
	a, b := sorted[lo], sorted[lo+1]
	if frac == 0 || a == b {
		return a
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		if frac < 1 && math.IsInf(a, 0) {
			return a
		}
		return b
	}
	return a + frac*(b-a)
}

// Met reports whether a measured value meets the objective.
func (s FindMaxSLO) Met(v float64) bool {
	if math.IsNaN(v) {
		return false
	}
	if s.LargerIsBetter {
		return v >= s.Threshold
	}
	return v <= s.Threshold
}

// FindMaxPoint is one point a search profiled, in the order it was profiled.
type FindMaxPoint struct {
	Value float64 `json:"value"` // the rate (req/s) or concurrency
	Dir   string  `json:"dir"`   // its run directory, relative to the sweep's folder's parent
	Pass  bool    `json:"pass"`
	// Failed names the objectives the point missed (FindMaxSLO.Name), or why it could not
	// be judged (the point itself failed).
	Failed []string `json:"failed,omitempty"`
	// Measured holds each objective's statistic, in the order of FindMax.SLOs (null: no
	// request to compute it over); +Inf/−Inf (failed requests) are written as null too, with
	// Failed saying so.
	Measured []*float64 `json:"measured"`
	// Requests and Errors are the point's measured requests and how many failed; Goodput is
	// requests meeting every threshold per second, and RequestThroughput valid ones per second.
	Requests          int      `json:"requests"`
	Errors            int      `json:"errors"`
	Goodput           *float64 `json:"goodput,omitempty"`
	RequestThroughput *float64 `json:"request_throughput,omitempty"`
}

// FindMax is a whole search: what it looked for, every point, and the answer.
type FindMax struct {
	// Parameter is "request_rate" or "concurrency".
	Parameter string       `json:"parameter"`
	SLOs      []FindMaxSLO `json:"slos"`
	// Resolution is how close the answer is to the first failing value above it when the
	// search ends by bisection: an absolute step, or a fraction of the answer (Relative).
	Resolution float64        `json:"resolution"`
	Relative   bool           `json:"resolution_relative,omitempty"`
	MaxPoints  int            `json:"max_points"`
	Points     []FindMaxPoint `json:"points"`
	// Answer is the highest passing value (absent: no point passed); Above the lowest failing
	// value above it (absent: none failed, the answer is a lower bound).
	Answer *float64 `json:"answer,omitempty"`
	Above  *float64 `json:"above,omitempty"`
	// Verdict says the answer in a sentence, with how the search ended.
	Verdict string `json:"verdict"`
}

// FindMaxFile is the search's summary.json name in the sweep folder, beside summary.md.
const FindMaxFile = SummaryJSONFile

// WriteFindMax writes the search's summary.json and summary.md into dir.
func WriteFindMax(dir string, f *FindMax) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write find-max summary: %w", err)
	}
	b, err := json.MarshalIndent(struct {
		FindMax *FindMax `json:"find_max"`
	}{f}, "", "  ")
	if err != nil {
		return fmt.Errorf("write find-max summary: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FindMaxFile), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, SummaryMDFile), []byte(f.Markdown()), 0o644)
}

// ReadFindMax reads what WriteFindMax wrote.
func ReadFindMax(dir string) (*FindMax, error) {
	b, err := os.ReadFile(filepath.Join(dir, FindMaxFile))
	if err != nil {
		return nil, fmt.Errorf("read find-max summary: %w", err)
	}
	var doc struct {
		FindMax *FindMax `json:"find_max"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.FindMax == nil {
		return nil, fmt.Errorf("read %s: no find_max section (%v)", filepath.Join(dir, FindMaxFile), err)
	}
	return doc.FindMax, nil
}

// ValueText writes a searched value: a concurrency as an integer, a rate with up to four
// significant digits.
func (f *FindMax) ValueText(v float64) string {
	if f.Parameter == "concurrency" {
		return strconv.Itoa(int(v))
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func (f *FindMax) unit() string {
	if f.Parameter == "request_rate" {
		return " req/s"
	}
	return ""
}

// Markdown is summary.md's find-max section: the objectives, one row per point in the order
// profiled with each objective's figure (a failing one marked), and the answer.
func (f *FindMax) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Find max: highest %s meeting every SLO\n\n", f.Parameter)
	names := make([]string, len(f.SLOs))
	for i, s := range f.SLOs {
		names[i] = "`" + s.Name() + "`"
		if s.Spec != "" {
			names[i] += " (" + s.Spec + ")"
		}
	}
	fmt.Fprintf(&b, "SLOs: %s. A failed request counts as missing every SLO; goodput counts the requests meeting every threshold (METRICS.md).\n\n", strings.Join(names, ", "))
	fmt.Fprintf(&b, "**%s**\n\n", f.Verdict)
	fmt.Fprintf(&b, "| # | %s | result |", f.Parameter)
	for _, s := range f.SLOs {
		fmt.Fprintf(&b, " %s %s (%s) |", s.Tag, s.Stat, s.Unit)
	}
	b.WriteString(" requests | errors | goodput (req/s) | run |\n|---:|---:|---|")
	for range f.SLOs {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|---:|---|\n")
	for i, p := range f.Points {
		res := "pass"
		if !p.Pass {
			// The missed SLOs by name (their figures are in their columns), or why the point
			// could not be judged.
			var missed []string
			for j, s := range f.SLOs {
				if j < len(p.Measured) && p.Measured[j] != nil && !s.Met(*p.Measured[j]) {
					missed = append(missed, s.Tag+" "+s.Stat)
				}
			}
			if len(missed) == 0 {
				missed = p.Failed
			}
			res = "FAIL: " + strings.Join(missed, ", ")
		}
		fmt.Fprintf(&b, "| %d | %s | %s |", i+1, f.ValueText(p.Value), res)
		for j, s := range f.SLOs {
			cell := "-"
			if j < len(p.Measured) && p.Measured[j] != nil {
				cell = strconv.FormatFloat(*p.Measured[j], 'f', 2, 64)
				if !s.Met(*p.Measured[j]) {
					cell = "**" + cell + "**"
				}
			} else if !p.Pass {
				cell = "**failed requests**"
			}
			b.WriteString(" " + cell + " |")
		}
		gp := "-"
		if p.Goodput != nil {
			gp = strconv.FormatFloat(*p.Goodput, 'f', 2, 64)
		}
		fmt.Fprintf(&b, " %d | %d | %s | %s |\n", p.Requests, p.Errors, gp, p.Dir)
	}
	return b.String()
}

// Conclude sets Answer, Above and Verdict from the points; done says why the search stopped
// ("converged", "point budget spent", ...).
func (f *FindMax) Conclude(stop string) {
	var lo, hi *float64
	for i := range f.Points {
		p := f.Points[i]
		v := p.Value
		if p.Pass && (lo == nil || v > *lo) {
			lo = &v
		}
	}
	for i := range f.Points {
		p := f.Points[i]
		v := p.Value
		if !p.Pass && (lo == nil || v > *lo) && (hi == nil || v < *hi) {
			hi = &v
		}
	}
	f.Answer, f.Above = lo, hi
	switch {
	case lo == nil:
		f.Verdict = fmt.Sprintf("No %s searched meets the SLOs: the lowest tried, %s%s, fails (%s).", f.Parameter, f.ValueText(*hi), f.unit(), stop)
	case hi == nil:
		f.Verdict = fmt.Sprintf("Max %s meeting the SLOs: at least %s%s; no point up to it failed (%s).", f.Parameter, f.ValueText(*lo), f.unit(), stop)
	default:
		f.Verdict = fmt.Sprintf("Max %s meeting the SLOs: %s%s (%s%s fails; %s).", f.Parameter, f.ValueText(*lo), f.unit(), f.ValueText(*hi), f.unit(), stop)
	}
}
