// Package load generates load against an OpenAI-compatible endpoint and records every
// request: closed-loop concurrency, open-loop constant or Poisson request rates driven by an
// absolute schedule (with each request's lateness against it recorded), a rate with a
// concurrency cap, stop on a count or a duration, warmup requests kept and reported apart,
// a request-cancellation rate, and a fixed, recorded seed.
//
// Run is one sweep point; qual/load's Profile (profile.go) wraps it with a launcher,
// fingerprints, GPU telemetry, the server-record join and the exports, and is what both
// `qual profile` and qual/spec's LoadProfile call.
package load

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/records"
)

// Arrival patterns of open-loop runs.
const (
	ArrivalConstant = "constant"
	ArrivalPoisson  = "poisson"
)

// Config describes one load run (one sweep point).
type Config struct {
	// Client sends the requests; when nil one is made from BaseURL, Model and APIKey with a
	// pool sized to the run's concurrency.
	Client  *client.Client
	BaseURL string
	Model   string
	APIKey  string

	// Endpoint is client.Completions or client.Chat; Stream asks for SSE.
	Endpoint string
	Stream   bool

	// Concurrency > 0 with RequestRate == 0 is a closed loop: that many requests always in
	// flight.
	Concurrency int
	// RequestRate > 0 is an open loop at that many requests per second, on an absolute
	// schedule; Arrival picks Poisson arrivals (the default, as AIPerf's) or constant spacing.
	RequestRate float64
	Arrival     string
	// MaxConcurrency caps in-flight requests of an open loop (0: no cap). A request that
	// finds the cap reached waits, and its lateness records the wait.
	MaxConcurrency int

	// Requests is how many measured requests to send; Duration bounds the measured phase by
	// time. At least one must be set; with both, the first reached stops the run.
	Requests int
	Duration time.Duration
	// Warmup requests run first (closed loop at the run's concurrency, or 1 for an open
	// loop), are recorded with Phase "warmup", and never enter measured statistics.
	Warmup int
	// RampUp, after the warmup, raises the load linearly from about nothing to the point's
	// over this long before the measured phase (ramp.go): an open loop's rate from 0 to
	// RequestRate, a closed loop's active clients from 1 to Concurrency. Requests sent in
	// the ramp are recorded with Phase "warmup" (IDs RunID-u<n>): AIPerf ramps within a phase
	// and has no phase of its own for it, so a ramp kept out of the steady-state figures is
	// its warmup ramp. The measured phase follows without a pause, at the full load.
	RampUp time.Duration

	// Prompts are cycled through in order (request i uses Prompts[i % len]).
	Prompts []Prompt
	// Sessions, when set, replace Prompts in the measured phase (dataset.go: AIPerf's
	// single_turn, multi_turn, random_pool and mooncake_trace files): each session's turns
	// are sent one after another, each with the history before it, after the turn's delay;
	// a closed loop keeps Concurrency sessions going, an open loop starts sessions on the
	// RequestRate schedule, and FixedSchedule sends every turn at its trace timestamp.
	// Warmup requests use the sessions' first turns. Records carry session and turn.
	Sessions []Session
	// FixedSchedule sends each turn at its timestamp (ms from the trace's first), AIPerf's
	// --fixed-schedule; every turn must have one (Dataset.Timed), or follow its session's
	// previous turn by its delay. Lateness against the trace is recorded per request.
	FixedSchedule bool
	// OutputTokens > 0 sends max_tokens with ignore_eos, so every request generates exactly
	// that many tokens; a prompt's own Prompt.OutputTokens takes precedence.
	OutputTokens int
	// Extra body fields for every request (temperature, seed, ...).
	Extra map[string]any

	// CancelRate is the fraction (0..1) of measured requests cancelled by the client
	// CancelDelay after they start (AIPerf's request cancellation).
	CancelRate  float64
	CancelDelay time.Duration

	// Seed drives every random choice (Poisson gaps, cancellations); 0 picks one, and the
	// seed used is returned in Result.Seed so the run can be repeated.
	Seed uint64

	// Tokenizer, when set, counts output tokens on the client side (OutputTokensClient).
	Tokenizer Tokenizer

	// RequestTimeout bounds each request (0: none).
	RequestTimeout time.Duration
	// RunID prefixes request IDs (default: random hex), which are RunID-w<n> / RunID-<n>.
	RunID string
	// Progress receives a progress bar (terminal) or plain progress lines; nil for none.
	// ProgressLabel names the point in it ("concurrency 4 (2/5)"); ProgressSweep, when set,
	// adds what it returns (the sweep's ETA) given the point's time left (< 0: unknown).
	Progress      io.Writer
	ProgressLabel string
	ProgressSweep func(pointLeft time.Duration) string

	// OnPhase, when set, is called as each phase ("warmup", "profiling") starts and ends;
	// Profile uses it to read server CPU times over the measured window only.
	OnPhase func(phase string, start bool)

	// MixWarmupIntoMeasurement plants the "warmup mixed into measurement" defect: warmup
	// requests are labelled "profiling". Only tests proving that the LoadProfile gate bites
	// set it.
	MixWarmupIntoMeasurement bool
}

