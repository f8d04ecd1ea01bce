package server

// The OpenEngine API v1 frontend (--grpc-port): services openengine.v1.Inference and
// openengine.v1.Control, plus grpc.health.v1.Health and server reflection, on their own port
// beside the HTTP routes. Why inside package server rather than beside it: a gRPC request must
// be the same request as an HTTP one in every way the harness checks (issue 39): the same
// engine pool and queue, the same tokenizer, stop-string and UTF-8 code (gen.consume), the same
// records (endpoint "grpc"), request IDs, metrics, API key, cancellation and drain.
//
// Mapping of outcomes:
//   - refused before the engine (bad field, unknown model, queue full, draining, auth): a non-OK
//     status (INVALID_ARGUMENT or UNIMPLEMENTED naming the field, NOT_FOUND, RESOURCE_EXHAUSTED,
//     UNAVAILABLE, UNAUTHENTICATED), as the OpenEngine contract asks;
//   - accepted, then failed (engine error, worker crash, drain deadline): one terminal
//     EngineError event and OK, so the client gets the tokens that came before it;
//   - --request-timeout: DEADLINE_EXCEEDED; the client cancelling: CANCELLED (client side);
//     Control.Abort: GenerationFinished with FINISH_REASON_CANCELLED and Usage.
//
// Records: route is the gRPC method (/openengine.v1.Inference/Generate), status the HTTP
// status a gateway maps the gRPC code to (OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, ...;
// oe.HTTPStatus), error_type the gRPC code in snake case.

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/modelqual/modelqual/server/envconfig"
	oe "github.com/modelqual/modelqual/server/openengine/v1"
	"github.com/modelqual/modelqual/server/record"
	"github.com/modelqual/modelqual/server/wire"
)

// GenerateMethod is the full gRPC method name of Inference.Generate (the records' route).
const GenerateMethod = "/openengine.v1.Inference/Generate"

// OpenEngine schema identity served by Control.GetServerInfo.
const (
	openEngineSchemaRelease = "ai-dynamo/openengine@4def7c50b05e0674a0c3b26917399155535966e4"
	openEngineSchemaRev     = 1
)

var (
	errAborted        = errors.New("aborted by Control.Abort")
	errDrainCut       = errors.New("the server is shutting down and the drain deadline passed")
	errRequestTimeout = errors.New("--request-timeout passed")
)

// grpcFrontend is the gRPC listener's state.
type grpcFrontend struct {
	srv    *grpc.Server
	ln     net.Listener
	health *health.Server
	// base ends every running Generate when the drain deadline passes (errDrainCut).
	base   context.Context
	cutAll context.CancelCauseFunc

	mu      sync.Mutex
	running map[string]context.CancelCauseFunc // by request ID, for Control.Abort

	// cumulative is fault server.grpc_cumulative_deltas (MODELQUAL_FAULTS): every TokenOutput
	// repeats all the text so far, the seed's regression (a full history copy per update), so
	// that the per-token cost gate can be shown to catch it.
	cumulative bool
}

// GRPCAddr is the gRPC listener's address ("" without --grpc-port).
func (s *Server) GRPCAddr() string {
	if s.grpc == nil {
		return ""
	}
	return s.grpc.ln.Addr().String()
}

// startGRPC listens on --grpc-port (when set) and serves at once: until the engines are
// ready, Generate answers UNAVAILABLE and Health says STARTING.
func (s *Server) startGRPC() error {
	if s.cfg.GRPCPort < 0 {
		return nil
	}
	addr := net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.GRPCPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("qual-server: listen on %s (--grpc-port): %w; pick another --grpc-port or stop what holds it", addr, err)
	}
	f := &grpcFrontend{ln: ln, health: health.NewServer(), running: map[string]context.CancelCauseFunc{},
		cumulative: strings.Contains(envconfig.Faults.Get(), "server.grpc_cumulative_deltas")}
	f.base, f.cutAll = context.WithCancelCause(context.Background())
	f.srv = grpc.NewServer(
		grpc.ForceServerCodecV2(frameCodec{encoding.GetCodecV2("proto")}),
		grpc.MaxRecvMsgSize(int(min(s.cfg.MaxBodyBytes, math.MaxInt32))),
		grpc.UnaryInterceptor(s.grpcUnary),
	)
	inf := oe.Inference_ServiceDesc
	inf.Streams = []grpc.StreamDesc{{StreamName: "Generate", ServerStreams: true, Handler: s.grpcGenerate}}
	f.srv.RegisterService(&inf, grpcInference{})
	oe.RegisterControlServer(f.srv, grpcControl{s: s})
	healthpb.RegisterHealthServer(f.srv, f.health)
	reflection.Register(f.srv)
	for _, svc := range []string{"", "openengine.v1.Inference", "openengine.v1.Control"} {
		f.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.grpc = f
	go func() {
		if err := f.srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Printf("grpc serve: %v", err)
		}
	}()
	log.Printf("gRPC (OpenEngine v1) listening on %s", ln.Addr())
	return nil
}

