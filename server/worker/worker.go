// Package worker is qual-server's worker mode: one process holding one native engine, driven
// by the frontend over the wire protocol on two inherited pipes.
//
// Why a separate process: the engine is native code; a crash, an abort or a hang in it must
// cost only the requests it holds, never the HTTP frontend or the other engines (issue 3). The
// worker runs the engine's step loop on one goroutine (the engine is not goroutine-safe), and
// sends every token of one step in one frame with one write.
package worker

import (
	"errors"
	"io"
	"time"

	"github.com/modelqual/modelqual/server/wire"
)

// ErrBatchFull is returned by Engine.Add when every batch slot is taken; the worker keeps the
// request pending and adds it after a sequence finishes.
var ErrBatchFull = errors.New("engine batch full")

// Event is one engine event: a token of a sequence, its end, or both.
type Event struct {
	Seq          uint64
	Token        int32 // -1 when none
	Done         bool
	Reason       wire.Reason
	AddedNs      int64
	FirstTokenNs int64
	DoneNs       int64
	PromptTokens int
	OutputTokens int
	VisionNs     int64          // the vision tower's wall time on the sequence's images
	Logprobs     *wire.Logprobs // the token's, when its request asked for them
}

// Engine is what the worker needs from an inference engine. The native engine is adapted to it
// in native.go; tests may drive the loop with another implementation.
type Engine interface {
	Add(prompt []int32, s wire.Sampling) (seq uint64, err error)
	Cancel(seq uint64)
	// Step runs one engine step and calls fn for each event; it returns the number of
	// sequences still active.
	Step(fn func(Event)) (active int, err error)
	Active() int
	Logits(ids []int32) ([]float32, error)
	Close() error
}

// RoutingEngine is an Engine of a mixture-of-experts model: its routing counts so far,
// counts[layer][expert] (nil when the model has no experts).
type RoutingEngine interface {
	Routing() ([][]uint64, error)
}

// VisionEngine is an Engine that takes one image with a prompt (a vision-language family).
type VisionEngine interface {
	AddImage(prompt []int32, im *wire.ImageInput, s wire.Sampling) (seq uint64, err error)
}

// VisionLogitsEngine is a VisionEngine whose logits route takes the image too.
type VisionLogitsEngine interface {
	LogitsImage(ids []int32, im *wire.ImageInput) ([]float32, error)
}

type command struct {
	typ    uint8
	id     uint64
	samp   wire.Sampling
	prompt []int32
	image  wire.ImageRequest // text-to-image (image.go)
	pixels *wire.ImageInput  // a vision-language prompt's image (SubmitImage)
}

type pendingReq struct {
	id     uint64
	samp   wire.Sampling
	prompt []int32
	pixels *wire.ImageInput
}

// loop is the state of one worker session.
type loop struct {
	eng     Engine
	out     *wire.Writer
	bySeq   map[uint64]uint64 // engine sequence → frontend request id
	byID    map[uint64]uint64 // frontend request id → engine sequence
	pending []pendingReq
	dones   []wire.Done
	info    wire.Info
	sent    uint64 // Deltas frames sent
	acked   uint64 // Deltas frames the parent has consumed
	// batchFull: the last admit left requests pending because the engine had no free slot;
	// they wait for a step (or a cancellation) to free one.
	batchFull bool
	// fresh: engine sequences admitted but not yet prefilled → their prompt tokens, so that
	// each step's Step frame says how many prompts it prefilled.
	fresh map[uint64]int
	// routed: the routing counts already reported (RoutingEngine), so each Routing frame
	// carries only what the last step added.
	routed [][]uint64
}

// blocked reports whether the loop must wait for a command: nothing to run, or the parent is
// AckWindow frames behind and no pending request could be admitted.
func (l *loop) blocked() bool {
	switch {
	case l.eng.Active() == 0 && len(l.pending) == 0:
		return true
	case l.sent-l.acked < wire.AckWindow:
		return false
	}
	return len(l.pending) == 0 || l.batchFull
}