// Result is what a run recorded.
type Result struct {
	// Records holds every request, warmup first, in issue order.
	Records []records.Request
	// Epoch is the run start; records' ScheduledNs are measured from it.
	Epoch       time.Time
	StartUnixNs int64
	// RampStartNs is where a ramp (Config.RampUp) began, its schedule's origin (ns since
	// Epoch; 0 without a ramp). ProfilingStartNs and ProfilingEndNs bound the measured phase.
	RampStartNs      int64
	ProfilingStartNs int64
	ProfilingEndNs   int64
	// ClientCPU is this process's user+system CPU time over the measured phase.
	ClientCPU time.Duration
	// Seed is the seed used.
	Seed uint64
	// Mode is "concurrency" or "request_rate"; Concurrency and RequestRate echo the point.
	Mode        string
	Concurrency int
	RequestRate float64
	// Pacer says how an open loop kept its schedule: the clock it slept on and the scheduling
	// policy of its thread (SCHED_FIFO, or the normal class where that was refused); the
	// lateness figures are read with it. Empty for other runs.
	Pacer string
}

// Validate checks a Config, naming the field at fault.
func (c *Config) Validate() error {
	switch {
	case c.Client == nil && c.BaseURL == "":
		return errors.New("load.Run: Config.BaseURL is empty and no Config.Client given")
	case c.Endpoint != client.Completions && c.Endpoint != client.Chat && c.Endpoint != EndpointGRPC:
		return fmt.Errorf("load.Run: Config.Endpoint %q must be %q, %q or %q", c.Endpoint, client.Completions, client.Chat, EndpointGRPC)
	case c.RequestRate < 0 || math.IsNaN(c.RequestRate) || math.IsInf(c.RequestRate, 0):
		return fmt.Errorf("load.Run: Config.RequestRate %v must be a positive number", c.RequestRate)
	case c.FixedSchedule && len(c.Sessions) == 0:
		return errors.New("load.Run: Config.FixedSchedule needs Config.Sessions with timestamps (an input file with --custom-dataset-type)")
	case c.RequestRate == 0 && c.Concurrency < 1 && !c.FixedSchedule:
		return fmt.Errorf("load.Run: Config.Concurrency %d must be at least 1 for a closed loop (or set RequestRate)", c.Concurrency)
	case c.Requests < 0 || c.Duration < 0 || c.Warmup < 0 || c.RampUp < 0:
		return errors.New("load.Run: Config.Requests, Duration, Warmup and RampUp must not be negative")
	case c.RampUp > 0 && (len(c.Sessions) > 0 || c.FixedSchedule):
		return errors.New("load.Run: Config.RampUp ramps prompts at a rate or concurrency; sessions and fixed schedules (--custom-dataset-type, --fixed-schedule) keep their own timing, so leave RampUp 0")
	case c.Requests == 0 && c.Duration == 0 && len(c.Sessions) == 0:
		return errors.New("load.Run: set Config.Requests or Config.Duration to say when the run stops")
	case len(c.Prompts) == 0 && len(c.Sessions) == 0:
		return errors.New("load.Run: Config.Prompts is empty; read a corpus (ReadCorpus) or make synthetic prompts (Synthetic)")
	case c.CancelRate < 0 || c.CancelRate > 1:
		return fmt.Errorf("load.Run: Config.CancelRate %v must be within [0, 1]", c.CancelRate)
	case c.Arrival != "" && c.Arrival != ArrivalConstant && c.Arrival != ArrivalPoisson:
		return fmt.Errorf("load.Run: Config.Arrival %q must be %q or %q", c.Arrival, ArrivalConstant, ArrivalPoisson)
	}
	for i, p := range c.Prompts {
		if c.Endpoint != client.Chat && p.Prompt == "" {
			return fmt.Errorf("load.Run: prompt %d (%s) has no text for the completions endpoint (chat prompts need --endpoint chat)", i, p.Name)
		}
	}
	return nil
}

