// Package record is the one schema of qual-server's per-request JSONL records (README
// "Records"): the server writes Record, the harness reads the same type back and joins it to
// its own client records by request ID. It is a leaf library (standard library only), so both
// sides import it without either importing the other.
//
// A record carries no prompt, image or output content: a sha256 and a byte count stand in for
// each, so records can be kept and shared without leaking what was asked or answered. Times
// are integer nanoseconds; Task* are the engine's own timings from the worker's terminal
// message (0 when the request never reached an engine).
package record

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Endpoints a record can come from.
const (
	EndpointHTTP = "http"
	EndpointGRPC = "grpc"
)

// Record is one request's line in the --records file. The fields after WorkerID are written
// only by the routes that have them (omitempty), so a text record reads as it always did.
type Record struct {
	RequestID     string `json:"request_id"`
	Route         string `json:"route"`
	Endpoint      string `json:"endpoint,omitempty"` // EndpointHTTP (default when empty) or EndpointGRPC
	Model         string `json:"model"`
	Status        int    `json:"status"`
	Stream        bool   `json:"stream"`
	Warmup        bool   `json:"warmup,omitempty"`
	StartUnixNs   int64  `json:"start_unix_ns"`
	HTTPLatencyNs int64  `json:"http_latency_ns"`
	TTFTNs        int64  `json:"ttft_ns"` // arrival to the first content written (streams) or to the response; 0: none
	QueueWaitNs   int64  `json:"queue_wait_ns"`
	TaskWallNs    int64  `json:"task_wall_ns"`
	TaskTTFTNs    int64  `json:"task_ttft_ns"`
	InputTokens   int    `json:"input_tokens"`
	OutputTokens  int    `json:"output_tokens"`
	FinishReason  string `json:"finish_reason"`
	ErrorType     string `json:"error_type"`
	ErrorMessage  string `json:"error_message"`
	PromptSHA256  string `json:"prompt_sha256"`
	PromptBytes   int64  `json:"prompt_bytes"`
	OutputSHA256  string `json:"output_sha256"`
	OutputBytes   int64  `json:"output_bytes"`
	WorkerID      ID     `json:"worker_id"`
	// PreprocessNs is a text or chat request's time from its decoded body to its engine task:
	// chat template, tokenization and image processing (omitted when not measured).
	PreprocessNs int64 `json:"preprocess_ns,omitempty"`
	// VisionNs is the engine's wall time in the vision tower and projector for the request's
	// images (summed over choices; omitted for text requests and where the engine does not
	// measure it: the cuda backends). It lies within TaskTTFTNs, so a request's time to first
	// token splits as TTFTNs ≈ PreprocessNs + QueueWaitNs + VisionNs + prefill, the prefill
	// share being TaskTTFTNs - VisionNs (the engine's added-to-first-token time less the tower;
	// it includes waiting for a batch slot's step beside other sequences).
	VisionNs int64 `json:"vision_ns,omitempty"`

	// Session and turn of a multi-turn conversation, when the client named them.
	SessionID string `json:"session_id,omitempty"`
	Turn      int    `json:"turn,omitempty"`

	// Image generation (/v1/images/generations): the controls and the PNG's identity.
	Image *ImageGen `json:"image,omitempty"`
	// Vision-language chat: the one input image's identity and preprocessing.
	Vision *VisionInput `json:"vision,omitempty"`
	// VisionImages lists every image of a request with more than one (--max-images-per-request),
	// in message order; Vision is the first of them.
	VisionImages []VisionInput `json:"vision_images,omitempty"`
}

// ImageGen is what an image-generation record adds: the request's controls and the PNG's
// identity and cost. PNGEncodeNs is apart from TaskWallNs (the pipeline call alone).
type ImageGen struct {
	Width       int     `json:"width"`
	Height      int     `json:"height"`
	Steps       int     `json:"steps"`
	Guidance    float64 `json:"guidance"`
	Seed        int64   `json:"seed"`
	PNGSHA256   string  `json:"png_sha256"`
	PNGBytes    int64   `json:"png_bytes"`
	PNGEncodeNs int64   `json:"png_encode_ns"`
}

// VisionInput is what a vision-language chat record adds: the image's identity (of its bytes
// and of its decoded pixels), its size before and after the processor's resize, its token
// count, and the preprocessing time apart from the engine's.
type VisionInput struct {
	BytesSHA256    string `json:"image_bytes_sha256"`
	PixelsSHA256   string `json:"image_pixels_sha256"`
	Format         string `json:"image_format"`
	OriginalWidth  int    `json:"original_width"`
	OriginalHeight int    `json:"original_height"`
	ResizedWidth   int    `json:"resized_width"`
	ResizedHeight  int    `json:"resized_height"`
	ImageTokens    int    `json:"image_tokens"`
	// Tiles: a tiling processor's tile count (thumbnail included); absent otherwise.
	Tiles        int   `json:"tiles,omitempty"`
	PreprocessNs int64 `json:"preprocess_ns"`
}

// ID is an identifier written as a JSON number when it is an integer (qual-server's worker
// index, -1 for none) and read from a string, a number or null, so records of other servers
// parse too.
type ID string

// WorkerIndex is the ID of worker i.
func WorkerIndex(i int) ID { return ID(strconv.Itoa(i)) }

// MarshalJSON writes an integer ID as a number, anything else as a string.
func (id ID) MarshalJSON() ([]byte, error) {
	if id == "" {
		return []byte("null"), nil
	}
	if _, err := strconv.ParseInt(string(id), 10, 64); err == nil {
		return []byte(id), nil
	}
	return json.Marshal(string(id))
}

// UnmarshalJSON accepts a string, a number or null.
func (id *ID) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	switch {
	case s == "null":
		*id = ""
	case strings.HasPrefix(s, `"`):
		var v string
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*id = ID(v)
	default:
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return fmt.Errorf("worker_id %s is neither a string nor a number", s)
		}
		*id = ID(s)
	}
	return nil
}
