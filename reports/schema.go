// Package reports defines the run-artifact schema of modelqual and renders it: the
// AIPerf-compatible exports (profile_export.jsonl, profile_export_aiperf.json and .csv, see
// METRICS.md), summary.json, summary.md, PNG plots, compare and merge.
//
// Every run-level statistic is computed by Aggregate from the per-request export records, so
// anything written here can be recomputed from profile_export.jsonl alone (ReadRun); compare
// and merge rely on that. The package imports nothing else of the module: qual/metrics turns
// raw client and server records into ExportRecords and hands them to WriteRun.
package reports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Metric tags: AIPerf's names (METRICS.md), then ours, prefixed mq_.
const (
	TagTTFT                  = "time_to_first_token"
	TagTTST                  = "time_to_second_token"
	TagRequestLatency        = "request_latency"
	TagITL                   = "inter_token_latency"
	TagInterChunkLatency     = "inter_chunk_latency"
	TagOutputTPSPerUser      = "output_token_throughput_per_user"
	TagOutputSequenceLength  = "output_sequence_length"
	TagInputSequenceLength   = "input_sequence_length"
	TagOutputTokenThroughput = "output_token_throughput"
	TagRequestThroughput     = "request_throughput"
	TagRequestCount          = "request_count"
	TagGoodput               = "goodput"
	TagErrorRequestCount     = "error_request_count"
	TagBenchmarkDuration     = "benchmark_duration"
	TagOutputTokenCount      = "output_token_count"     // per request: output tokens, reasoning excluded
	TagErrorISL              = "error_isl"              // per failed request: its input length
	TagTotalOutputTokens     = "total_output_tokens"    // Σ output_token_count over valid requests
	TagTotalOSL              = "total_osl"              // Σ output_sequence_length over valid requests
	TagTotalISL              = "total_isl"              // Σ input_sequence_length over valid requests
	TagTotalErrorISL         = "total_error_isl"        // Σ error_isl over failed requests
	TagMinRequestTimestamp   = "min_request_timestamp"  // epoch ns of the first valid request's start
	TagMaxResponseTimestamp  = "max_response_timestamp" // epoch ns of the last valid request's last response
	TagGoodRequestCount      = "good_request_count"     // requests meeting every SLO
	TagNumImages             = "num_images"             // per request: images it carried or produced
	TagImageThroughput       = "image_throughput"       // per request: num_images / request latency
	TagImageLatency          = "image_latency"          // per request: request latency / num_images

	// Per request, ours.
	TagHTTPLatency        = "mq_http_latency"                  // end of the HTTP body − request start
	TagOutputLengthClient = "mq_output_sequence_length_client" // client tokenizer count
	TagInputLengthServer  = "mq_input_sequence_length_server"  // server usage.prompt_tokens
	TagTaskWallTime       = "mq_task_wall_time"                // native engine task wall time
	TagTaskTTFT           = "mq_task_ttft"                     // native engine time to first token
	TagHTTPMinusTask      = "mq_http_minus_task"               // client HTTP latency − task wall time
	TagQueueWait          = "mq_queue_wait"                    // server queue wait before a worker
	TagServerHTTPLatency  = "mq_server_http_latency"           // HTTP latency measured by the server
	TagServerTTFT         = "mq_server_ttft"                   // arrival to first content written, measured by the server
	TagScheduleLateness   = "mq_schedule_lateness"             // open loop: actual − scheduled start
	TagResponseBytes      = "mq_response_bytes"                // bytes of the response body
	TagImageTokens        = "mq_image_tokens"                  // vision chat: the image's tokens (server record)
	TagImagePreprocess    = "mq_image_preprocess"              // vision chat: image decode + preprocessing, apart from the engine
	TagImageVisionTower   = "mq_image_vision_tower"            // vision chat: the engine's vision tower + projector on the images (within task TTFT)
	TagTTFTWithImage      = "mq_ttft_with_image"               // TTFT of the requests that carried an image
	TagTTFTWithoutImage   = "mq_ttft_without_image"            // TTFT of the text-only requests of a run that has images
	TagPNGBytes           = "mq_png_bytes"                     // image generation: the PNG's bytes as received
	TagPNGEncode          = "mq_png_encode_time"               // image generation: the server's PNG encode, apart from the task

	// Per run, ours.
	TagCancelledRequestCount = "mq_cancelled_request_count"
	TagFrontendUsPerToken    = "mq_frontend_us_per_token"
	TagWorkerUsPerToken      = "mq_worker_us_per_token"
	TagClientUsPerToken      = "mq_client_us_per_token"
	TagResponseBytesPerToken = "mq_response_bytes_per_token"
	TagHeadroom              = "mq_headroom"
)

// Metric describes a metric tag: its CSV header (AIPerf's wording), unit, whether it is a
// per-request distribution or a single run-level value, and which way is better (for SLOs and
// for reading compare ratios).
type Metric struct {
	Tag            string
	Header         string
	Unit           string
	PerRequest     bool // a distribution over requests; false: one value per run (avg only)
	LargerIsBetter bool
}