// grpcReady marks the gRPC health services SERVING once the engines are ready.
func (s *Server) grpcReady() {
	if s.grpc == nil {
		return
	}
	for _, svc := range []string{"", "openengine.v1.Inference", "openengine.v1.Control"} {
		s.grpc.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
}

// drainGRPC stops the gRPC listener as HTTP's Shutdown does: new streams get UNAVAILABLE
// (state is already draining), running ones may finish until ctx ends; then they are ended
// with a DRAINING EngineError and an honest record. The returned channel closes when every
// stream has ended.
func (s *Server) drainGRPC(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	f := s.grpc
	if f == nil {
		close(done)
		return done
	}
	f.health.Shutdown() // NOT_SERVING to health watchers
	go func() {
		stopped := make(chan struct{})
		go func() { f.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			f.cutAll(errDrainCut)
			select {
			case <-stopped:
			case <-time.After(cancelWait + time.Second):
				f.srv.Stop()
			}
		}
		close(done)
	}()
	return done
}

// frameCodec is the proto codec, except that a *frame passes through as its bytes: Generate
// reads its request as bytes (so a malformed request, such as invalid UTF-8 in a string field,
// is answered INVALID_ARGUMENT naming the field instead of gRPC's generic INTERNAL), and
// writes its events as bytes it encodes itself into pooled buffers (encodeEvent).
type frameCodec struct{ proto encoding.CodecV2 }

// frame is an already-encoded message. buf, when set, is a pooled buffer that gRPC frees once
// written.
type frame struct {
	b   []byte
	buf mem.Buffer
}

func (c frameCodec) Name() string { return "proto" }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		if f.buf != nil {
			return mem.BufferSlice{f.buf}, nil
		}
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.b = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// snakeCode is a gRPC code as records spell error types (INVALID_ARGUMENT → invalid_argument).
func snakeCode(c codes.Code) string {
	if c == codes.Canceled {
		return "cancelled"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// grpcCall is one recorded gRPC call: the reqState its record and metrics live in.
type grpcCall struct {
	q    *reqState
	code codes.Code
}

// beginGRPC starts a call's record (as begin does for HTTP). id "" takes the x-request-id
// metadata, else a fresh id.
func (s *Server) beginGRPC(ctx context.Context, method, id string) *grpcCall {
	s.handlers.Add(1)
	s.m.inflight.Inc()
	if id == "" {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get("x-request-id"); len(v) > 0 && validRequestID(v[0]) {
				id = v[0]
			}
		}
	}
	if id == "" {
		id = newRequestID()
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-request-id", id))
	now := time.Now()
	q := &reqState{s: s, start: now, recorded: true,
		rec: Record{RequestID: id, Route: method, Endpoint: record.EndpointGRPC, Model: s.cfg.ModelName,
			StartUnixNs: now.UnixNano(), WorkerID: record.WorkerIndex(-1)}}
	return &grpcCall{q: q}
}

// fail notes a refusal in the record and returns it as a status error.
func (c *grpcCall) fail(code codes.Code, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	c.code = code
	c.q.rec.ErrorType, c.q.rec.ErrorMessage = snakeCode(code), msg
	if c.q.rec.FinishReason == "" {
		c.q.rec.FinishReason = "error"
	}
	return status.Error(code, msg)
}

// failAPI turns a shared-code *APIError into a status naming the field (param) it is about.
func (c *grpcCall) failAPI(e *APIError, param string) error {
	code := codes.InvalidArgument
	switch e.Status {
	case http.StatusNotFound:
		code = codes.NotFound
	case http.StatusTooManyRequests:
		code = codes.ResourceExhausted
	case http.StatusServiceUnavailable:
		code = codes.Unavailable
	}
	if param != "" {
		return c.fail(code, "%s: %s", param, e.Message)
	}
	return c.fail(code, "%s", e.Message)
}

func (s *Server) endGRPC(c *grpcCall) {
	c.q.status = oe.HTTPStatus(c.code)
	s.end(c.q)
}

// grpcAuth checks the API key (authorization: Bearer KEY metadata) and the server state.
func (s *Server) grpcAuth(ctx context.Context) (codes.Code, string) {
	if s.cfg.APIKey != "" {
		md, _ := metadata.FromIncomingContext(ctx)
		var got string
		if v := md.Get("authorization"); len(v) > 0 {
			got, _ = strings.CutPrefix(v[0], "Bearer ")
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) != 1 {
			return codes.Unauthenticated, "missing or wrong API key; send metadata authorization: Bearer <key> as given to --api-key"
		}
	}
	switch s.state.Load() {
	case stateLoading:
		return codes.Unavailable, "the model is still loading; poll Control.Health or grpc.health.v1.Health until it answers ready"
	case stateDraining:
		return codes.Unavailable, "the server is shutting down"
	}
	return codes.OK, ""
}

// grpcUnary guards and records the Control RPCs (Health unrecorded and open, as GET /health
// is; grpc.health.v1 and reflection too).
func (s *Server) grpcUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/openengine.v1.") {
		return h(ctx, req)
	}
	if info.FullMethod == "/openengine.v1.Control/Health" {
		return h(ctx, req)
	}
	c := s.beginGRPC(ctx, info.FullMethod, "")
	defer s.endGRPC(c)
	if code, msg := s.grpcAuth(ctx); code != codes.OK {
		return nil, c.fail(code, "%s", msg)
	}
	resp, err := h(ctx, req)
	if err != nil {
		st, _ := status.FromError(err)
		return nil, c.fail(st.Code(), "%s", st.Message())
	}
	return resp, nil
}

type grpcInference struct {
	oe.UnimplementedInferenceServer
}

// genOptions are what a GenerateRequest asks beyond GenRequest: stop token ids.
type genOptions struct {
	stopIDs   []int32
	maxTokSet bool
	inputName string // "prompt" or "token_ids"
}

// MaxStopTokenIDs bounds StoppingOptions' stop token ids.
const MaxStopTokenIDs = 64

// mapGenerateRequest turns a GenerateRequest into the HTTP path's GenRequest, refusing what
// qual-server does not implement by field name (UNIMPLEMENTED) and bad values
// (INVALID_ARGUMENT). Checks that need the bundle (vocabulary, context, model name) follow in
// grpcGenerate. Never panics (FuzzMapGenerateRequest).
func mapGenerateRequest(req *oe.GenerateRequest) (*GenRequest, genOptions, error) {
	var o genOptions
	bad := func(field, format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
	}
	unsup := func(field, what string) error {
		return status.Errorf(codes.Unimplemented, "%s: %s is not supported by qual-server; leave it unset", field, what)
	}
	r := &GenRequest{Model: req.GetModel(), Temperature: 1, TopP: 1, Stream: true}
	switch in := req.GetInput().(type) {
	case *oe.GenerateRequest_Prompt:
		o.inputName = "prompt"
		if !utf8.ValidString(in.Prompt) {
			return nil, o, bad("prompt", "not valid UTF-8")
		}
		if in.Prompt == "" {
			return nil, o, bad("prompt", "empty; send text or token_ids")
		}
		r.Prompt = in.Prompt
	case *oe.GenerateRequest_TokenIds:
		o.inputName = "token_ids"
		ids := in.TokenIds.GetIds()
		if len(ids) == 0 {
			return nil, o, bad("token_ids.ids", "empty; send at least one token id")
		}
		r.PromptIDs, r.HasPromptIDs = make([]int32, len(ids)), true
		for i, id := range ids {
			if id > math.MaxInt32 {
				return nil, o, bad(fmt.Sprintf("token_ids.ids[%d]", i), "token id %d is outside the vocabulary", id)
			}
			r.PromptIDs[i] = int32(id)
		}
	default:
		return nil, o, bad("input", "missing; set prompt (text) or token_ids")
	}
	if len(req.GetMedia()) > 0 {
		return nil, o, unsup("media", "multimodal input")
	}
	if req.GetLoraName() != "" {
		return nil, o, unsup("lora_name", "LoRA adapters")
	}
	if req.GetKv() != nil {
		return nil, o, unsup("kv", "KV sessions and cache options")
	}
	if req.GetGuided() != nil {
		return nil, o, unsup("guided", "guided decoding")
	}
	if len(req.GetExtra().GetFields()) > 0 {
		for k := range req.GetExtra().GetFields() {
			return nil, o, unsup("extra."+k, "engine-specific parameters")
		}
	}
	if sp := req.GetSampling(); sp != nil {
		if sp.Temperature != nil {
			t := sp.GetTemperature()
			if math.IsNaN(t) || t < 0 || t > 2 {
				return nil, o, bad("sampling.temperature", "must be between 0 and 2, got %v", t)
			}
			r.Temperature = t
		}
		if sp.TopP != nil {
			p := sp.GetTopP()
			if math.IsNaN(p) || p <= 0 || p > 1 {
				return nil, o, bad("sampling.top_p", "must be in (0, 1], got %v", p)
			}
			r.TopP = p
		}
		if sp.TopK != nil {
			k := sp.GetTopK()
			if k < -1 {
				return nil, o, bad("sampling.top_k", "must be >= -1 (-1 or 0: off), got %d", k)
			}
			r.TopK = int(max(k, 0))
		}
		if sp.Seed != nil {
			r.Seed, r.HasSeed = sp.GetSeed(), true
		}
		if sp.MinP != nil && sp.GetMinP() != 0 {
			return nil, o, unsup("sampling.min_p", "min_p sampling")
		}
		if sp.FrequencyPenalty != nil && sp.GetFrequencyPenalty() != 0 {
			return nil, o, unsup("sampling.frequency_penalty", "frequency penalty")
		}
		if sp.PresencePenalty != nil && sp.GetPresencePenalty() != 0 {
			return nil, o, unsup("sampling.presence_penalty", "presence penalty")
		}
		if sp.RepetitionPenalty != nil && sp.GetRepetitionPenalty() != 1 {
			return nil, o, unsup("sampling.repetition_penalty", "repetition penalty")
		}
		if sp.NumSequences != nil && sp.GetNumSequences() != 1 {
			if sp.GetNumSequences() == 0 {
				return nil, o, bad("sampling.num_sequences", "must be at least 1")
			}
			return nil, o, unsup("sampling.num_sequences", "more than one sequence per request")
		}
	}
	if st := req.GetStopping(); st != nil {
		if st.MaxTokens != nil {
			if st.GetMaxTokens() == 0 {
				return nil, o, bad("stopping.max_tokens", "must be at least 1 (unset: the rest of the context)")
			}
			if st.GetMaxTokens() > math.MaxInt32 {
				return nil, o, bad("stopping.max_tokens", "%d is beyond any context", st.GetMaxTokens())
			}
			r.MaxTokens, o.maxTokSet = int(st.GetMaxTokens()), true
		}
		if st.GetMinTokens() != 0 {
			return nil, o, unsup("stopping.min_tokens", "a minimum output length")
		}
		r.IncludeStopStr = st.GetIncludeStopInOutput()
		r.IgnoreEOS = st.GetIgnoreEos()
		if len(st.GetConditions()) > MaxStopStrings+MaxStopTokenIDs {
			return nil, o, bad("stopping.conditions", "%d conditions; at most %d stop texts and %d stop token ids", len(st.GetConditions()), MaxStopStrings, MaxStopTokenIDs)
		}
		for i, c := range st.GetConditions() {
			field := fmt.Sprintf("stopping.conditions[%d]", i)
			switch c := c.GetCondition().(type) {
			case *oe.StopCondition_StopText:
				if c.StopText == "" {
					return nil, o, bad(field+".stop_text", "must not be empty")
				}
				if !utf8.ValidString(c.StopText) {
					return nil, o, bad(field+".stop_text", "not valid UTF-8")
				}
				if len(r.Stop) == MaxStopStrings {
					return nil, o, bad(field+".stop_text", "more than %d stop texts", MaxStopStrings)
				}
				r.Stop = append(r.Stop, c.StopText)
			case *oe.StopCondition_StopTokenId:
				if c.StopTokenId > math.MaxInt32 {
					return nil, o, bad(field+".stop_token_id", "token id %d is outside the vocabulary", c.StopTokenId)
				}
				if len(o.stopIDs) == MaxStopTokenIDs {
					return nil, o, bad(field+".stop_token_id", "more than %d stop token ids", MaxStopTokenIDs)
				}
				o.stopIDs = append(o.stopIDs, int32(c.StopTokenId))
			default:
				return nil, o, bad(field, "empty; set stop_text or stop_token_id")
			}
		}
	}
	if rp := req.GetResponse(); rp != nil {
		if rp.GetReturnPromptLogprobs() || rp.PromptCandidates != nil || rp.PromptLogprobStart != nil {
			return nil, o, unsup("response.return_prompt_logprobs", "prompt logprobs (the engine scores generated tokens only)")
		}
		if c := rp.GetOutputCandidates(); c != nil {
			if !rp.GetReturnOutputLogprobs() {
				return nil, o, bad("response.output_candidates", "needs response.return_output_logprobs: true")
			}
			switch sel := c.GetSelection().(type) {
			case *oe.CandidateTokenSelection_TopN:
				if sel.TopN > MaxTopLogprobs {
					return nil, o, bad("response.output_candidates.top_n", "%d is more than the %d candidates a token carries", sel.TopN, MaxTopLogprobs)
				}
				r.TopLogprobs = int(sel.TopN)
			case *oe.CandidateTokenSelection_TokenIds:
				return nil, o, unsup("response.output_candidates.token_ids", "candidates chosen by id (use top_n)")
			case *oe.CandidateTokenSelection_All:
				return nil, o, unsup("response.output_candidates.all", "the whole vocabulary as candidates (use top_n <= 20)")
			default:
				return nil, o, bad("response.output_candidates", "set top_n")
			}
		}
		r.Logprobs = rp.GetReturnOutputLogprobs()
	}
	return r, o, nil
}

// invalidUTF8Field names the string field of a GenerateRequest that holds invalid UTF-8 (the
// reason proto.Unmarshal refused it), or "" when none does.
func invalidUTF8Field(b []byte) string {
	type path struct {
		name string
		sub  map[protowire.Number]path
	}
	var walk func(b []byte, fields map[protowire.Number]path, prefix string) string
	walk = func(b []byte, fields map[protowire.Number]path, prefix string) string {
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return ""
			}
			b = b[n:]
			if typ != protowire.BytesType {
				n = protowire.ConsumeFieldValue(num, typ, b)
				if n < 0 {
					return ""
				}
				b = b[n:]
				continue
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			b = b[n:]
			p, ok := fields[num]
			switch {
			case !ok:
			case p.sub == nil && !utf8.Valid(v):
				return prefix + p.name
			case p.sub != nil:
				if f := walk(v, p.sub, prefix+p.name+"."); f != "" {
					return f
				}
			}
		}
		return ""
	}
	stop := map[protowire.Number]path{1: {name: "stop_text"}}
	return walk(b, map[protowire.Number]path{
		1: {name: "request_id"}, 2: {name: "model"}, 3: {name: "prompt"}, 11: {name: "lora_name"},
		6: {name: "stopping", sub: map[protowire.Number]path{3: {name: "conditions", sub: stop}}},
	}, "")
}

