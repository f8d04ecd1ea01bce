// Package wire is the framed binary protocol between qual-server's frontend and its worker
// processes (the same binary in worker mode, one native engine each).
//
// Why binary and framed: the frontend's cost per output token is the product's main speed
// figure (issue 3, ≤ 3 µs/token), so a token must cross the pipe as 12 bytes inside a frame
// that carries every token of one engine step, with no reflection or text encoding.
//
// Every frame is
//
//	uint32 LE  payload length n (the type byte included)
//	uint8      message type
//	n-1 bytes  payload (little-endian fixed-width fields)
//
// A session starts with the worker's Hello (protocol version, capability bits, engine info as
// JSON, since it is sent once) or a Fatal frame if the engine could not be opened. The parent
// refuses a worker whose version differs or that lacks a capability it needs. Then the parent
// sends Submit, Cancel and Logits; the worker answers with one Deltas frame per engine step
// (every token of that step, for all sequences), a Done per finished request carrying the
// engine's native timings, a Step per engine step (its time, prompts and decodes: the
// frontend's engine-step metrics), and a LogitsResult per Logits request. The parent acknowledges
// consumed Deltas frames (Ack, batched while it is behind); the worker keeps at most AckWindow
// frames unacknowledged, so tokens never queue up in the pipe, except that a step which admits
// a new request runs at once (its first token does not wait for the parent to catch up), which
// admissions, bounded by the batch, keep bounded. The parent ends a session by
// closing its end of the pipe; the worker exits when it reads EOF.
package wire

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Version is bumped on any incompatible change of a frame layout.
const Version uint16 = 4

// Capability bits a worker announces in Hello.
const (
	CapStream   uint32 = 1 << iota // per-step token deltas
	CapCancel                      // Cancel takes effect at the next engine step
	CapLogits                      // full-vocabulary logits at every prompt position
	CapTimings                     // Done carries native CLOCK_MONOTONIC timings
	CapAck                         // the worker paces its steps by the parent's Ack frames
	CapLogprobs                    // Deltas carry the logprobs a Submit asked for
)

// AllCaps is what this build's worker implements and what the frontend requires.
const AllCaps = CapStream | CapCancel | CapLogits | CapTimings | CapAck | CapLogprobs

// AckWindow is how many Deltas frames a worker may send beyond the last one the parent
// acknowledged. Without it an engine faster than the frontend (the mock with no step delay)
// runs ahead and fills the pipe, and a new request's first token waits behind that backlog:
// time to first token then measures the pipe, not the server. A step that admits a request is
// exempt (package worker).
const AckWindow = 4

// Message types.
const (
	TypeHello        uint8 = 1 // worker → parent
	TypeFatal        uint8 = 2 // worker → parent: the engine could not be opened (UTF-8 message)
	TypeSubmit       uint8 = 3 // parent → worker
	TypeCancel       uint8 = 4 // parent → worker
	TypeLogits       uint8 = 5 // parent → worker
	TypeDeltas       uint8 = 6 // worker → parent
	TypeDone         uint8 = 7 // worker → parent
	TypeLogitsResult uint8 = 8 // worker → parent
	TypeAck          uint8 = 9 // parent → worker: count of Deltas frames consumed so far
	// TypeStep (worker → parent) follows each engine step: its time and work (Step). A parent
	// that predates it skips it, as both sides skip types they do not know.
	TypeStep uint8 = 10
)

// MaxFrame bounds a frame so a corrupt length cannot make the reader allocate without limit;
// the largest legitimate frame is a LogitsResult (positions × vocab × 4 bytes).
const MaxFrame = 1 << 31

// Info describes the engine a worker holds; sent once in Hello.
type Info struct {
	PID         int     `json:"pid"`
	Family      string  `json:"family"`
	VocabSize   int     `json:"vocab_size"`
	MaxContext  int     `json:"max_context"`
	MaxBatch    int     `json:"max_batch"`
	EOSIDs      []int32 `json:"eos_ids"`
	Device      string  `json:"device"`
	StepDelayNs int64   `json:"step_delay_ns"`
	LoadNs      int64   `json:"load_ns"` // time the worker spent opening bundle and engine
	// BundleDigest is the digest of the bundle file the worker serves, so the frontend can
	// refuse a worker that found the file changed and hashed something else.
	BundleDigest string `json:"bundle_digest"`
}

