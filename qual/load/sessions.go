package load

import (
	"context"
	"encoding/json"
	mrand "math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/records"
)

// history is what a session has said so far: chat messages, or the completions text the
// next prompt extends.
type history struct {
	messages []map[string]string
	text     string
}

// body builds the request of turn t after the history h, and the client tokenizer's count
// of what it sends.
func (r *run) turnBody(h *history, t *Turn) ([]byte, int, error) {
	cfg := r.cfg
	maxTokens := cfg.OutputTokens
	if t.Prompt.OutputTokens > 0 {
		maxTokens = t.Prompt.OutputTokens
	}
	req := client.Request{Endpoint: cfg.Endpoint, Stream: cfg.Stream, MaxTokens: maxTokens, IgnoreEOS: maxTokens > 0, Extra: cfg.Extra}
	count := func(s string) int {
		if cfg.Tokenizer == nil {
			return t.Prompt.InputTokens
		}
		return len(cfg.Tokenizer.Encode(s))
	}
	n := 0
	if cfg.Endpoint == client.Chat {
		msgs := append(append([]map[string]string(nil), h.messages...), map[string]string{"role": "user", "content": t.Prompt.Prompt})
		b, err := json.Marshal(msgs)
		if err != nil {
			return nil, 0, err
		}
		req.Messages = b
		if cfg.Tokenizer != nil {
			for _, m := range msgs {
				n += count(m["content"])
			}
		} else {
			n = t.Prompt.InputTokens
		}
	} else {
		req.Prompt = h.text + t.Prompt.Prompt
		n = count(req.Prompt)
	}
	b, err := r.cl.BuildBody(&req)
	return b, n, err
}

// remember adds a finished turn and its answer to the history.
func (h *history) remember(endpoint string, t *Turn, answer []byte) {
	if endpoint == client.Chat {
		h.messages = append(h.messages, map[string]string{"role": "user", "content": t.Prompt.Prompt},
			map[string]string{"role": "assistant", "content": string(answer)})
		return
	}
	h.text += t.Prompt.Prompt + string(answer) + "\n"
}

