package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/modelqual/modelqual/server/tokenizer"
	"github.com/modelqual/modelqual/server/wire"
)

// DefaultCompletionMaxTokens is OpenAI's default max_tokens for /v1/completions; chat
// defaults to the rest of the context.
const DefaultCompletionMaxTokens = 16

// textRoute is /v1/completions and /v1/chat/completions (chat), a chat request with or
// without its one image: the parts of the request lifecycle (server.go's serve) these routes
// have of their own.
type textRoute struct {
	s     *Server
	chat  bool
	req   *GenRequest
	extra []*task // choices 2..n (n > 1)
}

// choiceSeed is the seed of choice i of a request whose first choice has seed: distinct
// choices draw distinct sequences (equal at temperature 0), and a seeded request reproduces
// all of them.
func choiceSeed(seed uint64, i int) uint64 {
	z := seed + uint64(i)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// decode parses and validates the body, then checks the model name and that the bundle
// generates text.
func (r *textRoute) decode(q *reqState, body []byte) *APIError {
	s := r.s
	req, aerr := DecodeRequestLimited(body, r.chat, ChatLimits{MaxMessages: s.cfg.MaxMessages, MaxContentBytes: s.cfg.MaxChatBytes, MaxImages: s.cfg.MaxImages})
	if aerr != nil {
		return aerr
	}
	q.rec.Stream = req.Stream
	if req.Model != "" && req.Model != s.cfg.ModelName {
		return s.unknownModel(req.Model)
	}
	if s.task == "image" {
		return badRequest("model", "model %q is a text-to-image model; send POST /v1/images/generations", s.cfg.ModelName)
	}
	r.req = req
	return nil
}

// prepare renders and tokenizes the prompt, processes the image (chat_image.go: one image, its
// placeholder expanded) and checks the context.
func (r *textRoute) prepare(q *reqState) (*task, *APIError) {
	s, req := r.s, r.req
	start := time.Now()
	defer func() { q.rec.PreprocessNs = time.Since(start).Nanoseconds() }()
	ids, aerr := s.promptIDs(q, req)
	if aerr != nil {
		return nil, aerr
	}
	ids, img, aerr := s.prepareImage(q, req, ids)
	if aerr != nil {
		return nil, aerr
	}
	maxTok, aerr := s.capacity(req, len(ids))
	if aerr != nil {
		return nil, aerr
	}
	if req.MinTokens > maxTok {
		return nil, badRequest("min_tokens", "`min_tokens` (%d) exceeds the %d tokens this request may generate (max_tokens, or the context left after the prompt); lower it", req.MinTokens, maxTok)
	}
	t := s.newGenTask(req, ids, maxTok)
	t.vision = img
	// Choices 2..n: the same prompt, each its own sequence with its own seed; all the request's
	// tasks share one notify channel so that one wait serves them all.
	r.extra = r.extra[:0]
	for i := 1; i < req.N; i++ {
		x := s.newGenTask(req, ids, maxTok)
		x.vision = img
		x.notify = t.notify
		x.samp.Seed = choiceSeed(t.samp.Seed, i)
		r.extra = append(r.extra, x)
	}
	return t, nil
}

// context ends at the drain deadline and at --request-timeout.
func (r *textRoute) context(q *reqState) (context.Context, func()) {
	ctx, stopDrain := r.s.drainContext(q.r.Context())
	if r.s.cfg.RequestTimeout <= 0 {
		return ctx, stopDrain
	}
	ctx, cancel := context.WithTimeout(ctx, r.s.cfg.RequestTimeout)
	return ctx, func() { cancel(); stopDrain() }
}

// run turns the engine's tokens into text and answers: streamed as SSE, or whole.
func (r *textRoute) run(q *reqState, t *task, ctx context.Context) {
	s, req := r.s, r.req
	g := r.newGen(q, t, ctx, 0)
	if len(r.extra) == 0 {
		if req.Stream {
			g.stream()
		} else {
			g.collect()
		}
		return
	}
	// n > 1: the other choices are admitted after the first (each holds a batch slot; the
	// record keeps the first's worker and queue wait).
	gs := &genSet{gens: []*gen{g}}
	for i, x := range r.extra {
		if err := s.pool.run(x, ctx.Done(), func() error { return context.Cause(ctx) }); err != nil {
			gs.abandon()
			s.scheduleError(q, err, ctx)
			return
		}
		gs.gens = append(gs.gens, r.newGen(q, x, ctx, i+1))
	}
	if req.Stream {
		gs.stream()
	} else {
		gs.collect()
	}
}

// newGen is the text state of one choice (index) of the request.
func (r *textRoute) newGen(q *reqState, t *task, ctx context.Context, index int) *gen {
	s, req := r.s, r.req
	g := &gen{s: s, q: q, t: t, req: req, ctx: ctx, dec: s.textDecoder(t), stop: newStopMatcher(req.Stop, req.IncludeStopStr), index: index}
	if req.Logprobs {
		g.lp = &lpState{}
	}
	return g
}

// textDecoder is the detokenizer of one generation (HTTP or gRPC, streamed or not: one path,
// so the two answers are equal): primed with the task's prompt ids (for chat, the rendered
// template's), so the completion is the text the generated ids add after the prompt, as vLLM
// and TGI return it. A SentencePiece-style tokenizer's first generated word keeps its leading
// space (" Paris" after "The capital of France is"); see tokenizer.StreamDecoder.Prime.
func (s *Server) textDecoder(t *task) *tokenizer.StreamDecoder {
	return s.tok.NewStreamDecoder().Prime(t.prompt)
}

// newGenTask is the engine task of a text generation request (HTTP or gRPC): its prompt and
// sampling controls, with a fresh seed unless the request set one.
func (s *Server) newGenTask(req *GenRequest, ids []int32, maxTok int) *task {
	t := s.pool.newTask()
	t.prompt = ids
	t.samp = wire.Sampling{MaxNewTokens: uint32(maxTok), Temperature: float32(req.Temperature),
		TopK: int32(req.TopK), TopP: float32(req.TopP), Seed: req.Seed, IgnoreEOS: req.IgnoreEOS,
		Logprobs: req.Logprobs, TopLogprobs: uint8(req.TopLogprobs),
		RepetitionPenalty: float32(req.RepetitionPenalty), PresencePenalty: float32(req.PresencePenalty),
		FrequencyPenalty: float32(req.FrequencyPenalty), MinP: float32(req.MinP), MinTokens: int32(req.MinTokens)}
	if !req.HasSeed {
		t.samp.Seed = t.id*0x9e3779b97f4a7c15 ^ uint64(time.Now().UnixNano())
	}
	return t
}

// render applies the checkpoint's chat template.
func (s *Server) render(msgs []Message, addGen bool, kwargs map[string]any) (string, *APIError) {
	if !s.tok.HasChatTemplate() {
		return "", badRequest("messages", "model %q has no chat template; send plain /v1/completions requests", s.cfg.ModelName)
	}
	if s.faults.noGenPrompt {
		addGen = false
	}
	text, err := s.tok.ApplyChatTemplate(msgs, addGen, kwargs)
	if err != nil {
		return "", badRequest("messages", "chat template failed on these messages: %v", err)
	}
	return text, nil
}

// checkIDs refuses token ids outside the vocabulary.
func (s *Server) checkIDs(ids []int32, param string) *APIError {
	for i, id := range ids {
		if id < 0 || int(id) >= s.info.VocabSize {
			return badRequest(fmt.Sprintf("%s[%d]", param, i), "token id %d at %s[%d] is outside the vocabulary [0, %d)", id, param, i, s.info.VocabSize)
		}
	}
	return nil
}

func idsBytes(ids []int32) []byte {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
	}
	return b
}

