package server

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/cpuset"
	"github.com/modelqual/modelqual/server/wire"
)

// WorkerCommand is the first argument that puts the qual-server binary into worker mode.
const WorkerCommand = "worker"

// task is one request's life in an engine: submitted to a worker, fed tokens by the worker's
// reader goroutine, ended by the worker's Done (or by the worker's death).
//
// Hand-off between the reader and the HTTP handler is a mutex-protected token slice plus a
// one-slot notify channel: the reader appends every token it has read and, once it has caught
// up with the worker, signals each task once; the handler swaps the slice out and writes all
// of it with one flush. No channel operation or allocation per token.
type task struct {
	id     uint64
	prompt []int32
	samp   wire.Sampling
	logits bool
	image  *wire.ImageRequest // a text-to-image request (images.go)
	vision *wire.ImageInput   // a vision-language chat request's one image (chat_image.go)

	worker    *workerProc
	assigned  chan struct{} // closed when a queued task gets a slot
	queuedAt  time.Time
	queueWait time.Duration

	notify chan struct{}
	mu     sync.Mutex
	toks   []int32
	lps    []*wire.Logprobs // toks' logprobs, index for index, when samp.Logprobs
	done   bool
	res    wire.Done
	fail   error // the worker died or the request never reached an engine
	logitV []byte
	vocab  int
	imgRes wire.ImageAnswer // the worker's answer to image (PNG copied out of the frame)

	// owned by the worker's reader goroutine
	started bool // a token has been read for this task
	pending bool // in the reader's list of tasks to signal
}

func (t *task) signal() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// take swaps the pending tokens out (spare becomes the new pending buffer) and reports whether
// the task has ended.
func (t *task) take(spare []int32) (toks []int32, done bool) {
	toks, _, done = t.takeLogprobs(spare, nil)
	return toks, done
}

// takeLogprobs is take that also swaps out the tokens' logprobs (nil unless the request asked
// for them), so that tokens and their logprobs always move together.
func (t *task) takeLogprobs(spare []int32, spareLP []*wire.Logprobs) (toks []int32, lps []*wire.Logprobs, done bool) {
	t.mu.Lock()
	toks, t.toks = t.toks, spare[:0]
	if t.lps != nil {
		lps, t.lps = t.lps, spareLP[:0]
	}
	done = t.done
	t.mu.Unlock()
	return toks, lps, done
}

func (t *task) finish(d wire.Done, fail error) {
	t.mu.Lock()
	if !t.done {
		t.done, t.res, t.fail = true, d, fail
	}
	t.mu.Unlock()
	t.signal()
}

// workerProc is one worker process and its pipes.
type workerProc struct {
	index int // stable slot number: a replacement takes its predecessor's index
	gen   int // how many processes this slot has had
	cmd   *exec.Cmd
	info  wire.Info

	wmu sync.Mutex // serializes frames to the worker
	out *wire.Writer
	in  io.Closer // parent's write end, closed to end the session

	mu    sync.Mutex
	tasks map[uint64]*task

	// guarded by pool.mu
	alive    bool
	inflight int
	exited   chan struct{}
	exitErr  error
}

func (w *workerProc) send(fn func(*wire.Writer)) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	fn(w.out)
	return w.out.Flush()
}

// PoolConfig is what every worker process is started with; a replacement gets the same.
type PoolConfig struct {
	Exe            string // the qual-server binary (os.Executable)
	Bundle         string
	Workers        int
	MaxBatch       int // 0: the bundle's build setting
	QueueDepth     int
	Device         string
	Threads        int
	StartupTimeout time.Duration
	Env            []string // nil: inherit
	// Verified is the frontend's verification of Bundle; workers map the file with it rather
	// than hashing it again. A worker that finds the file changed hashes it itself, and is
	// refused unless its digest is still this one.
	Verified bundle.Verified
	// WorkerCPUs pins every worker process (and its engine's threads) to these CPUs; empty:
	// unpinned.
	WorkerCPUs cpuset.Set
}

// pool supervises the worker processes and schedules tasks onto their batch slots.
type pool struct {
	cfg     PoolConfig
	m       *metrics
	nextID  atomic.Uint64
	mu      sync.Mutex
	workers []*workerProc
	waiting []*task
	closing bool
	info    wire.Info // from the first worker that said hello
	hasInfo bool
	wg      sync.WaitGroup // supervisor goroutines
	// spawnErr is the last failure to start a replacement worker, cleared when one starts.
	// With no worker alive it fails requests at once (503) instead of queueing them for a
	// worker that may never come.
	spawnErr error
}

