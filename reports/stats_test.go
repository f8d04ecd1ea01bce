package reports

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"gonum.org/v1/gonum/stat"
)

// TestPercentileWorkedExample is METRICS.md's worked example (numpy.percentile, linear).
func TestPercentileWorkedExample(t *testing.T) {
	x := []float64{100, 110, 120, 130, 140, 150, 160, 180, 200, 400}
	// h = p·(n−1) with n = 10:
	//   p50: h = 4.5  → 140 + 0.5·(150−140) = 145
	//   p90: h = 8.1  → 200 + 0.1·(400−200) = 220
	//   p95: h = 8.55 → 200 + 0.55·200     = 310
	//   p99: h = 8.91 → 200 + 0.91·200     = 382
	for _, c := range []struct{ p, want float64 }{{50, 145}, {90, 220}, {95, 310}, {99, 382}, {0, 100}, {100, 400}} {
		if got := Percentile(x, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	d, ok := Describe(x)
	if !ok {
		t.Fatal("Describe of 10 values reported empty")
	}
	// avg = 1690/10 = 169; deviations −69 −59 −49 −39 −29 −19 −9 11 31 231; their squares sum
	// to 67890, so the population variance is 6789 and std = √6789 ≈ 82.40.
	if d.Avg != 169 || math.Abs(d.Std-math.Sqrt(6789)) > 1e-9 || d.P50 != 145 || d.Min != 100 || d.Max != 400 || d.Count != 10 {
		t.Errorf("Describe = %+v", d)
	}
}

// TestPercentileMatchesGonumTransform checks the helper against gonum's LinInterp (R type 4)
// with the probability transformed to R type 7, as METRICS.md documents.
func TestPercentileMatchesGonumTransform(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n < 60; n++ {
		x := make([]float64, n)
		for i := range x {
			x[i] = rng.ExpFloat64() * 100
		}
		sort.Float64s(x)
		for _, p := range append(Percentiles[:], 0, 33.3, 100) {
			got := Percentile(x, p)
			q := (p/100*float64(n-1) + 1) / float64(n)
			want := stat.Quantile(min(q, 1), stat.LinInterp, x, nil)
			if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
				t.Fatalf("n=%d p=%v: Percentile=%v gonum=%v", n, p, got, want)
			}
		}
	}
}

func TestDescribeEdgeCases(t *testing.T) {
	if _, ok := Describe(nil); ok {
		t.Error("Describe(nil) reported a distribution")
	}
	d, _ := Describe([]float64{7})
	if d.P1 != 7 || d.P99 != 7 || d.Std != 0 {
		t.Errorf("single value: %+v", d)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("Percentile of empty sample is not NaN")
	}
}
