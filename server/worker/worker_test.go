package worker

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/modelqual/modelqual/server/wire"
)

// fakeEngine emits token 100+k at the k-th step of a sequence and finishes after MaxNewTokens,
// with a batch of one slot, so the worker's queueing, cancellation and pacing are visible.
type fakeEngine struct {
	seqs    map[uint64]*fakeSeq
	next    uint64
	batch   int
	cancels map[uint64]bool
}

type fakeSeq struct {
	n, max int
}

func (f *fakeEngine) Add(prompt []int32, s wire.Sampling) (uint64, error) {
	if len(prompt) == 0 {
		return 0, errors.New("empty prompt")
	}
	if len(f.seqs) >= f.batch {
		return 0, ErrBatchFull
	}
	f.next++
	f.seqs[f.next] = &fakeSeq{max: int(s.MaxNewTokens)}
	return f.next, nil
}
func (f *fakeEngine) Cancel(seq uint64) { f.cancels[seq] = true }
func (f *fakeEngine) Step(fn func(Event)) (int, error) {
	for id, s := range f.seqs {
		if f.cancels[id] {
			delete(f.seqs, id)
			fn(Event{Seq: id, Token: -1, Done: true, Reason: wire.ReasonCancelled, OutputTokens: s.n})
			continue
		}
		s.n++
		ev := Event{Seq: id, Token: int32(100 + s.n)}
		if s.n == s.max {
			ev.Done, ev.Reason, ev.OutputTokens, ev.AddedNs, ev.DoneNs = true, wire.ReasonLength, s.n, 1, 2
			delete(f.seqs, id)
		}
		fn(ev)
	}
	return len(f.seqs), nil
}
func (f *fakeEngine) Active() int { return len(f.seqs) }
func (f *fakeEngine) Logits(ids []int32) ([]float32, error) {
	return make([]float32, 2*len(ids)), nil
}
func (f *fakeEngine) Close() error { return nil }

type session struct {
	t    *testing.T
	w    *wire.Writer
	r    *wire.Reader
	in   *io.PipeWriter
	outR *io.PipeReader
	end  chan error
}

// close ends the session (EOF on the worker's input) while draining what the worker still
// writes, and returns Serve's result.
func (s *session) close() error {
	go io.Copy(io.Discard, s.outR)
	s.in.Close()
	return <-s.end
}

func startSession(t *testing.T) *session { return startSessionBatch(t, 1) }

func startSessionBatch(t *testing.T, batch int) *session {
	eng := &fakeEngine{seqs: map[uint64]*fakeSeq{}, batch: batch, cancels: map[uint64]bool{}}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{t: t, w: wire.NewWriter(inW), r: wire.NewReader(outR), in: inW, outR: outR, end: make(chan error, 1)}
	go func() { s.end <- Serve(eng, wire.Info{VocabSize: 2, MaxBatch: batch}, inR, outW); outW.Close() }()
	typ, p, err := s.r.Next()
	if err != nil || typ != wire.TypeHello {
		t.Fatalf("first frame %d %v, want hello", typ, err)
	}
	if h, _ := wire.DecodeHello(p); h.Version != wire.Version || h.Caps != wire.AllCaps {
		t.Fatalf("hello %+v", h)
	}
	return s
}

func (s *session) send(fn func(*wire.Writer)) {
	fn(s.w)
	if err := s.w.Flush(); err != nil {
		s.t.Fatal(err)
	}
}

// next reads frames until one of type want (returning its payload), counting the Deltas
// frames it passed.
func (s *session) next(want uint8) []byte {
	s.t.Helper()
	// A worker that wrongly stays paused fails the test instead of hanging it.
	watchdog := time.AfterFunc(5*time.Second, func() { s.outR.CloseWithError(errors.New("no such frame within 5 s")) })
	defer watchdog.Stop()
	for {
		typ, p, err := s.r.Next()
		if err != nil {
			s.t.Fatalf("waiting for frame type %d: %v", want, err)
		}
		if typ == want {
			return p
		}
	}
}

