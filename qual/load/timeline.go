package load

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/modelqual/modelqual/qual/records"
)

// timeline sends the timed turns of sessions (trace timestamps, per-turn delays, session
// starts on a rate) from one dispatcher goroutine on the open loop's pacer, so that a replayed
// trace keeps its instants as precisely as the open loop does: its thread sleeps until each
// instant, and in the last stretch prepares the request (a pooled connection, the request's
// bytes) and writes it itself. The sessions' goroutines build each turn's body ahead (history
// and tokenizer work is theirs), queue it here, and collect the answer once it is sent; the
// request number, and with it the request ID, is drawn when the dispatcher prepares the
// request, so numbers follow the order in which requests are sent.
//
// A turn queued while the dispatcher is already in the last stretch of an earlier turn's wait
// (leadTime) waits for that send: a turn due within leadTime of being queued can be up to
// leadTime late, which only happens to turns whose delay after the previous answer is shorter
// than that.
type timeline struct {
	r      *run
	ctx    context.Context
	take   func(at time.Duration) (int, bool)
	mu     sync.Mutex
	q      turnHeap
	closed bool
	order  uint64        // turns queued so far (ties between equal instants)
	kick   chan struct{} // a turn earlier than the dispatcher's target was queued, or close
	done   chan struct{} // the dispatcher ended
	pacer  string        // the pacer's description (Result.Pacer)
}

// timedTurn is a turn queued on the timeline. sent receives the request number once the
// request is on the wire, or -1 when it was not sent (the run ended first).
type timedTurn struct {
	at          time.Duration
	order       uint64 // ties broken in queueing order
	x           *exchange
	body        []byte
	inTok       int
	worker, sid string
	turn        int
	cancel      func(int) (bool, time.Duration)
	sent        chan int
}

type turnHeap []*timedTurn

func (h turnHeap) Len() int { return len(h) }
func (h turnHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].order < h[j].order
}
func (h turnHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *turnHeap) Push(x any)   { *h = append(*h, x.(*timedTurn)) }
func (h *turnHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return t
}

// leadTime is how long before a turn's instant the dispatcher commits to it (stops watching
// for earlier turns), prepares it and sleeps the rest on the pacer (whose last millisecond,
// heldNap on Linux, keeps its processor): Go's timer, which the dispatcher waits on until
// then, can be a millisecond late.
const leadTime = 3 * time.Millisecond

// newTimeline starts the dispatcher; meanGap (the expected time between sends) bounds the
// pacer's spin margin as in the open loop. close ends it once every session has returned.
func newTimeline(ctx context.Context, r *run, meanGap time.Duration, take func(time.Duration) (int, bool)) *timeline {
	tl := &timeline{r: r, ctx: ctx, take: take, kick: make(chan struct{}, 1), done: make(chan struct{})}
	ready := make(chan struct{})
	go tl.dispatch(meanGap, ready)
	<-ready
	return tl
}

// send queues t and waits until it was sent; it returns the request number, or -1 when the
// run ended before t's instant (nothing was sent, no record is due).
func (tl *timeline) send(t *timedTurn) int {
	if t.sent == nil {
		t.sent = make(chan int, 1)
	}
	tl.mu.Lock()
	if tl.closed {
		tl.mu.Unlock()
		return -1
	}
	tl.order++
	t.order = tl.order
	heap.Push(&tl.q, t)
	first := tl.q[0] == t
	tl.mu.Unlock()
	if first {
		select {
		case tl.kick <- struct{}{}:
		default:
		}
	}
	return <-t.sent
}

// over reports that the timeline sends nothing more (the run's count, duration or context
// ended it).
func (tl *timeline) over() bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.closed
}

// close ends the dispatcher after the turns queued so far (none is left when every session
// has returned) and waits for it.
func (tl *timeline) close() {
	tl.mu.Lock()
	tl.closed = true
	tl.mu.Unlock()
	select {
	case tl.kick <- struct{}{}:
	default:
	}
	<-tl.done
}

func (tl *timeline) dispatch(meanGap time.Duration, ready chan<- struct{}) {
	defer close(tl.done)
	// As in openLoop: the thread stays locked until this goroutine ends, and is then
	// discarded with the timer slack and class the pacer gave it.
	pc := newPacer(tl.r.epoch, meanGap)
	tl.pacer = pc.describe()
	close(ready)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer func() {
		// The run ended: turns still queued were never sent.
		tl.mu.Lock()
		tl.closed = true
		q := tl.q
		tl.q = nil
		tl.mu.Unlock()
		for _, t := range q {
			t.sent <- -1
		}
	}()
	for {
		tl.mu.Lock()
		if len(tl.q) == 0 {
			closed := tl.closed
			tl.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-tl.kick:
			case <-tl.ctx.Done():
				return
			}
			continue
		}
		t := tl.q[0]
		if far := t.at - leadTime - time.Since(tl.r.epoch); far > 0 {
			tl.mu.Unlock()
			timer.Reset(far)
			select {
			case <-timer.C:
			case <-tl.kick:
				if !timer.Stop() {
					<-timer.C
				}
			case <-tl.ctx.Done():
				return
			}
			continue
		}
		heap.Pop(&tl.q)
		tl.mu.Unlock()
		i, ok := tl.take(t.at)
		if !ok {
			// The request count or the duration is reached, and stays so for every later
			// turn: the deferred drain answers them all.
			t.sent <- -1
			return
		}
		tl.r.prepare(tl.ctx, t.x, records.PhaseProfiling, "", i, t.body, t.inTok, t.worker, t.cancel, t.sid, t.turn)
		if !pc.wait(tl.ctx, t.at) {
			t.x.p.Discard()
			t.sent <- -1
			return
		}
		t.x.p.Send()
		t.sent <- i
	}
}
