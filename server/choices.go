package server

import (
	"net/http"
	"time"
)

// genSet is a request with n > 1 choices: one gen per choice, each its own engine sequence,
// all tasks sharing one notify channel (textRoute.prepare), answered together. The request
// still writes exactly one record: token counts and output bytes summed over the choices, the
// output digest over their texts in index order, the engine times from the first added to the
// last done, the finish reason of choice 0 (docs/api.md "n").
type genSet struct {
	gens []*gen
}

// drainAll consumes every choice's new tokens; true when the engine is done with all.
func (gs *genSet) drainAll() bool {
	all := true
	for _, g := range gs.gens {
		if !g.finished {
			if g.drain() {
				g.finished = true
			} else {
				all = false
			}
		}
	}
	return all
}

// waitAny blocks until some choice has news or the context ends (then every choice is
// cancelled and confirmed, bounded).
func (gs *genSet) waitAny() bool {
	g := gs.gens[0]
	select {
	case <-g.t.notify: // shared by all choices
		return true
	case <-g.ctx.Done():
	}
	gs.abandon()
	return false
}

// abandon cancels every choice and waits (bounded) until the engine confirms each.
func (gs *genSet) abandon() {
	for _, g := range gs.gens {
		if !g.gone {
			g.cancel()
		}
	}
	deadline := time.NewTimer(cancelWait)
	defer deadline.Stop()
	for _, g := range gs.gens {
		if !g.awaitDone(deadline.C) {
			return
		}
	}
}

// fillRecord fills the request's one record from all choices.
func (gs *genSet) fillRecord() {
	var out []byte
	ntok := 0
	var added, first, done, vision int64
	for _, g := range gs.gens {
		g.consume(g.takeAll())
		out = append(out, g.out...)
		ntok += g.ntok
		res := g.t.res
		if res.AddedNs > 0 && (added == 0 || res.AddedNs < added) {
			added = res.AddedNs
		}
		if res.FirstTokenNs > 0 && (first == 0 || res.FirstTokenNs < first) {
			first = res.FirstTokenNs
		}
		done = max(done, res.DoneNs)
		vision += res.VisionNs
	}
	g := gs.gens[0]
	r := &g.q.rec
	if done > 0 && added > 0 {
		r.TaskWallNs = done - added
	}
	if first > 0 && added > 0 {
		r.TaskTTFTNs = first - added
	}
	r.VisionNs = vision
	r.OutputTokens = ntok
	r.OutputSHA256, r.OutputBytes = sha256Hex(out), int64(len(out))
	if r.FinishReason == "" {
		r.FinishReason = g.finishReason()
	}
	g.s.m.inputTokens.Add(float64(len(g.t.prompt)))
	g.s.m.outputTokens.Add(float64(ntok))
}

// engineError is the first choice's engine failure, if any.
func (gs *genSet) engineError() *APIError {
	for _, g := range gs.gens {
		if e := g.engineError(); e != nil {
			return e
		}
	}
	return nil
}

// collect serves a non-streaming request with n > 1.
func (gs *genSet) collect() {
	g := gs.gens[0]
	for !gs.drainAll() {
		if !gs.waitAny() {
			gs.fillRecord()
			g.q.failContext(g.ctx)
			return
		}
	}
	for _, x := range gs.gens {
		x.finishText()
	}
	if aerr := gs.engineError(); aerr != nil {
		gs.fillRecord()
		g.q.fail(aerr)
		return
	}
	g.q.status = http.StatusOK
	g.q.ttft = time.Since(g.q.start)
	gs.fillRecord()
	g.answer(gs.gens)
}

// stream serves a streaming request with n > 1: every choice's chunks carry its index; all
// that an engine step produced goes out with one write per choice.
func (gs *genSet) stream() {
	g := gs.gens[0]
	w := g.q.w
	for _, x := range gs.gens {
		x.streamTemplates(w)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	g.q.status = http.StatusOK
	for _, x := range gs.gens {
		x.appendRoleChunk()
		x.send()
	}
	sendAll := func() bool {
		ok := true
		for _, x := range gs.gens {
			if len(x.buf) > 0 && !x.send() {
				ok = false
			}
		}
		return ok
	}
	for !gs.drainAll() {
		if !sendAll() {
			gs.abandon()
			g.q.rec.FinishReason = "cancelled"
			g.q.rec.ErrorType = g.goneType()
			gs.fillRecord()
			return
		}
		if !gs.waitAny() {
			gs.fillRecord()
			g.streamGone()
			return
		}
	}
	for _, x := range gs.gens {
		x.finishText()
	}
	gs.fillRecord()
	if aerr := gs.engineError(); aerr != nil {
		sendAll()
		g.streamError(aerr)
		return
	}
	if !sendAll() {
		return
	}
	if err := g.q.commitRecord(); err != nil {
		g.streamError(g.s.recordsError(err))
		return
	}
	for _, x := range gs.gens {
		x.held = nil
		x.appendFinishChunk(&g.buf)
	}
	g.appendStreamEnd(&g.buf, len(g.t.prompt), g.q.rec.OutputTokens)
	g.send()
}