func TestServeQueuesCancelsAndAnswersLogitsWhileIdle(t *testing.T) {
	s := startSession(t)
	// Logits while the engine is idle must be answered (not wait for a step).
	s.send(func(w *wire.Writer) { w.Logits(9, []int32{1, 1, 1}) })
	if a, err := wire.DecodeLogitsResult(s.next(wire.TypeLogitsResult)); err != nil || a.ID != 9 || a.Positions != 3 {
		t.Fatalf("logits %+v %v", a, err)
	}
	// Two requests on a batch of one: the second waits in the worker; cancelling it there
	// answers at once with a cancelled Done.
	s.send(func(w *wire.Writer) {
		w.Submit(1, wire.Sampling{MaxNewTokens: 3}, []int32{5})
		w.Submit(2, wire.Sampling{MaxNewTokens: 3}, []int32{5})
		w.Cancel(2)
	})
	var toks []int32
	var acks uint64
	for {
		typ, p, err := s.r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if typ == wire.TypeDeltas {
			wire.Deltas(p, func(id uint64, tok int32) {
				if id != 1 {
					t.Errorf("token for request %d, which was cancelled while queued", id)
				}
				toks = append(toks, tok)
			})
			acks++
			s.send(func(w *wire.Writer) { w.Ack(acks) })
			continue
		}
		if typ == wire.TypeDone {
			d, _ := wire.DecodeDone(p)
			if d.ID == 2 && d.Reason != wire.ReasonCancelled {
				t.Fatalf("queued request ended %v, want cancelled", d.Reason)
			}
			if d.ID == 1 {
				if d.Reason != wire.ReasonLength || d.OutputTokens != 3 {
					t.Fatalf("request 1 done %+v", d)
				}
				break
			}
		}
	}
	if len(toks) != 3 || toks[0] != 101 || toks[2] != 103 {
		t.Fatalf("tokens %v, want 101 102 103", toks)
	}
	if err := s.close(); err != nil {
		t.Fatalf("Serve after EOF: %v", err)
	}
}

func TestServeKeepsAtMostAckWindowFramesUnacknowledged(t *testing.T) {
	s := startSession(t)
	s.send(func(w *wire.Writer) { w.Submit(1, wire.Sampling{MaxNewTokens: 100}, []int32{5}) })
	for i := 0; i < wire.AckWindow; i++ {
		s.next(wire.TypeDeltas)
	}
	// Without an ack the worker must stop; a Logits request still gets through, and the
	// next frame after it must be the logits answer, not another step.
	s.expectPaused("after AckWindow unacknowledged steps")
	s.send(func(w *wire.Writer) { w.Ack(wire.AckWindow) })
	s.next(wire.TypeDeltas) // stepping resumes
	s.close()
}

// expectPaused checks that the worker sends no further step: a Logits request must be
// answered before any other frame but the Step frame of the step already seen.
func (s *session) expectPaused(why string) {
	s.t.Helper()
	s.send(func(w *wire.Writer) { w.Logits(7, []int32{1}) })
	typ, _, err := s.r.Next()
	for err == nil && typ == wire.TypeStep {
		typ, _, err = s.r.Next()
	}
	if err != nil || typ != wire.TypeLogitsResult {
		s.t.Fatalf("%s: the worker sent frame type %d (%v), want it paused", why, typ, err)
	}
}

// Each step is followed by a Step frame that counts the prompts it prefilled (with their
// tokens) apart from the sequences it decoded, and times it.
func TestServeReportsEachStep(t *testing.T) {
	s := startSessionBatch(t, 2)
	s.send(func(w *wire.Writer) { w.Submit(1, wire.Sampling{MaxNewTokens: 100}, []int32{5, 6, 7}) })
	steps := 0
	step := func() wire.Step {
		t.Helper()
		st, err := wire.DecodeStep(s.next(wire.TypeStep))
		if err != nil || st.DurationNs == 0 {
			t.Fatalf("step %+v %v", st, err)
		}
		steps++
		s.send(func(w *wire.Writer) { w.Ack(uint64(steps)) })
		st.DurationNs = 0
		return st
	}
	if st := step(); st != (wire.Step{Prompts: 1, PromptTokens: 3}) {
		t.Fatalf("the first step %+v, want request 1's 3-token prompt prefilled", st)
	}
	s.send(func(w *wire.Writer) { w.Submit(2, wire.Sampling{MaxNewTokens: 3}, []int32{8, 9}) })
	// Request 2's prompt joins one of the next steps, beside request 1's decode; the steps
	// before it decode request 1 alone.
	for {
		st := step()
		if st == (wire.Step{Prompts: 1, PromptTokens: 2, Decodes: 1}) {
			break
		}
		if st != (wire.Step{Decodes: 1}) || steps > 20 {
			t.Fatalf("step %d %+v, want request 1 decoded alone until request 2 is prefilled beside it", steps, st)
		}
	}
	if st := step(); st != (wire.Step{Decodes: 2}) {
		t.Fatalf("the step after both were prefilled %+v, want two decodes", st)
	}
	s.close()
}
