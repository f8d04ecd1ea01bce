// Package metrics turns raw load-run records (qual/records) into the per-request metrics of
// METRICS.md, AIPerf's definitions: TTFT, TTST, request latency, ITL, inter-chunk latency,
// output tokens per second per user, token counts, and our mq_ figures from the server join
// (task wall time, HTTP − task, queue wait; for vision chat the image's tokens and
// preprocessing time, and TTFT split by whether the request carried an image). Run-level statistics (percentiles, throughputs,
// goodput, errors) are computed by reports.Aggregate from these per-request values, so that
// they can be recomputed from profile_export.jsonl alone.
package metrics

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
)

// recordProcessorID names this package in AIPerf's metadata.record_processor_id.
const recordProcessorID = "modelqual/qual/metrics"

// nsToMs converts monotonic nanoseconds to the milliseconds the exports use.
func nsToMs(ns int64) float64 { return float64(ns) / 1e6 }

// PerRequest is the METRICS.md per-request metrics of one successful request. Latencies are
// nanoseconds; Has* say whether a metric is defined for the request.
type PerRequest struct {
	Streaming        bool  // TTFT, TTST, ITL, inter-chunk latency and per-user rate exist only for streams
	TTFTNs           int64 // streaming only
	TTSTNs           int64
	HasTTST          bool    // a stream with at least two content events
	LatencyNs        int64   // last content event (end of the body without one) − request start
	ITLNs            float64 // (latency − TTFT) / (output tokens − 1)
	HasITL           bool    // a stream with output tokens ≥ 2
	InterChunkNs     []int64 // gaps between consecutive content events
	OutputTPSPerUser float64 // 1 / ITL, tokens per second
	HasTPSPerUser    bool    // ITL > 0: every token in one event has no finite per-user rate
	OutputTokens     int     // server usage when given, else the client count
}

// Compute derives the per-request metrics of r. ok is false when r failed or was cancelled:
// a failed request has no latency metrics (errors are never averaged into latency).
//
// As in AIPerf, TTFT, TTST, ITL, inter-chunk latency and output TPS per user are streaming
// metrics: a non-streaming request has request latency and token counts only. A stream
// without any content event (zero output tokens) has no TTFT; its latency is the end of the
// HTTP body, the only response timestamp it has. ITL is kept when it is zero (several
// events stamped by one read: they arrived together as far as the client can tell); only the
// per-user rate, 1/ITL, is then left out.
func Compute(r *records.Request) (m PerRequest, ok bool) {
	if r.Failed() {
		return PerRequest{}, false
	}
	m.Streaming = r.Stream
	m.OutputTokens = r.OutputTokens()
	chunks := r.ChunkNs
	if len(chunks) == 0 {
		m.LatencyNs = r.EndNs
		return m, true
	}
	m.LatencyNs = chunks[len(chunks)-1]
	if !r.Stream {
		return m, true
	}
	m.TTFTNs = chunks[0]
	if len(chunks) >= 2 {
		m.HasTTST = true
		m.TTSTNs = chunks[1] - chunks[0]
		m.InterChunkNs = make([]int64, len(chunks)-1)
		for i := 1; i < len(chunks); i++ {
			m.InterChunkNs[i-1] = chunks[i] - chunks[i-1]
		}
	}
	if m.OutputTokens >= 2 {
		m.HasITL = true
		m.ITLNs = float64(m.LatencyNs-m.TTFTNs) / float64(m.OutputTokens-1)
		if m.ITLNs > 0 {
			m.HasTPSPerUser = true
			m.OutputTPSPerUser = 1e9 / m.ITLNs
		}
	}
	return m, true
}

// Options tunes Export.
type Options struct {
	// ScheduleLateness adds mq_schedule_lateness (open-loop runs only; closed-loop requests
	// have no schedule).
	ScheduleLateness bool
	// SplitTTFTByImage adds mq_ttft_with_image or mq_ttft_without_image to every streamed
	// request joined with its server record, by whether the server processed an image for it
	// (its record's vision object). Export sets it when any joined request carried an image,
	// so a run that mixes image and text-only requests reports both TTFTs side by side.
	SplitTTFTByImage bool
}

// Export converts a run's client records to profile_export.jsonl records, in order. When
// joined is non-nil (the result of records.Join for these requests) the mq_ server figures
// are added; a request missing from joined simply lacks them.
func Export(reqs []records.Request, joined *records.Joined, opt Options) []reports.ExportRecord {
	var byID map[string]*records.JoinedRequest
	if joined != nil {
		byID = make(map[string]*records.JoinedRequest, len(joined.Requests))
		for i := range joined.Requests {
			byID[joined.Requests[i].RequestID] = &joined.Requests[i]
		}
	}
	if joined != nil && !opt.SplitTTFTByImage {
		for i := range joined.Requests {
			if joined.Requests[i].Server.Vision != nil {
				opt.SplitTTFTByImage = true
				break
			}
		}
	}
	out := make([]reports.ExportRecord, len(reqs))
	for i := range reqs {
		out[i] = ExportRecord(&reqs[i], byID[reqs[i].RequestID], opt)
	}
	return out
}