// grpcGenerate serves Inference.Generate: one request read as bytes, mapped onto the HTTP
// path's validation and scheduling, then streamed as TokenOutput deltas.
func (s *Server) grpcGenerate(_ any, stream grpc.ServerStream) error {
	ctx := stream.Context()
	var in frame
	rerr := stream.RecvMsg(&in)
	req := &oe.GenerateRequest{}
	var uerr error
	if rerr == nil {
		uerr = proto.Unmarshal(in.b, req)
	}
	c := s.beginGRPC(ctx, GenerateMethod, req.GetRequestId())
	defer s.endGRPC(c)
	q := c.q
	q.rec.Stream = true
	switch {
	case rerr != nil:
		st, _ := status.FromError(rerr)
		if st.Code() == codes.ResourceExhausted {
			return c.fail(codes.ResourceExhausted, "request message is larger than the %d-byte limit (--max-body)", s.cfg.MaxBodyBytes)
		}
		return c.fail(st.Code(), "%s", st.Message())
	case uerr != nil:
		if f := invalidUTF8Field(in.b); f != "" {
			return c.fail(codes.InvalidArgument, "%s: not valid UTF-8; send UTF-8 text", f)
		}
		return c.fail(codes.InvalidArgument, "the request is not a valid openengine.v1.GenerateRequest: %v", uerr)
	}
	if id := req.GetRequestId(); id != "" && !validRequestID(id) {
		return c.fail(codes.InvalidArgument, "request_id: use 1 to 200 printable ASCII characters without spaces")
	}
	if code, msg := s.grpcAuth(ctx); code != codes.OK {
		return c.fail(code, "%s", msg)
	}
	greq, opt, err := mapGenerateRequest(req)
	if err != nil {
		st, _ := status.FromError(err)
		return c.fail(st.Code(), "%s", st.Message())
	}
	if greq.Model != "" && greq.Model != s.cfg.ModelName {
		return c.failAPI(s.unknownModel(greq.Model), "model")
	}
	ids, aerr := s.promptIDs(q, greq)
	if aerr != nil {
		return c.failAPI(aerr, opt.inputName)
	}
	if !opt.maxTokSet && len(ids) < s.info.MaxContext {
		greq.MaxTokens = s.info.MaxContext - len(ids) // unset: up to the context
	}
	maxTok, aerr := s.capacity(greq, len(ids))
	if aerr != nil {
		field := opt.inputName
		if aerr.Param == "max_tokens" {
			field = "stopping.max_tokens"
		}
		return c.failAPI(aerr, field)
	}
	if aerr := s.checkIDs(opt.stopIDs, "stopping.conditions.stop_token_id"); aerr != nil {
		return c.failAPI(aerr, "")
	}

	// Registered for Control.Abort; a duplicate running id would make Abort ambiguous.
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f := s.grpc
	f.mu.Lock()
	if _, dup := f.running[q.rec.RequestID]; dup {
		f.mu.Unlock()
		return c.fail(codes.AlreadyExists, "request_id: %q is already running; use a unique id per request", q.rec.RequestID)
	}
	f.running[q.rec.RequestID] = cancel
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.running, q.rec.RequestID)
		f.mu.Unlock()
	}()
	stopCut := context.AfterFunc(f.base, func() { cancel(context.Cause(f.base)) })
	defer stopCut()
	if s.cfg.RequestTimeout > 0 {
		var c2 context.CancelFunc
		gctx, c2 = context.WithTimeoutCause(gctx, s.cfg.RequestTimeout, errRequestTimeout)
		defer c2()
	}

	t := s.newGenTask(greq, ids, maxTok)
	switch err := s.admit(q, t, gctx); {
	case err == nil:
	case errors.Is(err, errQueueFull):
		return c.fail(codes.ResourceExhausted, "every batch slot is busy and the queue is full (--queue-depth %d); retry later", s.cfg.QueueDepth)
	case errors.Is(err, errClosing):
		return c.fail(codes.Unavailable, "the server is shutting down")
	case errors.As(err, new(*NoWorkerError)):
		return c.fail(codes.Unavailable, "%v; qual-server keeps trying to start one (see /health)", err)
	default:
		return s.grpcEnded(c, nil, gctx)
	}
	g := &gen{s: s, q: q, t: t, req: greq, ctx: gctx, dec: s.textDecoder(t), stop: newStopMatcher(greq.Stop, greq.IncludeStopStr)}
	gs := &grpcStream{g: g, c: c, stream: stream, stopIDs: opt.stopIDs}
	return gs.run()
}

