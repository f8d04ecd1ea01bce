package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// TestLogprobsRoundTrip: a Submit's logprobs request and a Deltas frame mixing tokens with
// and without logprobs come back as sent; Deltas (the reader without logprobs) still reads
// the records of such a frame.
func TestLogprobsRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	samp := Sampling{MaxNewTokens: 5, Logprobs: true, TopLogprobs: 20}
	w.Submit(1, samp, []int32{1, 2})
	lp1 := Logprobs{Logprob: -0.5, Rank: 2, Top: []Candidate{{ID: 9, Logprob: -0.1}, {ID: 7, Logprob: -0.5}}}
	lp2 := Logprobs{Logprob: -3, Rank: 40}
	for range 2 { // the second frame reuses the builder's buffers
		d := w.BeginDeltas()
		d.Add(5, 3)
		d.AddLogprobs(1, 7, lp1)
		d.Add(6, 4)
		d.AddLogprobs(2, 8, lp2)
		d.End()
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	typ, p, err := r.Next()
	if err != nil || typ != TypeSubmit {
		t.Fatal(typ, err)
	}
	if _, s, _, err := DecodeSubmit(p, nil); err != nil || s != samp {
		t.Fatalf("submit %+v %v, want %+v", s, err, samp)
	}
	for range 2 {
		typ, p, err = r.Next()
		if err != nil || typ != TypeDeltas {
			t.Fatal(typ, err)
		}
		type rec struct {
			id  uint64
			tok int32
			lp  *Logprobs
		}
		var got []rec
		if err := DeltasLogprobs(p, func(id uint64, tok int32, lp *Logprobs) { got = append(got, rec{id, tok, lp}) }); err != nil {
			t.Fatal(err)
		}
		lp2c := lp2
		lp2c.Top = []Candidate{}
		want := []rec{{5, 3, nil}, {1, 7, &lp1}, {6, 4, nil}, {2, 8, &lp2c}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("deltas %+v, want %+v", got, want)
		}
		n := 0
		if err := Deltas(p, func(uint64, int32) { n++ }); err != nil || n != 4 {
			t.Fatalf("Deltas read %d records (%v), want 4", n, err)
		}
	}
}

// TestDeltasLogprobsCorrupt: a logprobs section that does not fit its records is an error,
// never a panic.
func TestDeltasLogprobsCorrupt(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	d := w.BeginDeltas()
	d.AddLogprobs(1, 7, Logprobs{Top: []Candidate{{ID: 1}}})
	d.End()
	_ = w.Flush()
	_, p, _ := NewReader(&buf).Next()
	for cut := 1; cut < len(p); cut++ {
		_ = DeltasLogprobs(p[:cut], func(uint64, int32, *Logprobs) {})
	}
	bad := append([]byte(nil), p...)
	bad[16] = 5 // the entry's record index points past the records
	if err := DeltasLogprobs(bad, func(uint64, int32, *Logprobs) {}); err == nil {
		t.Fatal("an entry for a missing record was accepted")
	}
}