// promptIDs tokenizes the request's prompt and fills the record's prompt digest.
func (s *Server) promptIDs(q *reqState, req *GenRequest) ([]int32, *APIError) {
	var ids []int32
	var promptBytes []byte
	param := "prompt"
	switch {
	case req.Chat:
		param = "messages"
		if aerr := s.precountChat(req.Messages); aerr != nil {
			return nil, aerr
		}
		text, aerr := s.render(req.Messages, req.AddGenerationPrompt, req.ChatTemplateKwargs)
		if aerr != nil {
			return nil, aerr
		}
		ids, promptBytes = s.tok.Encode(text), []byte(text)
	case req.HasPromptIDs:
		if aerr := s.checkIDs(req.PromptIDs, "prompt"); aerr != nil {
			return nil, aerr
		}
		ids, promptBytes = req.PromptIDs, idsBytes(req.PromptIDs)
	default:
		ids, promptBytes = s.tok.Encode(req.Prompt), []byte(req.Prompt)
	}
	q.rec.PromptSHA256, q.rec.PromptBytes, q.rec.InputTokens = sha256Hex(promptBytes), int64(len(promptBytes)), len(ids)
	if len(ids) == 0 {
		return nil, badRequest(param, "`%s` is empty after tokenization; send at least one token", param)
	}
	return ids, nil
}

