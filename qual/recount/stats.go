package recount

import (
	"math"
	"sort"
	"strconv"
)

// percentiles are the ones every distribution reports (METRICS.md "Statistics").
var percentiles = []int{1, 5, 10, 25, 50, 75, 90, 95, 99}

// dist is a sample's statistics as METRICS.md defines them, with the ascending sample kept so
// that a mismatch can name the records behind a rank.
type dist struct {
	n                int
	avg, std, lo, hi float64
	pct              map[int]float64
	sorted           []float64
	ids              []string // request ID of each sorted value ("" when unknown)
	magnitude        float64  // max |x|, the scale float precision is judged against
	minID, maxID     string
	rankIDs          map[int][2]string // percentile → the two records it interpolates between
}

// sample is one value of a metric and the request it came from.
type sample struct {
	v  float64
	id string
}

// describe computes n, mean, population standard deviation (divide by n, as np.std), min,
// max and the percentiles by numpy's default linear method (Hyndman and Fan's definition 7):
// with the sample sorted and h = p/100·(n−1), x[⌊h⌋] + (h−⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]).
// It is written here from those definitions alone, apart from the code that reported the
// figures, so the two cannot share a mistake.
func describe(s []sample) (dist, bool) {
	if len(s) == 0 {
		return dist{}, false
	}
	x := append([]sample(nil), s...)
	sort.SliceStable(x, func(i, j int) bool { return x[i].v < x[j].v })
	d := dist{n: len(x), pct: map[int]float64{}, rankIDs: map[int][2]string{}}
	d.sorted = make([]float64, len(x))
	d.ids = make([]string, len(x))
	var sum float64
	for i, e := range x {
		d.sorted[i], d.ids[i] = e.v, e.id
		sum += e.v
		d.magnitude = math.Max(d.magnitude, math.Abs(e.v))
	}
	d.avg = sum / float64(len(x))
	var ss float64
	for _, e := range x {
		ss += (e.v - d.avg) * (e.v - d.avg)
	}
	d.std = math.Sqrt(ss / float64(len(x)))
	d.lo, d.hi = x[0].v, x[len(x)-1].v
	d.minID, d.maxID = x[0].id, x[len(x)-1].id
	for _, p := range percentiles {
		v, a, b := linear(d.sorted, p)
		d.pct[p] = v
		d.rankIDs[p] = [2]string{d.ids[a], d.ids[b]}
	}
	return d, true
}

// linear is numpy's linear percentile of an ascending sample, and the two ranks it
// interpolates between.
func linear(sorted []float64, p int) (v float64, lo, hi int) {
	n := len(sorted)
	h := float64(p) / 100 * float64(n-1)
	lo = int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1], n - 1, n - 1
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo]), lo, lo + 1
}

// stat returns a named statistic of d ("avg", "std", "min", "max", "count", "p50", ...).
func (d dist) stat(name string) (float64, bool) {
	switch name {
	case "avg":
		return d.avg, true
	case "std":
		return d.std, true
	case "min":
		return d.lo, true
	case "max":
		return d.hi, true
	case "count":
		return float64(d.n), true
	}
	for _, p := range percentiles {
		if name == pname(p) {
			return d.pct[p], true
		}
	}
	return 0, false
}

// statRecords names the records a statistic rests on: the extreme for min and max, the two
// neighbours a percentile interpolates between; nil for avg, std and count (every record).
func (d dist) statRecords(name string) []string {
	switch name {
	case "min":
		return nonEmpty(d.minID)
	case "max":
		return nonEmpty(d.maxID)
	}
	for _, p := range percentiles {
		if name == pname(p) {
			r := d.rankIDs[p]
			if r[0] == r[1] {
				return nonEmpty(r[0])
			}
			return nonEmpty(r[0], r[1])
		}
	}
	return nil
}

func nonEmpty(ids ...string) []string {
	var out []string
	for _, id := range ids {
		if id != "" {
			out = append(out, id)
		}
	}
	return out
}

func pname(p int) string { return "p" + strconv.Itoa(p) }

// precision is the relative error two computations of one figure from the same float64 inputs
// may differ by (summation order, the definition of the standard deviation's two passes): far
// below any real defect (one token, one chunk, one request), far above rounding.
const precision = 1e-12

// agree reports whether a and b agree to float precision, judged against scale (the
// magnitude of the sample a statistic came from; 0 for a plain value).
func agree(a, b, scale float64) bool {
	if a == b {
		return true
	}
	if math.IsNaN(a) || math.IsNaN(b) {
		return false
	}
	m := math.Max(math.Max(math.Abs(a), math.Abs(b)), scale)
	return math.Abs(a-b) <= precision*m
}
