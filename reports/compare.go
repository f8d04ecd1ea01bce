package reports

import (
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"gonum.org/v1/gonum/stat"
)

// CompareOptions tunes Compare. Zero values take the defaults.
type CompareOptions struct {
	// Iterations is the number of bootstrap resamples (default 1000).
	Iterations int
	// Seed fixes the resampling so the same inputs always give the same interval (default 1).
	Seed uint64
	// Stats are the statistics compared for every per-request metric (default avg, p50, p99).
	Stats []string
}

// Comparison is one statistic of one metric in two runs. Ratio is Cand/Base (NaN when Base
// is 0). Lo and Hi bound the 95% bootstrap interval of the ratio when HasCI is set.
type Comparison struct {
	Tag            string  `json:"tag"`
	Stat           string  `json:"stat"`
	Unit           string  `json:"unit"`
	Base           float64 `json:"base"`
	Cand           float64 `json:"candidate"`
	Ratio          float64 `json:"ratio"`
	Lo             float64 `json:"ci_lo"`
	Hi             float64 `json:"ci_hi"`
	HasCI          bool    `json:"has_ci"`
	LargerIsBetter bool    `json:"larger_is_better"`
}

// Compare compares the profiling phases of two runs. For every per-request scalar metric
// present in both, each statistic's ratio gets a 95% percentile-bootstrap interval
// (Efron & Tibshirani 1993, ch. 13): the valid requests of each run are resampled with
// replacement, independently, Iterations times, and the 2.5th and 97.5th percentiles of the
// resampled ratios bound the interval. inter_chunk_latency (a list per request) is left out; ITL
// carries the same information per request. Run-level values (throughputs, counts) are one
// observation per run and get a ratio without an interval.
func Compare(base, cand *Run, opt CompareOptions) []Comparison {
	if opt.Iterations <= 0 {
		opt.Iterations = 1000
	}
	if opt.Seed == 0 {
		opt.Seed = 1
	}
	if len(opt.Stats) == 0 {
		opt.Stats = []string{"avg", "p50", "p99"}
	}
	bs, cs := Summarize(base), Summarize(cand)
	var tags []string
	for _, tag := range bs.Profiling.Tags() {
		bm := bs.Profiling.Metrics[tag]
		if cm, ok := cs.Profiling.Metrics[tag]; ok && bm.Dist != nil && cm.Dist != nil && tag != TagInterChunkLatency {
			tags = append(tags, tag)
		}
	}
	lo, hi := bootstrapRatios(base.Records, cand.Records, tags, opt)
	var out []Comparison
	for _, tag := range bs.Profiling.Tags() {
		bm := bs.Profiling.Metrics[tag]
		cm, ok := cs.Profiling.Metrics[tag]
		if !ok || tag == TagInterChunkLatency {
			continue
		}
		m, _ := LookupMetric(tag)
		if tag == TagMinRequestTimestamp || tag == TagMaxResponseTimestamp {
			continue // wall-clock instants: a ratio of two says nothing
		}
		if bm.Dist == nil {
			out = append(out, Comparison{Tag: tag, Stat: "avg", Unit: bm.Unit, Base: bm.Avg, Cand: cm.Avg,
				Ratio: ratio(cm.Avg, bm.Avg), LargerIsBetter: m.LargerIsBetter})
			continue
		}
		for i, st := range opt.Stats {
			b, _ := bm.Dist.Stat(st)
			c, _ := cm.Dist.Stat(st)
			cmp := Comparison{Tag: tag, Stat: st, Unit: bm.Unit, Base: b, Cand: c, Ratio: ratio(c, b), LargerIsBetter: m.LargerIsBetter}
			if l := lo[tag][i]; !math.IsNaN(l) {
				cmp.Lo, cmp.Hi, cmp.HasCI = l, hi[tag][i], true
			}
			out = append(out, cmp)
		}
	}
	return out
}

// MarshalJSON writes a NaN ratio (base value 0), which JSON cannot carry, as null.
func (c Comparison) MarshalJSON() ([]byte, error) {
	type plain Comparison
	var r any = c.Ratio
	if math.IsNaN(c.Ratio) {
		r = nil
	}
	return json.Marshal(struct {
		plain
		Ratio any `json:"ratio"`
	}{plain(c), r})
}

func ratio(c, b float64) float64 {
	if b == 0 && c == 0 {
		return 1 // e.g. no error in either run: unchanged
	}
	if b == 0 {
		return math.NaN()
	}
	return c / b
}

// statOf computes a named statistic ("avg", "min", "max", "std", "p1".."p99") of a sorted
// sample; NaN for an unknown name.
func statOf(sorted []float64, st string) float64 {
	switch st {
	case "avg":
		return stat.Mean(sorted, nil)
	case "std":
		return stat.PopStdDev(sorted, nil)
	case "min":
		return sorted[0]
	case "max":
		return sorted[len(sorted)-1]
	}
	for _, p := range Percentiles {
		if st == percentileName(p) {
			return Percentile(sorted, p)
		}
	}
	return math.NaN()
}

