package load_test

// Benchmarks of the load generator against a real qual-server serving the mock bundle
// (make bench). Each reports the figure its target is stated in:
//
//	BenchmarkClientStreamingC32      client-us/token   (target <= 1)
//	BenchmarkNonStreamingRate        req/s             (target >= 10,000 on 2 cores)
//	BenchmarkOpenLoopLateness1000    lateness-p99-us   (target <= 100, Poisson arrivals)
//	BenchmarkOpenLoopLateness10000   lateness-p99-us   (target <= 1,000), client-cpu-%core
//	                                 (no core burnt spinning: well under 100)
//	BenchmarkOpenLoopLatenessStream1000 lateness-p99-us (target <= 100, streamed answers)
//	BenchmarkFixedScheduleLateness1000 lateness-p99-us (a trace replayed at 1,000 req/s)
//	BenchmarkMemoryPerStream4096     KiB/stream        (target <= 64)
//	BenchmarkLowRateDistortion       client and server latency p50, closed loop vs 10 req/s
//
// The server runs on the same machine and competes for its cores, so the request rate is
// a lower bound of what the client alone can drive.

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/records"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// readSyscalls is this process's count of read system calls (/proc/self/io syscr; -1 where
// unavailable): the streaming client's cost is mostly system calls, and their count per token
// is a figure that, unlike CPU time, a busy machine does not blur.
func readSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

func BenchmarkClientStreamingC32(b *testing.B) {
	ep := launchtest.Start(b, launchtest.MockBundle(b, 0), launch.WithArgs("--max-batch", "64"))
	const tokens = 256
	cfg := load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, Stream: true, Concurrency: 32,
		Prompts: []load.Prompt{{Prompt: "benchmark"}}, OutputTokens: tokens, Warmup: 32}
	// b.N counts output tokens.
	cfg.Requests = max(512, b.N/tokens)
	var reads0, reads1 int64
	cfg.OnPhase = func(phase string, start bool) {
		if phase == "profiling" && start {
			reads0 = readSyscalls()
		} else if phase == "profiling" {
			reads1 = readSyscalls()
		}
	}
	b.ResetTimer()
	res, err := load.Run(context.Background(), cfg)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	reads := reads1 - reads0
	out, events := 0, 0
	for _, r := range res.Records {
		if r.Phase != "profiling" {
			continue
		}
		if r.Error != nil {
			b.Fatalf("request failed: %+v", r.Error)
		}
		out += r.OutputTokensServer
		events += len(r.ChunkNs)
	}
	wall := time.Duration(res.ProfilingEndNs - res.ProfilingStartNs)
	b.ReportMetric(float64(res.ClientCPU.Microseconds())/float64(out), "client-us/token")
	b.ReportMetric(1, "goal-client-us/token")
	b.ReportMetric(float64(out)/wall.Seconds(), "tokens/s")
	b.ReportMetric(float64(events)/float64(out), "events/token")
	if reads0 >= 0 {
		b.ReportMetric(float64(reads)/float64(out), "reads/token")
	}
}

func BenchmarkNonStreamingRate(b *testing.B) {
	ep := launchtest.Start(b, launchtest.MockBundle(b, 0), launch.WithArgs("--max-batch", "256", "--queue-depth", "4096"))
	cfg := load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, Concurrency: 64,
		Prompts: []load.Prompt{{Prompt: "benchmark"}}, OutputTokens: 1, Warmup: 256}
	cfg.Requests = max(20000, b.N)
	b.ResetTimer()
	res, err := load.Run(context.Background(), cfg)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	ok := 0
	for _, r := range res.Records {
		if r.Phase == "profiling" && r.Error == nil {
			ok++
		}
	}
	wall := time.Duration(res.ProfilingEndNs - res.ProfilingStartNs)
	b.ReportMetric(float64(ok)/wall.Seconds(), "req/s")
	b.ReportMetric(10000, "goal-req/s")
	b.ReportMetric(float64(res.ClientCPU.Microseconds())/float64(ok), "client-us/req")
	b.ReportMetric(float64(cfg.Requests-ok), "errors")
}

func BenchmarkOpenLoopLateness1000(b *testing.B) { benchLateness(b, 1000, 3000, 100) }