// precountChat refuses messages too long for the context before the chat template renders
// them, counting tokens message by message and stopping as soon as the count is over: a huge
// conversation costs no more than the context's worth of tokenization. A token covers at
// least one byte, so contents of fewer bytes than the context cannot fill it and are not
// counted here (the exact check follows the rendering). Each message's count is lowered by
// two, the most a merge across the text the template puts on either side of it could save,
// so this refuses nothing the exact check would accept.
func (s *Server) precountChat(msgs []Message) *APIError {
	ctx := s.info.MaxContext
	total := 0
	for _, m := range msgs {
		c, _ := m["content"].(string)
		total += len(c)
	}
	if total < ctx {
		return nil
	}
	n := 0
	for i, m := range msgs {
		c, _ := m["content"].(string)
		if len(c) == 0 {
			continue
		}
		n += max(len(s.tok.Encode(c))-2, 0)
		if n >= ctx {
			e := badRequest("messages", "the messages' content has at least %d tokens by messages[%d], before the chat template adds its own; this model's context is %d tokens (prompt + max_tokens); shorten the conversation", n, i, ctx)
			e.Code = "context_length_exceeded"
			return e
		}
	}
	return nil
}

// capacity applies the context contract: prompt + max_tokens must fit the bundle's context.
func (s *Server) capacity(req *GenRequest, n int) (int, *APIError) {
	ctx := s.info.MaxContext
	param := "prompt"
	if req.Chat {
		param = "messages"
	}
	if n >= ctx {
		e := badRequest(param, "the prompt has %d tokens; this model's context is %d tokens (prompt + max_tokens); shorten the prompt", n, ctx)
		e.Code = "context_length_exceeded"
		return 0, e
	}
	maxTok := req.MaxTokens
	if maxTok == 0 {
		if req.Chat {
			return ctx - n, nil
		}
		return min(DefaultCompletionMaxTokens, ctx-n), nil
	}
	if n+maxTok > ctx {
		name := "max_tokens"
		if req.Chat {
			name = "max_tokens (or max_completion_tokens)"
		}
		e := badRequest("max_tokens", "prompt (%d tokens) + %s (%d) = %d exceeds this model's context of %d tokens; lower %s to at most %d or shorten the prompt",
			n, name, maxTok, n+maxTok, ctx, name, ctx-n)
		e.Code = "context_length_exceeded"
		return 0, e
	}
	return maxTok, nil
}

// gen is one generation request being turned from engine tokens into text.
type gen struct {
	s   *Server
	q   *reqState
	t   *task
	req *GenRequest
	ctx context.Context

	dec     *tokenizer.StreamDecoder
	stop    stopMatcher
	out     []byte // all text sent (or to be sent), for the response and the record digest
	ntok    int    // engine tokens consumed
	stopped bool   // a stop string matched
	gone    bool   // the client disconnected or the request timed out
	slow    bool   // a write to the client did not complete within --write-timeout
	armed   time.Time

	// streaming
	w                      http.ResponseWriter
	buf                    []byte
	prefix, suffix, header []byte
	held                   []byte // fault server.swallow_final_delta: the last chunk, held back
	spare                  []int32
	spareLP                []*wire.Logprobs
	firstSent              bool

	lp *lpState // the request asked for logprobs (HTTP; gRPC keeps its own per delta)

	index    int  // the choice's index (n > 1)
	finished bool // genSet: the engine is done with this choice
}