func (c *Config) phase(name string, start bool) {
	if c.OnPhase != nil {
		c.OnPhase(name, start)
	}
}

// run holds the state shared by a run's workers.
type run struct {
	cfg    *Config
	cl     *client.Client
	epoch  time.Time
	bodies [][]byte    // prebuilt request bodies, one per prompt
	grpc   *grpcClient // EndpointGRPC (grpc.go)
	recs   []records.Request
	pacer  string // the open loop's pacer (Result.Pacer)
}

// newSeed picks a random nonzero seed (0 means "pick one").
func newSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// Run performs one load run and returns every request's record. The error reports a
// configuration problem or a cancelled context; failed requests are recorded, not returned
// as errors (the caller's gate decides what failures mean).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = newSeed()
	}
	if cfg.RunID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.RunID = hex.EncodeToString(b[:])
	}
	if cfg.Arrival == "" {
		cfg.Arrival = ArrivalPoisson // AIPerf's default
	}
	if len(cfg.Prompts) == 0 {
		for _, s := range cfg.Sessions {
			if len(s.Turns) > 0 {
				cfg.Prompts = append(cfg.Prompts, s.Turns[0].Prompt)
			}
		}
	}
	inflight := cfg.Concurrency
	if cfg.RequestRate > 0 {
		inflight = cfg.MaxConcurrency
		if inflight == 0 {
			// Enough idle connections for the expected in-flight count at typical latencies.
			inflight = max(64, int(cfg.RequestRate))
		}
	}
	cl := cfg.Client
	var gc *grpcClient
	if cfg.Endpoint == EndpointGRPC {
		var err error
		if gc, err = newGRPCClient(&cfg); err != nil {
			return nil, err
		}
		defer gc.conn.Close()
	} else if cl == nil {
		var err error
		cl, err = client.New(client.Options{BaseURL: cfg.BaseURL, Model: cfg.Model, APIKey: cfg.APIKey,
			Concurrency: inflight, Timeout: cfg.RequestTimeout})
		if err != nil {
			return nil, err
		}
		defer cl.Close()
	}
	r := &run{cfg: &cfg, cl: cl, grpc: gc}
	if err := r.buildBodies(); err != nil {
		return nil, err
	}
	res := &Result{Seed: cfg.Seed, Concurrency: cfg.Concurrency, RequestRate: cfg.RequestRate, Mode: "concurrency"}
	if cfg.RequestRate > 0 {
		res.Mode = "request_rate"
		res.Concurrency = cfg.MaxConcurrency
	}
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x6c6f6164))
	prog := newProgress(&cfg)
	defer prog.stop()

	r.epoch = time.Now()
	res.Epoch = r.epoch
	res.StartUnixNs = r.epoch.UnixNano()

	// Warmup: a closed loop, recorded apart.
	if cfg.Warmup > 0 {
		phase := records.PhaseWarmup
		if cfg.MixWarmupIntoMeasurement {
			phase = records.PhaseProfiling
		}
		wc := cfg.Concurrency
		if cfg.RequestRate > 0 {
			wc = max(1, min(cfg.MaxConcurrency, cfg.Warmup))
		}
		wc = max(wc, 1) // a fixed schedule has no concurrency of its own
		prog.setPhase("warmup", cfg.Warmup)
		cfg.phase(records.PhaseWarmup, true)
		recs := r.closedLoop(ctx, phase, "w", wc, cfg.Warmup, 0, nil, prog)
		cfg.phase(records.PhaseWarmup, false)
		r.recs = append(r.recs, recs...)
		if err := ctx.Err(); err != nil {
			res.Records = r.recs
			return res, fmt.Errorf("load.Run: cancelled during warmup: %w", err)
		}
	}

	// Measured phase: decide cancellations up front so they depend only on the seed.
	n := cfg.Requests
	if n == 0 {
		n = -1
	}
	var cancel func(i int) (bool, time.Duration)
	if cfg.CancelRate > 0 {
		var mu sync.Mutex
		decided := map[int]bool{}
		cancel = func(i int) (bool, time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			v, ok := decided[i]
			if !ok {
				// Draw in index order so decisions depend only on the seed.
				for k := len(decided); k <= i; k++ {
					decided[k] = rng.Float64() < cfg.CancelRate
				}
				v = decided[i]
			}
			return v, cfg.CancelDelay
		}
	}
	// The measured phase starts now, or where a ramp ends (ramp.go): its start is marked once,
	// by a timer at the ramp's end or by the first measured request, whichever comes first.
	var cpu0 time.Duration
	begin := func() {
		prog.setPhase("profiling", cfg.Requests)
		cfg.phase(records.PhaseProfiling, true)
		cpu0 = cpuTime()
		res.ProfilingStartNs = int64(time.Since(r.epoch))
	}
	var recs, ramp []records.Request
	if cfg.RampUp > 0 {
		prog.setPhase("ramp-up", 0)
		prog.setRamp(cfg.RampUp)
		rampStart := time.Since(r.epoch)
		res.RampStartNs = int64(rampStart)
		mark := newPhaseMark(begin, r.epoch, rampStart+cfg.RampUp)
		if cfg.RequestRate > 0 {
			recs = r.openLoopRamped(ctx, rng, n, cancel, prog, rampStart)
		} else {
			recs = r.closedLoopRamped(ctx, n, cancel, prog, rampStart, mark)
		}
		mark.wait()
		ramp, recs = splitRamp(recs)
	} else {
		begin()
		if len(cfg.Sessions) > 0 {
			recs = r.runSessions(ctx, rng, n, cancel, prog)
			if cfg.FixedSchedule {
				res.Mode = "fixed_schedule"
			}
		} else if cfg.RequestRate > 0 {
			recs = r.openLoop(ctx, rng, n, cancel, prog)
		} else {
			recs = r.closedLoop(ctx, records.PhaseProfiling, "", cfg.Concurrency, n, cfg.Duration, cancel, prog)
		}
	}
	res.Pacer = r.pacer // set by the open loop and the sessions' timeline, empty otherwise
	res.ProfilingEndNs = int64(time.Since(r.epoch))
	res.ClientCPU = cpuTime() - cpu0
	cfg.phase(records.PhaseProfiling, false)
	r.recs = append(append(r.recs, ramp...), recs...)
	res.Records = r.recs
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("load.Run: cancelled: %w", err)
	}
	return res, nil
}

