package server

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// Record is one request's line in the --records JSONL file (README "Records"). It
// carries no prompt or output text: a sha256 and a byte count stand in for them, so records
// can be kept and shared without leaking what was asked or answered. Nanosecond integers;
// task_* come from the engine's own timings in the worker's terminal message (0 when the
// request never reached an engine).
type Record struct {
	RequestID     string `json:"request_id"`
	Route         string `json:"route"`
	Model         string `json:"model"`
	Status        int    `json:"status"`
	Stream        bool   `json:"stream"`
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
	PromptBytes   int    `json:"prompt_bytes"`
	OutputSHA256  string `json:"output_sha256"`
	OutputBytes   int    `json:"output_bytes"`
	WorkerID      int    `json:"worker_id"`
}

// recordWriter appends records to a file, one line each, flushed per record so that a killed
// frontend loses at most the line being written.
type recordWriter struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	n    int
	drop bool // fault server.drop_record: skip every 5th record
	err  error
}

func openRecords(path string, drop bool) (*recordWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open records file %s: %w; pass a writable --records path", path, err)
	}
	return &recordWriter{f: f, w: bufio.NewWriterSize(f, 64<<10), drop: drop}, nil
}

func (rw *recordWriter) write(r *Record) {
	if rw == nil {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		return // Record has only plain fields
	}
	line = append(line, '\n')
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.n++
	if rw.drop && rw.n%5 == 0 {
		return
	}
	if _, err := rw.w.Write(line); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.w.Flush(); err != nil && rw.err == nil {
		rw.err = err
	}
}

func (rw *recordWriter) close() error {
	if rw == nil {
		return nil
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if err := rw.w.Flush(); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.f.Sync(); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.f.Close(); err != nil && rw.err == nil {
		rw.err = err
	}
	return rw.err
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
