package load

import (
	"context"
	"math"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/records"
)

// rampKS is the Kolmogorov–Smirnov distance between the times ts (seconds from the ramp's
// start) and the distribution of arrivals on a linear ramp of length T, F(t) = (t/T)².
func rampKS(ts []float64, T float64) float64 {
	sort.Float64s(ts)
	d := 0.0
	for i, t := range ts {
		f := math.Min(t/T, 1)
		f *= f
		d = math.Max(d, math.Max(math.Abs(float64(i+1)/float64(len(ts))-f), math.Abs(float64(i)/float64(len(ts))-f)))
	}
	return d
}

// TestRampScheduleIsLinear: the schedule alone, drawn without sending, puts the ramp's
// arrivals where a rate rising linearly from 0 to R over T puts them: constant arrivals at
// exactly t_k = √(2Tk/R), R·T/2 of them, the measured phase at R from T on; Poisson ones with
// the ramp's distribution F(t) = (t/T)² (KS distance under the 1 % critical value 1.63/√n).
func TestRampScheduleIsLinear(t *testing.T) {
	const R, T = 200.0, 2 * time.Second
	s := rampSchedule{rate: R, ramp: T}
	var ramp, after []time.Duration
	for len(after) < 5 {
		at, in := s.next()
		if in {
			ramp = append(ramp, at)
		} else {
			after = append(after, at)
		}
	}
	if len(ramp) != int(R*T.Seconds()/2)-1 { // arrivals 1 .. RT/2−1; the RT/2-th lands on T
		t.Fatalf("%d ramp arrivals, want %d", len(ramp), int(R*T.Seconds()/2)-1)
	}
	for i, at := range ramp {
		want := math.Sqrt(2 * T.Seconds() * float64(i+1) / R)
		if math.Abs(at.Seconds()-want) > 1e-9 {
			t.Fatalf("ramp arrival %d at %v, want %.9fs", i+1, at, want)
		}
	}
	for i, at := range after {
		if want := T + time.Duration(i)*time.Second/R; at != want {
			t.Errorf("measured arrival %d at %v, want %v (rate R from the ramp's end)", i, at, want)
		}
	}

	p := rampSchedule{rng: mrand.New(mrand.NewPCG(7, 0)), poisson: true, rate: R, ramp: T}
	var ts []float64
	for {
		at, in := p.next()
		if !in {
			break
		}
		ts = append(ts, at.Seconds())
	}
	n := float64(len(ts))
	if math.Abs(n-R*T.Seconds()/2) > 4*math.Sqrt(R*T.Seconds()/2) {
		t.Errorf("%v Poisson arrivals in the ramp, want about %v", n, R*T.Seconds()/2)
	}
	if d := rampKS(ts, T.Seconds()); d > 1.63/math.Sqrt(n) {
		t.Errorf("Poisson ramp: KS distance %.3f to F(t) = (t/T)² over %v arrivals, over the 1%% critical value %.3f", d, n, 1.63/math.Sqrt(n))
	}
	// A plain schedule (no ramp) still sends its first request at its start.
	if at, in := (&rampSchedule{rate: R, start: 3}).next(); at != 3 || in {
		t.Errorf("plain schedule starts at %v (ramp %v)", at, in)
	}
}

// TestOpenLoopRampSendsFollowRamp: the sends themselves (first byte written, as recorded)
// follow the ramp: warmup phase with IDs -u<n> and times distributed as (t/T)², then the
// measured requests from T on, none of them before it.
func TestOpenLoopRampSendsFollowRamp(t *testing.T) {
	f := newFakeServer(t, false)
	const R, T = 100.0, time.Second
	var phases []string
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, RequestRate: R, Arrival: ArrivalPoisson,
		Requests: 20, Warmup: 2, RampUp: T, Prompts: prompts(3), Seed: 11,
		OnPhase: func(p string, start bool) {
			if start {
				phases = append(phases, p)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	var warm, ramp, measured []records.Request
	for _, r := range res.Records {
		switch {
		case r.Phase == records.PhaseProfiling:
			measured = append(measured, r)
		case strings.Contains(r.RequestID, "-u"):
			ramp = append(ramp, r)
		default:
			warm = append(warm, r)
		}
		if r.Phase == records.PhaseWarmup && strings.Contains(r.RequestID, "-u") != (r.SessionNum >= 2) {
			t.Errorf("record %s (session %d): the ramp's are numbered on from the 2 warmup requests", r.RequestID, r.SessionNum)
		}
	}
	if len(warm) != 2 || len(measured) != 20 || len(ramp) < 25 {
		t.Fatalf("warmup %d, ramp %d, measured %d; want 2, about R·T/2 = 50, 20", len(warm), len(ramp), len(measured))
	}
	for _, r := range ramp {
		if r.Phase != records.PhaseWarmup {
			t.Fatalf("ramp request %s in phase %q, want warmup", r.RequestID, r.Phase)
		}
	}
	// The sends are measured from the ramp's start, the schedule's origin.
	origin := float64(res.RampStartNs) / 1e9
	if res.RampStartNs <= 0 {
		t.Fatalf("Result.RampStartNs %d", res.RampStartNs)
	}
	var ts []float64
	for _, r := range ramp {
		sent := float64(r.StartUnixNs-res.StartUnixNs) / 1e9
		ts = append(ts, sent-origin)
	}
	if d := rampKS(ts, T.Seconds()); d > 1.63/math.Sqrt(float64(len(ts))) {
		t.Errorf("ramp sends: KS distance %.3f to (t/T)² over %d sends", d, len(ts))
	}
	for _, r := range measured {
		if sched := time.Duration(r.ScheduledNs); sched < time.Duration(origin*1e9)+T-time.Millisecond {
			t.Errorf("measured request %s scheduled at %v, before the ramp's end %v", r.RequestID, sched, time.Duration(origin*1e9)+T)
		}
	}
	if strings.Join(phases, ",") != "warmup,profiling" {
		t.Errorf("phases started %q, want warmup then profiling", phases)
	}
}

// TestClosedLoopRampAddsClients: client w of C starts w·T/C into the ramp, so the first
// sends of the C clients are T/C apart, and none of the measured requests starts before T.
func TestClosedLoopRampAddsClients(t *testing.T) {
	q := newQueueServer(t, 0)
	const C, T = 4, 800 * time.Millisecond
	res, err := Run(context.Background(), Config{BaseURL: q.URL, Endpoint: client.Completions, Concurrency: C,
		Requests: 8, RampUp: T, Prompts: prompts(3), Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]int64{}
	measured := 0
	rampStart := res.StartUnixNs + res.RampStartNs
	for _, r := range res.Records {
		if r.Phase == records.PhaseWarmup {
			if _, ok := first[r.WorkerID]; !ok {
				first[r.WorkerID] = r.StartUnixNs
			}
			continue
		}
		measured++
		if at := time.Duration(r.StartUnixNs - rampStart); at < T-5*time.Millisecond {
			t.Errorf("measured request %s started %v into the ramp of %v", r.RequestID, at, T)
		}
	}
	if measured != 8 || len(first) != C {
		t.Fatalf("measured %d, clients in the ramp %d; want 8 and %d", measured, len(first), C)
	}
	for w := 0; w < C; w++ {
		at := time.Duration(first["worker-"+string(rune('0'+w))] - rampStart)
		want := T * time.Duration(w) / C
		if at < want-time.Millisecond || at > want+60*time.Millisecond { // never early (wall clock, to 1 ms); late by what a loaded machine adds

			t.Errorf("client %d first sent %v into the ramp, want %v", w, at, want)
		}
	}
}