// buildBodies prebuilds one request body per prompt so the hot path only sends bytes.
func (r *run) buildBodies() error {
	cfg := r.cfg
	r.bodies = make([][]byte, len(cfg.Prompts))
	for i, p := range cfg.Prompts {
		maxTokens := cfg.OutputTokens
		if p.OutputTokens > 0 {
			maxTokens = p.OutputTokens
		}
		if r.grpc != nil {
			b, err := grpcRequest(cfg, p, maxTokens)
			if err != nil {
				return fmt.Errorf("load.Run: prompt %d (%s): %w", i, p.Name, err)
			}
			r.bodies[i] = b
			continue
		}
		req := client.Request{Endpoint: cfg.Endpoint, Stream: cfg.Stream, Prompt: p.Prompt,
			MaxTokens: maxTokens, IgnoreEOS: maxTokens > 0}
		extra := map[string]any{}
		for k, v := range cfg.Extra {
			extra[k] = v
		}
		if cfg.Endpoint == client.Chat {
			req.Messages = p.Messages
			if len(req.Messages) == 0 {
				m, _ := json.Marshal([]map[string]string{{"role": "user", "content": p.Prompt}})
				req.Messages = m
			}
			if p.AddGenerationPrompt != nil {
				extra["add_generation_prompt"] = *p.AddGenerationPrompt
			}
			if len(p.ChatTemplateKwargs) > 0 {
				extra["chat_template_kwargs"] = p.ChatTemplateKwargs
			}
		}
		req.Extra = extra
		b, err := r.cl.BuildBody(&req)
		if err != nil {
			return fmt.Errorf("load.Run: prompt %d (%s): %w", i, p.Name, err)
		}
		r.bodies[i] = b
	}
	return nil
}