// grpcEnded answers a call whose context ended (g nil: while queued).
func (s *Server) grpcEnded(c *grpcCall, gs *grpcStream, ctx context.Context) error {
	cause := context.Cause(ctx)
	if gs != nil {
		gs.g.fillRecord()
	}
	switch {
	case errors.Is(cause, errAborted):
		c.q.rec.FinishReason = "cancelled"
		if gs != nil {
			return gs.finish(oe.FinishReason_FINISH_REASON_CANCELLED, nil)
		}
		return c.fail(codes.Canceled, "request_id %q was aborted by Control.Abort while queued", c.q.rec.RequestID)
	case errors.Is(cause, errDrainCut):
		if gs != nil {
			return gs.engineError(oe.ErrorCode_ERROR_CODE_DRAINING, "shutting_down", errDrainCut.Error(), true)
		}
		return c.fail(codes.Unavailable, "%v", errDrainCut)
	case errors.Is(cause, errRequestTimeout):
		return c.fail(codes.DeadlineExceeded, "the request did not finish within --request-timeout %v", s.cfg.RequestTimeout)
	case errors.Is(cause, context.DeadlineExceeded):
		c.q.rec.FinishReason = "cancelled"
		return c.fail(codes.DeadlineExceeded, "the client's deadline passed")
	}
	c.q.rec.FinishReason = "cancelled"
	return c.fail(codes.Canceled, "the client cancelled the call")
}