// Metrics lists every known tag in report order.
var Metrics = []Metric{
	{TagTTFT, "Time to First Token", "ms", true, false},
	{TagTTST, "Time to Second Token", "ms", true, false},
	{TagRequestLatency, "Request Latency", "ms", true, false},
	{TagITL, "Inter Token Latency", "ms", true, false},
	{TagInterChunkLatency, "Inter Chunk Latency", "ms", true, false},
	{TagOutputTPSPerUser, "Output Token Throughput Per User", "tokens/sec/user", true, true},
	{TagOutputSequenceLength, "Output Sequence Length", "tokens", true, true},
	{TagOutputTokenCount, "Output Token Count", "tokens", true, true},
	{TagInputSequenceLength, "Input Sequence Length", "tokens", true, true},
	{TagErrorISL, "Error Input Sequence Length", "tokens", true, true},
	{TagHTTPLatency, "MQ HTTP Latency", "ms", true, false},
	{TagOutputLengthClient, "MQ Output Sequence Length (Client Tokenizer)", "tokens", true, true},
	{TagInputLengthServer, "MQ Input Sequence Length (Server)", "tokens", true, true},
	{TagTaskWallTime, "MQ Task Wall Time", "ms", true, false},
	{TagTaskTTFT, "MQ Task Time to First Token", "ms", true, false},
	{TagHTTPMinusTask, "MQ HTTP Minus Task", "ms", true, false},
	{TagQueueWait, "MQ Queue Wait", "ms", true, false},
	{TagServerHTTPLatency, "MQ Server HTTP Latency", "ms", true, false},
	{TagServerTTFT, "MQ Server Time to First Token", "ms", true, false},
	{TagScheduleLateness, "MQ Schedule Lateness", "ms", true, false},
	{TagResponseBytes, "MQ Response Bytes", "bytes", true, false},
	{TagImageTokens, "MQ Image Tokens", "tokens", true, false},
	{TagImagePreprocess, "MQ Image Preprocessing Time", "ms", true, false},
	{TagImageVisionTower, "MQ Image Vision Tower Time", "ms", true, false},
	{TagTTFTWithImage, "MQ Time to First Token With Image", "ms", true, false},
	{TagTTFTWithoutImage, "MQ Time to First Token Without Image", "ms", true, false},
	{TagNumImages, "Number of Images", "images", true, true},
	{TagImageThroughput, "Image Throughput", "images/sec", true, true},
	{TagImageLatency, "Image Latency", "ms/image", true, false},
	{TagPNGBytes, "MQ PNG Bytes", "bytes", true, false},
	{TagPNGEncode, "MQ PNG Encode Time", "ms", true, false},

	{TagOutputTokenThroughput, "Output Token Throughput", "tokens/sec", false, true},
	{TagRequestThroughput, "Request Throughput", "requests/sec", false, true},
	{TagGoodput, "Goodput", "requests/sec", false, true},
	{TagRequestCount, "Request Count", "requests", false, true},
	{TagGoodRequestCount, "Good Request Count", "requests", false, true},
	{TagErrorRequestCount, "Error Request Count", "requests", false, false},
	{TagTotalOutputTokens, "Total Output Tokens", "tokens", false, true},
	{TagTotalOSL, "Total Output Sequence Length", "tokens", false, true},
	{TagTotalISL, "Total Input Sequence Length", "tokens", false, true},
	{TagTotalErrorISL, "Total Error Input Sequence Length", "tokens", false, false},
	{TagMinRequestTimestamp, "Minimum Request Timestamp", "ns", false, false},
	{TagMaxResponseTimestamp, "Maximum Response Timestamp", "ns", false, false},
	{TagCancelledRequestCount, "MQ Cancelled Request Count", "requests", false, false},
	{TagBenchmarkDuration, "Benchmark Duration", "sec", false, false},
	{TagFrontendUsPerToken, "MQ Frontend CPU Per Token", "us/token", false, false},
	{TagWorkerUsPerToken, "MQ Worker CPU Per Token", "us/token", false, false},
	{TagClientUsPerToken, "MQ Client CPU Per Token", "us/token", false, false},
	{TagResponseBytesPerToken, "MQ Response Bytes Per Token", "bytes/token", false, false},
	{TagHeadroom, "MQ Headroom", "ratio", false, true},
}

// integerTags are the metrics whose values are whole numbers (counts, token lengths and
// sums, epoch timestamps): AIPerf writes them, and their min and max, without decimals.
var integerTags = map[string]bool{
	TagOutputSequenceLength: true, TagOutputTokenCount: true, TagInputSequenceLength: true,
	TagErrorISL: true, TagRequestCount: true, TagGoodRequestCount: true, TagErrorRequestCount: true,
	TagTotalOutputTokens: true, TagTotalOSL: true, TagTotalISL: true, TagTotalErrorISL: true,
	TagMinRequestTimestamp: true, TagMaxResponseTimestamp: true, TagCancelledRequestCount: true,
	TagOutputLengthClient: true, TagInputLengthServer: true, TagResponseBytes: true,
	TagImageTokens: true, TagNumImages: true, TagPNGBytes: true,
}

