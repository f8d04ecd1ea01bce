package numeric

import (
	"math"
	"testing"
)

func TestMulConventions(t *testing.T) {
	x := Matrix{Rows: 1, Cols: 2, Data: []float64{1, 2}}
	// Linear: w is out×in = 3×2; y = x·wᵀ + b.
	w := Matrix{Rows: 3, Cols: 2, Data: []float64{1, 0, 0, 1, 1, 1}}
	if y := MulT(x, w, []float64{10, 20, 30}); y.Data[0] != 11 || y.Data[1] != 22 || y.Data[2] != 33 {
		t.Errorf("MulT = %v, want [11 22 33]", y.Data)
	}
	// Conv1D: w is in×out = 2×3; y = x·w.
	c := Matrix{Rows: 2, Cols: 3, Data: []float64{1, 2, 3, 4, 5, 6}}
	if y := Mul(x, c, nil); y.Data[0] != 9 || y.Data[1] != 12 || y.Data[2] != 15 {
		t.Errorf("Mul = %v, want [9 12 15]", y.Data)
	}
}

func TestCausalAttention(t *testing.T) {
	// One head of width 1: with equal scores, position i averages the values of 0..i.
	var c KVCache
	q := Matrix{Rows: 3, Cols: 1, Data: []float64{0, 0, 0}}
	k := Matrix{Rows: 3, Cols: 1, Data: []float64{1, 2, 3}}
	v := Matrix{Rows: 3, Cols: 1, Data: []float64{3, 6, 9}}
	out := CausalAttention(&c, q, k, v, 1, 1, 1, 1)
	for i, want := range []float64{3, 4.5, 6} {
		if math.Abs(out.Data[i]-want) > 1e-12 {
			t.Errorf("position %d = %v, want %v (mean of values up to it)", i, out.Data[i], want)
		}
	}
	// Grouped-query: two query heads share one key/value head.
	var g KVCache
	q2 := Matrix{Rows: 1, Cols: 2, Data: []float64{1, -1}}
	one := CausalAttention(&g, q2, Matrix{Rows: 1, Cols: 1, Data: []float64{1}}, Matrix{Rows: 1, Cols: 1, Data: []float64{7}}, 2, 1, 1, 1)
	if one.Data[0] != 7 || one.Data[1] != 7 {
		t.Errorf("GQA output = %v, want both heads to read the shared value 7", one.Data)
	}
}

func TestArgmaxTopK(t *testing.T) {
	xs := []float64{1, 5, 5, -2, 3}
	if got := Argmax(xs); got != 1 {
		t.Errorf("Argmax = %d, want 1 (ties go to the lowest index)", got)
	}
	if got := TopK(xs, 3); got[0] != 1 || got[1] != 2 || got[2] != 4 {
		t.Errorf("TopK = %v, want [1 2 4]", got)
	}
	if Argmax(nil) != -1 {
		t.Error("Argmax(nil) should be -1")
	}
}
