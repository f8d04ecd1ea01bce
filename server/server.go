// Package server is qual-server's HTTP frontend: OpenAI-compatible routes over worker
// processes that each hold one native engine (package worker, protocol in package wire),
// with request records, Prometheus metrics and OpenAI-shaped errors.
//
// Where things are: this file holds the Server and one request's lifecycle (serve: decode →
// validate → render/tokenize → admit → run → stream → record); routes.go the routing table;
// generate.go the completions and chat routes, chat_image.go a chat request's image, images.go
// the text-to-image route, grpc.go the OpenEngine gRPC API, extensions.go /tokenize,
// /detokenize and /mq/v1/logits, info.go /health, /v1/models and /mq/v1/bundle; request.go
// decodes generation bodies; pool.go is the worker pool (package worker runs in the workers,
// package wire is their protocol); recordfile.go writes the --records file (its schema is
// package record); start.go starts and drains the server; conns.go bounds slow clients.
//
// Why a frontend in its own process: the product qualified by modelqual is the whole serving
// stack, so its cost per token must be measured and small (issue 3: ≤ 3 µs of frontend CPU per
// streamed token), and an engine crash must fail only the requests it held. The frontend owns
// tokenization (loaded once), chat templates, stop strings, UTF-8-safe deltas and SSE framing;
// workers own only the engine step loop.
//
// Faults (env MODELQUAL_FAULTS, comma-separated, read once at start; used to prove that the
// harness's gates catch real defects):
//
//	server.swallow_final_delta          drop the last content delta of every stream
//	server.template_no_generation_prompt render chat without the generation prompt
//	server.drop_record                  skip writing every 5th request record
//	server.grpc_cumulative_deltas       gRPC TokenOutput text repeats the whole output (grpc.go)
//	server.stream_drop_final_logprobs   a stream's finish chunk leaves out its tokens' logprobs
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/server/cpuset"
	"github.com/modelqual/modelqual/server/record"
	"github.com/modelqual/modelqual/server/tokenizer"
	"github.com/modelqual/modelqual/server/wire"
)

// Config is qual-server's configuration; flags map one to one (see ParseFlags).
type Config struct {
	Bundle         string
	ModelName      string
	Host           string
	Port           int
	GRPCPort       int // --grpc-port, OpenEngine v1 gRPC: -1 off (the flag's default), 0 any free port
	Workers        int
	MaxBatch       int // per worker; 0: the bundle's build setting
	QueueDepth     int
	StartupTimeout time.Duration
	RequestTimeout time.Duration // 0: none
	DrainTimeout   time.Duration
	Records        string
	APIKey         string
	Pprof          bool
	Device         string
	Threads        int
	MaxBodyBytes   int64
	// Slow and idle clients (conns.go): the body must arrive within BodyTimeout, each write
	// must complete within WriteTimeout, a keep-alive connection may idle IdleTimeout, and at
	// most MaxConns connections are open. 0 turns a timeout off.
	BodyTimeout  time.Duration
	WriteTimeout time.Duration
	IdleTimeout  time.Duration
	MaxConns     int
	// MaxMessages and MaxChatBytes bound a chat request's messages (count, and content bytes
	// in all); 0: no limit.
	MaxMessages  int
	MaxChatBytes int
	// MaxImages bounds the images of one vision-language chat request
	// (--max-images-per-request; 0 counts as 1, the seeds' contract).
	MaxImages int
	// FrontendCPUs and WorkerCPUs place the HTTP frontend and the worker processes on CPUs of
	// their own (--frontend-cpus, --worker-cpus; empty: wherever the kernel puts them). A
	// worker whose set is empty while the frontend's is not runs on the CPUs the server was
	// started with, not on the frontend's.
	FrontendCPUs cpuset.Set
	WorkerCPUs   cpuset.Set
	// Exe is the binary started in worker mode; default os.Executable().
	Exe string
}

type faults struct {
	swallowFinalDelta bool
	noGenPrompt       bool
	dropRecord        bool
	// dropFinalLogprobs: a stream's finish chunk leaves out the logprobs of tokens that
	// produced no text of their own (an EOS, a held stop prefix).
	dropFinalLogprobs bool
}