func BenchmarkOpenLoopLateness10000(b *testing.B) { benchLateness(b, 10000, 30000, 1000) }

// BenchmarkOpenLoopLatenessStream1000 is the 1,000 req/s open loop with streamed answers of 16
// tokens: the same pacer and the same goal, while the client also reads every SSE event.
func BenchmarkOpenLoopLatenessStream1000(b *testing.B) {
	ep := launchtest.Start(b, launchtest.MockBundle(b, 0), launch.WithArgs("--max-batch", "256", "--queue-depth", "8192"))
	runLateness(b, load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, Stream: true, RequestRate: 1000,
		Prompts: []load.Prompt{{Prompt: "benchmark"}}, OutputTokens: 16, Warmup: 64, Requests: max(3000, b.N)}, 100)
}

// benchLateness runs a Poisson open loop (AIPerf's default arrivals) of non-streaming
// requests at rate and reports the lateness of request starts against their schedule
// beside its goal, and the client's CPU over the measured phase as a share of one core:
// well under 100 % means no core is burnt spinning for precision.
func benchLateness(b *testing.B, rate float64, minRequests int, goalP99us float64) {
	ep := launchtest.Start(b, launchtest.MockBundle(b, 0), launch.WithArgs("--max-batch", "256", "--queue-depth", "8192"))
	cfg := load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, RequestRate: rate,
		Prompts: []load.Prompt{{Prompt: "benchmark"}}, OutputTokens: 1, Warmup: 64, MaxConcurrency: 0}
	cfg.Requests = max(minRequests, b.N)
	runLateness(b, cfg, goalP99us)
}

// runLateness runs cfg and reports the lateness of its measured requests against their
// schedule beside goalP99us, the client's CPU over the measured phase as a share of one core
// (well under 100 % means no core is burnt spinning for precision), the request rate, the
// failed requests, and the class the pacer's thread ran in.
func runLateness(b *testing.B, cfg load.Config, goalP99us float64) {
	b.ResetTimer()
	res, err := load.Run(context.Background(), cfg)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	var late []float64
	errs := 0
	kinds := map[string]int{}
	for _, r := range res.Records {
		if r.Phase == "profiling" {
			late = append(late, float64(r.LatenessNs)/1e3)
			if r.Error != nil {
				errs++
				kinds[fmt.Sprintf("%d %s: %.80s", r.Error.Code, r.Error.Type, r.Error.Message)]++
			}
		}
	}
	if len(late) == 0 {
		b.Fatal("no measured request recorded")
	}
	if errs > 0 {
		b.Logf("%d of %d requests failed: %v", errs, len(late), kinds)
	}
	sort.Float64s(late)
	p := func(q float64) float64 { return late[int(q*float64(len(late)-1))] }
	wall := time.Duration(res.ProfilingEndNs - res.ProfilingStartNs)
	b.ReportMetric(p(0.5), "lateness-p50-us")
	b.ReportMetric(p(0.99), "lateness-p99-us")
	b.ReportMetric(goalP99us, "goal-lateness-p99-us")
	b.ReportMetric(late[len(late)-1], "lateness-max-us")
	b.ReportMetric(100*res.ClientCPU.Seconds()/wall.Seconds(), "client-cpu-%core")
	b.ReportMetric(float64(len(late))/wall.Seconds(), "req/s")
	b.ReportMetric(float64(errs), "errors")
	// The pacer thread's class (see load.Result.Pacer): 2 SCHED_FIFO, 1 nice -20, 0 neither.
	class := 0.0
	switch {
	case strings.Contains(res.Pacer, "thread SCHED_FIFO"):
		class = 2
	case strings.Contains(res.Pacer, "nice -20 ("):
		class = 1
	}
	b.ReportMetric(class, "pacer-class")
}

