package server

// This file is the server's own life: New and Start (listen, verify the bundle once, load the
// tokenizer, start the workers) and Shutdown (drain, stop the workers, close the records). One
// request's life is in server.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/cpuset"
	"github.com/modelqual/modelqual/server/envconfig"
	"github.com/modelqual/modelqual/server/tokenizer"
)

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
	s := &Server{cfg: cfg, faults: parseFaults(envconfig.Faults.Get()), m: newMetrics(), created: time.Now().Unix()}
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
	t, err := tokenizer.FromBundle(sectionReader(func(name string) ([]byte, error) {
		switch name {
		case bundle.SectionTokenizer:
			return tj, nil
		case bundle.SectionTokenizerConfig:
			return tc, nil
		}
		return section(name)
	}))
	if err != nil {
		return fileReads{}, fmt.Errorf("qual-server: tokenizer of bundle %s: %w", s.cfg.Bundle, err)
	}
	s.tok = t
	if h.Task == "image" {
		if s.imagePrompt, err = native.ImagePromptFor(h.Family, h.Config); err != nil {
			return fileReads{}, fmt.Errorf("qual-server: bundle %s: %w", s.cfg.Bundle, err)
		}
		if p := s.imagePrompt.Second; p != nil { // a second text encoder's tokenizer (FLUX.1's T5)
			if s.tok2, err = tokenizer.FromBundleFolder(sectionReader(section), p.Tokenizer); err != nil {
				return fileReads{}, fmt.Errorf("qual-server: second tokenizer (%s) of bundle %s: %w", p.Tokenizer, s.cfg.Bundle, err)
			}
		}
	}
	if h.Task == "vision" {
		if s.vision, err = newVisionState(h.Config, section, t, s.cfg.MaxImages); err != nil {
			return fileReads{}, fmt.Errorf("qual-server: bundle %s: %w", s.cfg.Bundle, err)
		}
	}
	log.Printf("frontend loaded bundle header and tokenizer in %v", time.Since(t0).Round(time.Millisecond))
	return fileReads{before, after}, nil
}

// sectionReader adapts a section lookup to tokenizer.SectionReader.
type sectionReader func(name string) ([]byte, error)

func (f sectionReader) Section(name string) ([]byte, error) { return f(name) }

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