// consume turns engine tokens into text: EOS tokens produce none (unless ignore_eos), an
// incomplete UTF-8 sequence is held by the stream decoder, a possible stop-string prefix by
// the stop matcher.
func (g *gen) consume(toks []int32, lps []*wire.Logprobs) {
	for i, tok := range toks {
		if g.stopped {
			return
		}
		g.ntok++
		if g.lp != nil {
			var lp *wire.Logprobs
			if i < len(lps) {
				lp = lps[i]
			}
			g.lp.add(tok, lp)
		}
		if !g.req.IgnoreEOS && g.isEOS(tok) {
			continue
		}
		if text := g.dec.AddBytes(tok); len(text) > 0 {
			g.push(text)
		}
	}
}

func (g *gen) isEOS(tok int32) bool {
	for _, e := range g.s.info.EOSIDs {
		if e == tok {
			return true
		}
	}
	return false
}

// push sends decoded text (valid until the decoder's next call) through the stop matcher.
func (g *gen) push(text []byte) {
	emit, hit := g.stop.feed(text)
	g.emit(emit)
	if hit {
		g.stopped = true
		g.s.pool.cancel(g.t) // the rest of the generation is not wanted: free the slot
	}
}

// emit records released text and, when streaming, adds it to the write buffer as one delta.
func (g *gen) emit(text []byte) {
	if len(text) == 0 {
		return
	}
	g.out = append(g.out, text...)
	if g.w != nil {
		g.appendChunk(text)
	}
}

// finishText flushes held text once the engine is done.
func (g *gen) finishText() {
	if g.stopped {
		return
	}
	if tail := g.dec.Flush(); tail != "" {
		g.push([]byte(tail))
	}
	if !g.stopped {
		g.emit(g.stop.flush())
	}
}

// wait blocks until the task has news. On disconnect or timeout it cancels the task and waits
// (bounded) for the engine to confirm, so the slot is free when the handler returns.
func (g *gen) wait() {
	select {
	case <-g.t.notify:
		return
	case <-g.ctx.Done():
	}
	g.abandon()
}

func (g *gen) abandon() {
	if g.gone {
		return
	}
	g.cancel()
	deadline := time.NewTimer(cancelWait)
	defer deadline.Stop()
	g.awaitDone(deadline.C)
}

// cancel asks the engine to drop the generation (once).
func (g *gen) cancel() {
	g.gone = true
	g.s.pool.cancel(g.t)
}

// awaitDone waits until the engine confirms the generation ended, or deadline fires (false).
func (g *gen) awaitDone(deadline <-chan time.Time) bool {
	for {
		g.t.mu.Lock()
		done := g.t.done
		g.t.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-g.t.notify:
		case <-deadline:
			return false
		}
	}
}

// finishReason maps the engine's reason (and a stop-string match) to OpenAI's.
func (g *gen) finishReason() string {
	if g.stopped {
		return "stop"
	}
	switch g.t.res.Reason {
	case wire.ReasonStop:
		return "stop"
	case wire.ReasonLength:
		return "length"
	case wire.ReasonCancelled:
		return "cancelled"
	}
	return "error"
}

// engineError is non-nil when the task failed in (or with) its worker.
func (g *gen) engineError() *APIError {
	if g.stopped {
		return nil
	}
	if g.t.fail != nil {
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "worker_crashed", Message: g.t.fail.Error()}
	}
	if g.t.res.Reason == wire.ReasonError {
		return &APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "engine_error", Message: "the engine failed this request: " + g.t.res.Message}
	}
	return nil
}

// fillRecord copies the outcome into the request record.
func (g *gen) fillRecord() {
	r := &g.q.rec
	res := g.t.res
	if res.DoneNs > 0 && res.AddedNs > 0 {
		r.TaskWallNs = res.DoneNs - res.AddedNs
	}
	if res.FirstTokenNs > 0 && res.AddedNs > 0 {
		r.TaskTTFTNs = res.FirstTokenNs - res.AddedNs
	}
	r.VisionNs = res.VisionNs
	r.OutputTokens = g.ntok
	r.OutputSHA256, r.OutputBytes = sha256Hex(g.out), int64(len(g.out))
	if r.FinishReason == "" {
		r.FinishReason = g.finishReason()
	}
	g.s.m.inputTokens.Add(float64(len(g.t.prompt)))
	g.s.m.outputTokens.Add(float64(g.ntok))
}

