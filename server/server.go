// Package server is qual-server's HTTP frontend: OpenAI-compatible routes over worker
// processes that each hold one native engine (package worker, protocol in package wire),
// with request records, Prometheus metrics and OpenAI-shaped errors.
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
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/modelqual/modelqual/server/record"
)

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

// ServeHTTP routes requests. Hand-written rather than http.ServeMux so 404 and 405 carry
// OpenAI error bodies and so the records know the route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	rc := http.NewResponseController(w)
	if s.cfg.WriteTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	}
	if s.cfg.BodyTimeout > 0 && r.Body != http.NoBody {
		// Also bounds the discard of a body the handler did not read.
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	}
	var route string
	var method string
	var h func(*reqState)
	switch path {
	case "/health":
		s.handleHealth(w, r)
		return
	case "/metrics":
		promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		return
	case "/v1/models":
		route, method, h = path, http.MethodGet, s.handleModels
	case "/v1/completions":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.handleGenerate(q, false) }
	case "/v1/chat/completions":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.handleGenerate(q, true) }
	case "/tokenize":
		route, method, h = path, http.MethodPost, s.handleTokenize
	case "/detokenize":
		route, method, h = path, http.MethodPost, s.handleDetokenize
	case "/mq/v1/logits":
		route, method, h = path, http.MethodPost, s.handleLogits
	case "/v1/images/generations":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.handleImages(q, false) }
	case "/mq/v1/image_latents":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.handleImages(q, true) }
	case "/mq/v1/bundle":
		route, method, h = path, http.MethodGet, s.handleBundle
	default:
		if s.cfg.Pprof && strings.HasPrefix(path, "/debug/pprof/") {
			// Profiles, goroutine stacks and the command line are as sensitive as the API.
			if s.cfg.APIKey != "" && !s.authorized(r) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write(errUnauthorized.body())
				return
			}
			servePprof(w, r)
			return
		}
		if strings.HasPrefix(path, "/v1/models/") {
			route, method, h = "/v1/models/{model}", http.MethodGet, s.handleModel
			break
		}
		recorded := strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/mq/")
		q := s.begin(w, r, path, recorded)
		q.rc = rc
		q.fail(&APIError{Status: http.StatusNotFound, Type: "not_found_error", Message: fmt.Sprintf("no route %s %s; see /v1/models, /v1/completions, /v1/chat/completions", r.Method, path)})
		s.end(q)
		return
	}
	q := s.begin(w, r, route, true)
	q.rc = rc
	defer s.end(q)
	if r.Method != method {
		w.Header().Set("Allow", method)
		q.fail(&APIError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: fmt.Sprintf("%s does not accept %s; use %s", route, r.Method, method)})
		return
	}
	if s.cfg.APIKey != "" && !s.authorized(r) {
		q.fail(errUnauthorized)
		return
	}
	// Counted before the state is read, so a drain that sees none admitted has none coming.
	s.admitted.Add(1)
	defer s.admitted.Add(-1)
	switch s.state.Load() {
	case stateLoading:
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "loading", Message: "the model is still loading; poll /health until it answers ready"})
		return
	case stateDraining:
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	if err := s.records.failure(); err != nil {
		q.fail(s.recordsError(err))
		return
	}
	h(q)
}

var errUnauthorized = &APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
	Message: "missing or wrong API key; send Authorization: Bearer <key> with the key given to --api-key, --api-key-file or " + apiKeyEnv}

// redactedArgs is the command line with --api-key's value replaced, for /debug/pprof/cmdline.
func redactedArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i := 0; i < len(out); i++ {
		a := out[i]
		for _, p := range []string{"-api-key", "--api-key"} {
			if a == p && i+1 < len(out) {
				out[i+1] = "REDACTED"
				i++
			} else if strings.HasPrefix(a, p+"=") {
				out[i] = p + "=REDACTED"
			}
		}
	}
	return out
}

func servePprof(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimPrefix(r.URL.Path, "/debug/pprof/") {
	case "cmdline":
		// pprof.Cmdline would serve --api-key's value.
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(strings.Join(redactedArgs(os.Args), "\x00")))
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default:
		pprof.Index(w, r)
	}
}

func (s *Server) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) == 1
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
