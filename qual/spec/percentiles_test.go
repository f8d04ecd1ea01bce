package spec

import (
	"math"
	"testing"
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