// ExportRecord converts one client record (and its server record when sv is non-nil).
func ExportRecord(r *records.Request, sv *records.JoinedRequest, opt Options) reports.ExportRecord {
	md := reports.RecordMetadata{
		SessionNum:        r.SessionNum,
		XRequestID:        r.RequestID,
		XCorrelationID:    r.RequestID,
		RequestStartNs:    r.StartUnixNs,
		RequestAckNs:      r.StartUnixNs + r.AckNs,
		RequestEndNs:      r.StartUnixNs + r.EndNs,
		WorkerID:          r.WorkerID,
		RecordProcessorID: recordProcessorID,
		BenchmarkPhase:    r.Phase,
		WasCancelled:      r.Cancelled,
		TurnIndex:         r.TurnIndex,
	}
	if r.ConversationID != "" {
		c := r.ConversationID
		md.ConversationID = &c
	}
	if r.Cancelled {
		t := r.StartUnixNs + r.CancelNs
		md.CancellationTimeNs = &t
	}
	rec := reports.ExportRecord{Metadata: md, Metrics: map[string]reports.MetricValue{}}
	set := func(tag string, v float64) {
		m, _ := reports.LookupMetric(tag)
		rec.Metrics[tag] = reports.Scalar(v, m.Unit)
	}
	if r.InputTokensServer > 0 {
		set(reports.TagInputLengthServer, float64(r.InputTokensServer))
	}
	if opt.ScheduleLateness {
		set(reports.TagScheduleLateness, nsToMs(r.LatenessNs))
	}

	if r.Failed() {
		// AIPerf's error records carry their input length as error_isl.
		set(reports.TagErrorISL, float64(r.InputTokens))
		rec.Error = exportError(r)
		return rec
	}
	set(reports.TagInputSequenceLength, float64(r.InputTokens))
	m, _ := Compute(r)
	if m.Streaming && len(r.ChunkNs) > 0 {
		set(reports.TagTTFT, nsToMs(m.TTFTNs))
	}
	if m.HasTTST {
		set(reports.TagTTST, nsToMs(m.TTSTNs))
	}
	set(reports.TagRequestLatency, nsToMs(m.LatencyNs))
	if m.HasITL {
		set(reports.TagITL, m.ITLNs/1e6)
	}
	if m.HasTPSPerUser {
		set(reports.TagOutputTPSPerUser, m.OutputTPSPerUser)
	}
	if m.InterChunkNs != nil {
		icl := make([]float64, len(m.InterChunkNs))
		for i, g := range m.InterChunkNs {
			icl[i] = nsToMs(g)
		}
		rec.Metrics[reports.TagInterChunkLatency] = reports.List(icl, "ms")
	}
	// No reasoning tokens are told apart, so the output token count equals the output
	// sequence length (AIPerf: OSL = output_token_count + reasoning_token_count).
	set(reports.TagOutputSequenceLength, float64(m.OutputTokens))
	set(reports.TagOutputTokenCount, float64(m.OutputTokens))
	if r.OutputTokensClient > 0 {
		set(reports.TagOutputLengthClient, float64(r.OutputTokensClient))
	}
	set(reports.TagHTTPLatency, nsToMs(r.EndNs))
	if r.ResponseBytes > 0 {
		set(reports.TagResponseBytes, float64(r.ResponseBytes))
	}
	if sv != nil {
		set(reports.TagServerHTTPLatency, nsToMs(sv.Server.HTTPLatencyNs))
		if sv.Server.TTFTNs > 0 { // servers before ttft_ns, and requests that wrote no content
			set(reports.TagServerTTFT, nsToMs(sv.Server.TTFTNs))
		}
		set(reports.TagQueueWait, nsToMs(sv.QueueWaitNs))
		// Task timings exist only when a worker ran the request.
		if sv.TaskWallNs > 0 {
			set(reports.TagTaskWallTime, nsToMs(sv.TaskWallNs))
			set(reports.TagHTTPMinusTask, nsToMs(sv.HTTPMinusTaskNs))
		}
		if sv.Server.TaskTTFTNs > 0 {
			set(reports.TagTaskTTFT, nsToMs(sv.Server.TaskTTFTNs))
		}
		// Vision chat: what the request's images cost, from the server's record of it.
		if tokens, prep, ok := imageCost(&sv.Server); ok {
			set(reports.TagImageTokens, float64(tokens))
			set(reports.TagImagePreprocess, nsToMs(prep))
			// The engine's vision tower on them (vision_ns: cpu wall time, cuda device time).
			if sv.Server.VisionNs > 0 {
				set(reports.TagImageVisionTower, nsToMs(sv.Server.VisionNs))
			}
		}
		if opt.SplitTTFTByImage && m.Streaming && len(r.ChunkNs) > 0 {
			if sv.Server.Vision != nil {
				set(reports.TagTTFTWithImage, nsToMs(m.TTFTNs))
			} else {
				set(reports.TagTTFTWithoutImage, nsToMs(m.TTFTNs))
			}
		}
	}
	return rec
}

