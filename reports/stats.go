package reports

import (
	"math"
	"sort"
	"strconv"

	"gonum.org/v1/gonum/stat"
)

// Percentiles are the percentiles every distribution reports, as AIPerf does.
var Percentiles = [...]float64{1, 5, 10, 25, 50, 75, 90, 95, 99}

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of an ascending sample with numpy's
// default "linear" method (Hyndman & Fan 1996, definition 7): with the 0-based index
// h = p/100·(n−1), the value is x[⌊h⌋] + (h−⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]).
//
// gonum's stat.Quantile offers definitions 1 (Empirical) and 4 (LinInterp) only; definition 7
// equals stat.Quantile((p/100·(n−1)+1)/n, stat.LinInterp, x, nil), which the tests check. It
// is computed directly here because that transform loses a few ulps.
//
// Percentile returns NaN for an empty sample and panics if p is outside [0, 100]. The sample
// must be sorted; use Describe for unsorted data.
func Percentile(sorted []float64, p float64) float64 {
	if !(p >= 0 && p <= 100) {
		panic("reports: percentile out of [0, 100]")
	}
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := p / 100 * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := h - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Distribution summarises a sample the way AIPerf does. Std is the population standard
// deviation (divide by n, as np.std does).
type Distribution struct {
	Count int     `json:"count"`
	Avg   float64 `json:"avg"`
	P1    float64 `json:"p1"`
	P5    float64 `json:"p5"`
	P10   float64 `json:"p10"`
	P25   float64 `json:"p25"`
	P50   float64 `json:"p50"`
	P75   float64 `json:"p75"`
	P90   float64 `json:"p90"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	Std   float64 `json:"std"`
}

// Describe computes the Distribution of values (which it does not modify). It returns
// false for an empty sample.
func Describe(values []float64) (Distribution, bool) {
	if len(values) == 0 {
		return Distribution{}, false
	}
	x := append([]float64(nil), values...)
	sort.Float64s(x)
	d := Distribution{Count: len(x), Min: x[0], Max: x[len(x)-1]}
	d.Avg = stat.Mean(x, nil)
	d.Std = stat.PopStdDev(x, nil)
	ps := d.percentileFields()
	for i, p := range Percentiles {
		*ps[i] = Percentile(x, p)
	}
	return d, true
}

// percentileFields returns pointers to the percentile fields in Percentiles order.
func (d *Distribution) percentileFields() [len(Percentiles)]*float64 {
	return [...]*float64{&d.P1, &d.P5, &d.P10, &d.P25, &d.P50, &d.P75, &d.P90, &d.P95, &d.P99}
}

// Stat returns a named statistic: "avg", "min", "max", "std", or "p1".."p99". ok is false
// for an unknown name.
func (d Distribution) Stat(name string) (v float64, ok bool) {
	switch name {
	case "avg":
		return d.Avg, true
	case "min":
		return d.Min, true
	case "max":
		return d.Max, true
	case "std":
		return d.Std, true
	}
	ps := d.percentileFields()
	for i, p := range Percentiles {
		if name == percentileName(p) {
			return *ps[i], true
		}
	}
	return 0, false
}

func percentileName(p float64) string { return "p" + strconv.Itoa(int(p)) }
