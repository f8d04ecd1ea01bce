// Package native runs transformer inference in the C++ runtime of this directory (fp32 on CPU,
// or a CUDA backend loaded at run time) and is the project's only cgo binding.
//
// Why one package: every crossing of the Go/C boundary (pointer pinning, handle lifetimes,
// string freeing) lives in this package, so the rest of the project stays pure Go. `go build`
// compiles the runtime (native/*.cc) and, through the blank import of native/models, every
// family's model file; no separate step. The headers live in package include, which both import,
// so a header edit rebuilds both.
//
// An Engine holds one model, a KV cache with Params.MaxBatch slots, and a scheduler that
// batches every live sequence through each forward pass step by step. It is driven by one
// goroutine (Add, Step, Logits, Info, Close); only Cancel may be called concurrently.
package native

/*
#cgo CPPFLAGS: -I${SRCDIR}/include
#cgo CXXFLAGS: -O3 -std=c++17 -march=x86-64-v3 -Wall -Wno-maybe-uninitialized -Wno-comment
#cgo LDFLAGS: -lstdc++ -lm -ldl -lpthread
#include <stdlib.h>
#include "modelqual.h"

extern void mqGoEvent(mq_event *ev, uintptr_t user);

static void mq_go_event_trampoline(const mq_event *ev, void *user) {
	mqGoEvent((mq_event *)ev, (uintptr_t)user);
}

static mq_status mq_go_step(mq_engine *e, uintptr_t user, int32_t *active) {
	return mq_engine_step(e, mq_go_event_trampoline, (void *)user, active);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"time"
	"unsafe"

	"github.com/modelqual/modelqual/native/bundle"
	// Headers (rebuild on edit) and the family model files (registered at start-up).
	_ "github.com/modelqual/modelqual/native/include"
	_ "github.com/modelqual/modelqual/native/models"
)

// ErrBatchFull is returned (wrapped) by Add when every slot holds a live sequence; the caller
// should queue the request and retry after a Step finished one.
var ErrBatchFull = errors.New("native: batch full")

// ErrClosed is returned by calls on a closed engine.
var ErrClosed = errors.New("native: engine is closed")

// Params selects how an engine runs. Zero fields take the bundle's build settings.
type Params struct {
	Threads    int    // worker threads for the CPU runtime; 0 = all cores
	MaxBatch   int    // concurrent sequences; 0 = bundle provenance build.max_batch (else 8)
	MaxContext int    // prompt + new tokens per sequence; 0 = bundle build.max_context (else the model's limit)
	Device     string // "cpu" (default) or "cuda"
}

// DefaultParams are the parameters Open uses for zero fields: all cores, the bundle's batch
// and context, CPU.
func DefaultParams() Params {
	return Params{Device: "cpu"}
}

// Info describes an opened engine.
type Info struct {
	Family     string
	Task       string // text | image | vision
	VocabSize  int
	MaxContext int
	MaxBatch   int
	EOSIDs     []int32
	Device     string
	StepDelay  time.Duration // the mock family's step_delay_ns; 0 for others
	Threads    int
}

// Sampling controls one sequence's generation. The zero value (plus MaxNewTokens) is greedy.
type Sampling struct {
	MaxNewTokens int
	Temperature  float32 // 0 = greedy (argmax, lowest id on ties)
	TopK         int     // 0 = off
	TopP         float32 // 0 or 1 = off
	Seed         uint64  // same seed and inputs => same sampled tokens
	IgnoreEOS    bool
	// Logprobs asks for each token's log-probability and its TopLogprobs (0..MaxTopLogprobs)
	// most likely alternatives: log_softmax of the fp32 logits, before temperature, top-k and
	// top-p (vLLM's default raw logprobs). Off, a greedy step never materialises the logits.
	Logprobs    bool
	TopLogprobs int
	// Logits processors (applied before temperature; any of them samples on the host):
	// RepetitionPenalty (0 or 1 = off) is transformers' over prompt + generated ids;
	// PresencePenalty and FrequencyPenalty are OpenAI's over generated ids; MinP (0 = off) is
	// transformers' MinPLogitsWarper; MinTokens suppresses the EOS ids until that many tokens
	// are generated (vLLM's min_tokens).
	RepetitionPenalty float32
	PresencePenalty   float32
	FrequencyPenalty  float32
	MinP              float32
	MinTokens         int
}

// MaxTopLogprobs is the most alternatives a token's logprobs carry (OpenAI's limit).
const MaxTopLogprobs = C.MQ_MAX_TOP_LOGPROBS

// TokenLogprob is one candidate token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// SeqID names one sequence of an engine.
type SeqID uint64

// FinishReason says why a sequence ended.
type FinishReason string

// Finish reasons, as reported in the Done event.
const (
	FinishStop      FinishReason = "stop"      // EOS generated (the EOS token is the event's Token)
	FinishLength    FinishReason = "length"    // MaxNewTokens generated
	FinishCancelled FinishReason = "cancelled" // Cancel took effect
	FinishError     FinishReason = "error"     // the forward pass failed
)

// Timing is the engine's own account of one sequence (CLOCK_MONOTONIC nanoseconds).
type Timing struct {
	AddedNs, FirstTokenNs, DoneNs int64
	PromptTokens, OutputTokens    int
	// VisionNs is the time the vision tower and projector spent on the sequence's images (within
	// AddedNs..FirstTokenNs): wall time on cpu, on cuda the device time between two events around
	// the encode, read after the prefill's own synchronisation; 0 without images.
	VisionNs int64
}

// Event is one step's news for one sequence: a new token, the end, or both.
type Event struct {
	Seq    SeqID
	Token  int32 // -1 when none
	Done   bool
	Reason FinishReason // set when Done
	Timing Timing       // set when Done
	// Set when the sequence asked for logprobs and Token >= 0: the token's log-probability
	// and the most likely tokens' (descending; ties: the lowest id).
	HasLogprob bool
	Logprob    float32
	Rank       int // 1 + the number of tokens more likely than Token
	Top        []TokenLogprob
}

// Engine is an opened model with its scheduler. Not goroutine-safe except Cancel.
type Engine struct {
	c      *C.mq_engine
	b      *bundle.Bundle // keeps the weights' mapping referenced for the engine's lifetime
	info   Info
	handle cgo.Handle
	stepFn func(Event)
	mu     sync.RWMutex // guards c against Close while Cancel runs on another goroutine
}

// call runs one C call and reads its error message on the same OS thread: mq_last_error is
// thread-local, and a goroutine may otherwise move between threads between the two calls.
func call(f func() C.mq_status) (C.mq_status, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := f(); st != C.MQ_OK {
		return st, C.GoString(C.mq_last_error())
	}
	return C.MQ_OK, ""
}

// Open loads the model of b. Weights are read in place from b's mapping (zero copy), so b must
// stay open until the engine is closed.
func Open(b *bundle.Bundle, p Params) (*Engine, error) {
	if b == nil {
		return nil, errors.New("native.Open: bundle is nil; open one with bundle.Open")
	}
	h := b.Header()
	hp, err := Resolve(h.Family, h.Config)
	if err != nil {
		return nil, fmt.Errorf("native.Open %s: %w", b.Path(), err)
	}
	maxPositions := intParam(hp, "max_positions")
	if p.Device == "" {
		p.Device = "cpu"
	}
	if p.Device != "cpu" && p.Device != "cuda" {
		return nil, fmt.Errorf("native.Open %s: Params.Device %q is not supported; use cpu or cuda", b.Path(), p.Device)
	}
	if p.MaxBatch == 0 {
		p.MaxBatch = h.Provenance.Build.MaxBatch
		if p.MaxBatch == 0 {
			p.MaxBatch = 8
		}
	}
	if p.MaxContext == 0 {
		p.MaxContext = h.Provenance.Build.MaxContext
		if p.MaxContext == 0 || (maxPositions > 0 && p.MaxContext > maxPositions) {
			p.MaxContext = maxPositions
		}
	}
	if p.MaxBatch < 1 || p.MaxContext < 1 || p.Threads < 0 {
		return nil, fmt.Errorf("native.Open %s: Params %+v: MaxBatch and MaxContext must be >= 1 and Threads >= 0", b.Path(), p)
	}
	if maxPositions > 0 && p.MaxContext > maxPositions {
		return nil, fmt.Errorf("native.Open %s: Params.MaxContext %d exceeds the model's position limit %d", b.Path(), p.MaxContext, maxPositions)
	}
	eos, err := eosIDs(h, intParam(hp, "vocab_size"))
	if err != nil {
		return nil, fmt.Errorf("native.Open %s: %w", b.Path(), err)
	}

	// Everything handed to C lives in C memory (names, tensor table, config) or in the
	// bundle's mmap (weights), so no Go pointer is retained by C.
	var cp C.mq_engine_params = C.mq_engine_default_params()
	cp.n_threads = C.int32_t(p.Threads)
	cp.max_batch = C.int32_t(p.MaxBatch)
	cp.max_context = C.int32_t(p.MaxContext)
	cstrs := []*C.char{}
	cstr := func(s string) *C.char {
		c := C.CString(s)
		cstrs = append(cstrs, c)
		return c
	}
	defer func() {
		for _, c := range cstrs {
			C.free(unsafe.Pointer(c))
		}
	}()
	cp.device = cstr(p.Device)
	cp.family = cstr(h.Family)
	prec := h.Provenance.Build.Precision
	if prec == "" || p.Device == "cpu" {
		prec = "fp32"
	}
	cp.precision = cstr(prec)
	kvs, err := flattenConfig(h.Config)
	if err != nil {
		return nil, fmt.Errorf("native.Open %s: %w", b.Path(), err)
	}
	ck, freeKV := cKV(kvs)
	defer freeKV()
	cp.config, cp.n_config = ck.ptr, C.int32_t(ck.n)

	n := len(h.Tensors)
	if n > 0 {
		tab := (*[1 << 28]C.mq_tensor)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.mq_tensor{}))))[:n:n]
		defer C.free(unsafe.Pointer(&tab[0]))
		for i, ti := range h.Tensors {
			dt, ok := dtypes[ti.DType]
			if !ok {
				return nil, fmt.Errorf("native.Open %s: tensor %s has dtype %s; the runtime reads F32, BF16 and F16 (rebuild the bundle)", b.Path(), ti.Name, ti.DType)
			}
			if len(ti.Shape) > 4 {
				return nil, fmt.Errorf("native.Open %s: tensor %s has %d dimensions; at most 4 are supported", b.Path(), ti.Name, len(ti.Shape))
			}
			_, data, err := b.Tensor(ti.Name)
			if err != nil {
				return nil, fmt.Errorf("native.Open %s: %w", b.Path(), err)
			}
			tab[i].name = cstr(ti.Name)
			tab[i].dtype = dt
			if len(data) > 0 {
				tab[i].data = unsafe.Pointer(&data[0])
			}
			tab[i].ndim = C.int32_t(len(ti.Shape))
			for d, s := range ti.Shape {
				tab[i].shape[d] = C.int64_t(s)
			}
		}
		cp.tensors = &tab[0]
		cp.n_tensors = C.int32_t(n)
	}
	if len(eos) > 0 {
		ce := (*[1 << 20]C.int32_t)(C.calloc(C.size_t(len(eos)), 4))[:len(eos):len(eos)]
		defer C.free(unsafe.Pointer(&ce[0]))
		for i, id := range eos {
			ce[i] = C.int32_t(id)
		}
		cp.eos_ids = &ce[0]
		cp.n_eos_ids = C.int32_t(len(eos))
	}

	var ce *C.mq_engine
	if st, msg := call(func() C.mq_status { return C.mq_engine_open(&cp, &ce) }); st != C.MQ_OK {
		return nil, fmt.Errorf("native.Open %s: %s", b.Path(), msg)
	}
	e := &Engine{c: ce, b: b}
	var ci C.mq_engine_info
	C.mq_engine_info_get(ce, &ci)
	e.info = Info{
		Family:     h.Family,
		Task:       C.GoString(ci.task),
		VocabSize:  int(ci.vocab_size),
		MaxContext: int(ci.max_context),
		MaxBatch:   int(ci.max_batch),
		EOSIDs:     eos,
		Device:     C.GoString(ci.device),
		StepDelay:  time.Duration(intParam(hp, "step_delay_ns")),
		Threads:    int(ci.n_threads),
	}
	e.handle = cgo.NewHandle(e)
	return e, nil
}

// Info describes the engine (copied; safe to keep).
func (e *Engine) Info() Info {
	i := e.info
	i.EOSIDs = append([]int32(nil), e.info.EOSIDs...)
	return i
}

// Add queues a sequence; it is prefilled and gets its first token at the next Step. Errors
// name the offending field; a full batch returns an error wrapping ErrBatchFull.
func (e *Engine) Add(prompt []int32, s Sampling) (SeqID, error) {
	if e.c == nil {
		return 0, ErrClosed
	}
	if len(prompt) == 0 {
		return 0, errors.New("native.Add: prompt is empty; pass at least one token id")
	}
	if s.MaxNewTokens < 1 {
		return 0, fmt.Errorf("native.Add: max_new_tokens %d must be >= 1", s.MaxNewTokens)
	}
	if s.TopLogprobs < 0 || s.TopLogprobs > MaxTopLogprobs {
		return 0, fmt.Errorf("native.Add: top_logprobs %d must be in 0..%d", s.TopLogprobs, MaxTopLogprobs)
	}
	if s.TopK < 0 || s.Temperature < 0 || s.TopP < 0 {
		return 0, fmt.Errorf("native.Add: temperature %g, top_k %d, top_p %g must not be negative", s.Temperature, s.TopK, s.TopP)
	}
	cs := s.c()
	var pin runtime.Pinner
	pin.Pin(&prompt[0])
	defer pin.Unpin()
	var id C.uint64_t
	st, msg := call(func() C.mq_status {
		return C.mq_engine_add(e.c, (*C.int32_t)(unsafe.Pointer(&prompt[0])), C.int32_t(len(prompt)), &cs, &id)
	})
	switch st {
	case C.MQ_OK:
		return SeqID(id), nil
	case C.MQ_ERR_BATCH_FULL:
		return 0, fmt.Errorf("%w: %s", ErrBatchFull, msg)
	default:
		return 0, errors.New("native.Add: " + msg)
	}
}

// c converts s to the C struct (validated by the caller).
func (s Sampling) c() C.mq_sampling {
	cs := C.mq_sampling{
		max_new_tokens: C.uint32_t(s.MaxNewTokens),
		temperature:    C.float(s.Temperature),
		top_k:          C.int32_t(s.TopK),
		top_p:          C.float(s.TopP),
		seed:           C.uint64_t(s.Seed),

		repetition_penalty: C.float(s.RepetitionPenalty),
		presence_penalty:   C.float(s.PresencePenalty),
		frequency_penalty:  C.float(s.FrequencyPenalty),
		min_p:              C.float(s.MinP),
		min_tokens:         C.int32_t(s.MinTokens),
	}
	if s.IgnoreEOS {
		cs.ignore_eos = 1
	}
	if s.Logprobs {
		cs.logprobs = 1
		cs.top_logprobs = C.int32_t(s.TopLogprobs)
	}
	return cs
}

// Cancel ends the sequence at the next Step (Done event with reason "cancelled"). Safe to call
// from any goroutine; unknown or finished ids are ignored.
func (e *Engine) Cancel(id SeqID) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.c != nil {
		C.mq_engine_cancel(e.c, C.uint64_t(id))
	}
}

// Step runs one engine step: cancels, prefill of queued sequences, and one decoded token for
// every running sequence, batched through one forward pass. fn is called once per sequence
// touched, before Step returns. It returns the number of sequences still live.
func (e *Engine) Step(fn func(Event)) (active int, err error) {
	if e.c == nil {
		return 0, ErrClosed
	}
	e.stepFn = fn
	defer func() { e.stepFn = nil }()
	var a C.int32_t
	if st, msg := call(func() C.mq_status { return C.mq_go_step(e.c, C.uintptr_t(e.handle), &a) }); st != C.MQ_OK {
		return int(a), fmt.Errorf("native.Step: %s", msg)
	}
	return int(a), nil
}

//export mqGoEvent
func mqGoEvent(ev *C.mq_event, user C.uintptr_t) {
	e := cgo.Handle(user).Value().(*Engine)
	if e.stepFn == nil {
		return
	}
	out := Event{Seq: SeqID(ev.seq), Token: int32(ev.token), Done: ev.done != 0}
	if ev.has_logprob != 0 {
		out.HasLogprob, out.Logprob, out.Rank = true, float32(ev.logprob), int(ev.rank)
		out.Top = make([]TokenLogprob, int(ev.n_top))
		for i := range out.Top {
			out.Top[i] = TokenLogprob{ID: int32(ev.top_ids[i]), Logprob: float32(ev.top_logprobs[i])}
		}
	}
	if out.Done {
		switch ev.reason {
		case C.MQ_FINISH_STOP:
			out.Reason = FinishStop
		case C.MQ_FINISH_LENGTH:
			out.Reason = FinishLength
		case C.MQ_FINISH_CANCELLED:
			out.Reason = FinishCancelled
		default:
			out.Reason = FinishError
		}
		out.Timing = Timing{
			AddedNs:      int64(ev.added_ns),
			FirstTokenNs: int64(ev.first_token_ns),
			DoneNs:       int64(ev.done_ns),
			PromptTokens: int(ev.prompt_tokens),
			OutputTokens: int(ev.output_tokens),
			VisionNs:     int64(ev.vision_ns),
		}
	}
	e.stepFn(out)
}

// Active is the number of live sequences (queued or running).
func (e *Engine) Active() int {
	if e.c == nil {
		return 0
	}
	return int(C.mq_engine_active(e.c))
}

// Routing is a mixture-of-experts model's routing so far: counts[layer][expert] tokens routed
// since the engine opened (nil for a model without experts). Safe beside Step on another
// goroutine, as Cancel is.
func (e *Engine) Routing() ([][]uint64, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.c == nil {
		return nil, ErrClosed
	}
	var layers, experts C.int32_t
	st, msg := call(func() C.mq_status { return C.mq_engine_routing(e.c, nil, 0, &layers, &experts) })
	if st != C.MQ_OK {
		return nil, errors.New("native.Routing: " + msg)
	}
	if experts == 0 {
		return nil, nil
	}
	flat := make([]uint64, int(layers)*int(experts))
	var pin runtime.Pinner
	pin.Pin(&flat[0])
	defer pin.Unpin()
	st, msg = call(func() C.mq_status {
		return C.mq_engine_routing(e.c, (*C.uint64_t)(unsafe.Pointer(&flat[0])), C.int64_t(len(flat)), &layers, &experts)
	})
	if st != C.MQ_OK {
		return nil, errors.New("native.Routing: " + msg)
	}
	out := make([][]uint64, int(layers))
	for l := range out {
		out[l] = flat[l*int(experts) : (l+1)*int(experts)]
	}
	return out, nil
}

// Logits returns full-vocabulary logits at every position of ids (len(ids)*VocabSize floats,
// row-major by position), computed in a scratch slot without disturbing live sequences.
func (e *Engine) Logits(ids []int32) ([]float32, error) {
	if e.c == nil {
		return nil, ErrClosed
	}
	if len(ids) == 0 {
		return nil, errors.New("native.Logits: ids is empty; pass at least one token id")
	}
	out := make([]float32, len(ids)*e.info.VocabSize)
	var pin runtime.Pinner
	pin.Pin(&ids[0])
	pin.Pin(&out[0])
	defer pin.Unpin()
	st, msg := call(func() C.mq_status {
		return C.mq_engine_logits(e.c, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.int32_t(len(ids)), (*C.float)(unsafe.Pointer(&out[0])))
	})
	if st != C.MQ_OK {
		return nil, errors.New("native.Logits: " + msg)
	}
	return out, nil
}

// Close frees the engine (threads, KV cache). Live sequences are dropped without events.
// The bundle may be closed afterwards. Calling Close twice is a no-op.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return nil
	}
	C.mq_engine_close(e.c)
	e.c = nil
	e.handle.Delete()
	return nil
}

// dtypes maps a bundle tensor dtype to mq_dtype.
var dtypes = map[string]C.int32_t{"F32": C.MQ_DTYPE_F32, "BF16": C.MQ_DTYPE_BF16, "F16": C.MQ_DTYPE_F16}

// intParam reads a resolved hyper-parameter as an int (0 when absent).
func intParam(hp map[string]any, key string) int {
	if f, ok := hp[key].(float64); ok {
		return int(f)
	}
	return 0
}

// SamplingProbs is the distribution the engine samples one logits row from, for parity tests
// against transformers' logits processors: the logits after the processors (penalties,
// min_tokens; before temperature) and the probabilities after temperature, top-k, top-p and
// min-p (zero for removed tokens; one-hot at the argmax at temperature 0). prompt and output
// are the sequence's history so far.
func SamplingProbs(logits []float32, prompt, output, eos []int32, s Sampling) (processed []float32, probs []float64, err error) {
	v := len(logits)
	if v == 0 {
		return nil, nil, errors.New("native.SamplingProbs: logits is empty")
	}
	processed, probs = make([]float32, v), make([]float64, v)
	cs := s.c()
	var pin runtime.Pinner
	defer pin.Unpin()
	ptr := func(ids []int32) *C.int32_t {
		if len(ids) == 0 {
			return nil
		}
		pin.Pin(&ids[0])
		return (*C.int32_t)(unsafe.Pointer(&ids[0]))
	}
	pin.Pin(&logits[0])
	pin.Pin(&processed[0])
	pin.Pin(&probs[0])
	pp, op, ep := ptr(prompt), ptr(output), ptr(eos)
	st, msg := call(func() C.mq_status {
		return C.mq_sampling_probs(C.int32_t(v), (*C.float)(unsafe.Pointer(&logits[0])), pp, C.int32_t(len(prompt)),
			op, C.int32_t(len(output)), ep, C.int32_t(len(eos)), &cs,
			(*C.float)(unsafe.Pointer(&processed[0])), (*C.double)(unsafe.Pointer(&probs[0])))
	})
	if st != C.MQ_OK {
		return nil, nil, errors.New("native.SamplingProbs: " + msg)
	}
	return processed, probs, nil
}

// SamplingDraw draws n tokens from one logits row with the engine's sampler (one generator
// seeded with seed), for statistical tests against the exact distribution. budget overrides
// the plain-temperature sampler's candidate budget (0: the engine's; -1: weigh the whole
// vocabulary, the sampler before candidates were narrowed), so that a small vocabulary
// exercises its rejection paths.
func SamplingDraw(logits []float32, s Sampling, seed uint64, budget, n int) ([]int32, error) {
	if len(logits) == 0 || n < 1 {
		return nil, errors.New("native.SamplingDraw: logits is empty or n < 1")
	}
	out := make([]int32, n)
	cs := s.c()
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&logits[0])
	pin.Pin(&out[0])
	st, msg := call(func() C.mq_status {
		return C.mq_sampling_draw(C.int32_t(len(logits)), (*C.float)(unsafe.Pointer(&logits[0])), &cs, C.uint64_t(seed),
			C.int32_t(budget), C.int32_t(n), (*C.int32_t)(unsafe.Pointer(&out[0])))
	})
	if st != C.MQ_OK {
		return nil, errors.New("native.SamplingDraw: " + msg)
	}
	return out, nil
}
