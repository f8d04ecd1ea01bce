package reports

import "testing"

// BenchmarkCompare10k measures a default compare of two 10,000-request runs.
func BenchmarkCompare10k(b *testing.B) {
	base := &Run{Records: synthRecords(10000, 0, 1, 1)}
	cand := &Run{Records: synthRecords(10000, 0, 1.1, 1)}
	for b.Loop() {
		Compare(base, cand, CompareOptions{})
	}
}
