package recount

// The metric tags, headers and units of METRICS.md and AIPerf's exports, written out here
// rather than imported, so that a tag renamed or a unit changed in the reporting code shows
// as a mismatch instead of following along.
const (
	tagTTFT             = "time_to_first_token"
	tagTTST             = "time_to_second_token"
	tagLatency          = "request_latency"
	tagITL              = "inter_token_latency"
	tagICL              = "inter_chunk_latency"
	tagTPSUser          = "output_token_throughput_per_user"
	tagOSL              = "output_sequence_length"
	tagOutCount         = "output_token_count"
	tagISL              = "input_sequence_length"
	tagErrISL           = "error_isl"
	tagHTTPLatency      = "mq_http_latency"
	tagOSLClient        = "mq_output_sequence_length_client"
	tagISLServer        = "mq_input_sequence_length_server"
	tagTaskWall         = "mq_task_wall_time"
	tagTaskTTFT         = "mq_task_ttft"
	tagHTTPMinusTask    = "mq_http_minus_task"
	tagQueueWait        = "mq_queue_wait"
	tagServerHTTP       = "mq_server_http_latency"
	tagServerTTFT       = "mq_server_ttft"
	tagLateness         = "mq_schedule_lateness"
	tagRespBytes        = "mq_response_bytes"
	tagImageTokens      = "mq_image_tokens"
	tagImagePreprocess  = "mq_image_preprocess"
	tagImageVision      = "mq_image_vision_tower"
	tagTTFTWithImage    = "mq_ttft_with_image"
	tagTTFTWithoutImage = "mq_ttft_without_image"
	tagNumImages        = "num_images"
	tagImageLatency     = "image_latency"
	tagImageTput        = "image_throughput"
	tagPNGBytes         = "mq_png_bytes"
	tagPNGEncode        = "mq_png_encode_time"

	tagOutTput        = "output_token_throughput"
	tagReqTput        = "request_throughput"
	tagGoodput        = "goodput"
	tagReqCount       = "request_count"
	tagGoodCount      = "good_request_count"
	tagErrCount       = "error_request_count"
	tagTotalOut       = "total_output_tokens"
	tagTotalOSL       = "total_osl"
	tagTotalISL       = "total_isl"
	tagTotalErrISL    = "total_error_isl"
	tagMinStart       = "min_request_timestamp"
	tagMaxEnd         = "max_response_timestamp"
	tagCancelled      = "mq_cancelled_request_count"
	tagDuration       = "benchmark_duration"
	tagFrontendPerTok = "mq_frontend_us_per_token"
	tagWorkerPerTok   = "mq_worker_us_per_token"
	tagClientPerTok   = "mq_client_us_per_token"
	tagBytesPerTok    = "mq_response_bytes_per_token"
	tagHeadroom       = "mq_headroom"
)

// metricInfo is what the exports say of a tag: AIPerf's CSV header and the unit.
type metricInfo struct {
	header, unit string
}

var known = map[string]metricInfo{
	tagTTFT:             {"Time to First Token", "ms"},
	tagTTST:             {"Time to Second Token", "ms"},
	tagLatency:          {"Request Latency", "ms"},
	tagITL:              {"Inter Token Latency", "ms"},
	tagICL:              {"Inter Chunk Latency", "ms"},
	tagTPSUser:          {"Output Token Throughput Per User", "tokens/sec/user"},
	tagOSL:              {"Output Sequence Length", "tokens"},
	tagOutCount:         {"Output Token Count", "tokens"},
	tagISL:              {"Input Sequence Length", "tokens"},
	tagErrISL:           {"Error Input Sequence Length", "tokens"},
	tagHTTPLatency:      {"MQ HTTP Latency", "ms"},
	tagOSLClient:        {"MQ Output Sequence Length (Client Tokenizer)", "tokens"},
	tagISLServer:        {"MQ Input Sequence Length (Server)", "tokens"},
	tagTaskWall:         {"MQ Task Wall Time", "ms"},
	tagTaskTTFT:         {"MQ Task Time to First Token", "ms"},
	tagHTTPMinusTask:    {"MQ HTTP Minus Task", "ms"},
	tagQueueWait:        {"MQ Queue Wait", "ms"},
	tagServerHTTP:       {"MQ Server HTTP Latency", "ms"},
	tagServerTTFT:       {"MQ Server Time to First Token", "ms"},
	tagLateness:         {"MQ Schedule Lateness", "ms"},
	tagRespBytes:        {"MQ Response Bytes", "bytes"},
	tagImageTokens:      {"MQ Image Tokens", "tokens"},
	tagImagePreprocess:  {"MQ Image Preprocessing Time", "ms"},
	tagImageVision:      {"MQ Image Vision Tower Time", "ms"},
	tagTTFTWithImage:    {"MQ Time to First Token With Image", "ms"},
	tagTTFTWithoutImage: {"MQ Time to First Token Without Image", "ms"},
	tagNumImages:        {"Number of Images", "images"},
	tagImageLatency:     {"Image Latency", "ms/image"},
	tagImageTput:        {"Image Throughput", "images/sec"},
	tagPNGBytes:         {"MQ PNG Bytes", "bytes"},
	tagPNGEncode:        {"MQ PNG Encode Time", "ms"},

	tagOutTput:        {"Output Token Throughput", "tokens/sec"},
	tagReqTput:        {"Request Throughput", "requests/sec"},
	tagGoodput:        {"Goodput", "requests/sec"},
	tagReqCount:       {"Request Count", "requests"},
	tagGoodCount:      {"Good Request Count", "requests"},
	tagErrCount:       {"Error Request Count", "requests"},
	tagTotalOut:       {"Total Output Tokens", "tokens"},
	tagTotalOSL:       {"Total Output Sequence Length", "tokens"},
	tagTotalISL:       {"Total Input Sequence Length", "tokens"},
	tagTotalErrISL:    {"Total Error Input Sequence Length", "tokens"},
	tagMinStart:       {"Minimum Request Timestamp", "ns"},
	tagMaxEnd:         {"Maximum Response Timestamp", "ns"},
	tagCancelled:      {"MQ Cancelled Request Count", "requests"},
	tagDuration:       {"Benchmark Duration", "sec"},
	tagFrontendPerTok: {"MQ Frontend CPU Per Token", "us/token"},
	tagWorkerPerTok:   {"MQ Worker CPU Per Token", "us/token"},
	tagClientPerTok:   {"MQ Client CPU Per Token", "us/token"},
	tagBytesPerTok:    {"MQ Response Bytes Per Token", "bytes/token"},
	tagHeadroom:       {"MQ Headroom", "ratio"},
}

// csvLabel is the first column AIPerf's CSV gives a tag: "<Header> (<unit>)", the unit left
// out when it is "requests" or "count".
func csvLabel(tag string) string {
	m := known[tag]
	if m.unit == "" || m.unit == "requests" || m.unit == "count" {
		return m.header
	}
	return m.header + " (" + m.unit + ")"
}

// distStats are the statistics of a per-request metric in summary.json and
// profile_export_aiperf.json.
var distStats = []string{"avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std", "count"}