// NoWorkerError is why a request was refused because no worker is alive and the last attempt
// to start one failed.
type NoWorkerError struct{ Cause error }

func (e *NoWorkerError) Error() string {
	return "no worker can start: " + e.Cause.Error()
}

// unavailableLocked reports why no request can be served now, or nil.
func (p *pool) unavailableLocked() error {
	if p.spawnErr == nil {
		return nil
	}
	for _, w := range p.workers {
		if w != nil && w.alive {
			return nil
		}
	}
	return &NoWorkerError{Cause: p.spawnErr}
}

// Unavailable is unavailableLocked for /health.
func (p *pool) unavailable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unavailableLocked()
}

var (
	errQueueFull = errors.New("queue full")
	errClosing   = errors.New("server shutting down")
)

func newPool(cfg PoolConfig, m *metrics) *pool {
	return &pool{cfg: cfg, m: m, workers: make([]*workerProc, cfg.Workers)}
}

// start launches every worker in parallel and waits until all said hello (or one failed).
func (p *pool) start() error {
	errs := make(chan error, p.cfg.Workers)
	for i := 0; i < p.cfg.Workers; i++ {
		go func(i int) { errs <- p.spawn(i, 0) }(i)
	}
	var first error
	for i := 0; i < p.cfg.Workers; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (p *pool) workerArgs() []string {
	args := []string{WorkerCommand, "--bundle", p.cfg.Bundle, "--device", p.cfg.Device,
		"--threads", fmt.Sprint(p.cfg.Threads), "--max-batch", fmt.Sprint(p.cfg.MaxBatch)}
	if p.cfg.Verified.SHA256 != "" {
		v, _ := p.cfg.Verified.MarshalText() // cannot fail
		args = append(args, "--bundle-verified", string(v))
	}
	if len(p.cfg.WorkerCPUs) > 0 {
		args = append(args, "--cpus", p.cfg.WorkerCPUs.String())
	}
	return args
}

// spawn starts worker process number index, waits for its hello and starts its reader.
func (p *pool) spawn(index, gen int) error {
	toR, toW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("worker %d: pipe: %w", index, err)
	}
	fromR, fromW, err := os.Pipe()
	if err != nil {
		toR.Close()
		toW.Close()
		return fmt.Errorf("worker %d: pipe: %w", index, err)
	}
	cmd := exec.Command(p.cfg.Exe, p.workerArgs()...)
	cmd.ExtraFiles = []*os.File{toR, fromW} // fd 3: requests in, fd 4: events out
	cmd.Stdout = os.Stderr                  // native code must never write into the protocol
	cmd.Stderr = os.Stderr
	cmd.Env = p.cfg.Env
	// The worker dies with its parent: Linux delivers SIGKILL when the parent exits, so a
	// killed frontend never leaves engines holding memory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		toR.Close()
		toW.Close()
		fromR.Close()
		fromW.Close()
		return fmt.Errorf("start worker %d (%s): %w", index, p.cfg.Exe, err)
	}
	toR.Close()
	fromW.Close()
	w := &workerProc{index: index, gen: gen, cmd: cmd, out: wire.NewWriter(toW), in: toW,
		tasks: map[uint64]*task{}, exited: make(chan struct{})}
	go func() {
		w.exitErr = cmd.Wait()
		close(w.exited)
	}()

	r := wire.NewReader(fromR)
	type helloResult struct {
		h   wire.Hello
		err error
	}
	hc := make(chan helloResult, 1)
	go func() {
		typ, pl, err := r.Next()
		switch {
		case err != nil:
			hc <- helloResult{err: fmt.Errorf("read hello: %w", err)}
		case typ == wire.TypeFatal:
			hc <- helloResult{err: errors.New(string(pl))}
		case typ != wire.TypeHello:
			hc <- helloResult{err: fmt.Errorf("first frame has type %d, want hello", typ)}
		default:
			h, err := wire.DecodeHello(pl)
			hc <- helloResult{h: h, err: err}
		}
	}()
	var hr helloResult
	select {
	case hr = <-hc:
	case <-time.After(p.cfg.StartupTimeout):
		hr.err = fmt.Errorf("no hello within --startup-timeout %v", p.cfg.StartupTimeout)
	}
	if hr.err == nil && hr.h.Version != wire.Version {
		hr.err = fmt.Errorf("protocol version %d, this frontend speaks %d; the worker binary is from another build", hr.h.Version, wire.Version)
	}
	if hr.err == nil && hr.h.Caps&wire.AllCaps != wire.AllCaps {
		hr.err = fmt.Errorf("capabilities %#x lack required %#x", hr.h.Caps, wire.AllCaps)
	}
	if want := p.cfg.Verified.SHA256; hr.err == nil && want != "" {
		switch got := hr.h.Info.BundleDigest; {
		case got == "":
			hr.err = errors.New("its hello does not name the bundle's sha256; the worker binary is from another build")
		case got != want:
			hr.err = fmt.Errorf("it serves bundle %s with sha256 %s, but qual-server verified sha256 %s at start: the file was replaced; restart qual-server to serve the new file",
				p.cfg.Bundle, got, want)
		}
	}
	if hr.err != nil {
		_ = cmd.Process.Kill()
		toW.Close()
		fromR.Close()
		<-w.exited
		if w.exitErr != nil {
			return fmt.Errorf("worker %d (pid %d) failed to start: %v (exit: %v)", index, cmd.Process.Pid, hr.err, w.exitErr)
		}
		return fmt.Errorf("worker %d (pid %d) failed to start: %v", index, cmd.Process.Pid, hr.err)
	}
	w.info = hr.h.Info

	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		toW.Close()
		fromR.Close()
		<-w.exited
		return errClosing
	}
	if !p.hasInfo {
		p.info, p.hasInfo = w.info, true
	}
	w.alive = true
	p.spawnErr = nil
	p.workers[index] = w
	p.m.workersReady.Inc()
	p.assignWaitingLocked(w)
	p.mu.Unlock()
	log.Printf("worker %d ready: pid %d, %s on %s, batch %d, context %d, loaded in %v",
		index, w.info.PID, w.info.Family, w.info.Device, w.info.MaxBatch, w.info.MaxContext, time.Duration(w.info.LoadNs))

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.read(w, r)
		fromR.Close()
		p.died(w)
	}()
	return nil
}