// exchange is one request in flight and the state kept across a worker's requests (the
// response's buffers, the client's Pending), so that sending allocates little.
type exchange struct {
	req         client.Request
	resp        client.Response
	p           client.Pending
	phase       string
	worker      string
	seq         int
	inputTokens int
}

// one sends request number seq of a phase and returns its record.
func (r *run) one(ctx context.Context, phase, idPrefix string, seq int, worker string, cancel func(int) (bool, time.Duration), x *exchange) records.Request {
	pi := seq % len(r.cfg.Prompts)
	return r.send(ctx, phase, idPrefix, seq, r.bodies[pi], r.cfg.Prompts[pi].InputTokens, worker, cancel, x, "", 0)
}

// send sends body as request number seq of a phase (of session sid, turn turn, when sid is
// set) and returns its record.
func (r *run) send(ctx context.Context, phase, idPrefix string, seq int, body []byte, inputTokens int, worker string, cancel func(int) (bool, time.Duration), x *exchange, sid string, turn int) records.Request {
	r.begin(ctx, x, phase, idPrefix, seq, body, inputTokens, worker, cancel, sid, turn)
	return r.end(ctx, x)
}

// begin starts request number seq in x: over HTTP it is written before begin returns (see
// client.Begin); gRPC requests are sent by end.
func (r *run) begin(ctx context.Context, x *exchange, phase, idPrefix string, seq int, body []byte, inputTokens int, worker string, cancel func(int) (bool, time.Duration), sid string, turn int) {
	r.prepare(ctx, x, phase, idPrefix, seq, body, inputTokens, worker, cancel, sid, turn)
	x.p.Send()
}

// prepare readies request number seq in x for x.p.Send (client.Prepare): what is left to do at
// the request's instant is to stamp its start and write it. gRPC requests are sent by end.
func (r *run) prepare(ctx context.Context, x *exchange, phase, idPrefix string, seq int, body []byte, inputTokens int, worker string, cancel func(int) (bool, time.Duration), sid string, turn int) {
	cfg := r.cfg
	x.phase, x.worker, x.seq, x.inputTokens = phase, worker, seq, inputTokens
	x.req = client.Request{ID: cfg.RunID + "-" + idPrefix + strconv.Itoa(seq), Endpoint: cfg.Endpoint, Stream: cfg.Stream,
		Body: body, SessionID: sid, Turn: turn}
	if cancel != nil {
		if yes, d := cancel(seq); yes {
			// The client arms the cancellation when it stamps the start, so the request is
			// cancelled d after StartNs (not d after this point, which is earlier).
			x.req.CancelAfter = max(d, 1)
		}
	}
	if r.grpc == nil {
		r.cl.Prepare(ctx, r.epoch, &x.req, &x.resp, &x.p)
	}
}

