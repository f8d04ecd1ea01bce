package reports

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"
)

// RunComparison is one statistic of one metric compared between two groups of runs of the
// same configuration (repeats). Base and Cand are the means over each group's runs of the
// per-run statistic; Ratio is Cand/Base; [Lo, Hi] is the interval of the ratio at the
// family-wise Level over every statistic compared, so an A/A comparison (identical configs)
// calls any change at all in at most 1 − Level of its comparisons.
type RunComparison struct {
	Comparison
	BaseRuns []float64 `json:"base_runs"` // the statistic in each base run
	CandRuns []float64 `json:"candidate_runs"`
	Level    float64   `json:"level"`   // family-wise confidence of the interval
	Verdict  string    `json:"verdict"` // "no change", "better", "worse", VerdictTooFewRuns; "" when no interval
	// RunsNeeded, with VerdictTooFewRuns, is about how many runs a side would resolve the
	// change seen (or a 5 % change, when the one seen is smaller) at the same level, from
	// the runs' own spread; 0 when that is more than maxRunsNeeded.
	RunsNeeded int `json:"runs_needed,omitempty"`
}

// VerdictTooFewRuns is the verdict of a statistic whose interval contains 1 and is wider
// on both sides than any ratio of a candidate run to a base run: too few runs to say
// "no change" or anything else.
const VerdictTooFewRuns = "too few runs"

// maxRunsNeeded bounds the search of RunsNeeded: beyond it, repeats are not the remedy.
const maxRunsNeeded = 1000

// resolvableChange is the smallest relative change RunsNeeded is computed for when the
// change seen is smaller (or none): 5 %, below the run-to-run spread of most servers.
var resolvableChange = math.Log(1.05)

// CompareRunsOptions tunes CompareRuns.
type CompareRunsOptions struct {
	// Stats are the statistics compared for every per-request metric (default avg, p50, p99).
	Stats []string
	// Level is the family-wise confidence over all statistics compared (default 0.95).
	Level float64
}

// CompareRuns compares two groups of runs, each at least two repeats of one configuration,
// so that a change is called only beyond run-to-run variance: requests within one run share
// that run's conditions (the machine's load, the server's warm state), so a bootstrap over
// requests calls run-to-run noise a change (two runs of one config differ in nearly every
// statistic by more than their request-level intervals allow).
//
// Each run is summarized on its own; for every statistic the runs' values are the
// observations. The interval of the ratio comes from Welch's t interval on the difference
// of the mean log values (Welch 1947; the log makes the ratio's interval symmetric and a
// constant factor additive), at confidence 1 − (1 − Level)/K for K statistics compared
// (Bonferroni), so the whole table keeps Level. A statistic whose runs agree exactly on both
// sides (counts, fixed lengths) has an interval of zero width. Timestamps are left out.
func CompareRuns(base, cand []*Run, opt CompareRunsOptions) ([]RunComparison, error) {
	if len(base) < 2 || len(cand) < 2 {
		return nil, fmt.Errorf("compare: %d base and %d candidate runs; run-to-run variance needs at least 2 runs per side (qual profile --repeat N)", len(base), len(cand))
	}
	if len(opt.Stats) == 0 {
		opt.Stats = []string{"avg", "p50", "p99"}
	}
	if opt.Level <= 0 || opt.Level >= 1 {
		opt.Level = 0.95
	}
	bs, cs := summaries(base), summaries(cand)
	type key struct{ tag, stat string }
	var keys []key
	units := map[string]string{}
	for _, tag := range bs[0].Profiling.Tags() {
		if tag == TagMinRequestTimestamp || tag == TagMaxResponseTimestamp || tag == TagInterChunkLatency {
			continue
		}
		m := bs[0].Profiling.Metrics[tag]
		units[tag] = m.Unit
		stats := opt.Stats
		if m.Dist == nil {
			stats = []string{"avg"}
		}
		for _, st := range stats {
			if all(bs, tag, st) && all(cs, tag, st) {
				keys = append(keys, key{tag, st})
			}
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("compare: the two groups share no metric present in every run")
	}
	alpha := (1 - opt.Level) / float64(len(keys))
	var out []RunComparison
	for _, k := range keys {
		b, c := values(bs, k.tag, k.stat), values(cs, k.tag, k.stat)
		m, _ := LookupMetric(k.tag)
		rc := RunComparison{BaseRuns: b, CandRuns: c, Level: opt.Level}
		rc.Comparison = Comparison{Tag: k.tag, Stat: k.stat, Unit: units[k.tag], Base: meanOf(b), Cand: meanOf(c),
			LargerIsBetter: m.LargerIsBetter}
		rc.Ratio = ratio(rc.Cand, rc.Base)
		if lo, hi, ok := welchLogRatio(b, c, alpha); ok {
			rc.Lo, rc.Hi, rc.HasCI = lo, hi, true
			switch {
			case lo > 1:
				rc.Verdict = pick(m.LargerIsBetter, "better", "worse")
			case hi < 1:
				rc.Verdict = pick(m.LargerIsBetter, "worse", "better")
			case beyondData(b, c, lo, hi):
				// The t quantile of too few runs, not the runs' spread, set this width: no
				// verdict, and no interval that claims more than the runs show.
				rc.Lo, rc.Hi, rc.HasCI = 0, 0, false
				rc.Verdict = VerdictTooFewRuns
				rc.RunsNeeded = runsNeeded(b, c, alpha)
			default:
				rc.Verdict = "no change"
			}
		}
		out = append(out, rc)
	}
	return out, nil
}

func summaries(runs []*Run) []*Summary {
	out := make([]*Summary, len(runs))
	for i, r := range runs {
		out[i] = Summarize(r)
	}
	return out
}

func all(ss []*Summary, tag, st string) bool {
	for _, s := range ss {
		if _, ok := s.Profiling.Stat(tag, st); !ok {
			return false
		}
	}
	return true
}

func values(ss []*Summary, tag, st string) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i], _ = s.Profiling.Stat(tag, st)
	}
	return out
}