// Hello is the worker's first frame.
type Hello struct {
	Version uint16
	Caps    uint32
	Info    Info
}

// Sampling mirrors the engine's sampling controls.
type Sampling struct {
	MaxNewTokens uint32
	Temperature  float32
	TopK         int32
	TopP         float32
	Seed         uint64
	IgnoreEOS    bool
	// Logprobs asks for every token's log-probability and TopLogprobs (0..MaxTopLogprobs)
	// alternatives, carried in the Deltas frames.
	Logprobs    bool
	TopLogprobs uint8
	// Logits processors (native.Sampling says what each does).
	RepetitionPenalty float32
	PresencePenalty   float32
	FrequencyPenalty  float32
	MinP              float32
	MinTokens         int32
}

// MaxTopLogprobs is the most alternatives a token's logprobs carry (the engine's limit).
const MaxTopLogprobs = 20

// Candidate is one token and its log-probability.
type Candidate struct {
	ID      int32
	Logprob float32
}

// Logprobs is one generated token's log-probability and its most likely alternatives
// (descending).
type Logprobs struct {
	Logprob float32
	Rank    uint32 // 1 + the number of tokens more likely than this one
	Top     []Candidate
}

// Reason is a request's finish reason as the engine reports it.
type Reason uint8

// Finish reasons.
const (
	ReasonStop      Reason = 1 // end-of-sequence token
	ReasonLength    Reason = 2 // max_tokens reached
	ReasonCancelled Reason = 3
	ReasonError     Reason = 4 // the request was refused or failed in the engine; see Done.Message
)

func (r Reason) String() string {
	switch r {
	case ReasonStop:
		return "stop"
	case ReasonLength:
		return "length"
	case ReasonCancelled:
		return "cancelled"
	case ReasonError:
		return "error"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Done ends one request. Timings are the engine's CLOCK_MONOTONIC nanoseconds.
type Done struct {
	ID           uint64
	Reason       Reason
	AddedNs      int64
	FirstTokenNs int64
	DoneNs       int64
	PromptTokens uint32
	OutputTokens uint32
	VisionNs     int64  // the vision tower's wall time on the request's images (0: none or not measured)
	Message      string // only for ReasonError
}

const doneFixed = 8 + 1 + 8*3 + 4*2 + 8 + 2

// Writer appends frames into one buffer; Flush sends them in one write, which is how a whole
// engine step (deltas and dones) leaves the worker in one syscall.
type Writer struct {
	w   io.Writer
	buf []byte
	lp  []byte // the open Deltas frame's logprobs section
}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, buf: make([]byte, 0, 4096)} }

func (w *Writer) begin(t uint8) int {
	start := len(w.buf)
	w.buf = append(w.buf, 0, 0, 0, 0, t)
	return start
}

func (w *Writer) end(start int) {
	binary.LittleEndian.PutUint32(w.buf[start:], uint32(len(w.buf)-start-4))
}

// Pending reports whether frames are buffered.
func (w *Writer) Pending() bool { return len(w.buf) > 0 }

// Flush writes every buffered frame.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Hello buffers a Hello frame.
func (w *Writer) Hello(h Hello) {
	s := w.begin(TypeHello)
	w.buf = binary.LittleEndian.AppendUint16(w.buf, h.Version)
	w.buf = binary.LittleEndian.AppendUint32(w.buf, h.Caps)
	js, _ := json.Marshal(h.Info) // Info has only plain fields; Marshal cannot fail
	w.buf = append(w.buf, js...)
	w.end(s)
}

// Fatal buffers a Fatal frame.
func (w *Writer) Fatal(msg string) {
	s := w.begin(TypeFatal)
	w.buf = append(w.buf, msg...)
	w.end(s)
}

