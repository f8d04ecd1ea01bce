package load

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/reports"
)

// queueServer is a completions server with one FIFO worker that serves each request for a
// fixed time S before streaming its answer: a D/D/1 queue, whose latencies under load are
// known in closed form. A request's first token comes when its service ends: TTFT = its wait
// in the queue + S.
//   - A closed loop of C clients keeps C−1 requests ahead of each new one: TTFT = C·S once
//     the first wave is through (before, S, 2S, ... C·S), so TTFT's p99 is C·S.
//   - Constant arrivals at R > 1/S fall behind by S − 1/R a request: request k (from 0) of
//     N waits k·(S − 1/R), so TTFT_k = S + k·(S − 1/R), a linear sequence whose numpy p99
//     is exactly S + 0.99·(N−1)·(S − 1/R); at R ≤ 1/S it is S.
type queueServer struct {
	*httptest.Server
	service time.Duration
	mu      sync.Mutex
	busy    time.Time // when the worker is free
	bodies  []string
}

func newQueueServer(t *testing.T, service time.Duration) *queueServer {
	q := &queueServer{service: service}
	q.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := time.Now()
		q.mu.Lock()
		q.bodies = append(q.bodies, string(body))
		start := q.busy
		if start.Before(now) {
			start = now
		}
		q.busy = start.Add(q.service)
		done := q.busy
		q.mu.Unlock()
		time.Sleep(time.Until(done))
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 2; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d \"}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(q.Close)
	return q
}