// read is the worker's reader goroutine: the frontend's side of the hot path.
func (p *pool) read(w *workerProc, r *wire.Reader) {
	// Tasks with new tokens are signalled once the reader has caught up with the worker, and
	// tasks receiving their first token are signalled before the others: Go runs readied
	// goroutines in order (but for the last one readied, which runs first). Under load every
	// stream's handler is runnable at once, and closed-loop clients arrive in bursts; without
	// this a new request's first token waits behind a whole round of other streams' writes,
	// which is its time to first token.
	var ready, first []*task
	addToken := func(id uint64, tok int32, lp *wire.Logprobs) {
		t := w.tasks[id]
		if t == nil {
			return // ended already (e.g. cancelled after the step that produced this token)
		}
		t.mu.Lock()
		t.toks = append(t.toks, tok)
		if t.samp.Logprobs {
			t.lps = append(t.lps, lp)
		}
		t.mu.Unlock()
		if t.pending {
			return
		}
		t.pending = true
		if t.started {
			ready = append(ready, t)
		} else {
			t.started = true
			first = append(first, t)
		}
	}
	signalAll := func() {
		for _, list := range [2][]*task{first, ready} {
			for i, t := range list {
				t.pending = false
				t.signal()
				list[i] = nil
			}
		}
		ready, first = ready[:0], first[:0]
	}
	defer signalAll()
	var consumed, acked uint64 // Deltas frames handled, and acknowledged to the worker
	ack := func(out *wire.Writer) { out.Ack(consumed) }
	for {
		typ, pl, err := r.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				log.Printf("worker %d (pid %d): read: %v", w.index, w.info.PID, err)
			}
			return
		}
		switch typ {
		case wire.TypeDeltas:
			w.mu.Lock()
			err = wire.DeltasLogprobs(pl, addToken)
			w.mu.Unlock()
			consumed++
		case wire.TypeDone:
			var d wire.Done
			if d, err = wire.DecodeDone(pl); err == nil {
				if t := p.detach(w, d.ID); t != nil {
					t.finish(d, nil)
				}
			}
		case wire.TypeStep:
			var st wire.Step
			if st, err = wire.DecodeStep(pl); err == nil {
				p.m.step(st)
			}
		case wire.TypeRouting:
			err = wire.DecodeRouting(pl, p.m.routed)
		case wire.TypeImageResult:
			var a wire.ImageAnswer
			if a, err = wire.DecodeImageResult(pl); err == nil {
				if t := p.detach(w, a.ID); t != nil {
					a.PNG = append([]byte(nil), a.PNG...)
					t.mu.Lock()
					t.imgRes = a
					t.mu.Unlock()
					d := wire.Done{ID: a.ID, Reason: wire.ReasonLength}
					if a.Err != "" {
						d.Reason, d.Message = wire.ReasonError, a.Err
					}
					t.finish(d, nil)
				}
			}
		case wire.TypeLogitsResult:
			var a wire.LogitsAnswer
			if a, err = wire.DecodeLogitsResult(pl); err == nil {
				if t := p.detach(w, a.ID); t != nil {
					t.mu.Lock()
					t.logitV = append([]byte(nil), a.Data...)
					t.vocab = a.Vocab
					t.mu.Unlock()
					d := wire.Done{ID: a.ID, Reason: wire.ReasonLength, PromptTokens: uint32(a.Positions)}
					if a.Err != "" {
						d.Reason, d.Message = wire.ReasonError, a.Err
					}
					t.finish(d, nil)
				}
			}
		}
		if err != nil {
			log.Printf("worker %d (pid %d): bad frame type %d: %v; replacing it", w.index, w.info.PID, typ, err)
			_ = w.cmd.Process.Kill()
			return
		}
		if !r.Buffered() {
			// Caught up with the worker: let it step again (while behind, acks are batched),
			// then wake the handlers.
			if consumed != acked {
				acked = consumed
				_ = w.send(ack)
			}
			signalAll()
		}
	}
}