// grpcStream writes one Generate's events.
type grpcStream struct {
	g       *gen
	c       *grpcCall
	stream  grpc.ServerStream
	stopIDs []int32
	idStop  int32 // the stop token id that ended generation, -1: none
	lastTok int32 // the last token consumed (the EOS on a natural end)
	sent    int   // bytes of g.out already sent
	toks    []int32
	lps     []*wire.Logprobs // toks' logprobs when the request asked for them
	spare   []int32
	spareLP []*wire.Logprobs
	first   bool
}

func (gs *grpcStream) run() error {
	g := gs.g
	gs.idStop = -1
	for {
		toks, lps, done := g.t.takeLogprobs(gs.spare, gs.spareLP)
		gs.consume(toks, lps)
		gs.spare, gs.spareLP = toks, lps
		if len(gs.toks) > 0 || g.sentText(gs.sent) {
			if err := gs.sendDelta(); err != nil {
				g.abandon()
				g.consume(g.takeAll())
				g.fillRecord()
				gs.c.q.rec.FinishReason = "cancelled"
				return gs.c.fail(codes.Canceled, "the client went away: %v", err)
			}
		}
		if done {
			break
		}
		g.wait()
		if g.gone {
			gs.consume(g.takeAll())
			return gs.g.s.grpcEnded(gs.c, gs, g.ctx)
		}
	}
	g.finishText()
	if g.sentText(gs.sent) {
		if err := gs.sendDelta(); err != nil {
			g.fillRecord()
			gs.c.q.rec.FinishReason = "cancelled"
			return gs.c.fail(codes.Canceled, "the client went away: %v", err)
		}
	}
	g.fillRecord()
	if gs.idStop < 0 {
		if aerr := g.engineError(); aerr != nil {
			return gs.engineError(oe.ErrorCode_ERROR_CODE_INTERNAL, aerr.Type, aerr.Message, aerr.Code == "worker_crashed")
		}
	}
	var match *oe.StopMatch
	reason := oe.FinishReason_FINISH_REASON_LENGTH
	switch {
	case gs.idStop >= 0:
		reason = oe.FinishReason_FINISH_REASON_STOP
		match = &oe.StopMatch{Match: &oe.StopMatch_StopTokenId{StopTokenId: uint32(gs.idStop)}}
		gs.c.q.rec.FinishReason = "stop"
	case g.stopped:
		reason = oe.FinishReason_FINISH_REASON_STOP
		match = &oe.StopMatch{Match: &oe.StopMatch_StopText{StopText: g.req.Stop[g.stop.hit]}}
	case g.t.res.Reason == wire.ReasonStop:
		reason = oe.FinishReason_FINISH_REASON_STOP
		if g.isEOS(gs.lastTok) {
			match = &oe.StopMatch{Match: &oe.StopMatch_EosTokenId{EosTokenId: uint32(gs.lastTok)}}
		}
	case g.t.res.Reason == wire.ReasonCancelled:
		reason = oe.FinishReason_FINISH_REASON_CANCELLED
	}
	return gs.finish(reason, match)
}