func findMaxProfile(t *testing.T, q *queueServer, in ProfileInput) *ProfileResult {
	t.Helper()
	in.Endpoint = &launch.Endpoint{BaseURL: q.URL, Model: "m", Kind: "external"}
	in.OutDir = t.TempDir()
	in.Load.Endpoint, in.Load.Stream, in.Load.Prompts, in.Load.Seed = client.Completions, true, prompts(4), 3
	res, err := Profile(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if res.FindMax == nil {
		t.Fatal("no FindMax in the result")
	}
	// Every searched point is a run of its own, and the search's summary is beside them.
	for _, p := range res.FindMax.Points {
		if _, err := os.Stat(filepath.Join(in.OutDir, p.Dir, reports.SummaryJSONFile)); err != nil {
			t.Errorf("point %v: %v", p.Value, err)
		}
	}
	got, err := reports.ReadFindMax(filepath.Join(in.OutDir, "profile"+SweepDirSuffix))
	if err != nil || len(got.Points) != len(res.FindMax.Points) || got.Verdict != res.FindMax.Verdict {
		t.Fatalf("find-max summary.json: %+v, %v", got, err)
	}
	md, _ := os.ReadFile(filepath.Join(in.OutDir, "profile"+SweepDirSuffix, reports.SummaryMDFile))
	if !strings.Contains(string(md), res.FindMax.Verdict) || !strings.Contains(string(md), "## Find max") {
		t.Errorf("find-max summary.md lacks the verdict:\n%s", md)
	}
	return res
}

// TestFindMaxConcurrencyOnQueue: with S = 50 ms and TTFT p99 at most 225 ms, C·S <= 225 ms
// holds up to C = 4 and fails from 5, so the search (1, 2, 4, 8, then bisection) answers 4.
// S is long against the timer's oversleep on a loaded machine (a few ms), which only ever
// adds to a request's TTFT without shifting the queue's arithmetic schedule.
func TestFindMaxConcurrencyOnQueue(t *testing.T) {
	q := newQueueServer(t, 50*time.Millisecond)
	res := findMaxProfile(t, q, ProfileInput{
		Load:          Config{Requests: 12},
		Concurrencies: []int{1},
		FindMax:       &FindMax{SLOs: "ttft_p99:225ms", MaxPoints: 8},
	})
	fm := res.FindMax
	t.Logf("%s\n%s", fm.Verdict, fm.Markdown())
	if fm.Answer == nil || *fm.Answer != 4 || fm.Above == nil || *fm.Above != 5 {
		t.Fatalf("%s; want 4, with 5 failing (C·S = 200 ms passes, 250 ms fails)", fm.Verdict)
	}
	for _, p := range fm.Points {
		if want := p.Value <= 4; p.Pass != want {
			t.Errorf("concurrency %v: pass %v, want %v (%v)", p.Value, p.Pass, want, p.Failed)
		}
		if !p.Pass && (len(p.Failed) != 1 || !strings.Contains(p.Failed[0], "time_to_first_token p99")) {
			t.Errorf("concurrency %v: failed SLOs %q, want TTFT p99 named", p.Value, p.Failed)
		}
	}
}

// TestFindMaxRateOnQueue: with S = 100 ms, N = 12 constant arrivals and TTFT p99 at most
// 300 ms, S + 0.99·11·(S − 1/R) <= 300 ms gives R* = 1/(S − 0.2/10.89) = 12.25 req/s (the
// queue keeps up to 1/S = 10 req/s; past it each request waits S − 1/R longer than the one
// before). The margins (200 ms of slack at the stable rates) are wide against the timer's
// oversleep on a loaded machine.
func TestFindMaxRateOnQueue(t *testing.T) {
	q := newQueueServer(t, 100*time.Millisecond)
	const S, N, T = 0.100, 12, 0.300
	want := 1 / (S - (T-S)/(0.99*(N-1)))
	res := findMaxProfile(t, q, ProfileInput{
		Load:         Config{Requests: N, Arrival: ArrivalConstant},
		RequestRates: []float64{5},
		FindMax:      &FindMax{SLOs: "ttft_p99:300ms", Resolution: 0.02, Relative: true, MaxPoints: 10},
	})
	fm := res.FindMax
	t.Logf("analytic %.2f req/s; %s\n%s", want, fm.Verdict, fm.Markdown())
	if fm.Answer == nil || fm.Above == nil {
		t.Fatalf("no bracket: %s", fm.Verdict)
	}
	if *fm.Answer < 0.9*want || *fm.Answer > 1.03*want || *fm.Above < *fm.Answer || *fm.Above > 1.1*want {
		t.Errorf("answer %.3g (next failing %.3g), want about %.3g", *fm.Answer, *fm.Above, want)
	}
	for _, p := range fm.Points {
		if p.Value <= 0.9/S && !p.Pass || p.Value >= 1.1*want && p.Pass {
			t.Errorf("rate %v: pass %v, analytic R* %.2f", p.Value, p.Pass, want)
		}
	}
}

func TestParseFindMaxSLOs(t *testing.T) {
	slos, err := ParseFindMaxSLOs("ttft_p99:200ms, itl_p99.9:50, e2e_avg:2s, request_latency:1s, tps_p90:20")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range slos {
		got = append(got, s.Name())
	}
	want := "time_to_first_token p99 <= 200 ms; inter_token_latency p99.9 <= 50 ms; request_latency avg <= 2000 ms; request_latency max <= 1000 ms; output_token_throughput_per_user p90 >= 20 tokens/sec/user"
	if strings.Join(got, "; ") != want {
		t.Errorf("parsed\n %s\nwant\n %s", strings.Join(got, "; "), want)
	}
	for _, bad := range []string{"", "ttft_p0:1s", "ttft_p101:1s", "nosuch_p99:1", "ttft_p99"} {
		if _, err := ParseFindMaxSLOs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestFindMaxMeasureCountsFailures: a failed request misses every SLO, pulling a percentile
// to +Inf once it reaches the percentile's rank; planned cancellations are left out.
func TestFindMaxMeasureCountsFailures(t *testing.T) {
	slos, _ := ParseFindMaxSLOs("ttft_p50:100ms,ttft_p99:100ms,tps_p50:10")
	var recs []reports.ExportRecord
	for i := 0; i < 10; i++ {
		recs = append(recs, reports.ExportRecord{Metadata: reports.RecordMetadata{BenchmarkPhase: reports.PhaseProfiling},
			Metrics: map[string]reports.MetricValue{reports.TagTTFT: {Value: float64(10 * (i + 1)), Unit: "ms"},
				reports.TagOutputTPSPerUser: {Value: float64(i + 1)}}})
	}
	recs[9].Metrics, recs[9].Error = nil, &reports.ErrorDetails{Code: 500, Type: "x"}
	recs = append(recs, reports.ExportRecord{Metadata: reports.RecordMetadata{BenchmarkPhase: reports.PhaseProfiling},
		Error: &reports.ErrorDetails{Code: reports.CancelledCode, Type: "cancelled"}})
	// p99 is +Inf; TPS 1..9 and −Inf: its p50 read from the low end is numpy's p50 of
	// [−Inf 1 .. 9] = (4+5)/2.
	// TTFT 10..90 ms and one failure (+Inf): numpy's p50 of [10 .. 90 +Inf] is (50+60)/2.
	for i, want := range []float64{55, math.Inf(1), 4.5} {
		v, n := slos[i].Measure(recs)
		if v != want || n != 10 {
			t.Errorf("%s = %v over %d, want %v over 10", slos[i].Name(), v, n, want)
		}
	}
}

func TestFindMaxSearchSequence(t *testing.T) {
	// Passing up to 13: 1 2 4 8 16 (fail) 12 14 (fail) 13, then 13..14 is the resolution.
	s := findMaxSearch{integer: true, start: 1, resolution: 1, hi: math.Inf(1), tried: map[float64]bool{}}
	var seq []float64
	for {
		v, why := s.next()
		if why != "" {
			break
		}
		seq = append(seq, v)
		s.record(v, v <= 13)
	}
	if fmt.Sprint(seq) != "[1 2 4 8 16 12 14 13]" || s.lo != 13 || s.hi != 14 {
		t.Errorf("sequence %v, bracket [%v, %v)", seq, s.lo, s.hi)
	}
	// Failing from the start halves down to a pass.
	s = findMaxSearch{start: 8, resolution: 0.1, relative: true, hi: math.Inf(1), tried: map[float64]bool{}}
	seq = nil
	for len(seq) < 20 {
		v, why := s.next()
		if why != "" {
			break
		}
		seq = append(seq, v)
		s.record(v, v <= 1.5)
	}
	if fmt.Sprint(seq[:4]) != "[8 4 2 1]" || s.lo < 1.35 || s.hi-s.lo > 0.1*s.lo {
		t.Errorf("sequence %v, bracket [%v, %v)", seq, s.lo, s.hi)
	}
}

// TestFindMaxStopsWhenNothingSucceeds: a first point none of whose requests succeeded is a
// wrong request or server, not a load too high: the search stops with the error instead of
// halving the load in search of one that passes.
func TestFindMaxStopsWhenNothingSucceeds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"message":"model m not found","type":"invalid_request_error"}}`)
	}))
	t.Cleanup(srv.Close)
	res, err := Profile(context.Background(), ProfileInput{
		Endpoint: &launch.Endpoint{BaseURL: srv.URL, Model: "m", Kind: "external"}, OutDir: t.TempDir(),
		Load:         Config{Endpoint: client.Completions, Requests: 4, Prompts: prompts(2), Arrival: ArrivalConstant},
		RequestRates: []float64{50},
		FindMax:      &FindMax{SLOs: "e2e_p99:1s"},
	})
	if err == nil || !strings.Contains(err.Error(), "0 of 4 requests succeeded") || res.FindMax == nil || len(res.FindMax.Points) != 1 {
		t.Fatalf("err %v, search %+v; want it stopped at the first point naming 0 of 4 succeeded", err, res.FindMax)
	}
}