// detach removes a finished task from its worker and gives the freed slot to the oldest
// waiting task.
func (p *pool) detach(w *workerProc, id uint64) *task {
	w.mu.Lock()
	t := w.tasks[id]
	delete(w.tasks, id)
	w.mu.Unlock()
	if t == nil {
		return nil
	}
	p.mu.Lock()
	if w.alive {
		w.inflight--
		p.m.slotsInUse.Dec()
		p.assignWaitingLocked(w)
	}
	p.mu.Unlock()
	return t
}

// died fails the worker's in-flight tasks, and replaces the worker unless the pool is closing.
func (p *pool) died(w *workerProc) {
	_ = w.in.Close()
	select {
	case <-w.exited:
	case <-time.After(2 * time.Second):
		_ = w.cmd.Process.Kill() // a worker that broke the protocol but still runs
		<-w.exited
	}
	p.mu.Lock()
	w.alive = false
	p.m.slotsInUse.Sub(float64(w.inflight))
	w.inflight = 0
	p.m.workersReady.Dec()
	closing := p.closing
	p.mu.Unlock()

	w.mu.Lock()
	tasks := w.tasks
	w.tasks = map[uint64]*task{}
	w.mu.Unlock()
	why := fmt.Errorf("worker %d (pid %d) exited (%v) while serving this request; it is being replaced, retry the request", w.index, w.info.PID, exitText(w.exitErr))
	for _, t := range tasks {
		t.finish(wire.Done{ID: t.id, Reason: wire.ReasonError, Message: why.Error()}, why)
	}
	if closing {
		return
	}
	log.Printf("worker %d (pid %d) exited: %v; %d in-flight requests failed; starting a replacement", w.index, w.info.PID, exitText(w.exitErr), len(tasks))
	p.m.workerRestarts.Inc()
	for attempt := 0; ; attempt++ {
		err := p.spawn(w.index, w.gen+1)
		if err == nil || errors.Is(err, errClosing) {
			return
		}
		log.Printf("replacement for worker %d failed: %v", w.index, err)
		p.mu.Lock()
		p.spawnErr = err
		if p.unavailableLocked() != nil {
			// Nothing can serve the queue: fail it now rather than let it wait.
			for _, t := range p.waiting {
				p.m.queueDepth.Dec()
				close(t.assigned) // with no worker: run returns the reason
			}
			p.waiting = nil
		}
		p.mu.Unlock()
		time.Sleep(min(time.Duration(attempt+1)*200*time.Millisecond, 5*time.Second))
		p.mu.Lock()
		closing := p.closing
		p.mu.Unlock()
		if closing {
			return
		}
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// capacity is a worker's batch size; the scheduler never gives a worker more tasks than that,
// so a queued request waits in the frontend (bounded, measurable) rather than in the engine.
func (w *workerProc) capacity() int { return max(w.info.MaxBatch, 1) }

// assignWaitingLocked hands free slots of w to queued tasks in arrival order.
func (p *pool) assignWaitingLocked(w *workerProc) {
	for len(p.waiting) > 0 && w.alive && w.inflight < w.capacity() {
		t := p.waiting[0]
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		p.m.queueDepth.Dec()
		p.assignLocked(t, w)
		close(t.assigned)
	}
}

func (p *pool) assignLocked(t *task, w *workerProc) {
	w.inflight++
	p.m.slotsInUse.Inc()
	t.worker = w
	t.queueWait = time.Since(t.queuedAt)
	w.mu.Lock()
	w.tasks[t.id] = t
	w.mu.Unlock()
}

// newTask allocates a task with a fresh id.
func (p *pool) newTask() *task {
	return &task{id: p.nextID.Add(1), notify: make(chan struct{}, 1)}
}

// run schedules t onto a worker (waiting in the bounded queue if every slot is busy) and
// submits it. It returns errQueueFull when the queue is full, errClosing when shutting down,
// or done's cause when the caller gave up while queued.
func (p *pool) run(t *task, done <-chan struct{}, cause func() error) error {
	t.queuedAt = time.Now()
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return errClosing
	}
	if err := p.unavailableLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	var best *workerProc
	for _, w := range p.workers {
		if w != nil && w.alive && w.inflight < w.capacity() && (best == nil || w.inflight < best.inflight) {
			best = w
		}
	}
	if best != nil {
		p.assignLocked(t, best)
		p.mu.Unlock()
	} else {
		if len(p.waiting) >= p.cfg.QueueDepth {
			p.mu.Unlock()
			return errQueueFull
		}
		t.assigned = make(chan struct{})
		p.waiting = append(p.waiting, t)
		p.m.queueDepth.Inc()
		p.mu.Unlock()
		select {
		case <-t.assigned:
		case <-done:
			p.mu.Lock()
			if t.worker == nil {
				for i, q := range p.waiting {
					if q == t {
						p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
						p.m.queueDepth.Dec()
						break
					}
				}
				p.mu.Unlock()
				return cause()
			}
			p.mu.Unlock() // assigned just now: submit and let the caller cancel it
		}
	}
	w := t.worker
	if w == nil {
		p.mu.Lock()
		err := p.unavailableLocked()
		p.mu.Unlock()
		if err != nil {
			return err
		}
		return errClosing
	}
	err := w.send(func(out *wire.Writer) {
		if t.image != nil {
			_ = out.Image(t.id, *t.image)
		} else if t.logits && t.vision != nil {
			out.LogitsImage(t.id, t.prompt, t.vision)
		} else if t.logits {
			out.Logits(t.id, t.prompt)
		} else if t.vision != nil {
			out.SubmitImage(t.id, t.samp, t.prompt, t.vision)
		} else {
			out.Submit(t.id, t.samp, t.prompt)
		}
	})
	if err != nil {
		// The pipe broke: the worker is dying and died() will fail this task; make sure the
		// process is really gone so that happens now.
		_ = w.cmd.Process.Kill()
	}
	return nil
}

// cancel asks t's engine to drop it at its next step; the slot is freed when the engine
// confirms with Done.
func (p *pool) cancel(t *task) {
	if w := t.worker; w != nil {
		_ = w.send(func(out *wire.Writer) { out.Cancel(t.id) })
	}
}

// readyWorkers counts live workers.
func (p *pool) readyWorkers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range p.workers {
		if w != nil && w.alive {
			n++
		}
	}
	return n
}

// engineInfo is the engine description shared by all workers (same bundle, same settings).
func (p *pool) engineInfo() (wire.Info, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info, p.hasInfo
}

// workerPIDs lists the live workers' process ids (for benchmarks and tests).
func (p *pool) workerPIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for _, w := range p.workers {
		if w != nil && w.alive {
			pids = append(pids, w.cmd.Process.Pid)
		}
	}
	return pids
}

// close ends every worker session (EOF on its pipe) and waits for the processes, killing
// those that do not exit within grace.
func (p *pool) close(grace time.Duration) {
	p.mu.Lock()
	p.closing = true
	ws := append([]*workerProc(nil), p.workers...)
	waiting := p.waiting
	p.waiting = nil
	p.mu.Unlock()
	for _, t := range waiting {
		close(t.assigned) // with no worker: run returns errClosing
	}
	for _, w := range ws {
		if w == nil {
			continue
		}
		_ = w.in.Close()
	}
	deadline := time.After(grace)
	for _, w := range ws {
		if w == nil {
			continue
		}
		select {
		case <-w.exited:
		case <-deadline:
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
	}
	p.wg.Wait()
}
