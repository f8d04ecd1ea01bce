package reports_test

import (
	"fmt"

	"github.com/modelqual/modelqual/reports"
)

// METRICS.md's worked example: numpy's linear percentiles of ten latencies.
func ExamplePercentile() {
	x := []float64{100, 110, 120, 130, 140, 150, 160, 180, 200, 400} // sorted
	for _, p := range []float64{50, 90, 95, 99} {
		fmt.Printf("p%g = %.0f\n", p, reports.Percentile(x, p))
	}
	// Output:
	// p50 = 145
	// p90 = 220
	// p95 = 310
	// p99 = 382
}