// IntegerMetric reports whether tag's values are whole numbers.
func IntegerMetric(tag string) bool { return integerTags[tag] }

// LookupMetric finds a tag's description.
func LookupMetric(tag string) (Metric, bool) {
	for _, m := range Metrics {
		if m.Tag == tag {
			return m, true
		}
	}
	return Metric{}, false
}

// Phases of a run, as written in metadata.benchmark_phase.
const (
	PhaseWarmup    = "warmup"
	PhaseProfiling = "profiling"
)

// CancelledCode is the error code of a request the client cancelled (AIPerf's convention).
const CancelledCode = 499

// ExportRecord is one line of profile_export.jsonl (AIPerf's MetricRecordInfo).
type ExportRecord struct {
	Metadata RecordMetadata         `json:"metadata"`
	Metrics  map[string]MetricValue `json:"metrics"`
	Error    *ErrorDetails          `json:"error"`
}

// Valid reports whether the request succeeded: only valid requests enter latency statistics.
func (r *ExportRecord) Valid() bool { return r.Error == nil }

// Value returns a scalar metric of the record.
func (r *ExportRecord) Value(tag string) (float64, bool) {
	v, ok := r.Metrics[tag]
	if !ok || v.IsList {
		return 0, false
	}
	return v.Value, true
}

// RecordMetadata is AIPerf's MetricRecordMetadata. Times are epoch nanoseconds (wall clock);
// durations derived from them are only used across machines (merge), never for latencies.
type RecordMetadata struct {
	SessionNum         int     `json:"session_num"`
	XRequestID         string  `json:"x_request_id"`
	XCorrelationID     string  `json:"x_correlation_id"`
	ConversationID     *string `json:"conversation_id"`
	TurnIndex          int     `json:"turn_index"`
	RequestStartNs     int64   `json:"request_start_ns"`
	RequestAckNs       int64   `json:"request_ack_ns"`
	RequestEndNs       int64   `json:"request_end_ns"`
	WorkerID           string  `json:"worker_id"`
	RecordProcessorID  string  `json:"record_processor_id"`
	BenchmarkPhase     string  `json:"benchmark_phase"`
	WasCancelled       bool    `json:"was_cancelled"`
	CancellationTimeNs *int64  `json:"cancellation_time_ns"`
	// ShardID names the machine or run a record came from after `qual report merge`.
	ShardID string `json:"mq_shard_id,omitempty"`
}

// ErrorDetails is AIPerf's error object; Code is the HTTP status, CancelledCode for a
// cancelled request, 0 when no response arrived.
type ErrorDetails struct {
	Code    int    `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// MetricValue is {"value": number | [numbers], "unit": string}. inter_chunk_latency is the
// only list-valued metric.
type MetricValue struct {
	Value  float64
	List   []float64
	IsList bool
	Unit   string
}

// Scalar makes a number-valued MetricValue.
func Scalar(v float64, unit string) MetricValue { return MetricValue{Value: v, Unit: unit} }

// List makes a list-valued MetricValue.
func List(v []float64, unit string) MetricValue {
	if v == nil {
		v = []float64{}
	}
	return MetricValue{List: v, IsList: true, Unit: unit}
}

// MarshalJSON writes {"value": ..., "unit": ...}.
func (m MetricValue) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"value":`)
	if m.IsList {
		b.WriteByte('[')
		for i, v := range m.List {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(formatFloat(v))
		}
		b.WriteByte(']')
	} else {
		b.WriteString(formatFloat(m.Value))
	}
	b.WriteString(`,"unit":`)
	u, _ := json.Marshal(m.Unit)
	b.Write(u)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a number or a list of numbers.
func (m *MetricValue) UnmarshalJSON(data []byte) error {
	var raw struct {
		Value json.RawMessage `json:"value"`
		Unit  string          `json:"unit"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*m = MetricValue{Unit: raw.Unit}
	v := bytes.TrimSpace(raw.Value)
	if len(v) > 0 && v[0] == '[' {
		m.IsList = true
		return json.Unmarshal(v, &m.List)
	}
	if err := json.Unmarshal(v, &m.Value); err != nil {
		return fmt.Errorf("metric value %s: %w", v, err)
	}
	return nil
}

// formatFloat writes the shortest representation that reads back to the same float64, so
// statistics recomputed from the export match exactly. NaN and ±Inf, which JSON lacks, are
// written as null and never produced by this package.
func formatFloat(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "null"
	}
	// Whole numbers (counts, epoch-ns timestamps) as integers, as AIPerf writes them, not
	// in exponent form; the value read back is the same float64.
	if v == math.Trunc(v) && math.Abs(v) < 1e19 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
