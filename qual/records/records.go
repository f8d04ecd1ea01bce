// Package records holds the raw per-request records of a load run: the client's view
// (Request, produced by qual/client and qual/load) and the server's view (Server, the JSONL
// lines qual-server writes with --records), and joins the two by request ID.
//
// Raw records are kept verbatim so that every derived figure (qual/metrics, reports) can be
// recomputed later; nothing here aggregates.
package records

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/modelqual/modelqual/server/record"
)

// Phases of a run. Warmup requests are recorded but never mixed into measured statistics.
const (
	PhaseWarmup    = "warmup"
	PhaseProfiling = "profiling"
)

// CancelledCode is the error code a client-cancelled request carries, as in AIPerf
// (nginx's "client closed request").
const CancelledCode = 499

// Error describes why a request failed. Code is the HTTP status (or CancelledCode, or 0 when
// no response arrived at all, e.g. a connection error); Type is a short class such as
// "http_error", "timeout", "connection", "cancelled" or the server's error type.
type Error struct {
	Code    int    `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// Request is the client-side record of one request (README "Records"). All *Ns
// fields except StartUnixNs are monotonic nanoseconds since the request start, so latencies
// are plain field reads and never subtract wall-clock readings.
type Request struct {
	RequestID  string `json:"request_id"`  // X-Request-Id sent
	Phase      string `json:"phase"`       // PhaseWarmup | PhaseProfiling
	SessionNum int    `json:"session_num"` // sequence number in the run
	WorkerID   string `json:"worker_id"`   // load-generator worker that issued it
	Endpoint   string `json:"endpoint"`    // "completions" | "chat"
	Stream     bool   `json:"stream"`
	// ConversationID and TurnIndex place the request in its session (AIPerf's
	// conversation_id and turn_index): a multi-turn session's requests share the ID and
	// count turns from 0; a single request is a session of one turn.
	ConversationID string `json:"conversation_id,omitempty"`
	TurnIndex      int    `json:"turn_index,omitempty"`

	StartUnixNs int64   `json:"start_unix_ns"` // wall clock at request start (export metadata only)
	AckNs       int64   `json:"ack_ns"`        // response headers received
	EndNs       int64   `json:"end_ns"`        // end of HTTP body
	ChunkNs     []int64 `json:"chunk_ns"`      // each CONTENT event; non-streaming: one entry = EndNs

	HTTPStatus int    `json:"http_status"`
	Error      *Error `json:"error,omitempty"` // nil on success
	Cancelled  bool   `json:"cancelled"`
	CancelNs   int64  `json:"cancel_ns"`

	InputTokens        int    `json:"input_tokens"`         // client tokenizer count of what was sent
	InputTokensServer  int    `json:"input_tokens_server"`  // usage.prompt_tokens (0 when not given)
	OutputTokensServer int    `json:"output_tokens_server"` // usage.completion_tokens (0 when not given)
	OutputTokensClient int    `json:"output_tokens_client"` // client tokenizer count of the returned text
	ResponseBytes      int64  `json:"response_bytes"`
	FinishReason       string `json:"finish_reason"`

	ScheduledNs int64 `json:"scheduled_ns"` // open loop: scheduled start since run start
	LatenessNs  int64 `json:"lateness_ns"`  // actual start − scheduled start
}

// Failed reports whether the request counts as an error (including cancellation) and must
// therefore stay out of latency statistics.
func (r *Request) Failed() bool { return r.Error != nil || r.Cancelled }

// OutputTokens is the output token count the metrics use: the server's usage when given,
// the client tokenizer's count otherwise (METRICS.md "output tokens").
func (r *Request) OutputTokens() int {
	if r.OutputTokensServer > 0 {
		return r.OutputTokensServer
	}
	return r.OutputTokensClient
}

// Server is one JSONL record of qual-server (README "Records"): the schema package the
// server writes with, so the two sides cannot drift apart.
type Server = record.Record

// WriteJSONL writes one JSON object per line to path (created or truncated). T is Request,
// Server or any record type; the file is the raw artifact later reread by ReadJSONL.
func WriteJSONL[T any](path string, recs []T) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write records %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write records %s: %w", path, err)
	}
	w := bufio.NewWriterSize(f, 1<<16)
	enc := json.NewEncoder(w)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			f.Close()
			return fmt.Errorf("write records %s: record %d: %w", path, i, err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write records %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write records %s: %w", path, err)
	}
	return nil
}

// ReadJSONL reads a file written by WriteJSONL (or by qual-server). Blank lines are skipped;
// a malformed line fails with its line number.
func ReadJSONL[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	recs, err := DecodeJSONL[T](f)
	if err != nil {
		return nil, fmt.Errorf("read records %s: %w", path, err)
	}
	return recs, nil
}

// DecodeJSONL decodes JSON lines from r; see ReadJSONL.
func DecodeJSONL[T any](r io.Reader) ([]T, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20) // a streaming record with many chunks can be long
	var out []T
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return out, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("line %d: %w", line+1, err)
	}
	return out, nil
}

// ReadServer reads qual-server's --records JSONL file.
func ReadServer(path string) ([]Server, error) { return ReadJSONL[Server](path) }

// SelectRoutes keeps the server records whose route starts with one of prefixes, e.g.
// "/v1/" to drop the harness's own /tokenize and /mq calls before a Join of load traffic.
func SelectRoutes(sv []Server, prefixes ...string) []Server {
	var out []Server
	for _, s := range sv {
		for _, p := range prefixes {
			if strings.HasPrefix(s.Route, p) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// Joined is the result of Join: every request of a run with both views.
type Joined struct {
	Requests []JoinedRequest `json:"requests"` // in client order
}

// JoinedRequest is one client request with its server record.
type JoinedRequest struct {
	Request
	Server Server `json:"server"`

	// HTTPLatencyNs is the client-observed HTTP latency: request start to end of body.
	HTTPLatencyNs int64 `json:"http_latency_ns"`
	// TaskWallNs is the native engine's wall time for the task (0 when the request never
	// reached a worker).
	TaskWallNs int64 `json:"task_wall_ns"`
	// HTTPMinusTaskNs is HTTPLatencyNs − TaskWallNs: what the HTTP frontend, the worker
	// protocol, the network and the client cost on top of inference. Only meaningful when
	// TaskWallNs > 0.
	HTTPMinusTaskNs int64 `json:"http_minus_task_ns"`
	// QueueWaitNs is the server's queue wait before a worker took the request.
	QueueWaitNs int64 `json:"queue_wait_ns"`
}

// maxNamed caps how many IDs a join error lists so the message stays readable.
const maxNamed = 20

// Join pairs every client record with the server record of the same request ID. Every
// client ID must have exactly one server record and vice versa: any unmatched or duplicate
// ID on either side is an error naming the IDs, because a lost record means the run's
// numbers cannot be trusted. The result is in client order; on error the matched part is still returned so the
// caller can write it out with the failure.
func Join(cl []Request, sv []Server) (*Joined, error) {
	byID := make(map[string]int, len(sv))
	var dupServer, dupClient, missingServer []string
	for i, s := range sv {
		if _, dup := byID[s.RequestID]; dup {
			dupServer = append(dupServer, s.RequestID)
			continue
		}
		byID[s.RequestID] = i
	}
	seen := make(map[string]bool, len(cl))
	out := make([]JoinedRequest, 0, len(cl))
	for _, c := range cl {
		if seen[c.RequestID] {
			dupClient = append(dupClient, c.RequestID)
			continue
		}
		seen[c.RequestID] = true
		i, ok := byID[c.RequestID]
		if !ok {
			missingServer = append(missingServer, c.RequestID)
			continue
		}
		s := sv[i]
		j := JoinedRequest{Request: c, Server: s, HTTPLatencyNs: c.EndNs, TaskWallNs: s.TaskWallNs, QueueWaitNs: s.QueueWaitNs}
		j.HTTPMinusTaskNs = j.HTTPLatencyNs - j.TaskWallNs
		out = append(out, j)
	}
	var missingClient []string
	for id := range byID {
		if !seen[id] {
			missingClient = append(missingClient, id)
		}
	}
	var problems []string
	add := func(what string, ids []string) {
		if len(ids) == 0 {
			return
		}
		sort.Strings(ids)
		shown := ids
		more := ""
		if len(ids) > maxNamed {
			shown, more = ids[:maxNamed], fmt.Sprintf(" and %d more", len(ids)-maxNamed)
		}
		problems = append(problems, fmt.Sprintf("%d %s: %s%s", len(ids), what, strings.Join(shown, ", "), more))
	}
	add("client request IDs without a server record", missingServer)
	add("server request IDs without a client record", missingClient)
	add("request IDs duplicated in client records", dupClient)
	add("request IDs duplicated in server records", dupServer)
	if len(problems) > 0 {
		return &Joined{Requests: out}, fmt.Errorf("join client and server records (%d client, %d server): %s; "+
			"check that the server wrote --records for this run only and that X-Request-Id is echoed",
			len(cl), len(sv), strings.Join(problems, "; "))
	}
	return &Joined{Requests: out}, nil
}