func parseFaults(s string) faults {
	var f faults
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case "server.swallow_final_delta":
			f.swallowFinalDelta = true
		case "server.template_no_generation_prompt":
			f.noGenPrompt = true
		case "server.drop_record":
			f.dropRecord = true
		case "server.stream_drop_final_logprobs":
			f.dropFinalLogprobs = true
		}
	}
	return f
}

const (
	stateLoading int32 = iota
	stateReady
	stateDraining
)

// Server is one running qual-server frontend.
type Server struct {
	cfg     Config
	faults  faults
	m       *metrics
	pool    *pool
	records *recordWriter

	state   atomic.Int32
	tok     *tokenizer.Tokenizer
	vision  *visionState    // the image side of a vision bundle (chat_image.go); nil otherwise
	header  json.RawMessage // the bundle header as served by /mq/v1/bundle
	task    string          // the bundle's task: "text", "image" or "vision"
	image   imageGeometry   // what the images route checks sizes against (task "image")
	fileSum string          // the bundle's digest, from the start's one verification
	info    wire.Info
	eos     map[int32]bool
	created int64

	imagePrompt native.ImagePrompt   // how the family formats a text encoder's prompt (task "image")
	tok2        *tokenizer.Tokenizer // the second text encoder's tokenizer (imagePrompt.Second), else nil

	httpSrv    *http.Server
	grpc       *grpcFrontend // nil without --grpc-port
	ln         net.Listener
	baseCancel context.CancelFunc
	// drainCtx ends at the drain deadline; admitted counts requests past the state check.
	drainCtx    context.Context
	drainCancel context.CancelFunc
	admitted    atomic.Int64
	handlers    sync.WaitGroup
	startedAt   time.Time
	readyAt     time.Time
}

// A request's lifecycle. Every generation route (completions, chat, chat with an image,
// images) takes one path, serve:
//
//	decode → validate → render/tokenize (text, image) → admit → run → stream → record
//
// around which ServeHTTP puts what every recorded route has: begin (request ID, record,
// metrics), the method, API key and server state checks, and end (the record written, the
// metrics observed). A route supplies the parts that differ (route below): generate.go the
// completions and chat routes, chat_image.go a chat request's image, images.go the
// text-to-image route. gRPC's Generate (grpc.go) takes the same steps with its own framing and
// status codes: beginGRPC, promptIDs, capacity, newGenTask, admit, the shared gen, end.

// route is what one generation route does at each step of serve.
type route interface {
	// decode parses and validates the body and checks the model (and that the bundle serves
	// this route); a refusal names the field.
	decode(q *reqState, body []byte) *APIError
	// prepare renders and tokenizes the prompt (processing an image), checks the context and
	// returns the engine task.
	prepare(q *reqState) (*task, *APIError)
	// context bounds the task: the request's own context, and for text also the drain
	// deadline and --request-timeout.
	context(q *reqState) (ctx context.Context, cancel func())
	// run waits for the engine and answers, streamed or whole, filling the record.
	run(q *reqState, t *task, ctx context.Context)
}

// reqState is one request's bookkeeping: its record, metrics labels and response writer.
type reqState struct {
	s         *Server
	w         http.ResponseWriter
	rc        *http.ResponseController
	r         *http.Request
	rec       Record
	start     time.Time
	recorded  bool
	committed bool // the record was written before the answer's last bytes (commitRecord)
	status    int
	ttft      time.Duration
}

func newRequestID() string {
	var b [16]byte
	x, y := rand.Uint64(), rand.Uint64()
	for i := 0; i < 8; i++ {
		b[i], b[8+i] = byte(x>>(8*i)), byte(y>>(8*i))
	}
	const hx = "0123456789abcdef"
	out := make([]byte, 32)
	for i, c := range b {
		out[2*i], out[2*i+1] = hx[c>>4], hx[c&0xf]
	}
	return string(out)
}