// drain consumes the tokens the reader has handed over since the last call, reusing the
// previous slice as the next swap buffer, and reports whether the task is done.
func (g *gen) drain() bool {
	toks, lps, done := g.t.takeLogprobs(g.spare, g.spareLP)
	g.consume(toks, lps)
	g.spare, g.spareLP = toks, lps
	return done
}

// collect serves a non-streaming request.
func (g *gen) collect() {
	for {
		if g.drain() {
			break
		}
		g.wait()
		if g.gone {
			g.consume(g.takeAll())
			g.fillRecord()
			g.q.failContext(g.ctx)
			return
		}
	}
	g.finishText()
	if aerr := g.engineError(); aerr != nil {
		g.fillRecord()
		g.q.fail(aerr)
		return
	}
	g.q.status = http.StatusOK
	g.q.ttft = time.Since(g.q.start) // the answer is ready; its write follows the record
	g.fillRecord()
	g.answer([]*gen{g})
}

// answer writes the non-streamed body of gens' choices (one per choice), usage and timings
// from the record, once the record is committed.
func (g *gen) answer(gens []*gen) {
	size := 256
	for _, x := range gens {
		size += 2 * len(x.out)
	}
	b := make([]byte, 0, size)
	b = g.appendHead(b, false)
	b = append(b, `,"choices":[`...)
	for i, x := range gens {
		if i > 0 {
			b = append(b, ',')
		}
		b = x.appendChoice(b)
	}
	b = append(b, ']')
	b = g.appendUsageOf(b, len(g.t.prompt), g.q.rec.OutputTokens)
	if g.req.Timings {
		b = g.q.appendTimings(b)
	}
	b = append(b, '}')
	if err := g.q.commitRecord(); err != nil {
		g.q.fail(g.s.recordsError(err))
		return
	}
	h := g.q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	g.q.armWrite()
	g.q.w.WriteHeader(http.StatusOK)
	_, _ = g.q.w.Write(b)
}