// runSessions is the measured phase over cfg.Sessions: a closed loop of Concurrency
// sessions at a time, sessions started on the RequestRate schedule, or every turn at its
// trace timestamp (FixedSchedule). Within a session turns go one after another, each after
// its delay; n > 0 stops after n requests, cfg.Duration after that long.
func (r *run) runSessions(ctx context.Context, rng *mrand.Rand, n int, cancel func(int) (bool, time.Duration), prog *progress) []records.Request {
	cfg := r.cfg
	start := time.Since(r.epoch)
	var deadline time.Duration
	if cfg.Duration > 0 {
		deadline = start + cfg.Duration
	}
	var (
		seq  atomic.Int64
		mu   sync.Mutex
		recs []records.Request
	)
	// take reserves the next request number, or reports that the run is over; a timed turn
	// is judged against the duration by its instant at, an untimed one (at 0) by now.
	take := func(at time.Duration) (int, bool) {
		if at == 0 {
			at = time.Since(r.epoch)
		}
		if ctx.Err() != nil || deadline > 0 && at >= deadline {
			return 0, false
		}
		s := int(seq.Add(1) - 1)
		return s, n < 0 || s < n
	}
	var tl *timeline
	if cfg.FixedSchedule || cfg.RequestRate > 0 || timedTurns(cfg.Sessions) {
		tl = newTimeline(ctx, r, sessionGap(cfg), take)
	}
	// session plays one session; base is when its first turn is due (0: now), timed whether
	// turns with timestamps keep to them. Turns with an instant (a timestamp, a delay, a
	// session start on the rate) are sent by the timeline's dispatcher; the others by the
	// session's goroutine at once.
	session := func(s *Session, worker string, base time.Duration, timed bool) {
		var h history
		var x exchange
		tt := timedTurn{x: &x, worker: worker, sid: s.ID, cancel: cancel}
		due := base
		for k := range s.Turns {
			t := &s.Turns[k]
			sched := time.Duration(0)
			switch {
			case timed && t.TimestampMs != nil:
				sched = start + time.Duration(*t.TimestampMs*float64(time.Millisecond))
			case k == 0 && due > 0:
				sched = due + time.Duration(t.DelayMs*float64(time.Millisecond))
			case t.DelayMs > 0 || timed:
				sched = time.Since(r.epoch) + time.Duration(t.DelayMs*float64(time.Millisecond))
			}
			// The body is built, and the history tokenised, before the turn's instant: none
			// of that work lies between the instant and its first byte.
			body, inTok, err := r.turnBody(&h, t)
			if err != nil {
				i, ok := take(sched)
				if !ok {
					return
				}
				rec := records.Request{RequestID: cfg.RunID + "-" + strconv.Itoa(i), Phase: records.PhaseProfiling, SessionNum: i,
					Error: &records.Error{Type: "InvalidRequest", Message: "build turn body: " + err.Error()}}
				mu.Lock()
				recs = append(recs, rec)
				mu.Unlock()
				return
			}
			var rec records.Request
			if sched > 0 && tl != nil {
				tt.at, tt.body, tt.inTok, tt.turn = sched, body, inTok, k
				if tl.send(&tt) < 0 {
					return
				}
				rec = r.end(ctx, &x)
			} else {
				i, ok := take(0)
				if !ok {
					return
				}
				rec = r.send(ctx, records.PhaseProfiling, "", i, body, inTok, worker, cancel, &x, s.ID, k)
			}
			rec.ConversationID, rec.TurnIndex = s.ID, k
			resp := &x.resp
			if sched > 0 {
				rec.ScheduledNs = int64(sched)
				rec.LatenessNs = resp.StartNs - int64(sched)
			}
			mu.Lock()
			recs = append(recs, rec)
			mu.Unlock()
			prog.add(rec.Error != nil)
			if rec.Failed() {
				return // the rest of a conversation depends on this answer
			}
			h.remember(cfg.Endpoint, t, resp.Text)
		}
	}

	var wg sync.WaitGroup
	switch {
	case cfg.FixedSchedule:
		sessions := cfg.Sessions
		order := make([]int, len(sessions))
		first := func(i int) time.Duration {
			if ts := sessions[i].Turns; len(ts) > 0 && ts[0].TimestampMs != nil {
				return time.Duration(*ts[0].TimestampMs * float64(time.Millisecond))
			}
			return 0
		}
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return first(order[a]) < first(order[b]) })
		turns := 0
		for _, i := range order {
			// Only the sessions that start before the run's end and whose turns fit the
			// request count are played, in the order of their first instants, so the run
			// does not wait out the rest of the trace.
			due := start + first(i)
			if n >= 0 && turns >= n || deadline > 0 && due >= deadline || tl.over() {
				break
			}
			if !launchBefore(ctx, r.epoch, due) {
				break
			}
			turns += len(sessions[i].Turns)
			s := &sessions[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				session(s, "trace", 0, true)
			}()
		}
	case cfg.RequestRate > 0:
		mean := float64(time.Second) / cfg.RequestRate
		at := float64(start)
		for i := 0; ctx.Err() == nil; i++ {
			if i > 0 {
				if cfg.Arrival == ArrivalPoisson {
					at += rng.ExpFloat64() * mean
				} else {
					at += mean
				}
			}
			if n >= 0 && int(seq.Load()) >= n || deadline > 0 && time.Duration(at) >= deadline {
				break
			}
			if n >= 0 && i >= n || tl.over() {
				break
			}
			if !launchBefore(ctx, r.epoch, time.Duration(at)) {
				break
			}
			s := &cfg.Sessions[i%len(cfg.Sessions)]
			wg.Add(1)
			go func(at time.Duration) {
				defer wg.Done()
				session(s, "scheduler", at, false)
			}(time.Duration(at))
		}
	default:
		var next atomic.Int64
		for w := 0; w < max(cfg.Concurrency, 1); w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				worker := "worker-" + strconv.Itoa(w)
				for ctx.Err() == nil {
					i := int(next.Add(1) - 1)
					if n < 0 && deadline == 0 && i >= len(cfg.Sessions) {
						return // no count, no duration: each session once
					}
					if n >= 0 && int(seq.Load()) >= n || deadline > 0 && time.Since(r.epoch) >= deadline {
						return
					}
					session(&cfg.Sessions[i%len(cfg.Sessions)], worker, 0, false)
				}
			}(w)
		}
	}
	wg.Wait()
	if tl != nil {
		tl.close()
		r.pacer = tl.pacer
	}
	sortBySeq(recs)
	return recs
}

// sessionLead is how long before its first instant a session's goroutine is started. Starting
// every session of a trace at once made the run's first instants wait behind thousands of new
// goroutines building their bodies (a 5,000 req/s trace replay: 400 of its first 1,000
// requests more than 1 ms late); started just ahead, a session has its first body built and
// queued on the timeline by its instant.
const sessionLead = 20 * time.Millisecond

// launchBefore waits until sessionLead before epoch+due; false when ctx ended first.
func launchBefore(ctx context.Context, epoch time.Time, due time.Duration) bool {
	wait := due - sessionLead - time.Since(epoch)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// timedTurns reports whether any turn waits for a delay (and so has an instant to keep).
func timedTurns(sessions []Session) bool {
	for i := range sessions {
		for _, t := range sessions[i].Turns {
			if t.DelayMs > 0 {
				return true
			}
		}
	}
	return false
}

// sessionGap is the expected time between sends of a session run, which bounds the pacer's
// spin margin: the trace's span over its timestamped turns, the rate's mean gap, or 1 ms.
func sessionGap(cfg *Config) time.Duration {
	if cfg.RequestRate > 0 {
		return time.Duration(float64(time.Second) / cfg.RequestRate)
	}
	var lo, hi float64
	n := 0
	for i := range cfg.Sessions {
		for _, t := range cfg.Sessions[i].Turns {
			if t.TimestampMs == nil {
				continue
			}
			if n == 0 || *t.TimestampMs < lo {
				lo = *t.TimestampMs
			}
			if n == 0 || *t.TimestampMs > hi {
				hi = *t.TimestampMs
			}
			n++
		}
	}
	if cfg.FixedSchedule && n > 1 && hi > lo {
		return time.Duration((hi - lo) / float64(n-1) * float64(time.Millisecond))
	}
	return time.Millisecond
}