// Serve runs the protocol over in/out until in reaches EOF (the frontend closed the pipe or
// died), then closes the engine. hello.Info describes eng. It returns the first write or
// engine error; EOF on in is a clean end.
func Serve(eng Engine, info wire.Info, in io.Reader, out io.Writer) error {
	l := &loop{eng: eng, out: wire.NewWriter(out), bySeq: map[uint64]uint64{}, byID: map[uint64]uint64{}, info: info,
		fresh: map[uint64]int{}}
	l.out.Hello(wire.Hello{Version: wire.Version, Caps: wire.AllCaps, Info: info})
	if err := l.out.Flush(); err != nil {
		return err
	}
	cmds := make(chan command, 1024)
	readErr := make(chan error, 1)
	go readCommands(in, cmds, readErr)
	defer eng.Close()
	for {
		for l.blocked() {
			// Answers produced while idle (logits, cancelled pending requests) go out before
			// waiting again.
			if err := l.out.Flush(); err != nil {
				return err
			}
			c, ok := <-cmds
			if !ok {
				return cleanEOF(<-readErr)
			}
			l.handle(c)
		}
	drain:
		for {
			select {
			case c, ok := <-cmds:
				if !ok {
					return cleanEOF(<-readErr)
				}
				l.handle(c)
			default:
				break drain
			}
		}
		// A step that admitted a request runs even past the window: the new request's first
		// token must not wait for the parent to catch up with other streams' tokens (its time
		// to first token would be a round of the parent's writes longer). Admissions are
		// bounded by the batch, so the pipe's backlog stays bounded too.
		admitted := l.admit()
		if eng.Active() > 0 && (l.sent-l.acked < wire.AckWindow || admitted > 0) {
			if err := l.step(); err != nil {
				return err
			}
		}
		if err := l.out.Flush(); err != nil {
			return err
		}
	}
}