// Submit buffers a Submit frame.
func (w *Writer) Submit(id uint64, s Sampling, prompt []int32) {
	st := w.begin(TypeSubmit)
	w.buf = appendSubmit(w.buf, id, s, prompt)
	w.end(st)
}

// appendSubmit appends a Submit payload (also the head of SubmitImage's).
func appendSubmit(b []byte, id uint64, s Sampling, prompt []int32) []byte {
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint32(b, s.MaxNewTokens)
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s.Temperature))
	b = binary.LittleEndian.AppendUint32(b, uint32(s.TopK))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s.TopP))
	b = binary.LittleEndian.AppendUint64(b, s.Seed)
	if s.IgnoreEOS {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	if s.Logprobs {
		b = append(b, 1, s.TopLogprobs)
	} else {
		b = append(b, 0, 0)
	}
	for _, f := range [...]float32{s.RepetitionPenalty, s.PresencePenalty, s.FrequencyPenalty, s.MinP} {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(s.MinTokens))
	return appendIDs(b, prompt)
}

func appendIDs(b []byte, ids []int32) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, t := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return b
}

// Cancel buffers a Cancel frame.
func (w *Writer) Cancel(id uint64) {
	s := w.begin(TypeCancel)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, id)
	w.end(s)
}

// Ack buffers an Ack: the parent has consumed n Deltas frames in total.
func (w *Writer) Ack(n uint64) {
	s := w.begin(TypeAck)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, n)
	w.end(s)
}

// Logits buffers a Logits request.
func (w *Writer) Logits(id uint64, ids []int32) {
	s := w.begin(TypeLogits)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, id)
	w.buf = appendIDs(w.buf, ids)
	w.end(s)
}

// DeltasBuilder accumulates one engine step's tokens into a single Deltas frame.
//
// A Deltas payload is uint32 n, then n records (uint64 request, uint32 token), then, only
// when some token carries logprobs, uint32 m and m entries: uint32 record index, float32
// logprob, uint32 rank, uint8 k, k × (uint32 token, float32 logprob). Tokens without logprobs keep their
// 12 bytes, and a reader that predates the section stops after the records.
type DeltasBuilder struct {
	w     *Writer
	start int
	n     uint32
	m     uint32
}

// BeginDeltas starts a Deltas frame; call Add per token and then End (which drops the frame
// when no token was added).
func (w *Writer) BeginDeltas() DeltasBuilder {
	s := w.begin(TypeDeltas)
	w.buf = append(w.buf, 0, 0, 0, 0)
	return DeltasBuilder{w: w, start: s}
}

// Add appends one token of request id.
func (d *DeltasBuilder) Add(id uint64, tok int32) {
	d.w.buf = binary.LittleEndian.AppendUint64(d.w.buf, id)
	d.w.buf = binary.LittleEndian.AppendUint32(d.w.buf, uint32(tok))
	d.n++
}

// AddLogprobs appends one token of request id with its logprobs (at most MaxTopLogprobs
// alternatives are kept).
func (d *DeltasBuilder) AddLogprobs(id uint64, tok int32, lp Logprobs) {
	b := binary.LittleEndian.AppendUint32(d.w.lp, d.n)
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lp.Logprob))
	b = binary.LittleEndian.AppendUint32(b, lp.Rank)
	top := lp.Top[:min(len(lp.Top), MaxTopLogprobs)]
	b = append(b, byte(len(top)))
	for _, c := range top {
		b = binary.LittleEndian.AppendUint32(b, uint32(c.ID))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(c.Logprob))
	}
	d.w.lp = b
	d.m++
	d.Add(id, tok)
}

// End closes the frame and reports whether it holds tokens (an empty frame is dropped).
func (d *DeltasBuilder) End() bool {
	if d.n == 0 {
		d.w.buf = d.w.buf[:d.start]
		d.w.lp = d.w.lp[:0]
		return false
	}
	binary.LittleEndian.PutUint32(d.w.buf[d.start+5:], d.n)
	if d.m > 0 {
		d.w.buf = binary.LittleEndian.AppendUint32(d.w.buf, d.m)
		d.w.buf = append(d.w.buf, d.w.lp...)
		d.w.lp = d.w.lp[:0]
	}
	d.w.end(d.start)
	return true
}

