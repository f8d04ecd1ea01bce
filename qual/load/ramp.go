package load

import (
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelqual/modelqual/qual/records"
)

// A ramp (Config.RampUp) raises the load linearly before the measured phase, as AIPerf's
// --request-rate-ramp-duration and --concurrency-ramp-duration and vLLM's
// --ramp-up-strategy linear do:
//
//   - open loop: the arrival rate at time t of a ramp of length T is λ(t) = R·t/T, so the
//     expected count of arrivals by t is Λ(t) = R·t²/(2T) and R·T/2 requests arrive in the
//     ramp. Arrivals are drawn in Λ's units (unit-mean exponential gaps for Poisson arrivals,
//     gaps of 1 for constant ones) and mapped back by t = √(2T·Λ/R): the time change that
//     turns a unit-rate process into one of rate λ(t) (Çinlar's inversion for a
//     non-homogeneous Poisson process). Past Λ(T) the schedule goes on at rate R with no
//     seam, so the ramp's last gap and the measured phase's first are drawn alike.
//   - closed loop: client w of C starts at w·T/C, so 1 client is active at the start, C at
//     the end, one more every T/C (AIPerf adds one every T/(C−1)).
//
// Requests sent in the ramp are recorded as warmup (IDs RunID-u<n>, numbered on from the
// warmup's), so they are reported apart from the steady state as METRICS.md asks of warmup.

// rampTime maps a position lambda (expected arrivals) on a ramp of length T to rate R to
// the time since the ramp's start at which the ramp has delivered lambda arrivals.
func rampTime(lambda float64, T time.Duration, rate float64) time.Duration {
	return time.Duration(math.Sqrt(2*T.Seconds()*lambda/rate) * float64(time.Second))
}

// phaseMark starts the measured phase once: at a set instant by a timer, or earlier when
// fire is called (a closed-loop client about to send the first measured request), so the
// phase's hooks run once and before any measured request when a client gets there first.
type phaseMark struct {
	once  sync.Once
	begin func()
	stop  chan struct{}
	done  chan struct{}
}

func newPhaseMark(begin func(), epoch time.Time, at time.Duration) *phaseMark {
	m := &phaseMark{begin: begin, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		t := time.NewTimer(at - time.Since(epoch))
		defer t.Stop()
		select {
		case <-t.C:
			m.fire()
		case <-m.stop:
		}
	}()
	return m
}

func (m *phaseMark) fire() { m.once.Do(m.begin) }

// wait ends the timer and starts the phase if nothing did (a run cancelled in its ramp), so
// that a phase's end always follows its start.
func (m *phaseMark) wait() {
	close(m.stop)
	<-m.done
	m.fire()
}

// splitRamp separates the ramp's records (warmup phase) from the measured ones, each in
// the order of its own numbering.
func splitRamp(recs []records.Request) (ramp, measured []records.Request) {
	for _, r := range recs {
		if r.Phase == records.PhaseProfiling {
			measured = append(measured, r)
		} else {
			ramp = append(ramp, r)
		}
	}
	sort.SliceStable(ramp, func(i, j int) bool { return ramp[i].SessionNum < ramp[j].SessionNum })
	sort.SliceStable(measured, func(i, j int) bool { return measured[i].SessionNum < measured[j].SessionNum })
	return ramp, measured
}

// closedLoopRamped is the closed loop with a ramp: client w of c starts at w·T/c after
// rampStart; what a client sends before the ramp's end is warmup, then it goes on with the
// measured phase (n requests, or cfg.Duration from the ramp's end) without a pause.
func (r *run) closedLoopRamped(ctx context.Context, n int, cancel func(int) (bool, time.Duration), prog *progress, rampStart time.Duration, mark *phaseMark) []records.Request {
	cfg := r.cfg
	c := cfg.Concurrency
	rampEnd := rampStart + cfg.RampUp
	var deadline time.Duration
	if cfg.Duration > 0 {
		deadline = rampEnd + cfg.Duration
	}
	var next, rampNext atomic.Int64
	out := make([][]records.Request, c)
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			worker := fmt.Sprintf("worker-%d", w)
			if !sleepUntil(ctx, r.epoch, rampStart+cfg.RampUp*time.Duration(w)/time.Duration(c)) {
				return
			}
			var x exchange
			for ctx.Err() == nil {
				now := time.Since(r.epoch)
				if now < rampEnd {
					k := int(rampNext.Add(1) - 1)
					rec := r.one(ctx, records.PhaseWarmup, "u", cfg.Warmup+k, worker, nil, &x)
					out[w] = append(out[w], rec)
					prog.addIn(rec.Phase, rec.Error != nil)
					continue
				}
				mark.fire()
				if deadline > 0 && now >= deadline {
					return
				}
				seq := int(next.Add(1) - 1)
				if n >= 0 && seq >= n {
					return
				}
				rec := r.one(ctx, records.PhaseProfiling, "", seq, worker, cancel, &x)
				out[w] = append(out[w], rec)
				prog.addIn(rec.Phase, rec.Error != nil)
			}
		}(w)
	}
	wg.Wait()
	return mergeBySeq(out)
}

// rampSchedule yields an open loop's send instants (since the run's epoch): a linear ramp
// from rate 0 at start to rate at start+ramp, then rate; ramp == 0 is the plain schedule,
// whose first send is at start. inRamp says whether an instant lies in the ramp.
type rampSchedule struct {
	rng     *mrand.Rand
	poisson bool
	rate    float64 // requests per second at full load
	start   time.Duration
	ramp    time.Duration
	lambda  float64 // arrivals drawn so far, in expected-count units (ramp only)
	at      float64 // the last instant, ns since the epoch
	n       int
}

// next returns the next instant and whether it lies in the ramp.
func (s *rampSchedule) next() (time.Duration, bool) {
	s.n++
	mean := float64(time.Second) / s.rate
	if s.ramp <= 0 && s.n == 1 {
		s.at = float64(s.start) // the plain schedule's first send is at its start
		return time.Duration(s.at), false
	}
	gap := 1.0
	if s.poisson {
		gap = s.rng.ExpFloat64()
	}
	if s.ramp <= 0 {
		s.at += gap * mean
		return time.Duration(s.at), false
	}
	full := s.rate * s.ramp.Seconds() / 2 // arrivals the ramp holds
	if s.lambda < full {
		s.lambda += gap
		if s.lambda < full {
			s.at = float64(s.start + rampTime(s.lambda, s.ramp, s.rate))
			return time.Duration(s.at), true
		}
		// The gap that crosses the ramp's end: what is left of it goes at the full rate.
		s.at = float64(s.start+s.ramp) + (s.lambda-full)*mean
		return time.Duration(s.at), false
	}
	s.at += gap * mean
	return time.Duration(s.at), false
}