// validRequestID accepts client ids that are safe to echo and record.
func validRequestID(id string) bool {
	if id == "" || len(id) > 200 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

func (s *Server) begin(w http.ResponseWriter, r *http.Request, route string, recorded bool) *reqState {
	s.handlers.Add(1)
	s.m.inflight.Inc()
	id := r.Header.Get("X-Request-Id")
	if !validRequestID(id) {
		id = newRequestID()
	}
	w.Header().Set("X-Request-Id", id)
	now := time.Now()
	q := &reqState{s: s, w: w, r: r, start: now, recorded: recorded,
		rec: Record{RequestID: id, Route: route, Model: s.cfg.ModelName, StartUnixNs: now.UnixNano(), WorkerID: record.WorkerIndex(-1)}}
	q.rec.SessionID, q.rec.Turn = sessionOf(r.Header)
	return q
}

// serve is the one path of a generation request (see above); the record is written by end, or
// by run before the answer's last bytes (commitRecord).
func (s *Server) serve(q *reqState, rt route) {
	body, ok := q.readBody()
	if !ok {
		return
	}
	if aerr := rt.decode(q, body); aerr != nil {
		q.fail(aerr)
		return
	}
	t, aerr := rt.prepare(q)
	if aerr != nil {
		q.fail(aerr)
		return
	}
	ctx, cancel := rt.context(q)
	defer cancel()
	if !s.schedule(q, t, ctx) {
		return
	}
	rt.run(q, t, ctx)
}

// admit runs t on a worker (pool.go), queueing it while every batch slot is busy, until ctx
// ends; the record gets the worker and the queue wait. Its error says why t did not start.
func (s *Server) admit(q *reqState, t *task, ctx context.Context) error {
	err := s.pool.run(t, ctx.Done(), func() error { return context.Cause(ctx) })
	if t.worker != nil {
		q.rec.WorkerID = record.WorkerIndex(t.worker.index)
	}
	q.rec.QueueWaitNs = t.queueWait.Nanoseconds()
	return err
}

// schedule admits t, answering 429/503/499/504 when it cannot.
func (s *Server) schedule(q *reqState, t *task, ctx context.Context) bool {
	err := s.admit(q, t, ctx)
	if err == nil {
		return true
	}
	s.scheduleError(q, err, ctx)
	return false
}

// scheduleError answers a task that could not be admitted (pool.run's error).
func (s *Server) scheduleError(q *reqState, err error, ctx context.Context) {
	switch {
	case errors.Is(err, errQueueFull):
		q.fail(&APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full",
			Message: fmt.Sprintf("every batch slot is busy and the queue is full (--queue-depth %d); retry later", s.cfg.QueueDepth)})
	case errors.As(err, new(*NoWorkerError)):
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_worker",
			Message: err.Error() + "; qual-server keeps trying to start one (see /health)"})
	case errors.Is(err, errClosing):
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: "the server is shutting down"})
	default:
		q.failContext(ctx)
	}
}

// failContext answers a request whose context ended before it could be answered.
func (q *reqState) failContext(ctx context.Context) {
	if errors.Is(context.Cause(ctx), errDrained) {
		q.rec.FinishReason = "drain"
		q.fail(q.s.drainError())
		q.rec.ErrorType = "drain_timeout"
		return
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		q.fail(&APIError{Status: http.StatusGatewayTimeout, Type: "timeout_error", Code: "request_timeout",
			Message: fmt.Sprintf("the request did not finish within --request-timeout %v", q.s.cfg.RequestTimeout)})
		return
	}
	// The client went away; nothing will read this answer (499 as nginx records it).
	q.rec.FinishReason = "cancelled"
	q.fail(&APIError{Status: 499, Type: "client_closed_request", Message: "the client closed the connection"})
}

// cancelWait bounds how long a handler waits for the engine to confirm a cancellation (so
// that its record carries the engine's timings and the slot is known free).
const cancelWait = 5 * time.Second

// errDrained is the cause of a request context ended by the drain deadline.
var errDrained = errors.New("the server is shutting down and --drain-timeout passed before this request finished")

// drainContext is the request's context, also ended (with cause errDrained) at the drain
// deadline.
func (s *Server) drainContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.drainCtx, func() { cancel(errDrained) })
	return ctx, func() { stop(); cancel(nil) }
}

// drainError answers a request ended by the drain deadline.
func (s *Server) drainError() *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "drain_timeout",
		Message: fmt.Sprintf("the server is shutting down and --drain-timeout %v passed before this request finished; retry on another server", s.cfg.DrainTimeout)}
}

