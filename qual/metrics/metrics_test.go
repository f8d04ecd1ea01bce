package metrics

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
	"github.com/modelqual/modelqual/server/record"
)

const ms = int64(1_000_000) // nanoseconds per millisecond

// t0 is an arbitrary wall-clock epoch (ns) for the hand-made run.
const t0 = int64(1_800_000_000_000_000_000)

// handRun is a hand-made profiling run with values simple enough to compute by hand:
//
//	A: streaming, start t0, content at 10, 15, 25, 40 ms, 4 output tokens (usage)
//	   TTFT 10, TTST 5, latency 40, ITL (40−10)/(4−1) = 10 ms, 100 tok/s/user, ICL [5 10 15]
//	B: non-streaming, start t0+30ms, one token at 20 ms: latency 20; no TTFT, TTST, ITL
//	   (streaming metrics, as in AIPerf)
//	C: HTTP 500 at t0+5ms, ended at 8 ms         (error: no latency metrics)
//	D: cancelled at 12 ms after start t0+1ms     (error code 499)
//	W: warmup, start t0−1s, latency 999 ms        (must not change any profiling figure)
//
// Duration = max(start+latency) − min(start) = (t0+30+20 ms) − t0 = 50 ms = 0.05 s.
func handRun() []records.Request {
	return []records.Request{
		{RequestID: "A", Phase: "profiling", SessionNum: 0, Stream: true, StartUnixNs: t0,
			AckNs: 2 * ms, EndNs: 41 * ms, ChunkNs: []int64{10 * ms, 15 * ms, 25 * ms, 40 * ms},
			HTTPStatus: 200, InputTokens: 7, InputTokensServer: 7, OutputTokensServer: 4, OutputTokensClient: 4, ResponseBytes: 400},
		{RequestID: "B", Phase: "profiling", SessionNum: 1, StartUnixNs: t0 + 30*ms,
			AckNs: 20 * ms, EndNs: 20 * ms, ChunkNs: []int64{20 * ms},
			HTTPStatus: 200, InputTokens: 3, OutputTokensServer: 1, OutputTokensClient: 1, ResponseBytes: 100},
		{RequestID: "C", Phase: "profiling", SessionNum: 2, StartUnixNs: t0 + 5*ms, EndNs: 3 * ms,
			HTTPStatus: 500, Error: &records.Error{Code: 500, Type: "server_error", Message: "boom"}},
		{RequestID: "D", Phase: "profiling", SessionNum: 3, Stream: true, StartUnixNs: t0 + 1*ms, EndNs: 12 * ms,
			ChunkNs: []int64{9 * ms}, Cancelled: true, CancelNs: 12 * ms},
		{RequestID: "W", Phase: "warmup", SessionNum: 4, Stream: true, StartUnixNs: t0 - 1000*ms,
			EndNs: 999 * ms, ChunkNs: []int64{500 * ms, 999 * ms}, HTTPStatus: 200, OutputTokensServer: 2},
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestComputeHandMade(t *testing.T) {
	reqs := handRun()
	a, ok := Compute(&reqs[0])
	if !ok {
		t.Fatal("A reported failed")
	}
	want := PerRequest{Streaming: true, HasTPSPerUser: true, TTFTNs: 10 * ms, TTSTNs: 5 * ms, HasTTST: true, LatencyNs: 40 * ms,
		ITLNs: float64(10 * ms), HasITL: true, InterChunkNs: []int64{5 * ms, 10 * ms, 15 * ms},
		OutputTPSPerUser: 100, OutputTokens: 4}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("A = %+v\nwant %+v", a, want)
	}
	b, _ := Compute(&reqs[1])
	if b.Streaming || b.HasITL || b.HasTTST || b.TTFTNs != 0 || b.LatencyNs != 20*ms || b.OutputTokens != 1 {
		t.Errorf("B (non-streaming) = %+v; want latency 20ms and no TTFT/ITL/TTST", b)
	}
	for _, i := range []int{2, 3} {
		if _, ok := Compute(&reqs[i]); ok {
			t.Errorf("%s: failed request produced latency metrics", reqs[i].RequestID)
		}
	}
}

func TestExportAndAggregateHandMade(t *testing.T) {
	slos, err := ParseSLOs("ttft:15ms,request_latency:45")
	if err != nil {
		t.Fatal(err)
	}
	recs := Export(handRun(), nil, Options{})
	ps := reports.Aggregate(recs, reports.PhaseProfiling, slos, nil)

	check := func(tag, stat string, want float64) {
		t.Helper()
		got, ok := ps.Stat(tag, stat)
		if !ok || !near(got, want) {
			t.Errorf("%s.%s = %v (present %v), want %v", tag, stat, got, ok, want)
		}
	}
	// Only A and B are valid, and only A streams: TTFT {10}.
	check(reports.TagTTFT, "avg", 10)
	check(reports.TagTTFT, "p50", 10)
	check(reports.TagTTFT, "std", 0)
	// latency {40, 20}: p90 with h = 0.9·1 = 0.9 → 20 + 0.9·20 = 38.
	check(reports.TagRequestLatency, "p90", 38)
	check(reports.TagITL, "avg", 10)               // only A has an ITL
	check(reports.TagTTST, "max", 5)               // only A has a second chunk
	check(reports.TagInterChunkLatency, "avg", 10) // pooled gaps {5, 10, 15}
	check(reports.TagOutputTPSPerUser, "p50", 100)
	check(reports.TagOutputSequenceLength, "avg", 2.5) // {4, 1}
	check(reports.TagBenchmarkDuration, "avg", 0.05)
	check(reports.TagOutputTokenThroughput, "avg", 100) // 5 tokens / 0.05 s
	check(reports.TagRequestThroughput, "avg", 40)      // 2 valid / 0.05 s
	// Good: A (TTFT 10 ≤ 15, latency 40 ≤ 45); B has no TTFT, so is not proven good → 1 / 0.05 s.
	check(reports.TagGoodput, "avg", 20)
	check(reports.TagGoodRequestCount, "avg", 1)
	check(reports.TagRequestCount, "avg", 2)
	check(reports.TagErrorRequestCount, "avg", 2)
	check(reports.TagCancelledRequestCount, "avg", 1)
	check(reports.TagResponseBytesPerToken, "avg", 100) // 500 bytes / 5 tokens
	// AIPerf's totals and bounds: output tokens {4, 1}, input {7, 3}; C and D failed with
	// input lengths 0 (error_isl); first start t0 (A), last response t0+30+20 ms (B).
	check(reports.TagOutputTokenCount, "avg", 2.5)
	check(reports.TagTotalOutputTokens, "avg", 5)
	check(reports.TagTotalOSL, "avg", 5)
	check(reports.TagTotalISL, "avg", 10)
	check(reports.TagErrorISL, "max", 0)
	check(reports.TagTotalErrorISL, "avg", 0)
	check(reports.TagMinRequestTimestamp, "avg", float64(t0))
	check(reports.TagMaxResponseTimestamp, "avg", float64(t0+50*ms))
	if ps.Requests != 4 {
		t.Errorf("profiling requests = %d, want 4", ps.Requests)
	}
	codes := map[int]int{}
	for _, g := range ps.Errors {
		codes[g.Details.Code] += g.Count
	}
	if !reflect.DeepEqual(codes, map[int]int{500: 1, 499: 1}) {
		t.Errorf("errors by code = %v, want 500:1 499:1", codes)
	}
	// The export's timestamps are the client record's made absolute: the send, the response's
	// headers, the end of the body (AIPerf's request_start_ns, request_ack_ns, request_end_ns).
	for i, c := range handRun() {
		md := recs[i].Metadata
		if md.RequestStartNs != c.StartUnixNs || md.RequestAckNs != c.StartUnixNs+c.AckNs || md.RequestEndNs != c.StartUnixNs+c.EndNs {
			t.Errorf("%s: exported start/ack/end %d/%d/%d, want %d/%d/%d", c.RequestID, md.RequestStartNs, md.RequestAckNs, md.RequestEndNs,
				c.StartUnixNs, c.StartUnixNs+c.AckNs, c.StartUnixNs+c.EndNs)
		}
	}
	if recs[3].Error == nil || recs[3].Error.Code != 499 || !recs[3].Metadata.WasCancelled ||
		*recs[3].Metadata.CancellationTimeNs != t0+13*ms {
		t.Errorf("cancelled export record = %+v %+v", recs[3].Error, recs[3].Metadata)
	}
	if _, ok := recs[2].Metrics[reports.TagRequestLatency]; ok {
		t.Error("failed request carries a request latency")
	}
}

// TestWarmupDoesNotChangeProfiling is what the gate "warmup mixed into measurement" relies
// on: adding warmup records leaves every profiling statistic unchanged, while relabelling the
// same records as profiling does change them.
func TestWarmupDoesNotChangeProfiling(t *testing.T) {
	all := Export(handRun(), nil, Options{})
	var noWarmup []reports.ExportRecord
	for _, r := range all {
		if r.Metadata.BenchmarkPhase != reports.PhaseWarmup {
			noWarmup = append(noWarmup, r)
		}
	}
	with := reports.Aggregate(all, reports.PhaseProfiling, nil, nil)
	without := reports.Aggregate(noWarmup, reports.PhaseProfiling, nil, nil)
	if !reflect.DeepEqual(with, without) {
		t.Errorf("warmup records changed profiling statistics:\nwith    %+v\nwithout %+v", with, without)
	}
	warm := reports.Aggregate(all, reports.PhaseWarmup, nil, nil)
	if v, _ := warm.Stat(reports.TagRequestLatency, "max"); v != 999 {
		t.Errorf("warmup latency max = %v, want 999", v)
	}
	mixed := append([]reports.ExportRecord(nil), all...)
	for i := range mixed {
		mixed[i].Metadata.BenchmarkPhase = reports.PhaseProfiling
	}
	m := reports.Aggregate(mixed, reports.PhaseProfiling, nil, nil)
	if v, _ := m.Stat(reports.TagRequestLatency, "max"); v != 999 {
		t.Errorf("mixing warmup in should raise the max latency to 999 ms, got %v", v)
	}
}

func TestExportJoinedServerFigures(t *testing.T) {
	reqs := handRun()[:2]
	sv := []records.Server{
		{RequestID: "A", Route: "/v1/completions", Status: 200, HTTPLatencyNs: 39 * ms, TTFTNs: 7 * ms, QueueWaitNs: 1 * ms, TaskWallNs: 30 * ms, TaskTTFTNs: 6 * ms},
		{RequestID: "B", Route: "/v1/completions", Status: 200, HTTPLatencyNs: 19 * ms},
	}
	j, err := records.Join(reqs, sv)
	if err != nil {
		t.Fatal(err)
	}
	recs := Export(reqs, j, Options{})
	a := recs[0]
	// A: client HTTP latency is EndNs = 41 ms; task 30 ms → HTTP − task = 11 ms.
	for tag, want := range map[string]float64{reports.TagTaskWallTime: 30, reports.TagHTTPMinusTask: 11,
		reports.TagQueueWait: 1, reports.TagTaskTTFT: 6, reports.TagHTTPLatency: 41, reports.TagServerHTTPLatency: 39,
		reports.TagServerTTFT: 7} {
		if v, ok := a.Value(tag); !ok || v != want {
			t.Errorf("A %s = %v (present %v), want %v", tag, v, ok, want)
		}
	}
	if _, ok := recs[1].Value(reports.TagTaskWallTime); ok {
		t.Error("B never reached a worker (task_wall_ns 0) but has mq_task_wall_time")
	}
	if _, ok := recs[1].Value(reports.TagServerTTFT); ok {
		t.Error("B's server wrote no ttft_ns (an older server) but it has mq_server_ttft")
	}
}

// TestExportImageFigures: a run mixing a streamed request with an image (the server's record
// has a vision object) and a streamed text-only one exports the image's tokens and
// preprocessing time and its vision tower time (vision_ns) for the first, and splits TTFT into with- and without-image; the
// aggregate then reports both TTFTs in one run. A text-only run gets no split.
func TestExportImageFigures(t *testing.T) {
	reqs := handRun()[:1]
	b := reqs[0]
	b.RequestID, b.StartUnixNs, b.ChunkNs = "B", t0+50*ms, []int64{4 * ms, 9 * ms}
	reqs = append(reqs, b)
	sv := []records.Server{
		{RequestID: "A", Route: "/v1/chat/completions", Status: 200, HTTPLatencyNs: 39 * ms, VisionNs: 2 * ms,
			Vision: &record.VisionInput{ImageTokens: 54, PreprocessNs: 3 * ms}},
		{RequestID: "B", Route: "/v1/chat/completions", Status: 200, HTTPLatencyNs: 8 * ms},
	}
	j, err := records.Join(reqs, sv)
	if err != nil {
		t.Fatal(err)
	}
	recs := Export(reqs, j, Options{})
	for tag, want := range map[string]float64{reports.TagImageTokens: 54, reports.TagImagePreprocess: 3, reports.TagImageVisionTower: 2, reports.TagTTFTWithImage: 10} {
		if v, ok := recs[0].Value(tag); !ok || v != want {
			t.Errorf("A %s = %v (present %v), want %v", tag, v, ok, want)
		}
	}
	if _, ok := recs[0].Value(reports.TagTTFTWithoutImage); ok {
		t.Error("A carried an image but has mq_ttft_without_image")
	}
	if v, ok := recs[1].Value(reports.TagTTFTWithoutImage); !ok || v != 4 {
		t.Errorf("B mq_ttft_without_image = %v (present %v), want 4", v, ok)
	}
	for _, tag := range []string{reports.TagImageTokens, reports.TagImagePreprocess, reports.TagImageVisionTower, reports.TagTTFTWithImage} {
		if _, ok := recs[1].Value(tag); ok {
			t.Errorf("text-only B has %s", tag)
		}
	}
	ps := reports.Aggregate(recs, "profiling", nil, nil)
	for tag, want := range map[string]float64{reports.TagTTFTWithImage: 10, reports.TagTTFTWithoutImage: 4, reports.TagTTFT: 7, reports.TagImageVisionTower: 2} {
		if v, ok := ps.Stat(tag, "avg"); !ok || v != want {
			t.Errorf("aggregate %s avg = %v (present %v), want %v", tag, v, ok, want)
		}
	}
	sv[0].Vision = nil
	if j, err = records.Join(reqs, sv); err != nil {
		t.Fatal(err)
	}
	for _, r := range Export(reqs, j, Options{}) {
		if _, ok := r.Value(reports.TagTTFTWithoutImage); ok {
			t.Error("a run without images got mq_ttft_without_image")
		}
	}
}

func TestParseSLOs(t *testing.T) {
	got, err := ParseSLOs("ttft:200ms, request_latency:1s,output_token_throughput_per_user:50")
	if err != nil {
		t.Fatal(err)
	}
	want := []reports.SLO{
		{Tag: reports.TagTTFT, Threshold: 200, Unit: "ms", Spec: "ttft:200ms"},
		{Tag: reports.TagRequestLatency, Threshold: 1000, Unit: "ms", Spec: "request_latency:1s"},
		{Tag: reports.TagOutputTPSPerUser, Threshold: 50, Unit: "tokens/sec/user", LargerIsBetter: true, Spec: "output_token_throughput_per_user:50"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseSLOs = %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"ttft", "nosuch:1", "ttft:fast", "tps:10ms", "ttft:1ms,ttft:2ms", "request_throughput:5"} {
		if _, err := ParseSLOs(bad); err == nil {
			t.Errorf("ParseSLOs(%q) accepted", bad)
		} else if !strings.Contains(err.Error(), "slo") {
			t.Errorf("ParseSLOs(%q) error does not say slo: %v", bad, err)
		}
	}
	if s, err := ParseSLOs(""); err != nil || s != nil {
		t.Errorf("empty spec = %v, %v", s, err)
	}
}

func TestBuildRunOpenLoopLateness(t *testing.T) {
	reqs := handRun()
	if r := BuildRun("closed", reqs, nil, nil); len(r.Records) != 5 {
		t.Fatalf("BuildRun kept %d records, want 5", len(r.Records))
	} else if _, ok := r.Records[0].Value(reports.TagScheduleLateness); ok {
		t.Error("closed-loop run exports schedule lateness")
	}
	reqs[1].ScheduledNs, reqs[1].LatenessNs = 30*ms, 250_000 // 0.25 ms late
	r := BuildRun("open", reqs, nil, nil)
	if v, ok := r.Records[1].Value(reports.TagScheduleLateness); !ok || v != 0.25 {
		t.Errorf("lateness = %v (present %v), want 0.25 ms", v, ok)
	}
}

// TestITLWhenEventsShareARead: a stream whose events were stamped by one read (they arrived
// together) keeps its ITL, 0 ms, rather than dropping it; only 1/ITL is left out.
func TestITLWhenEventsShareARead(t *testing.T) {
	r := records.Request{RequestID: "S", Phase: "profiling", Stream: true, StartUnixNs: t0,
		EndNs: 12 * ms, ChunkNs: []int64{10 * ms, 10 * ms, 10 * ms}, HTTPStatus: 200, OutputTokensServer: 3}
	rec := ExportRecord(&r, nil, Options{})
	if v, ok := rec.Value(reports.TagITL); !ok || v != 0 {
		t.Errorf("inter_token_latency = %v (present %v), want 0", v, ok)
	}
	if _, ok := rec.Value(reports.TagOutputTPSPerUser); ok {
		t.Error("output_token_throughput_per_user written for ITL 0 (infinite)")
	}
	// Non-streaming: no streaming metric at all.
	r.Stream = false
	rec = ExportRecord(&r, nil, Options{})
	for _, tag := range []string{reports.TagTTFT, reports.TagTTST, reports.TagITL, reports.TagInterChunkLatency, reports.TagOutputTPSPerUser} {
		if _, ok := rec.Metrics[tag]; ok {
			t.Errorf("non-streaming record has %s", tag)
		}
	}
	if v, _ := rec.Value(reports.TagRequestLatency); v != 10 {
		t.Errorf("non-streaming request_latency = %v, want 10 (its one content event)", v)
	}
}

// TestExportImageFiguresSeveralImages: a request whose record lists two images (vision_images,
// --max-images-per-request 2) exports the tokens and preprocessing time of both, not of the
// first alone (its vision object).
func TestExportImageFiguresSeveralImages(t *testing.T) {
	reqs := handRun()[:1]
	first := record.VisionInput{ImageTokens: 54, PreprocessNs: 3 * ms}
	second := record.VisionInput{ImageTokens: 12, PreprocessNs: 2 * ms}
	sv := []records.Server{{RequestID: "A", Route: "/v1/chat/completions", Status: 200, HTTPLatencyNs: 39 * ms,
		Vision: &first, VisionImages: []record.VisionInput{first, second}}}
	j, err := records.Join(reqs, sv)
	if err != nil {
		t.Fatal(err)
	}
	recs := Export(reqs, j, Options{})
	for tag, want := range map[string]float64{reports.TagImageTokens: 66, reports.TagImagePreprocess: 5} {
		if v, ok := recs[0].Value(tag); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v (both images)", tag, v, ok, want)
		}
	}
}
