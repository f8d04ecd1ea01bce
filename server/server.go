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
	"github.com/modelqual/modelqual/server/record"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/cpuset"
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
	vision  *visionState    // the image side of a vision bundle (vision.go); nil otherwise
	header  json.RawMessage // the bundle header as served by /mq/v1/bundle
	task    string          // the bundle's task: "text", "image" or "vision"
	image   imageGeometry   // what the images route checks sizes against (task "image")
	fileSum string          // the bundle's digest, from the start's one verification
	info    wire.Info
	eos     map[int32]bool
	created int64

	imagePrompt native.ImagePrompt // how the family formats a text encoder's prompt (task "image")

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

// New checks cfg and opens the records file; Start does the rest.
func New(cfg Config) (*Server, error) {
	if cfg.Bundle == "" {
		return nil, errors.New("qual-server: --bundle is required: the .mqb file to serve (qual bundle build makes one)")
	}
	if cfg.ModelName == "" {
		return nil, errors.New("qual-server: --model-name is required: the name clients send as \"model\"")
	}
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("qual-server: --workers %d must be at least 1", cfg.Workers)
	}
	if cfg.QueueDepth < 0 {
		return nil, fmt.Errorf("qual-server: --queue-depth %d must not be negative", cfg.QueueDepth)
	}
	if cfg.Device != "cpu" && cfg.Device != "cuda" {
		return nil, fmt.Errorf("qual-server: --device %q: use cpu or cuda", cfg.Device)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.BodyTimeout < 0 || cfg.WriteTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("qual-server: --body-timeout, --write-timeout and --idle-timeout must not be negative (0 turns one off)")
	}
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("qual-server: find own binary for worker processes: %w", err)
		}
		cfg.Exe = exe
	}
	if _, err := os.Stat(cfg.Bundle); err != nil {
		return nil, fmt.Errorf("qual-server: --bundle %s: %w", cfg.Bundle, err)
	}
	for _, c := range []struct {
		flag string
		set  cpuset.Set
	}{{"--frontend-cpus", cfg.FrontendCPUs}, {"--worker-cpus", cfg.WorkerCPUs}} {
		if len(c.set) > 0 {
			if err := c.set.Check(c.flag); err != nil {
				return nil, fmt.Errorf("qual-server: %w", err)
			}
		}
	}
	if len(cfg.FrontendCPUs) > 0 && len(cfg.WorkerCPUs) == 0 {
		all, err := cpuset.Allowed()
		if err != nil {
			return nil, fmt.Errorf("qual-server: --frontend-cpus: %w", err)
		}
		cfg.WorkerCPUs = all // workers inherit the frontend's mask otherwise
	}
	s := &Server{cfg: cfg, faults: parseFaults(os.Getenv("MODELQUAL_FAULTS")), m: newMetrics(), created: time.Now().Unix()}
	s.drainCtx, s.drainCancel = context.WithCancel(context.Background())
	if cfg.Records != "" {
		rw, err := openRecords(cfg.Records, s.faults.dropRecord, s.m.recordErrors)
		if err != nil {
			return nil, err
		}
		s.records = rw
	}
	s.pool = newPool(PoolConfig{
		Exe: cfg.Exe, Bundle: cfg.Bundle, Workers: cfg.Workers, MaxBatch: cfg.MaxBatch,
		QueueDepth: cfg.QueueDepth, Device: cfg.Device, Threads: cfg.Threads,
		StartupTimeout: cfg.StartupTimeout, WorkerCPUs: cfg.WorkerCPUs,
	}, s.m)
	return s, nil
}