// Done buffers a Done frame.
func (w *Writer) Done(d Done) {
	s := w.begin(TypeDone)
	b := w.buf
	b = binary.LittleEndian.AppendUint64(b, d.ID)
	b = append(b, byte(d.Reason))
	b = binary.LittleEndian.AppendUint64(b, uint64(d.AddedNs))
	b = binary.LittleEndian.AppendUint64(b, uint64(d.FirstTokenNs))
	b = binary.LittleEndian.AppendUint64(b, uint64(d.DoneNs))
	b = binary.LittleEndian.AppendUint32(b, d.PromptTokens)
	b = binary.LittleEndian.AppendUint32(b, d.OutputTokens)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.VisionNs))
	msg := d.Message
	if len(msg) > math.MaxUint16 {
		msg = msg[:math.MaxUint16]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	w.buf = b
	w.end(s)
}

// LogitsResult buffers the answer to a Logits request: either err or positions×vocab floats.
func (w *Writer) LogitsResult(id uint64, vocab, positions int, logits []float32, errMsg string) {
	s := w.begin(TypeLogitsResult)
	b := w.buf
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(vocab))
	b = binary.LittleEndian.AppendUint32(b, uint32(positions))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(errMsg)))
	b = append(b, errMsg...)
	for _, f := range logits {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	w.buf = b
	w.end(s)
}

// Reader reads frames. The payload returned by Next is valid until the next call.
type Reader struct {
	r   *bufio.Reader
	buf []byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10), buf: make([]byte, 4096)}
}

// Buffered reports whether bytes of a next frame are already read from the peer, i.e. the
// reader is behind the writer.
func (r *Reader) Buffered() bool { return r.r.Buffered() > 0 }

// ErrShort is returned when a frame's payload is shorter than its type requires: the peer is
// from another build or the stream is corrupt.
var ErrShort = errors.New("wire: frame payload too short for its type")