// end waits for the request that begin started in x and returns its record.
func (r *run) end(ctx context.Context, x *exchange) records.Request {
	cfg := r.cfg
	if r.grpc != nil {
		r.grpc.do(ctx, r.epoch, cfg.RequestTimeout, &x.req, &x.resp)
	} else {
		_ = x.p.Wait()
	}
	resp := &x.resp
	rec := toRecord(resp, cfg, x.phase, x.seq, x.worker, x.inputTokens)
	if resp.Cancelled && ctx.Err() != nil {
		// The run itself was cancelled; this is not a planned cancellation.
		rec.Cancelled = false
		rec.CancelNs = 0
		rec.Error = &records.Error{Code: 0, Type: "RunCancelled", Message: "the load run was cancelled before this request finished"}
	}
	return rec
}

// toRecord converts the client's measurement (times since the run epoch) into a record
// whose times are since the request start.
func toRecord(resp *client.Response, cfg *Config, phase string, seq int, worker string, inputTokens int) records.Request {
	rec := records.Request{
		RequestID:          resp.RequestID,
		Phase:              phase,
		SessionNum:         seq,
		WorkerID:           worker,
		Endpoint:           cfg.Endpoint,
		Stream:             cfg.Stream,
		StartUnixNs:        resp.StartUnixNs,
		ConversationID:     resp.RequestID, // a session's own ID replaces it (sessions.go)
		HTTPStatus:         resp.Status,
		Cancelled:          resp.Cancelled,
		InputTokens:        inputTokens,
		InputTokensServer:  resp.PromptTokens,
		OutputTokensServer: resp.CompletionTokens,
		ResponseBytes:      resp.ResponseBytes,
		FinishReason:       resp.FinishReason,
	}
	s := resp.StartNs
	if resp.AckNs > 0 {
		rec.AckNs = resp.AckNs - s
	}
	rec.EndNs = resp.EndNs - s
	if len(resp.ChunkNs) > 0 {
		rec.ChunkNs = make([]int64, len(resp.ChunkNs))
		for i, t := range resp.ChunkNs {
			rec.ChunkNs[i] = t - s
		}
	}
	if resp.Cancelled {
		rec.CancelNs = resp.CancelNs - s
	}
	if resp.Err != nil {
		rec.Error = &records.Error{Code: resp.Err.Code, Type: resp.Err.Type, Message: resp.Err.Message}
	}
	if cfg.Tokenizer != nil && len(resp.Text) > 0 {
		rec.OutputTokensClient = len(cfg.Tokenizer.Encode(string(resp.Text)))
	}
	return rec
}

// closedLoop keeps c requests in flight until n requests were issued (n < 0: no count
// limit) or d elapsed (d == 0: no time limit).
func (r *run) closedLoop(ctx context.Context, phase, idPrefix string, c, n int, d time.Duration, cancel func(int) (bool, time.Duration), prog *progress) []records.Request {
	var next atomic.Int64
	var deadline time.Time
	if d > 0 {
		deadline = time.Now().Add(d)
	}
	out := make([][]records.Request, c)
	if n > 0 {
		// Each worker's share and some more, allocated before the first request (as the open
		// loop's records are): growing by appends copies every record so far.
		for w := range out {
			out[w] = make([]records.Request, 0, min(n/c+n/(4*c)+1, 1<<20))
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			worker := fmt.Sprintf("worker-%d", w)
			var x exchange
			for ctx.Err() == nil {
				if d > 0 && !time.Now().Before(deadline) {
					return
				}
				seq := int(next.Add(1) - 1)
				if n >= 0 && seq >= n {
					return
				}
				rec := r.one(ctx, phase, idPrefix, seq, worker, cancel, &x)
				out[w] = append(out[w], rec)
				prog.add(rec.Error != nil)
			}
		}(w)
	}
	wg.Wait()
	return mergeBySeq(out)
}

