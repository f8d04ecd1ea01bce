package load

import (
	"context"
	"encoding/json"
	mrand "math/rand/v2"
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
	// take reserves the next request number, or reports that the run is over.
	take := func() (int, bool) {
		if ctx.Err() != nil || deadline > 0 && time.Since(r.epoch) >= deadline {
			return 0, false
		}
		s := int(seq.Add(1) - 1)
		return s, n < 0 || s < n
	}
	// session plays one session; base is when its first turn is due (0: now), timed whether
	// turns with timestamps keep to them. Each session waits on a schedule clock of its own
	// (a timerfd on Linux), as sessions wait in parallel.
	session := func(s *Session, worker string, base time.Duration, timed bool) {
		var clock *schedClock
		waitUntil := func(at time.Duration) bool {
			if clock == nil {
				c, err := newSchedClock(r.epoch)
				if err != nil {
					return sleepUntil(ctx, r.epoch, at)
				}
				clock = c
			}
			return clock.wait(ctx, at)
		}
		defer func() {
			if clock != nil {
				clock.close()
			}
		}()
		var h history
		var x exchange
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
			// The body is built, and the history tokenised, before the wait: none of that
			// work lies between the turn's instant and its first byte.
			body, inTok, err := r.turnBody(&h, t)
			if sched > 0 && !waitUntil(sched) {
				return
			}
			i, ok := take()
			if !ok {
				return
			}
			if err != nil {
				rec := records.Request{RequestID: cfg.RunID + "-" + strconv.Itoa(i), Phase: records.PhaseProfiling, SessionNum: i,
					Error: &records.Error{Type: "InvalidRequest", Message: "build turn body: " + err.Error()}}
				mu.Lock()
				recs = append(recs, rec)
				mu.Unlock()
				return
			}
			rec := r.send(ctx, records.PhaseProfiling, "", i, body, inTok, worker, cancel, &x, s.ID, k)
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
		if n >= 0 {
			// Only the sessions whose turns fit the request count are played, so the run
			// does not wait out the rest of the trace.
			turns := 0
			for i := range sessions {
				if turns >= n {
					sessions = sessions[:i]
					break
				}
				turns += len(sessions[i].Turns)
			}
		}
		for i := range sessions {
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
			if n >= 0 && i >= n {
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
	sortBySeq(recs)
	return recs
}