func meanOf(x []float64) float64 {
	t := 0.0
	for _, v := range x {
		t += v
	}
	return t / float64(len(x))
}

// sampleVar is the unbiased sample variance (n − 1), as Welch's interval needs.
func sampleVar(x []float64) float64 {
	m, t := meanOf(x), 0.0
	for _, v := range x {
		t += (v - m) * (v - m)
	}
	return t / float64(len(x)-1)
}

// welchLogRatio is the two-sided 1 − alpha interval of exp(mean log c − mean log b) by
// Welch's t with the Welch–Satterthwaite degrees of freedom. ok is false when a value is
// not positive (no log), which leaves the statistic without an interval.
func welchLogRatio(b, c []float64, alpha float64) (lo, hi float64, ok bool) {
	zero := true
	for _, v := range append(append([]float64(nil), b...), c...) {
		zero = zero && v == 0
	}
	if zero {
		return 1, 1, true // zero in every run on both sides (no error, no output): unchanged
	}
	lb, lc := make([]float64, len(b)), make([]float64, len(c))
	for i, v := range b {
		if v <= 0 || math.IsNaN(v) {
			return 0, 0, false
		}
		lb[i] = math.Log(v)
	}
	for i, v := range c {
		if v <= 0 || math.IsNaN(v) {
			return 0, 0, false
		}
		lc[i] = math.Log(v)
	}
	d := meanOf(lc) - meanOf(lb)
	vb, vc := sampleVar(lb)/float64(len(lb)), sampleVar(lc)/float64(len(lc))
	se := math.Sqrt(vb + vc)
	if se == 0 {
		return math.Exp(d), math.Exp(d), true
	}
	df := (vb + vc) * (vb + vc) / (vb*vb/float64(len(lb)-1) + vc*vc/float64(len(lc)-1))
	q := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: df}.Quantile(1 - alpha/2)
	return math.Exp(d - q*se), math.Exp(d + q*se), true
}

// beyondData says whether the interval [lo, hi] reaches past every ratio of a candidate
// run's value to a base run's value on both sides. All values are positive (welchLogRatio
// gave an interval).
func beyondData(b, c []float64, lo, hi float64) bool {
	if lo == hi {
		return false
	}
	return lo < slices.Min(c)/slices.Max(b) && hi > slices.Max(c)/slices.Min(b)
}

// runsNeeded is the smallest number of runs a side for which Welch's interval, with the
// pooled spread of the log values seen, would be narrower than the change seen (or
// resolvableChange): t(1 − alpha/2, 2n − 2) · s · √(2/n) < max(|d|, resolvableChange).
// 0 when more than maxRunsNeeded would be needed.
func runsNeeded(b, c []float64, alpha float64) int {
	lb, lc := logs(b), logs(c)
	d := math.Abs(meanOf(lc) - meanOf(lb))
	s2 := (float64(len(lb)-1)*sampleVar(lb) + float64(len(lc)-1)*sampleVar(lc)) / float64(len(lb)+len(lc)-2)
	e := max(d, resolvableChange)
	for n := 2; n <= maxRunsNeeded; n++ {
		q := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(2*n - 2)}.Quantile(1 - alpha/2)
		if q*math.Sqrt(s2*2/float64(n)) < e {
			return n
		}
	}
	return 0
}

func logs(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Log(v)
	}
	return out
}

// GroupLabel names a group of runs for a compare column: the one run's name, or how many
// runs and the first and last names.
func GroupLabel(names []string) string {
	switch len(names) {
	case 0:
		return "-"
	case 1:
		return names[0]
	}
	return fmt.Sprintf("%d runs %s", len(names), strings.Join([]string{names[0], names[len(names)-1]}, " .. "))
}