// Start listens (so /health answers "loading" at once), then verifies the bundle (the start's
// only pass over the file) while this process loads the bundle's tokenizer; the workers open
// their engines once the bundle is verified. It returns when the server is ready, or with the
// first load error.
func (s *Server) Start() error {
	s.startedAt = time.Now()
	if len(s.cfg.FrontendCPUs) > 0 {
		if err := cpuset.Pin(s.cfg.FrontendCPUs); err != nil {
			return fmt.Errorf("qual-server: --frontend-cpus: %w", err)
		}
		cpuset.MatchGOMAXPROCS(s.cfg.FrontendCPUs)
		log.Printf("frontend on CPUs %s, workers on CPUs %s", s.cfg.FrontendCPUs, s.cfg.WorkerCPUs)
	}
	addr := net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("qual-server: listen on %s: %w; pick another --port or stop what holds it", addr, err)
	}
	s.ln = ln
	base, cancel := context.WithCancel(context.Background())
	s.baseCancel = cancel
	s.httpSrv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ConnState:         connState,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          log.New(os.Stderr, "qual-server http: ", 0),
	}
	go func() {
		if err := s.httpSrv.Serve(newConnListener(ln, s)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("serve: %v", err)
		}
	}()
	log.Printf("listening on %s (loading %s)", ln.Addr(), s.cfg.Bundle)
	if err := s.startGRPC(); err != nil {
		return err
	}

	// The tokenizer is parsed while the bundle is hashed, and the workers start once it is
	// verified, so start-to-ready is the slower of the tokenizer parse and verification plus
	// engine load, not their sum.
	type loaded struct {
		src fileReads
		err error
	}
	loadDone := make(chan loaded, 1)
	go func() {
		src, err := s.loadFrontend()
		loadDone <- loaded{src, err}
	}()
	v, err := s.verifyBundle()
	if err != nil {
		return err
	}
	s.pool.cfg.Verified = v
	poolErr := make(chan error, 1)
	go func() { poolErr <- s.pool.start() }()
	if l := <-loadDone; l.err != nil {
		return l.err
	} else if err := s.checkTokenizerSource(v, l.src); err != nil {
		return err
	}
	if err := <-poolErr; err != nil {
		return err
	}
	info, _ := s.pool.engineInfo()
	s.info = info
	s.eos = map[int32]bool{}
	for _, id := range info.EOSIDs {
		s.eos[id] = true
	}
	s.readyAt = time.Now()
	s.state.Store(stateReady)
	s.grpcReady()
	log.Printf("ready in %v: model %q, %d workers, batch %d each, context %d, queue %d",
		s.readyAt.Sub(s.startedAt).Round(time.Millisecond), s.cfg.ModelName, s.cfg.Workers, info.MaxBatch, info.MaxContext, s.cfg.QueueDepth)
	return nil
}

// verifyBundle opens the bundle with bundle.Open: its structure and header checksum, and the
// sha256 of every data chunk and section, hashed on every core (a mismatch is an error naming
// the file and the field); its digest is served by /mq/v1/bundle. Workers map the file with the
// result (bundle.OpenVerified) instead of hashing it again, so a start hashes a multi-gigabyte
// bundle once, not once per worker plus once here.
func (s *Server) verifyBundle() (bundle.Verified, error) {
	t0 := time.Now()
	b, err := bundle.Open(s.cfg.Bundle)
	if err != nil {
		return bundle.Verified{}, fmt.Errorf("qual-server: %w", err)
	}
	defer b.Close()
	hdr, err := json.Marshal(b.Header())
	if err != nil {
		return bundle.Verified{}, fmt.Errorf("qual-server: encode bundle header: %w", err)
	}
	s.header, s.fileSum = hdr, b.Digest()
	s.task, s.image = b.Header().Task, imageGeometryOf(hdr)
	el := time.Since(t0)
	log.Printf("verified bundle %s (%d MB, digest %s) in %v (%.1f GB/s)", s.cfg.Bundle, len(b.Data())>>20, s.fileSum, el.Round(time.Millisecond),
		float64(len(b.Data()))/el.Seconds()/1e9)
	return b.Verified(), nil
}

// fileReads is the bundle file as loadFrontend found it before and after reading it.
type fileReads [2]os.FileInfo

// loadFrontend reads the bundle's header and tokenizer sections and builds the tokenizer,
// while verifyBundle hashes the file. It hashes nothing: checkTokenizerSource then accepts what
// it read only if the file kept the identity it had when verifyBundle hashed it.
func (s *Server) loadFrontend() (fileReads, error) {
	t0 := time.Now()
	f, err := os.Open(s.cfg.Bundle)
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: open bundle: %w", err)
	}
	defer f.Close()
	before, err := f.Stat()
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: stat bundle: %w", err)
	}
	h, err := bundle.ReadHeader(f, before.Size(), s.cfg.Bundle)
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: %w", err)
	}
	section := func(name string) ([]byte, error) {
		for _, sec := range h.Sections {
			if sec.Name == name {
				b := make([]byte, sec.Size)
				if _, err := f.ReadAt(b, sec.Offset); err != nil {
					return nil, fmt.Errorf("qual-server: bundle %s: read section %s: %w", s.cfg.Bundle, name, err)
				}
				return b, nil
			}
		}
		return nil, fmt.Errorf("qual-server: bundle %s has no section %s; rebuild it with qual bundle build", s.cfg.Bundle, name)
	}
	tj, err := section(bundle.SectionTokenizer)
	if err != nil {
		return fileReads{}, err
	}
	tc, err := section(bundle.SectionTokenizerConfig)
	if err != nil {
		return fileReads{}, err
	}
	after, err := f.Stat()
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: stat bundle: %w", err)
	}
	t, err := tokenizer.FromBytes(tj, tc)
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: tokenizer of bundle %s: %w", s.cfg.Bundle, err)
	}
	s.tok = t
	if h.Task == "image" {
		if s.imagePrompt, err = native.ImagePromptFor(h.Family, h.Config); err != nil {
			return fileReads{}, fmt.Errorf("qual-server: bundle %s: %w", s.cfg.Bundle, err)
		}
	}
	if h.Task == "vision" {
		if s.vision, err = newVisionState(h.Config, section); err != nil {
			return fileReads{}, fmt.Errorf("qual-server: bundle %s: %w", s.cfg.Bundle, err)
		}
	}
	log.Printf("frontend loaded bundle header and tokenizer in %v", time.Since(t0).Round(time.Millisecond))
	return fileReads{before, after}, nil
}