// bootSample is one run's valid profiling requests prepared for resampling: per metric, the
// values in ascending order with the index of the request each came from.
type bootSample struct {
	requests int
	sorted   map[string][]valueOf
	counts   []int // per request: how often the current resample drew it
}

type valueOf struct {
	v   float64
	req int
}

func newBootSample(recs []ExportRecord, tags []string) *bootSample {
	b := &bootSample{sorted: map[string][]valueOf{}}
	for i := range recs {
		r := &recs[i]
		if r.Metadata.BenchmarkPhase != PhaseProfiling || !r.Valid() {
			continue
		}
		for _, tag := range tags {
			if v, ok := r.Value(tag); ok {
				b.sorted[tag] = append(b.sorted[tag], valueOf{v, b.requests})
			}
		}
		b.requests++
	}
	for _, vs := range b.sorted {
		sort.Slice(vs, func(i, j int) bool { return vs[i].v < vs[j].v })
	}
	b.counts = make([]int, b.requests)
	return b
}

// draw resamples the requests with replacement (the same draw serves every metric, so a
// metric's resample keeps the requests' own values together).
func (b *bootSample) draw(rng *rand.Rand) {
	clear(b.counts)
	for range b.requests {
		b.counts[rng.IntN(b.requests)]++
	}
}

// values writes tag's resampled values in ascending order into buf: a counting sort over the
// drawn requests, O(n) per metric instead of O(n log n), which keeps 1000 resamples of
// 10k-request runs to about a second.
func (b *bootSample) values(tag string, buf []float64) []float64 {
	buf = buf[:0]
	for _, x := range b.sorted[tag] {
		for n := b.counts[x.req]; n > 0; n-- {
			buf = append(buf, x.v)
		}
	}
	return buf
}

// bootstrapRatios returns, per tag and per statistic of opt.Stats, the 95% interval of
// cand/base; NaN where a resample had no value of the metric or a zero base statistic.
func bootstrapRatios(base, cand []ExportRecord, tags []string, opt CompareOptions) (lo, hi map[string][]float64) {
	lo, hi = map[string][]float64{}, map[string][]float64{}
	for _, tag := range tags {
		lo[tag] = nanSlice(len(opt.Stats))
		hi[tag] = nanSlice(len(opt.Stats))
	}
	bs, cs := newBootSample(base, tags), newBootSample(cand, tags)
	if bs.requests == 0 || cs.requests == 0 {
		return lo, hi
	}
	// The second PCG word is an arbitrary fixed constant ("mqboot" in ASCII) so that the
	// stream depends on Seed alone.
	rng := rand.New(rand.NewPCG(opt.Seed, 0x6d71626f6f74))
	ratios := map[string][][]float64{}
	for _, tag := range tags {
		ratios[tag] = make([][]float64, len(opt.Stats))
	}
	var bbuf, cbuf []float64
	for it := 0; it < opt.Iterations; it++ {
		bs.draw(rng)
		cs.draw(rng)
		for _, tag := range tags {
			bbuf, cbuf = bs.values(tag, bbuf), cs.values(tag, cbuf)
			for i, st := range opt.Stats {
				r := math.NaN()
				if len(bbuf) > 0 && len(cbuf) > 0 {
					r = ratio(statOf(cbuf, st), statOf(bbuf, st))
				}
				ratios[tag][i] = append(ratios[tag][i], r)
			}
		}
	}
	for _, tag := range tags {
		for i, r := range ratios[tag] {
			if slices.ContainsFunc(r, math.IsNaN) {
				continue
			}
			sort.Float64s(r)
			lo[tag][i], hi[tag][i] = Percentile(r, 2.5), Percentile(r, 97.5)
		}
	}
	return lo, hi
}

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

// WriteComparison prints a comparison of one run a side (Compare) as WriteSweepComparison
// prints one point. A verdict marks intervals that exclude 1, "better" or "worse (within
// run)" by the metric's direction: the interval resamples requests, so it cannot see
// run-to-run variance, and the table ends saying so (CompareRuns compares repeats).
func WriteComparison(w io.Writer, baseName, candName string, cmps []Comparison) error {
	p := PointComparison{Point: "-", BaseRuns: []string{baseName}, CandRuns: []string{candName}}
	for _, c := range cmps {
		p.Rows = append(p.Rows, RunComparison{Comparison: c, Verdict: withinRunVerdict(c)})
	}
	return WriteSweepComparison(w, &SweepComparison{Points: []PointComparison{p}}, false)
}

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// FindComparison returns the comparison of tag and stat.
func FindComparison(cmps []Comparison, tag, stat string) (Comparison, bool) {
	for _, c := range cmps {
		if c.Tag == tag && c.Stat == stat {
			return c, true
		}
	}
	return Comparison{}, false
}
