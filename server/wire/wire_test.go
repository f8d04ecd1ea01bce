package wire

import (
	"bytes"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Hello(Hello{Version: Version, Caps: AllCaps, Info: Info{PID: 7, Family: "mock", VocabSize: 10, MaxContext: 64, MaxBatch: 4, EOSIDs: []int32{2}}})
	w.Submit(42, Sampling{MaxNewTokens: 5, Temperature: 0.5, TopK: 3, TopP: 0.9, Seed: 99, IgnoreEOS: true}, []int32{1, 2, 3})
	w.Cancel(42)
	w.Logits(43, []int32{4, 5})
	d := w.BeginDeltas()
	d.Add(42, 7)
	d.Add(44, -1)
	d.End()
	empty := w.BeginDeltas()
	empty.End() // a step without tokens adds no frame
	w.Done(Done{ID: 42, Reason: ReasonLength, AddedNs: 1, FirstTokenNs: 2, DoneNs: 3, PromptTokens: 3, OutputTokens: 5, VisionNs: 7, Message: "m"})
	w.LogitsResult(43, 2, 2, []float32{1, 2, 3, 4}, "")
	w.Step(Step{DurationNs: 1 << 40, Prompts: 31, PromptTokens: 3968, Decodes: 1})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	next := func(want uint8) []byte {
		t.Helper()
		typ, p, err := r.Next()
		if err != nil || typ != want {
			t.Fatalf("frame type %d err %v, want %d", typ, err, want)
		}
		return p
	}
	h, err := DecodeHello(next(TypeHello))
	if err != nil || h.Version != Version || h.Caps != AllCaps || h.Info.Family != "mock" || h.Info.EOSIDs[0] != 2 {
		t.Fatalf("hello %+v %v", h, err)
	}
	id, s, ids, err := DecodeSubmit(next(TypeSubmit), nil)
	if err != nil || id != 42 || s != (Sampling{MaxNewTokens: 5, Temperature: 0.5, TopK: 3, TopP: 0.9, Seed: 99, IgnoreEOS: true}) || len(ids) != 3 || ids[2] != 3 {
		t.Fatalf("submit %d %+v %v %v", id, s, ids, err)
	}
	if id, err := DecodeCancel(next(TypeCancel)); err != nil || id != 42 {
		t.Fatalf("cancel %d %v", id, err)
	}
	if id, ids, err := DecodeLogits(next(TypeLogits), nil); err != nil || id != 43 || len(ids) != 2 {
		t.Fatalf("logits %d %v %v", id, ids, err)
	}
	var got [][2]int64
	if err := Deltas(next(TypeDeltas), func(id uint64, tok int32) { got = append(got, [2]int64{int64(id), int64(tok)}) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != [2]int64{42, 7} || got[1] != [2]int64{44, -1} {
		t.Fatalf("deltas %v", got)
	}
	dn, err := DecodeDone(next(TypeDone))
	if err != nil || dn != (Done{ID: 42, Reason: ReasonLength, AddedNs: 1, FirstTokenNs: 2, DoneNs: 3, PromptTokens: 3, OutputTokens: 5, VisionNs: 7, Message: "m"}) {
		t.Fatalf("done %+v %v", dn, err)
	}
	a, err := DecodeLogitsResult(next(TypeLogitsResult))
	if err != nil || a.ID != 43 || a.Vocab != 2 || a.Positions != 2 || len(a.Data) != 16 {
		t.Fatalf("logits result %+v %v", a, err)
	}
	if st, err := DecodeStep(next(TypeStep)); err != nil || st != (Step{DurationNs: 1 << 40, Prompts: 31, PromptTokens: 3968, Decodes: 1}) {
		t.Fatalf("step %+v %v", st, err)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("after last frame: %v, want EOF", err)
	}
}

func TestShortPayloadsAreErrors(t *testing.T) {
	if _, err := DecodeDone([]byte{1, 2}); err != ErrShort {
		t.Error("short done accepted")
	}
	if _, err := DecodeStep(make([]byte, 19)); err != ErrShort {
		t.Error("short step accepted")
	}
	if err := Deltas([]byte{5, 0, 0, 0, 1}, func(uint64, int32) {}); err != ErrShort {
		t.Error("short deltas accepted")
	}
	sub := make([]byte, 37)
	sub[33] = 5 // claims five prompt ids, carries none
	if _, _, _, err := DecodeSubmit(sub, nil); err == nil {
		t.Error("submit claiming more ids than it carries accepted")
	}
	r := NewReader(bytes.NewReader([]byte{0, 0, 0, 0, 1}))
	if _, _, err := r.Next(); err == nil {
		t.Error("zero-length frame accepted")
	}
}

func BenchmarkDeltasFrame32(b *testing.B) {
	w := NewWriter(io.Discard)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d := w.BeginDeltas()
		for j := 0; j < 32; j++ {
			d.Add(uint64(j), int32(i))
		}
		d.End()
		_ = w.Flush()
	}
}