// checkTokenizerSource makes sure the tokenizer was read from the file verifyBundle verified:
// the file had the verified identity before and after loadFrontend read it (src), so nothing
// wrote it in between.
func (s *Server) checkTokenizerSource(v bundle.Verified, src fileReads) error {
	for _, fi := range src {
		if !v.Matches(fi) {
			return fmt.Errorf("qual-server: bundle %s changed while qual-server was starting (%v, size %d); make sure nothing writes it while it is served, then start again",
				s.cfg.Bundle, fi.ModTime().UTC().Format(time.RFC3339Nano), fi.Size())
		}
	}
	return nil
}

// Addr is the address the server listens on (useful with --port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// WorkerPIDs lists the live worker processes.
func (s *Server) WorkerPIDs() []int { return s.pool.workerPIDs() }

// Shutdown drains. The listener stays open: new requests (on new connections too) get 503
// shutting_down and keep-alive ends, while admitted requests may finish until the drain
// deadline. Past it they are ended by the server, not blamed on the client: streams with an
// error event (code drain_timeout), others with 503, and their records say finish_reason
// "drain". Then workers are stopped and the records file is flushed and closed. Its error is
// the records file's, so exit status says whether every record landed.
func (s *Server) Shutdown(deadline time.Duration) error {
	s.state.Store(stateDraining)
	gctx, gcancel := context.WithTimeout(context.Background(), deadline)
	defer gcancel()
	grpcDone := s.drainGRPC(gctx)
	if s.httpSrv != nil {
		s.httpSrv.SetKeepAlivesEnabled(false) // also closes idle connections
		if !s.waitAdmitted(deadline) {
			log.Printf("drain deadline %v passed with %d requests unfinished; ending them", deadline, s.admitted.Load())
			s.drainCancel()
			if !s.waitAdmitted(cancelWait + time.Second) {
				log.Printf("%d requests still unfinished after the drain; closing their connections", s.admitted.Load())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := s.httpSrv.Shutdown(ctx); err != nil {
			s.baseCancel()
			_ = s.httpSrv.Close()
		}
		cancel()
	}
	<-grpcDone
	// Handlers write their records before returning; wait for the last ones.
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		log.Print("some handlers did not finish 10 s after the drain; their records may be missing")
	}
	s.pool.close(5 * time.Second)
	if s.baseCancel != nil {
		s.baseCancel()
	}
	s.drainCancel()
	return s.records.close()
}

// waitAdmitted waits up to d for the admitted requests to finish.
func (s *Server) waitAdmitted(d time.Duration) bool {
	end := time.Now().Add(d)
	for s.admitted.Load() > 0 {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

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
	Message: "missing or wrong API key; send Authorization: Bearer <key> with the key given to --api-key, --api-key-file or " + APIKeyEnv}

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

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch s.state.Load() {
	case stateLoading:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"loading"}`))
		return
	case stateDraining:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"draining"}`))
		return
	}
	if err := s.records.failure(); err != nil {
		b, _ := json.Marshal(map[string]any{"status": "records_failing", "reason": fmt.Sprintf("--records %s: %v", s.cfg.Records, err)})
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(b)
		return
	}
	n := s.pool.readyWorkers()
	if n == 0 {
		reason := "every worker exited; replacements are starting"
		if err := s.pool.unavailable(); err != nil {
			reason = err.Error()
		}
		b, _ := json.Marshal(map[string]any{"status": "unavailable", "reason": reason})
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(b)
		return
	}
	b, _ := json.Marshal(map[string]any{"status": "ready", "workers": n, "model": s.cfg.ModelName,
		"worker_pids": s.pool.workerPIDs(), "startup_ns": s.readyAt.Sub(s.startedAt).Nanoseconds()})
	_, _ = w.Write(b)
}

func (s *Server) modelObject() map[string]any {
	return map[string]any{"id": s.cfg.ModelName, "object": "model", "created": s.created, "owned_by": "modelqual",
		"max_model_len": s.info.MaxContext}
}

func (s *Server) handleModels(q *reqState) {
	q.writeJSON(http.StatusOK, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

func (s *Server) handleModel(q *reqState) {
	id := strings.TrimPrefix(q.r.URL.Path, "/v1/models/")
	if id != s.cfg.ModelName {
		q.fail(s.unknownModel(id))
		return
	}
	q.writeJSON(http.StatusOK, s.modelObject())
}

func (s *Server) handleBundle(q *reqState) {
	q.writeJSON(http.StatusOK, map[string]any{"header": s.header, "bundle_digest": s.fileSum, "bundle_path": s.cfg.Bundle})
}

func (s *Server) unknownModel(name string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: "not_found_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("model %q does not exist; this server serves %q", name, s.cfg.ModelName)}
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