// openLoop issues requests on an absolute schedule at cfg.RequestRate.
//
// One dispatcher goroutine, on its own OS thread (SCHED_FIFO where allowed), prepares each
// request before its send time (client.Prepare: a pooled connection taken, the request's bytes
// laid out, the connection registered with the reader), sleeps in the kernel until shortly
// before the send time (pacer: clock_nanosleep with a 1 ns timer slack, then a spin of an
// adaptive margin), and writes the request itself (Pending.Send) before it hands the exchange
// to a worker goroutine that was already waiting, which collects the answer and makes the
// record. So what a request's lateness measures is the time its first byte was written minus
// its scheduled time, with nothing between the two but the wake-up and the write: no goroutine
// to schedule, no dial, no body to build, no system call but the write. Workers are reused (a
// new one is started only when none is idle), so in-flight requests are never limited by the
// pool.
func (r *run) openLoop(ctx context.Context, rng *mrand.Rand, n int, cancel func(int) (bool, time.Duration), prog *progress) []records.Request {
	return r.openLoopRamped(ctx, rng, n, cancel, prog, -1)
}

// openLoopRamped is openLoop, after a ramp (ramp.go) from rampStart when cfg.RampUp > 0
// (rampStart < 0: none): the ramp's sends are warmup, then n measured requests (or
// cfg.Duration from the ramp's end) follow on the same schedule.
func (r *run) openLoopRamped(ctx context.Context, rng *mrand.Rand, n int, cancel func(int) (bool, time.Duration), prog *progress, rampStart time.Duration) []records.Request {
	cfg := r.cfg
	var sem chan struct{}
	if cfg.MaxConcurrency > 0 {
		sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	if r.cl != nil {
		// Errors surface as the requests' own (a dead server fails them all).
		_ = r.cl.Prewarm(ctx, prewarmConns(cfg.RequestRate, cfg.MaxConcurrency))
	}
	mean := float64(time.Second) / cfg.RequestRate
	var mu sync.Mutex
	// Sized for the whole run up front, so that the measured phase makes almost no garbage:
	// growing it by appends reallocates and copies every record so far, and a collection during
	// the schedule puts a dedicated mark worker on one of the processors that the dispatcher and
	// the workers share, so the dispatcher, back from its sleep, waits for a processor. Then one
	// collection before the first instant, so that the heap's next goal (twice what is live,
	// these records included) lies beyond what the run will allocate. Measured against the mock
	// at 10,000 req/s on 2 cores: lateness p99 1-9 ms with the appends, 0.7-1.7 ms preallocated,
	// 0.15-0.19 ms with the client's collector off.
	expect := n
	if n < 0 {
		expect = int(cfg.RequestRate*cfg.Duration.Seconds()*1.1) + 64
	}
	ramp := time.Duration(0)
	if rampStart >= 0 {
		ramp = cfg.RampUp
		expect += int(cfg.RequestRate*ramp.Seconds()/2*1.1) + 16
	}
	recs := make([]records.Request, 0, min(max(expect, 0), 1<<20))
	runtime.GC()
	start := time.Since(r.epoch)
	if rampStart >= 0 {
		start = rampStart
	}
	var durEnd time.Duration
	if cfg.Duration > 0 {
		durEnd = start + ramp + cfg.Duration
	}
	var wg sync.WaitGroup

	type slot struct {
		x     exchange
		sched time.Duration
		go_   chan bool // true: collect the exchange begun in x; false: exit
	}
	var idleMu sync.Mutex
	var idle []*slot
	var all []*slot
	var inflight sync.WaitGroup
	worker := func(s *slot) {
		defer wg.Done()
		for <-s.go_ {
			rec := r.end(ctx, &s.x)
			if sem != nil {
				<-sem
			}
			rec.ScheduledNs = int64(s.sched)
			rec.LatenessNs = s.x.resp.StartNs - int64(s.sched)
			mu.Lock()
			recs = append(recs, rec)
			mu.Unlock()
			prog.addIn(rec.Phase, rec.Error != nil)
			idleMu.Lock()
			idle = append(idle, s)
			idleMu.Unlock()
			inflight.Done()
		}
	}
	take := func() *slot {
		idleMu.Lock()
		defer idleMu.Unlock()
		if k := len(idle); k > 0 {
			s := idle[k-1]
			idle = idle[:k-1]
			return s
		}
		s := &slot{go_: make(chan bool, 1)}
		all = append(all, s)
		wg.Add(1)
		go worker(s)
		return s
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		// The dispatcher's thread stays locked until the goroutine ends, and is then
		// discarded with the timer slack the pacer set on it.
		pc := newPacer(r.epoch, time.Duration(mean))
		r.pacer = pc.describe()
		sch := rampSchedule{rng: rng, poisson: cfg.Arrival == ArrivalPoisson, rate: cfg.RequestRate, start: start, ramp: ramp}
		rampN := 0
		for seq := 0; n < 0 || seq < n; {
			sched, inRamp := sch.next()
			if durEnd > 0 && sched >= durEnd {
				break
			}
			// Everything but the write is done before the wait (client.Prepare).
			s := take()
			s.sched = sched
			if inRamp {
				k := cfg.Warmup + rampN
				rampN++
				pi := k % len(cfg.Prompts)
				r.prepare(ctx, &s.x, records.PhaseWarmup, "u", k, r.bodies[pi], cfg.Prompts[pi].InputTokens, "scheduler", nil, "", 0)
			} else {
				pi := seq % len(cfg.Prompts)
				r.prepare(ctx, &s.x, records.PhaseProfiling, "", seq, r.bodies[pi], cfg.Prompts[pi].InputTokens, "scheduler", cancel, "", 0)
				seq++
			}
			ok := pc.wait(ctx, sched)
			if ok && sem != nil {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					ok = false
				}
			}
			if !ok {
				s.x.p.Discard()
				idleMu.Lock()
				idle = append(idle, s)
				idleMu.Unlock()
				break
			}
			s.x.p.Send()
			inflight.Add(1)
			s.go_ <- true
		}
	}()
	<-done
	inflight.Wait() // every exchange recorded: the workers are idle
	for _, s := range all {
		s.go_ <- false
	}
	wg.Wait()
	out := [][]records.Request{recs}
	return mergeBySeq(out)
}