// Next reads one frame and returns its type and payload.
func (r *Reader) Next() (uint8, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:4])
	if n == 0 || n > MaxFrame {
		return 0, nil, fmt.Errorf("wire: frame length %d outside 1..%d", n, MaxFrame)
	}
	n--
	if uint32(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	p := r.buf[:n]
	if _, err := io.ReadFull(r.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[4], p, nil
}

// DecodeHello parses a Hello payload.
func DecodeHello(p []byte) (Hello, error) {
	if len(p) < 6 {
		return Hello{}, ErrShort
	}
	h := Hello{Version: binary.LittleEndian.Uint16(p), Caps: binary.LittleEndian.Uint32(p[2:])}
	if err := json.Unmarshal(p[6:], &h.Info); err != nil {
		return h, fmt.Errorf("wire: hello info: %w", err)
	}
	return h, nil
}

// submitFixed is the size of a Submit payload's fixed fields (before the prompt).
const submitFixed = 8 + 4*4 + 8 + 1 + 2 + 5*4

// DecodeSubmit parses a Submit payload; the prompt is appended to ids.
func DecodeSubmit(p []byte, ids []int32) (uint64, Sampling, []int32, error) {
	const fixed = submitFixed
	if len(p) < fixed+4 {
		return 0, Sampling{}, ids, ErrShort
	}
	id := binary.LittleEndian.Uint64(p)
	s := Sampling{
		MaxNewTokens: binary.LittleEndian.Uint32(p[8:]),
		Temperature:  math.Float32frombits(binary.LittleEndian.Uint32(p[12:])),
		TopK:         int32(binary.LittleEndian.Uint32(p[16:])),
		TopP:         math.Float32frombits(binary.LittleEndian.Uint32(p[20:])),
		Seed:         binary.LittleEndian.Uint64(p[24:]),
		IgnoreEOS:    p[32] != 0,
		Logprobs:     p[33] != 0,
		TopLogprobs:  p[34],

		RepetitionPenalty: math.Float32frombits(binary.LittleEndian.Uint32(p[35:])),
		PresencePenalty:   math.Float32frombits(binary.LittleEndian.Uint32(p[39:])),
		FrequencyPenalty:  math.Float32frombits(binary.LittleEndian.Uint32(p[43:])),
		MinP:              math.Float32frombits(binary.LittleEndian.Uint32(p[47:])),
		MinTokens:         int32(binary.LittleEndian.Uint32(p[51:])),
	}
	if s.TopLogprobs > MaxTopLogprobs {
		return id, s, ids, fmt.Errorf("wire: submit asks for %d top logprobs, at most %d", s.TopLogprobs, MaxTopLogprobs)
	}
	ids, err := decodeIDs(p[fixed:], ids)
	return id, s, ids, err
}

func decodeIDs(p []byte, ids []int32) ([]int32, error) {
	if len(p) < 4 {
		return ids, ErrShort
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if len(p) < 4*n {
		return ids, ErrShort
	}
	for i := 0; i < n; i++ {
		ids = append(ids, int32(binary.LittleEndian.Uint32(p[4*i:])))
	}
	return ids, nil
}

// DecodeCancel parses a Cancel payload (and an Ack's, which has the same layout).
func DecodeCancel(p []byte) (uint64, error) {
	if len(p) < 8 {
		return 0, ErrShort
	}
	return binary.LittleEndian.Uint64(p), nil
}

// DecodeLogits parses a Logits request payload.
func DecodeLogits(p []byte, ids []int32) (uint64, []int32, error) {
	if len(p) < 12 {
		return 0, ids, ErrShort
	}
	ids, err := decodeIDs(p[8:], ids)
	return binary.LittleEndian.Uint64(p), ids, err
}

// Deltas iterates a Deltas payload without allocating: fn gets every (request, token) pair.
func Deltas(p []byte, fn func(id uint64, tok int32)) error {
	recs, _, err := deltaRecords(p)
	if err != nil {
		return err
	}
	for i := 0; i < len(recs)/12; i++ {
		q := recs[12*i:]
		fn(binary.LittleEndian.Uint64(q), int32(binary.LittleEndian.Uint32(q[8:])))
	}
	return nil
}

// deltaRecords splits a Deltas payload into its 12-byte (request, token) records and what
// follows them (the logprobs section, when there is one).
func deltaRecords(p []byte) (recs, rest []byte, err error) {
	if len(p) < 4 {
		return nil, nil, ErrShort
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if len(p) < 12*n {
		return nil, nil, ErrShort
	}
	return p[:12*n], p[12*n:], nil
}

// lpFixed is the size of a logprobs entry before its candidates.
const lpFixed = 4 + 4 + 4 + 1

// DeltasLogprobs is Deltas with each token's logprobs (nil for a token without); a frame
// without a logprobs section costs what Deltas does.
func DeltasLogprobs(p []byte, fn func(id uint64, tok int32, lp *Logprobs)) error {
	recs, sec, err := deltaRecords(p)
	if err != nil {
		return err
	}
	n := len(recs) / 12
	m, next := 0, -1 // entries left, and the record index of the next one
	if len(sec) >= 4 {
		m = int(binary.LittleEndian.Uint32(sec))
		sec = sec[4:]
	}
	readNext := func() error {
		next = -1
		if m == 0 {
			return nil
		}
		if len(sec) < lpFixed {
			return ErrShort
		}
		next = int(binary.LittleEndian.Uint32(sec))
		return nil
	}
	if err := readNext(); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		q := recs[12*i:]
		var lp *Logprobs
		if i == next {
			k := int(sec[lpFixed-1])
			if len(sec) < lpFixed+8*k || k > MaxTopLogprobs {
				return ErrShort
			}
			lp = &Logprobs{Logprob: math.Float32frombits(binary.LittleEndian.Uint32(sec[4:])),
				Rank: binary.LittleEndian.Uint32(sec[8:]), Top: make([]Candidate, k)}
			for j := range lp.Top {
				c := sec[lpFixed+8*j:]
				lp.Top[j] = Candidate{ID: int32(binary.LittleEndian.Uint32(c)), Logprob: math.Float32frombits(binary.LittleEndian.Uint32(c[4:]))}
			}
			sec = sec[lpFixed+8*k:]
			m--
			if err := readNext(); err != nil {
				return err
			}
		}
		fn(binary.LittleEndian.Uint64(q), int32(binary.LittleEndian.Uint32(q[8:])), lp)
	}
	if m != 0 {
		return fmt.Errorf("wire: deltas frame has %d logprobs entries that match no token record", m)
	}
	return nil
}

// DecodeDone parses a Done payload.
func DecodeDone(p []byte) (Done, error) {
	if len(p) < doneFixed {
		return Done{}, ErrShort
	}
	d := Done{
		ID:           binary.LittleEndian.Uint64(p),
		Reason:       Reason(p[8]),
		AddedNs:      int64(binary.LittleEndian.Uint64(p[9:])),
		FirstTokenNs: int64(binary.LittleEndian.Uint64(p[17:])),
		DoneNs:       int64(binary.LittleEndian.Uint64(p[25:])),
		PromptTokens: binary.LittleEndian.Uint32(p[33:]),
		OutputTokens: binary.LittleEndian.Uint32(p[37:]),
		VisionNs:     int64(binary.LittleEndian.Uint64(p[41:])),
	}
	n := int(binary.LittleEndian.Uint16(p[49:]))
	if len(p) < doneFixed+n {
		return d, ErrShort
	}
	d.Message = string(p[doneFixed : doneFixed+n])
	return d, nil
}

// Step is one engine step as the worker timed it: the wall time of the engine call, the
// prompts it prefilled (how many, and their tokens) and the sequences it decoded a token for.
// The parent turns it into the engine-step metrics; a step's prompt tokens are what makes it
// long, which is where a burst of requests' time to first token goes.
type Step struct {
	DurationNs   uint64
	Prompts      uint32
	PromptTokens uint32
	Decodes      uint32
}

const stepSize = 8 + 4*3

// Step buffers a Step frame.
func (w *Writer) Step(st Step) {
	s := w.begin(TypeStep)
	b := binary.LittleEndian.AppendUint64(w.buf, st.DurationNs)
	b = binary.LittleEndian.AppendUint32(b, st.Prompts)
	b = binary.LittleEndian.AppendUint32(b, st.PromptTokens)
	w.buf = binary.LittleEndian.AppendUint32(b, st.Decodes)
	w.end(s)
}

// DecodeStep decodes a Step frame's payload.
func DecodeStep(p []byte) (Step, error) {
	if len(p) < stepSize {
		return Step{}, ErrShort
	}
	return Step{
		DurationNs:   binary.LittleEndian.Uint64(p),
		Prompts:      binary.LittleEndian.Uint32(p[8:]),
		PromptTokens: binary.LittleEndian.Uint32(p[12:]),
		Decodes:      binary.LittleEndian.Uint32(p[16:]),
	}, nil
}

// LogitsAnswer is a decoded LogitsResult; Data aliases the frame payload (little-endian
// float32, positions × vocab) and is valid until the Reader's next call.
type LogitsAnswer struct {
	ID        uint64
	Vocab     int
	Positions int
	Err       string
	Data      []byte
}

// DecodeLogitsResult parses a LogitsResult payload.
func DecodeLogitsResult(p []byte) (LogitsAnswer, error) {
	if len(p) < 20 {
		return LogitsAnswer{}, ErrShort
	}
	a := LogitsAnswer{
		ID:        binary.LittleEndian.Uint64(p),
		Vocab:     int(binary.LittleEndian.Uint32(p[8:])),
		Positions: int(binary.LittleEndian.Uint32(p[12:])),
	}
	n := int(binary.LittleEndian.Uint32(p[16:]))
	p = p[20:]
	if len(p) < n {
		return a, ErrShort
	}
	a.Err = string(p[:n])
	a.Data = p[n:]
	if a.Err == "" && len(a.Data) != 4*a.Vocab*a.Positions {
		return a, fmt.Errorf("wire: logits result carries %d bytes, want 4×%d×%d", len(a.Data), a.Positions, a.Vocab)
	}
	return a, nil
}