func cleanEOF(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func readCommands(in io.Reader, cmds chan<- command, readErr chan<- error) {
	r := wire.NewReader(in)
	defer close(cmds)
	for {
		typ, p, err := r.Next()
		if err != nil {
			readErr <- err
			return
		}
		c := command{typ: typ}
		switch typ {
		case wire.TypeSubmit:
			c.id, c.samp, c.prompt, err = wire.DecodeSubmit(p, nil)
		case wire.TypeSubmitImage:
			c.id, c.samp, c.prompt, c.pixels, err = wire.DecodeSubmitImage(p, nil)
		case wire.TypeCancel:
			c.id, err = wire.DecodeCancel(p)
		case wire.TypeLogits:
			c.id, c.prompt, err = wire.DecodeLogits(p, nil)
		case wire.TypeLogitsImage:
			c.id, c.prompt, c.pixels, err = wire.DecodeLogitsImage(p, nil)
		case wire.TypeAck:
			c.id, err = wire.DecodeCancel(p)
		case wire.TypeImage:
			c.id, c.image, err = wire.DecodeImage(p)
		default:
			continue // a newer frontend's optional message: ignore
		}
		if err != nil {
			readErr <- err
			return
		}
		cmds <- c
	}
}

func (l *loop) handle(c command) {
	switch c.typ {
	case wire.TypeAck:
		l.acked = max(l.acked, c.id)
	case wire.TypeSubmit, wire.TypeSubmitImage:
		l.pending = append(l.pending, pendingReq{id: c.id, samp: c.samp, prompt: c.prompt, pixels: c.pixels})
	case wire.TypeCancel:
		for i, p := range l.pending {
			if p.id == c.id {
				l.pending = append(l.pending[:i], l.pending[i+1:]...)
				l.out.Done(wire.Done{ID: c.id, Reason: wire.ReasonCancelled, PromptTokens: uint32(len(p.prompt))})
				return
			}
		}
		if seq, ok := l.byID[c.id]; ok {
			l.eng.Cancel(seq)
		}
	case wire.TypeLogits, wire.TypeLogitsImage:
		var logits []float32
		var err error
		if c.pixels == nil {
			logits, err = l.eng.Logits(c.prompt)
		} else if ve, ok := l.eng.(VisionLogitsEngine); ok {
			logits, err = ve.LogitsImage(c.prompt, c.pixels)
		} else {
			err = errors.New("this engine does not take images")
		}
		if err != nil {
			l.out.LogitsResult(c.id, l.info.VocabSize, 0, nil, err.Error())
			return
		}
		l.out.LogitsResult(c.id, l.info.VocabSize, len(c.prompt), logits, "")
	case wire.TypeImage:
		l.image(c.id, c.image)
	}
}

// admit adds pending requests to the engine in arrival order until the batch is full, and
// returns how many it took off the pending list.
func (l *loop) admit() int {
	n := 0
	l.batchFull = false
	for _, p := range l.pending {
		var seq uint64
		var err error
		if p.pixels == nil {
			seq, err = l.eng.Add(p.prompt, p.samp)
		} else if ve, ok := l.eng.(VisionEngine); ok {
			seq, err = ve.AddImage(p.prompt, p.pixels, p.samp)
		} else {
			err = errors.New("this engine does not take images")
		}
		if errors.Is(err, ErrBatchFull) {
			l.batchFull = true
			break
		}
		n++
		if err != nil {
			l.out.Done(wire.Done{ID: p.id, Reason: wire.ReasonError, PromptTokens: uint32(len(p.prompt)), Message: err.Error()})
			continue
		}
		l.bySeq[seq] = p.id
		l.byID[p.id] = seq
		l.fresh[seq] = len(p.prompt)
	}
	l.pending = append(l.pending[:0], l.pending[n:]...)
	return n
}

func (l *loop) step() error {
	d := l.out.BeginDeltas()
	l.dones = l.dones[:0]
	var st wire.Step
	t0 := time.Now()
	prefills := len(l.fresh) > 0 // most steps prefill nothing: no lookup per token then
	_, err := l.eng.Step(func(ev Event) {
		fresh := false
		if prefills {
			var n int
			if n, fresh = l.fresh[ev.Seq]; fresh {
				delete(l.fresh, ev.Seq)
				if ev.Token >= 0 {
					st.Prompts++
					st.PromptTokens += uint32(n)
				}
			}
		}
		if !fresh && ev.Token >= 0 {
			st.Decodes++
		}
		id, ok := l.bySeq[ev.Seq]
		if !ok {
			return
		}
		if ev.Token >= 0 {
			if ev.Logprobs != nil {
				d.AddLogprobs(id, ev.Token, *ev.Logprobs)
			} else {
				d.Add(id, ev.Token)
			}
		}
		if ev.Done {
			l.dones = append(l.dones, wire.Done{
				ID: id, Reason: ev.Reason, AddedNs: ev.AddedNs, FirstTokenNs: ev.FirstTokenNs, DoneNs: ev.DoneNs,
				PromptTokens: uint32(ev.PromptTokens), OutputTokens: uint32(ev.OutputTokens),
				VisionNs: ev.VisionNs,
			})
			delete(l.bySeq, ev.Seq)
			delete(l.byID, id)
		}
	})
	if d.End() {
		l.sent++
	}
	// The Step frame goes before the Dones, so that the parent has counted a step before it
	// answers the requests that step finished (a client reading /metrics after its last
	// response sees every step).
	if err == nil {
		st.DurationNs = uint64(time.Since(t0))
		l.out.Step(st)
		l.reportRouting()
	}
	for _, done := range l.dones {
		l.out.Done(done)
	}
	if err != nil {
		// A failed step leaves the engine in an unknown state: fail everything it held and
		// let the frontend replace this worker.
		for seq, id := range l.bySeq {
			l.out.Done(wire.Done{ID: id, Reason: wire.ReasonError, Message: "engine step failed: " + err.Error()})
			delete(l.bySeq, seq)
			delete(l.byID, id)
		}
		clear(l.fresh)
		_ = l.out.Flush()
		return err
	}
	return nil
}

// reportRouting sends what the engine's routing counts gained since the last report.
func (l *loop) reportRouting() {
	re, ok := l.eng.(RoutingEngine)
	if !ok {
		return
	}
	now, err := re.Routing()
	if err != nil || now == nil {
		return
	}
	var ds []wire.RoutingDelta
	first := l.routed == nil
	for layer, row := range now {
		sparse := false         // a layer that routed anything: on the first report all its experts are
		for _, n := range row { // sent, zeros too, so /metrics shows the experts never chosen
			sparse = sparse || n > 0
		}
		for e, n := range row {
			var before uint64
			if layer < len(l.routed) && e < len(l.routed[layer]) {
				before = l.routed[layer][e]
			}
			if n > before || first && sparse {
				ds = append(ds, wire.RoutingDelta{Layer: uint16(layer), Expert: uint16(e), Tokens: uint32(n - before)})
			}
		}
	}
	l.routed = now
	if len(ds) > 0 {
		l.out.Routing(ds)
	}
}