// appendChoice appends this choice's object of a non-streamed answer.
func (g *gen) appendChoice(b []byte) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(g.index), 10)
	if g.req.Chat {
		b = append(b, `,"message":{"role":"assistant","content":`...)
		b = appendJSONString(b, string(g.out))
		b = append(b, `},"logprobs":`...)
	} else {
		b = append(b, `,"text":`...)
		b = appendJSONString(b, string(g.out))
		b = append(b, `,"logprobs":`...)
	}
	if g.lp != nil {
		b = g.appendLogprobs(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":`...)
	b = appendJSONString(b, g.finishReason())
	return append(b, '}')
}

func (g *gen) takeAll() ([]int32, []*wire.Logprobs) {
	toks, lps, _ := g.t.takeLogprobs(nil, nil)
	return toks, lps
}

// appendHead appends `{"id":...,"object":...,"created":...,"model":...` (no closing brace).
func (g *gen) appendHead(b []byte, chunk bool) []byte {
	id := "cmpl-" + g.q.rec.RequestID
	object := "text_completion"
	if g.req.Chat {
		id = "chatcmpl-" + g.q.rec.RequestID
		object = "chat.completion"
		if chunk {
			object = "chat.completion.chunk"
		}
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, g.s.created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, g.s.cfg.ModelName)
	return b
}

func (g *gen) appendUsage(b []byte) []byte {
	return g.appendUsageOf(b, len(g.t.prompt), g.ntok)
}

// appendUsageOf appends OpenAI's usage object: with n > 1 the prompt is counted once and the
// completion tokens of all choices summed, as OpenAI does.
func (g *gen) appendUsageOf(b []byte, prompt, completion int) []byte {
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

// stream serves a streaming request as Server-Sent Events in OpenAI's chunk format. Chunk
// templates are encoded once per request; each token's text is JSON-escaped straight into a
// reused buffer, and everything an engine step produced goes out with one write and one flush.
func (g *gen) stream() {
	w := g.q.w
	g.streamTemplates(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	g.q.status = http.StatusOK
	g.appendRoleChunk()
	g.send()
	for {
		if g.drain() {
			break
		}
		if len(g.buf) > 0 && !g.send() {
			g.abandon()
			g.consume(g.takeAll())
			g.q.rec.FinishReason = "cancelled"
			g.q.rec.ErrorType = g.goneType()
			g.fillRecord()
			return
		}
		g.wait()
		if g.gone {
			g.consume(g.takeAll())
			g.fillRecord()
			g.streamGone()
			return
		}
	}
	g.finishText()
	g.fillRecord()
	if aerr := g.engineError(); aerr != nil {
		g.streamError(aerr)
		return
	}
	// The record is written before the finish event and [DONE]: if it cannot be, the stream
	// ends with an error event rather than as a success nobody recorded. Content not sent yet
	// goes out with them, right after the record: its time to first token is now.
	if !g.firstSent && len(g.out) > 0 {
		g.firstSent = true
		g.q.ttft = time.Since(g.q.start)
	}
	if err := g.q.commitRecord(); err != nil {
		g.streamError(g.s.recordsError(err))
		return
	}
	g.held = nil // fault server.swallow_final_delta: the last content delta is never sent
	g.appendFinishChunk(&g.buf)
	g.appendStreamEnd(&g.buf, len(g.t.prompt), g.ntok)
	g.send()
}

// streamGone ends a stream whose context ended (drain, --request-timeout, client gone).
func (g *gen) streamGone() {
	if errors.Is(context.Cause(g.ctx), errDrained) {
		g.streamError(g.s.drainError())
		g.q.rec.FinishReason, g.q.rec.ErrorType = "drain", "drain_timeout"
	} else if errors.Is(g.ctx.Err(), context.DeadlineExceeded) {
		e := &APIError{Type: "timeout_error", Code: "request_timeout", Message: fmt.Sprintf("the request did not finish within --request-timeout %v", g.s.cfg.RequestTimeout)}
		g.streamError(e)
	} else {
		g.q.rec.FinishReason = "cancelled"
		g.q.rec.ErrorType = g.goneType()
	}
}

// appendRoleChunk adds a chat stream's first chunk (the assistant role) for this choice.
func (g *gen) appendRoleChunk() {
	if !g.req.Chat {
		return
	}
	g.buf = append(g.buf, "data: "...)
	g.buf = append(g.buf, g.header...)
	g.buf = append(g.buf, `,"choices":[{"index":`...)
	g.buf = strconv.AppendInt(g.buf, int64(g.index), 10)
	g.buf = append(g.buf, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// appendFinishChunk adds this choice's finish chunk to *dst.
func (g *gen) appendFinishChunk(dst *[]byte) {
	b := *dst
	b = append(b, "data: "...)
	b = append(b, g.header...)
	b = append(b, `,"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(g.index), 10)
	if g.req.Chat {
		b = append(b, `,"delta":{},"logprobs":`...)
	} else {
		b = append(b, `,"text":"","logprobs":`...)
	}
	// Tokens that produced no text of their own (EOS, a held stop-string prefix) are answered
	// in the finish chunk, so that a stream's logprobs are the non-streamed answer's.
	if g.lp != nil && len(g.lp.pending) > 0 && !g.s.faults.dropFinalLogprobs {
		b = g.appendLogprobs(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":"`...)
	b = append(b, g.finishReason()...)
	b = append(b, `"}]}`+"\n\n"...)
	*dst = b
}

// appendStreamEnd adds what follows the finish chunks: the usage chunk when asked for, the
// timings chunk (llama.cpp's "timings", from the record) when asked for, and [DONE].
func (g *gen) appendStreamEnd(dst *[]byte, prompt, completion int) {
	b := *dst
	if g.req.IncludeUsage {
		b = append(b, "data: "...)
		b = append(b, g.header...)
		b = append(b, `,"choices":[]`...)
		b = g.appendUsageOf(b, prompt, completion)
		b = append(b, "}\n\n"...)
	}
	if g.req.Timings {
		b = append(b, "data: "...)
		b = append(b, g.header...)
		b = append(b, `,"choices":[]`...)
		b = g.q.appendTimings(b)
		b = append(b, "}\n\n"...)
	}
	*dst = append(b, "data: [DONE]\n\n"...)
}

// streamTemplates encodes the chunk templates of this choice once.
func (g *gen) streamTemplates(w http.ResponseWriter) {
	g.w = w
	g.header = g.appendHead(make([]byte, 0, 160), true)
	g.prefix = append(append([]byte("data: "), g.header...), `,"choices":[{"index":`...)
	g.prefix = strconv.AppendInt(g.prefix, int64(g.index), 10)
	g.prefix = append(g.prefix, ',')
	if g.req.Chat {
		g.prefix = append(g.prefix, `"delta":{"content":"`...)
		g.suffix = []byte(`"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	} else {
		g.prefix = append(g.prefix, `"text":"`...)
		g.suffix = []byte(`","logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	if g.lp != nil {
		// The chunk's logprobs go between the two halves of the suffix (appendChunk).
		g.suffix = g.suffix[:len(g.suffix)-len(`null,"finish_reason":null}]}`+"\n\n")]
	}
	g.buf = make([]byte, 0, 4096)
}

// goneType names why a stream lost its client, for the record.
func (g *gen) goneType() string {
	if g.slow {
		return "write_timeout"
	}
	return "client_disconnected"
}

// appendChunk adds one content delta event to the write buffer.
func (g *gen) appendChunk(text []byte) {
	if g.lp != nil {
		dst := &g.buf
		if swallow := g.s.faults.swallowFinalDelta; swallow {
			g.buf = append(g.buf, g.held...)
			g.held = g.held[:0]
			dst = &g.held
		}
		b := append(*dst, g.prefix...)
		b = appendJSONStringBody(b, text)
		b = append(b, g.suffix...)
		b = g.appendLogprobs(b)
		*dst = append(b, `,"finish_reason":null}]}`+"\n\n"...)
		return
	}
	if g.s.faults.swallowFinalDelta {
		g.buf = append(g.buf, g.held...)
		g.held = append(g.held[:0], g.prefix...)
		g.held = appendJSONStringBody(g.held, text)
		g.held = append(g.held, g.suffix...)
		return
	}
	g.buf = append(g.buf, g.prefix...)
	g.buf = appendJSONStringBody(g.buf, text)
	g.buf = append(g.buf, g.suffix...)
}

// send writes and flushes the buffer; false when the client is gone (or too slow: a write
// did not complete within --write-timeout, re-armed here before each write so that a stream
// the client keeps reading may run as long as it generates).
func (g *gen) send() bool {
	if len(g.buf) == 0 {
		return true
	}
	if wt := g.s.cfg.WriteTimeout; wt > 0 {
		// Re-arming costs a timer update; once a second is enough for a deadline of seconds.
		if now := time.Now(); now.Sub(g.armed) > time.Second {
			g.armed = now
			_ = g.q.rc.SetWriteDeadline(now.Add(wt))
		}
	}
	_, err := g.w.Write(g.buf)
	g.buf = g.buf[:0]
	if err == nil {
		err = g.q.rc.Flush()
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		g.slow = true
	}
	if !g.firstSent && len(g.out) > 0 {
		g.firstSent = true
		if g.q.ttft == 0 { // n > 1: the first content of any choice
			g.q.ttft = time.Since(g.q.start)
		}
	}
	// Only the client's own context says it left; the --request-timeout deadline on g.ctx
	// is answered by the caller with an error event, which needs a writable stream.
	return err == nil && g.q.r.Context().Err() == nil
}

// streamError ends a stream that already answered 200 with an OpenAI error event (what
// OpenAI's SDKs surface as an error), then [DONE].
func (g *gen) streamError(e *APIError) {
	g.q.rec.ErrorType, g.q.rec.ErrorMessage = e.Type, e.Message
	g.q.rec.FinishReason = "error"
	g.held = nil
	g.buf = append(g.buf, "data: "...)
	g.buf = append(g.buf, e.body()...)
	g.buf = append(g.buf, "\n\ndata: [DONE]\n\n"...)
	g.send()
}