// consume hands tokens to the shared text path (gen.consume) and keeps their ids for the next
// delta, ending generation at a stop token id (counted as output, its text not sent, as with
// EOS).
func (gs *grpcStream) consume(toks []int32, lps []*wire.Logprobs) {
	g := gs.g
	for i, tok := range toks {
		if g.stopped || gs.idStop >= 0 {
			return
		}
		for _, id := range gs.stopIDs {
			if tok == id {
				n := g.ntok
				g.consume(toks[:i], lps)
				gs.keep(toks[:g.ntok-n], lps)
				if !g.stopped {
					g.ntok++
					gs.idStop = tok
					gs.keep(toks[i:i+1], lpsFrom(lps, i))
					g.s.pool.cancel(g.t)
				}
				return
			}
		}
	}
	n := g.ntok
	g.consume(toks, lps)
	gs.keep(toks[:g.ntok-n], lps)
}

// lpsFrom is lps[i:], or nil when the request has no logprobs.
func lpsFrom(lps []*wire.Logprobs, i int) []*wire.Logprobs {
	if i >= len(lps) {
		return nil
	}
	return lps[i:]
}

// keep adds consumed tokens (and, when asked for, their logprobs: lps is aligned with toks)
// to the next delta.
func (gs *grpcStream) keep(toks []int32, lps []*wire.Logprobs) {
	gs.toks = append(gs.toks, toks...)
	if gs.g.req.Logprobs {
		for i := range toks {
			var lp *wire.Logprobs
			if i < len(lps) {
				lp = lps[i]
			}
			gs.lps = append(gs.lps, lp)
		}
	}
	if len(toks) > 0 {
		gs.lastTok = toks[len(toks)-1]
	}
}

// sentText reports whether g.out has text beyond the first sent bytes.
func (g *gen) sentText(sent int) bool { return len(g.out) > sent }

// sendDelta sends the tokens and text gathered since the last delta: never cumulative.
func (gs *grpcStream) sendDelta() error {
	g := gs.g
	text := g.out[gs.sent:]
	if g.s.grpc.cumulative {
		text = g.out // the seed's regression, planted: every update repeats the history
	}
	var msg any
	if g.req.Logprobs {
		msg = gs.logprobsEvent(text)
	} else {
		msg = encodeTokenEvent(gs.c.q.rec.RequestID, gs.toks, text)
	}
	gs.sent = len(g.out)
	gs.toks, gs.lps = gs.toks[:0], gs.lps[:0]
	err := gs.stream.SendMsg(msg)
	if !gs.first && len(g.out) > 0 {
		gs.first = true
		g.q.ttft = time.Since(g.q.start)
	}
	return err
}

// logprobsEvent is the TokenOutput of a request that asked for logprobs: each TokenInfo
// carries the token's text, logprob and rank, and its top_n candidates (with their text).
// Built with the proto library: this path is not the per-token hot path that
// encodeTokenEvent keeps allocation-free.
func (gs *grpcStream) logprobsEvent(text []byte) *oe.GenerateResponse {
	g := gs.g
	idx := uint32(0)
	out := &oe.TokenOutput{OutputIndex: &idx, Text: string(text), Tokens: make([]*oe.TokenInfo, len(gs.toks))}
	var tb []byte
	tokText := func(id int32) string {
		tb = g.s.tok.TokenBytes(tb[:0], id)
		return string(appendLossyUTF8(nil, tb))
	}
	for i, tok := range gs.toks {
		ti := &oe.TokenInfo{TokenId: uint32(tok), Token: tokText(tok)}
		if i < len(gs.lps) && gs.lps[i] != nil {
			lp := gs.lps[i]
			x, rank := float64(lp.Logprob), lp.Rank
			ti.Logprob, ti.Rank = &x, &rank
			for j, c := range lp.Top[:min(len(lp.Top), g.req.TopLogprobs)] {
				r := uint32(j + 1)
				ti.Candidates = append(ti.Candidates, &oe.LogProb{TokenId: uint32(c.ID), Logprob: float64(c.Logprob), Token: tokText(c.ID), Rank: &r})
			}
		}
		out.Tokens[i] = ti
	}
	return &oe.GenerateResponse{RequestId: gs.c.q.rec.RequestID, Event: &oe.GenerateResponse_Token{Token: out}}
}