// prewarmConns is how many connections an open loop opens before its first send: the
// in-flight count the rate reaches at 50 ms per request, so that a stall of the server (or of
// this process) that piles requests up does not leave the dispatcher dialling in front of its
// next instants (more are dialled when needed, ahead of their requests' instants, and the pool
// refills in the background), bounded by the concurrency cap.
func prewarmConns(rate float64, maxConcurrency int) int {
	n := min(1024, max(16, int(rate/20)))
	if maxConcurrency > 0 {
		n = min(n, maxConcurrency)
	}
	return n
}

// spinWindow is how long before a scheduled start the scheduler stops sleeping and spins:
// Go's timers can fire up to about a millisecond late when the process is otherwise idle,
// which would swamp the 100 µs lateness target of an open-loop schedule.
const spinWindow = 300 * time.Microsecond

// sleepUntil waits until epoch+at (monotonic), sleeping for most of the wait and spinning
// with yields for the last spinWindow. It returns false when ctx ends first.
func sleepUntil(ctx context.Context, epoch time.Time, at time.Duration) bool {
	for {
		left := at - time.Since(epoch)
		if left <= 0 {
			return ctx.Err() == nil
		}
		if left > spinWindow {
			t := time.NewTimer(left - spinWindow)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false
			}
			continue
		}
		if ctx.Err() != nil {
			return false
		}
		for time.Since(epoch) < at {
			runtimeGosched()
		}
		return ctx.Err() == nil
	}
}

// mergeBySeq flattens per-worker records into sequence order.
func mergeBySeq(parts [][]records.Request) []records.Request {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	out := make([]records.Request, 0, total)
	for _, p := range parts {
		out = append(out, p...)
	}
	sortBySeq(out)
	return out
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