// BenchmarkFixedScheduleLateness1000 replays a trace (AIPerf's --fixed-schedule over
// single-turn sessions with timestamps, as a mooncake trace is read) whose timestamps are
// Poisson arrivals at 1,000 req/s, and reports the lateness of the sends against the trace
// beside the open loop's goal.
func BenchmarkFixedScheduleLateness1000(b *testing.B) {
	ep := launchtest.Start(b, launchtest.MockBundle(b, 0), launch.WithArgs("--max-batch", "256", "--queue-depth", "8192"))
	const rate = 1000
	n := max(3000, b.N)
	rng := mrand.New(mrand.NewPCG(1, 2))
	sessions := make([]load.Session, n)
	at := 0.0
	for i := range sessions {
		ts := at
		sessions[i] = load.Session{ID: strconv.Itoa(i), Turns: []load.Turn{{Prompt: load.Prompt{Prompt: "benchmark", InputTokens: 1}, TimestampMs: &ts}}}
		at += rng.ExpFloat64() * 1000 / rate
	}
	runLateness(b, load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, Sessions: sessions,
		FixedSchedule: true, OutputTokens: 1, Warmup: 64, Requests: n}, 100)
}

func BenchmarkMemoryPerStream4096(b *testing.B) {
	const streams = 4096
	// 20 ms per token and 2,000 tokens: every stream stays open for the whole measurement.
	ep := launchtest.Start(b, launchtest.MockBundle(b, 20*time.Millisecond),
		launch.WithArgs("--max-batch", "4096", "--queue-depth", "8192"))
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var inflight int
	go func() {
		defer close(done)
		load.Run(ctx, load.Config{BaseURL: ep.BaseURL, Model: ep.Model, Endpoint: client.Completions, Stream: true,
			Concurrency: streams, Requests: streams, Prompts: []load.Prompt{{Prompt: "m"}}, OutputTokens: 2000})
	}()
	// Wait until every stream has its connection open and is receiving tokens.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		inflight = openConns()
		if inflight >= streams {
			break
		}
	}
	time.Sleep(2 * time.Second)
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	cancel()
	<-done
	used := (during.HeapInuse + during.StackInuse) - (before.HeapInuse + before.StackInuse)
	b.ReportMetric(float64(used)/streams/1024, "KiB/stream")
	b.ReportMetric(float64(inflight), "open-conns")
	b.ReportMetric(float64(during.NumGC-before.NumGC), "gcs")
}

// BenchmarkLowRateDistortion measures what an open loop at 10 req/s does to the latency it
// reports, against a closed loop at concurrency 1 on the same server (the 10 req/s
// question): for each it reports the client's HTTP latency p50 and the server's own
// (http_latency_ns of its records, joined by request ID), so that the client's share
// (client minus server) is told apart from the server's slower answers after idle gaps.
func BenchmarkLowRateDistortion(b *testing.B) {
	// 8 tokens at 250 µs per engine step: a request of about 2-3 ms, as gpt2-tiny's.
	ep := launchtest.Start(b, launchtest.MockBundle(b, 250*time.Microsecond))
	point := func(name string, cfg load.Config) {
		cfg.BaseURL, cfg.Model, cfg.Endpoint = ep.BaseURL, ep.Model, client.Completions
		cfg.Prompts, cfg.OutputTokens, cfg.Warmup, cfg.Requests = []load.Prompt{{Prompt: "benchmark"}}, 8, 4, 50
		cfg.RunID = name
		res, err := load.Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		sv, err := records.ReadServer(ep.RecordsPath)
		if err != nil {
			b.Fatal(err)
		}
		server := map[string]int64{}
		for _, s := range sv {
			server[s.RequestID] = s.HTTPLatencyNs
		}
		var cl, sl, diff []float64
		for _, r := range res.Records {
			s, ok := server[r.RequestID]
			if r.Phase != "profiling" || r.Error != nil || !ok {
				continue
			}
			cl = append(cl, float64(r.EndNs)/1e6)
			sl = append(sl, float64(s)/1e6)
			diff = append(diff, float64(r.EndNs-s)/1e6)
		}
		if len(cl) == 0 {
			b.Fatalf("%s: no request joined to a server record", name)
		}
		med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
		b.ReportMetric(med(cl), name+"-client-p50-ms")
		b.ReportMetric(med(sl), name+"-server-p50-ms")
		b.ReportMetric(med(diff), name+"-client-minus-server-p50-ms")
	}
	b.ResetTimer()
	point("closed-c1", load.Config{Concurrency: 1})
	point("open-10rps", load.Config{RequestRate: 10, Arrival: load.ArrivalConstant})
}