// finish sends GenerationFinished with Usage and ends the call with OK.
func (gs *grpcStream) finish(reason oe.FinishReason, match *oe.StopMatch) error {
	g := gs.g
	idx := uint32(0)
	resp := &oe.GenerateResponse{RequestId: gs.c.q.rec.RequestID,
		Event: &oe.GenerateResponse_Finished{Finished: &oe.GenerationFinished{OutputIndex: &idx, Reason: reason, StopMatch: match}},
		Usage: &oe.Usage{PromptTokens: uint32(len(g.t.prompt)), CompletionTokens: uint32(g.ntok), TotalTokens: uint32(len(g.t.prompt) + g.ntok)}}
	if err := gs.stream.SendMsg(resp); err != nil {
		gs.c.q.rec.FinishReason = "cancelled"
		return gs.c.fail(codes.Canceled, "the client went away: %v", err)
	}
	return nil
}

// engineError ends an accepted stream with one terminal EngineError (and OK), recording it.
func (gs *grpcStream) engineError(code oe.ErrorCode, errType, msg string, retryable bool) error {
	g := gs.g
	q := gs.c.q
	q.rec.ErrorType, q.rec.ErrorMessage, q.rec.FinishReason = errType, msg, "error"
	resp := &oe.GenerateResponse{RequestId: q.rec.RequestID,
		Event: &oe.GenerateResponse_Error{Error: &oe.EngineError{Code: code, Message: msg, Retryable: retryable}},
		Usage: &oe.Usage{PromptTokens: uint32(len(g.t.prompt)), CompletionTokens: uint32(g.ntok), TotalTokens: uint32(len(g.t.prompt) + g.ntok)}}
	_ = gs.stream.SendMsg(resp)
	return nil
}

// encodeTokenEvent encodes GenerateResponse{request_id, token: TokenOutput{output_index: 0,
// tokens: [{token_id}...], text}} by hand into a pooled buffer that gRPC frees once written:
// the per-token path allocates no message and runs no reflection. TestTokenEventEncoding checks
// it against proto.Marshal.
func encodeTokenEvent(requestID string, toks []int32, text []byte) *frame {
	// TokenOutput body size.
	inner := 2 // output_index: tag + varint 0
	for _, t := range toks {
		ti := 1 + protowire.SizeVarint(uint64(uint32(t))) // TokenInfo{token_id}
		if t == 0 {
			ti = 0 // proto3 omits a zero token_id
		}
		inner += 1 + protowire.SizeVarint(uint64(ti)) + ti
	}
	if len(text) > 0 {
		inner += 1 + protowire.SizeVarint(uint64(len(text))) + len(text)
	}
	n := 0
	if requestID != "" {
		n += 1 + protowire.SizeVarint(uint64(len(requestID))) + len(requestID)
	}
	n += 1 + protowire.SizeVarint(uint64(inner)) + inner
	pool := mem.DefaultBufferPool()
	bp := pool.Get(n)
	b := (*bp)[:0]
	if requestID != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, requestID)
	}
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 0)
	for _, t := range toks {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		if t == 0 {
			b = protowire.AppendVarint(b, 0)
			continue
		}
		v := uint64(uint32(t))
		b = protowire.AppendVarint(b, uint64(1+protowire.SizeVarint(v)))
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	if len(text) > 0 {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, text)
	}
	*bp = b
	return &frame{buf: mem.NewBuffer(bp, pool)}
}

// grpcControl serves openengine.v1.Control.
type grpcControl struct {
	oe.UnimplementedControlServer
	s *Server
}

func (c grpcControl) Health(ctx context.Context, req *oe.HealthRequest) (*oe.HealthResponse, error) {
	s := c.s
	if req.GetIncludeInferenceProbe() {
		return nil, status.Error(codes.Unimplemented, "include_inference_probe: inference probes are not supported; send a Generate instead")
	}
	if req.GetModel() != "" && req.GetModel() != s.cfg.ModelName {
		return nil, status.Errorf(codes.NotFound, "model: %q does not exist; this server serves %q", req.GetModel(), s.cfg.ModelName)
	}
	st := oe.HealthState_HEALTH_STATE_READY
	msg := ""
	switch s.state.Load() {
	case stateLoading:
		st, msg = oe.HealthState_HEALTH_STATE_STARTING, "loading the bundle and starting workers"
	case stateDraining:
		st, msg = oe.HealthState_HEALTH_STATE_DRAINING, "shutting down"
	default:
		if n := s.pool.readyWorkers(); n == 0 {
			st, msg = oe.HealthState_HEALTH_STATE_NOT_READY, "no worker is alive"
		} else if n < s.cfg.Workers {
			st, msg = oe.HealthState_HEALTH_STATE_DEGRADED, fmt.Sprintf("%d of %d workers alive", n, s.cfg.Workers)
		}
	}
	return &oe.HealthResponse{State: st, Checks: []*oe.HealthCheck{{Name: "scheduler", State: st, Message: msg}}}, nil
}

func (c grpcControl) GetServerInfo(ctx context.Context, _ *oe.GetServerInfoRequest) (*oe.ServerInfo, error) {
	s := c.s
	maxRun := uint64(s.info.MaxBatch * s.cfg.Workers)
	one := uint32(1)
	dp := uint32(s.cfg.Workers)
	return &oe.ServerInfo{
		EngineName: "qual-server", EngineVersion: "modelqual", EngineRole: oe.EngineRole_ENGINE_ROLE_AGGREGATED,
		InstanceId: s.GRPCAddr(), SupportedModels: []string{s.cfg.ModelName},
		Parallelism:    &oe.ParallelismInfo{TensorParallelSize: &one, PipelineParallelSize: &one, DataParallelSize: &dp},
		SchemaRevision: openEngineSchemaRev, MinimumClientRevision: openEngineSchemaRev, SchemaRelease: openEngineSchemaRelease,
		Capacity: &oe.DeploymentCapacity{MaxRunningRequests: &maxRun},
	}, nil
}