// imageCost is a vision chat request's image tokens and preprocessing time over all its images:
// the record's vision_images when it lists several (--max-images-per-request), else its one
// vision object. ok is false for a request without an image.
func imageCost(r *records.Server) (tokens int, preprocessNs int64, ok bool) {
	if len(r.VisionImages) > 0 {
		for _, v := range r.VisionImages {
			tokens += v.ImageTokens
			preprocessNs += v.PreprocessNs
		}
		return tokens, preprocessNs, true
	}
	if r.Vision == nil {
		return 0, 0, false
	}
	return r.Vision.ImageTokens, r.Vision.PreprocessNs, true
}

// exportError maps a failed record to AIPerf's error object; a cancellation is code 499
// whatever else went wrong, as in AIPerf.
func exportError(r *records.Request) *reports.ErrorDetails {
	e := &reports.ErrorDetails{Code: r.HTTPStatus, Type: "error"}
	if r.Error != nil {
		e.Code, e.Type, e.Message = r.Error.Code, r.Error.Type, r.Error.Message
	}
	if r.Cancelled {
		e.Code = records.CancelledCode
		if r.Error == nil {
			e.Type = "cancelled"
			e.Message = fmt.Sprintf("cancelled by the client %s after the request started",
				time.Duration(r.CancelNs))
		}
	}
	return e
}

// sloAliases maps the short names users type in --slo to metric tags.
var sloAliases = map[string]string{
	"ttft":       reports.TagTTFT,
	"ttst":       reports.TagTTST,
	"itl":        reports.TagITL,
	"e2el":       reports.TagRequestLatency,
	"latency":    reports.TagRequestLatency,
	"tps":        reports.TagOutputTPSPerUser,
	"tpot":       reports.TagITL,
	"queue_wait": reports.TagQueueWait,
}

// ParseSLOs parses a comma-separated SLO list such as
// "ttft:200ms,request_latency:1s,output_token_throughput_per_user:50". Names are metric tags
// or the aliases ttft, ttst, itl, tpot, e2el, latency, tps, queue_wait. A latency threshold
// is a Go duration ("200ms", "1.5s") or a bare number of milliseconds; other metrics take a
// bare number in their unit. An empty spec gives no SLOs.
func ParseSLOs(spec string) ([]reports.SLO, error) {
	var out []reports.SLO
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("slo %q: want NAME:THRESHOLD, e.g. ttft:200ms", item)
		}
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		tag := name
		if t, ok := sloAliases[name]; ok {
			tag = t
		}
		m, ok := reports.LookupMetric(tag)
		if !ok || !m.PerRequest {
			return nil, fmt.Errorf("slo %q: %q is not a per-request metric; use one of ttft, ttst, itl, e2el, tps or a tag such as request_latency", item, name)
		}
		if seen[tag] {
			return nil, fmt.Errorf("slo %q: %s given twice", item, tag)
		}
		seen[tag] = true
		var th float64
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			th = f
		} else if m.Unit == "ms" {
			d, err := time.ParseDuration(val)
			if err != nil {
				return nil, fmt.Errorf("slo %q: threshold %q is neither a number of ms nor a duration like 200ms", item, val)
			}
			th = float64(d) / 1e6
		} else {
			return nil, fmt.Errorf("slo %q: threshold %q must be a number in %s", item, val, m.Unit)
		}
		if th < 0 {
			return nil, fmt.Errorf("slo %q: threshold must not be negative", item)
		}
		out = append(out, reports.SLO{Tag: tag, Threshold: th, Unit: m.Unit, LargerIsBetter: m.LargerIsBetter, Spec: item})
	}
	return out, nil
}

// HasSchedule reports whether any request of reqs was scheduled open loop, i.e. whether
// Options.ScheduleLateness makes sense.
func HasSchedule(reqs []records.Request) bool {
	for i := range reqs {
		if reqs[i].ScheduledNs != 0 || reqs[i].LatenessNs != 0 {
			return true
		}
	}
	return false
}

// BuildRun assembles the reports.Run of one load run (one sweep point) from its client
// records, both phases included, and their join with the server records (nil when the
// server wrote none, e.g. an external endpoint). The caller fills the opaque sections
// (InputConfig, Environment, Provenance, GPUTelemetry), Cost and Sweep, then calls
// reports.WriteRun. Schedule lateness is exported when the run was open loop.
func BuildRun(name string, reqs []records.Request, joined *records.Joined, slos []reports.SLO) *reports.Run {
	return &reports.Run{
		Name:    name,
		Records: Export(reqs, joined, Options{ScheduleLateness: HasSchedule(reqs)}),
		SLOs:    slos,
	}
}