// recordsError answers a request when the records file cannot be written.
func (s *Server) recordsError(err error) *APIError {
	return &APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "records_write_failed",
		Message: fmt.Sprintf("qual-server cannot write its request records (--records %s: %v); fix the file or its disk and restart", s.cfg.Records, err)}
}

// commitRecord writes a generation's record before its answer is complete (the last bytes of
// a stream, or the whole body of a non-streaming answer), so that a record that cannot be
// written turns the answer into an error the client sees instead of a success nobody
// recorded. Its latency and time to first token are taken here, just before that last write.
func (q *reqState) commitRecord() error {
	if !q.recorded || q.committed {
		return nil
	}
	q.committed = true
	q.rec.Status = q.status
	q.rec.HTTPLatencyNs = time.Since(q.start).Nanoseconds()
	if q.ttft > 0 {
		q.rec.TTFTNs = q.ttft.Nanoseconds()
	}
	return q.s.records.write(&q.rec)
}

func (s *Server) end(q *reqState) {
	el := time.Since(q.start)
	q.rec.Status = q.status
	q.rec.HTTPLatencyNs = el.Nanoseconds()
	s.m.requests.WithLabelValues(q.rec.Route, strconv.Itoa(q.status)).Inc()
	s.m.latency.WithLabelValues(q.rec.Route).Observe(el.Seconds())
	if q.ttft > 0 {
		q.rec.TTFTNs = q.ttft.Nanoseconds()
		s.m.ttft.WithLabelValues(q.rec.Route).Observe(q.ttft.Seconds())
	}
	if q.recorded && !q.committed {
		_ = s.records.write(&q.rec) // a failure is counted, logged and fails later requests
	}
	s.m.inflight.Dec()
	s.handlers.Done()
}

// fail answers with e (unless a streaming response already started; see streamError).
func (q *reqState) fail(e *APIError) {
	q.rec.ErrorType = e.Type
	q.rec.ErrorMessage = e.Message
	if q.rec.FinishReason == "" {
		q.rec.FinishReason = "error"
	}
	q.status = e.Status
	q.armWrite()
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	q.w.WriteHeader(e.Status)
	_, _ = q.w.Write(e.body())
}

func (q *reqState) writeJSON(status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		q.fail(&APIError{Status: 500, Type: "server_error", Message: "encode response: " + err.Error()})
		return
	}
	q.status = status
	q.w.Header().Set("Content-Type", "application/json")
	q.writeBody(status, b)
}

// writeChunk is how much of a large body goes to the client between two --write-timeout
// deadlines.
const writeChunk = 1 << 20

// writeBody writes b in writeChunk pieces, re-arming --write-timeout before each: the timeout
// cuts a client that stops reading, not one that reads a large answer (a /mq/v1/logits of a
// long prompt is hundreds of MB) more slowly than the whole body could cross in one deadline.
func (q *reqState) writeBody(status int, b []byte) {
	q.armWrite()
	q.w.WriteHeader(status)
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		q.armWrite()
		if _, err := q.w.Write(b[:n]); err != nil {
			return
		}
		b = b[n:]
	}
}

func readAllLimited(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// readBody reads the request body within --max-body (413 past it) and --body-timeout (408
// past it; ServeHTTP set the deadline).
func (q *reqState) readBody() ([]byte, bool) {
	body, err := readAllLimited(q.w, q.r, q.s.cfg.MaxBodyBytes)
	if err == nil && q.s.cfg.BodyTimeout > 0 {
		// The body is in: no deadline on the read net/http keeps open to notice a client
		// that leaves, or it would cancel a long generation.
		_ = q.rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.Is(err, os.ErrDeadlineExceeded) {
			q.w.Header().Set("Connection", "close")
			q.fail(&APIError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "body_timeout",
				Message: fmt.Sprintf("the request body did not arrive within --body-timeout %v; send the whole body at once", q.s.cfg.BodyTimeout)})
		} else if errors.As(err, &mbe) {
			q.fail(&APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body is larger than the %d-byte limit", mbe.Limit)})
		} else {
			q.fail(badRequest("", "read request body: %v", err))
		}
		return nil, false
	}
	q.rec.PromptBytes = 0
	return body, true
}