func (c grpcControl) GetModelInfo(ctx context.Context, req *oe.GetModelInfoRequest) (*oe.ModelInfo, error) {
	s := c.s
	if req.GetModel() != "" && req.GetModel() != s.cfg.ModelName {
		return nil, status.Errorf(codes.NotFound, "model: %q does not exist; this server serves %q", req.GetModel(), s.cfg.ModelName)
	}
	ctxLen := uint32(s.info.MaxContext)
	yes, no := true, false
	one, maxTop := uint32(1), uint32(MaxTopLogprobs)
	return &oe.ModelInfo{
		ModelId: s.cfg.ModelName, ServedModelName: s.cfg.ModelName, MaxContextLength: &ctxLen, MaxOutputTokens: &ctxLen,
		TokenizerModes: []string{"text", "token_ids"}, SupportsTextInput: &yes, SupportsTokenIdsInput: &yes,
		SupportsLora: &no, SupportsMultimodal: &no,
		Generation: &oe.GenerationCapabilities{
			PromptLogprobs: &oe.LogprobCapabilities{Supported: &no},
			OutputLogprobs: &oe.LogprobCapabilities{Supported: &yes, MaxTopN: &maxTop,
				CandidateSelectionModes: []oe.CandidateTokenSelectionMode{oe.CandidateTokenSelectionMode_CANDIDATE_TOKEN_SELECTION_MODE_TOP_N}},
			GuidedDecoding: &oe.GuidedDecodingCapabilities{Supported: &no}, MaxNumSequences: &one,
			SupportsPriority: &no, SupportsStopInOutput: &yes, SupportsCacheSalt: &no, SupportsPrefixCacheBypass: &no,
		},
	}, nil
}

func (c grpcControl) GetLoad(ctx context.Context, req *oe.GetLoadRequest) (*oe.LoadInfo, error) {
	s := c.s
	if req.GetIncludePerRank() {
		return nil, status.Error(codes.Unimplemented, "include_per_rank: per-rank load is not reported; each worker is one engine")
	}
	p := s.pool
	p.mu.Lock()
	var running uint32
	for _, w := range p.workers {
		if w != nil && w.alive {
			running += uint32(w.inflight)
		}
	}
	queued := uint32(len(p.waiting))
	p.mu.Unlock()
	now := uint64(time.Now().UnixNano())
	return &oe.LoadInfo{InstanceId: s.GRPCAddr(), TimestampUnixNanos: &now, RunningRequests: &running, QueuedRequests: &queued}, nil
}

func (c grpcControl) Abort(ctx context.Context, req *oe.AbortRequest) (*oe.AbortResponse, error) {
	f := c.s.grpc
	switch t := req.GetTarget().(type) {
	case *oe.AbortRequest_RequestId:
		f.mu.Lock()
		cancel, ok := f.running[t.RequestId]
		f.mu.Unlock()
		if !ok {
			return &oe.AbortResponse{Status: oe.AbortStatus_ABORT_STATUS_ALREADY_FINISHED,
				Message: fmt.Sprintf("no Generate with request_id %q is running here (finished, or never started)", t.RequestId)}, nil
		}
		cancel(errAborted)
		return &oe.AbortResponse{Status: oe.AbortStatus_ABORT_STATUS_ABORTED}, nil
	case *oe.AbortRequest_AllRequests:
		f.mu.Lock()
		n := len(f.running)
		for _, cancel := range f.running {
			cancel(errAborted)
		}
		f.mu.Unlock()
		return &oe.AbortResponse{Status: oe.AbortStatus_ABORT_STATUS_ABORTED, Message: fmt.Sprintf("aborted %d running Generate calls", n)}, nil
	case *oe.AbortRequest_KvSession:
		return nil, status.Error(codes.Unimplemented, "kv_session: KV sessions are not supported")
	}
	return nil, status.Error(codes.InvalidArgument, "target: set request_id or all_requests")
}

func (grpcControl) LoadLora(context.Context, *oe.LoadLoraRequest) (*oe.LoadLoraResponse, error) {
	return nil, status.Error(codes.Unimplemented, "LoadLora: LoRA adapters are not supported by qual-server")
}

func (grpcControl) UnloadLora(context.Context, *oe.UnloadLoraRequest) (*oe.UnloadLoraResponse, error) {
	return nil, status.Error(codes.Unimplemented, "UnloadLora: LoRA adapters are not supported by qual-server")
}

func (grpcControl) ListLoras(context.Context, *oe.ListLorasRequest) (*oe.ListLorasResponse, error) {
	return nil, status.Error(codes.Unimplemented, "ListLoras: LoRA adapters are not supported by qual-server")
}

func (grpcControl) GetKvEventSources(context.Context, *oe.GetKvEventSourcesRequest) (*oe.GetKvEventSourcesResponse, error) {
	return nil, status.Error(codes.Unimplemented, "GetKvEventSources: KV events are not supported by qual-server")
}

func (grpcControl) SubscribeKvEvents(*oe.SubscribeKvEventsRequest, grpc.ServerStreamingServer[oe.SubscribeKvEventsResponse]) error {
	return status.Error(codes.Unimplemented, "SubscribeKvEvents: KV events are not supported by qual-server")
}
