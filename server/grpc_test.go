package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// grpcServer is a qual-server started with --grpc-port and a client connection to it.
type grpcServer struct {
	*testServer
	addr string
	conn *grpc.ClientConn
	inf  oe.InferenceClient
	ctl  oe.ControlClient
}

func startGRPCServer(t testing.TB, bundlePath string, args ...string) *grpcServer {
	t.Helper()
	gp := freePort(t)
	s := startServer(t, bundlePath, append([]string{"--grpc-port", strconv.Itoa(gp)}, args...)...)
	addr := fmt.Sprintf("127.0.0.1:%d", gp)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &grpcServer{testServer: s, addr: addr, conn: conn, inf: oe.NewInferenceClient(conn), ctl: oe.NewControlClient(conn)}
}

// genResult is a Generate stream as a client sees it.
type genResult struct {
	text     string
	toks     []uint32
	deltas   int
	prompts  int
	finished *oe.GenerationFinished
	usage    *oe.Usage
	engErr   *oe.EngineError
	ids      map[string]bool // request_id of every event
	header   metadata.MD
	after    int // events after the terminal one (must be 0)
}

func (g *grpcServer) generate(ctx context.Context, req *oe.GenerateRequest, opts ...grpc.CallOption) (genResult, error) {
	r := genResult{ids: map[string]bool{}}
	st, err := g.inf.Generate(ctx, req, append(opts, grpc.Header(&r.header))...)
	if err != nil {
		return r, err
	}
	return r, collect(st, &r, nil)
}

// collect reads st's events into r until the stream ends, or until stop (when given) reports
// true after an event.
func collect(st grpc.ServerStreamingClient[oe.GenerateResponse], r *genResult, stop func() bool) error {
	for {
		if stop != nil && stop() {
			return nil
		}
		ev, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		r.ids[ev.GetRequestId()] = true
		if r.finished != nil || r.engErr != nil {
			r.after++
		}
		switch e := ev.GetEvent().(type) {
		case *oe.GenerateResponse_Prompt:
			r.prompts++
		case *oe.GenerateResponse_Token:
			r.deltas++
			r.text += e.Token.GetText()
			for _, ti := range e.Token.GetTokens() {
				r.toks = append(r.toks, ti.GetTokenId())
			}
		case *oe.GenerateResponse_Finished:
			r.finished = e.Finished
			r.usage = ev.GetUsage()
		case *oe.GenerateResponse_Error:
			r.engErr = e.Error
			r.usage = ev.GetUsage()
		}
	}
}

// firstToken starts req as a stream and reads it until its first token has arrived, so that
// what the test does next (an abort, a drain) finds a stream under way with output.
func firstToken(t *testing.T, g *grpcServer, req *oe.GenerateRequest) (grpc.ServerStreamingClient[oe.GenerateResponse], *genResult) {
	t.Helper()
	st, err := g.inf.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	r := &genResult{ids: map[string]bool{}}
	if err := collect(st, r, func() bool { return r.deltas > 0 }); err != nil || r.deltas == 0 {
		t.Fatalf("%s: no token arrived (%v)", req.GetRequestId(), err)
	}
	return st, r
}

func textReq(prompt string, maxTok uint32) *oe.GenerateRequest {
	temp := 0.0
	return &oe.GenerateRequest{Input: &oe.GenerateRequest_Prompt{Prompt: prompt},
		Sampling: &oe.SamplingParams{Temperature: &temp}, Stopping: &oe.StoppingOptions{MaxTokens: &maxTok}}
}

// httpCompletion is a greedy /v1/completions answer.
type httpCompletion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func (g *grpcServer) completion(t *testing.T, body string) httpCompletion {
	t.Helper()
	code, _, b := g.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, b)
	}
	var c httpCompletion
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("completion %s: %v", b, err)
	}
	return c
}

// TestGRPCGenerateMatchesHTTP: on the real qwen3-tiny engine, a greedy gRPC stream's deltas
// concatenate to the HTTP completion's text, with the same finish reason and usage; token-id
// input answers as the text it tokenizes to; stop texts and stop token ids end it as the HTTP
// stop does; records join by request ID with endpoint "grpc".
func TestGRPCGenerateMatchesHTTP(t *testing.T) {
	g := startGRPCServer(t, qwenBundle(t), "--max-batch", "4")
	ctx := context.Background()
	const prompt = "The capital of France is"
	want := g.completion(t, `{"prompt":"The capital of France is","max_tokens":24,"temperature":0}`)

	req := textReq(prompt, 24)
	req.RequestId = "grpc-parity-1"
	got, err := g.generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.text != want.Choices[0].Text {
		t.Errorf("gRPC text %q, HTTP text %q", got.text, want.Choices[0].Text)
	}
	if got.finished == nil || got.usage == nil {
		t.Fatalf("no GenerationFinished with usage: %+v", got)
	}
	if got.after != 0 || got.prompts > 1 {
		t.Errorf("%d events after the terminal one, %d PromptOutputs", got.after, got.prompts)
	}
	if int(got.usage.CompletionTokens) != want.Usage.CompletionTokens || int(got.usage.PromptTokens) != want.Usage.PromptTokens ||
		got.usage.TotalTokens != got.usage.PromptTokens+got.usage.CompletionTokens {
		t.Errorf("usage %+v, HTTP %+v", got.usage, want.Usage)
	}
	if len(got.toks) != int(got.usage.CompletionTokens) {
		t.Errorf("%d token ids in deltas, usage says %d", len(got.toks), got.usage.CompletionTokens)
	}
	reasons := map[string]oe.FinishReason{"stop": oe.FinishReason_FINISH_REASON_STOP, "length": oe.FinishReason_FINISH_REASON_LENGTH}
	if got.finished.GetReason() != reasons[want.Choices[0].FinishReason] {
		t.Errorf("finish %v, HTTP %q", got.finished.GetReason(), want.Choices[0].FinishReason)
	}
	if len(got.ids) != 1 || !got.ids["grpc-parity-1"] || got.header.Get("x-request-id")[0] != "grpc-parity-1" {
		t.Errorf("request ids on events %v, header %v", got.ids, got.header)
	}

	// Token-id input: the ids /tokenize gives for the prompt answer the same text.
	_, _, tb := g.post("/tokenize", `{"prompt":"The capital of France is"}`)
	var tk struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(tb, &tk); err != nil || len(tk.Tokens) == 0 {
		t.Fatalf("tokenize: %s %v", tb, err)
	}
	idReq := textReq("", 24)
	idReq.Input = &oe.GenerateRequest_TokenIds{TokenIds: &oe.TokenIds{Ids: tk.Tokens}}
	byIDs, err := g.generate(ctx, idReq, grpc.Header(&metadata.MD{}))
	if err != nil {
		t.Fatal(err)
	}
	if byIDs.text != got.text {
		t.Errorf("token-id input text %q, text input %q", byIDs.text, got.text)
	}

	// A stop text cut from the middle of the answer: generation ends before it, as HTTP's stop.
	if len([]rune(got.text)) > 8 {
		stop := string([]rune(got.text)[4:7])
		stopJSON, _ := json.Marshal(stop)
		hw := g.completion(t, `{"prompt":"The capital of France is","max_tokens":24,"temperature":0,"stop":[`+string(stopJSON)+`]}`)
		sreq := textReq(prompt, 24)
		sreq.Stopping.Conditions = []*oe.StopCondition{{Condition: &oe.StopCondition_StopText{StopText: stop}}}
		sg, err := g.generate(ctx, sreq)
		if err != nil {
			t.Fatal(err)
		}
		if sg.text != hw.Choices[0].Text || sg.finished.GetReason() != oe.FinishReason_FINISH_REASON_STOP || sg.finished.GetStopMatch().GetStopText() != stop {
			t.Errorf("stop %q: gRPC %q %v %v; HTTP %q", stop, sg.text, sg.finished.GetReason(), sg.finished.GetStopMatch(), hw.Choices[0].Text)
		}
	}
	// A stop token id: the 5th generated token ends generation and is counted, not shown.
	if len(got.toks) > 6 {
		id := got.toks[4]
		first := 4
		for i, x := range got.toks {
			if x == id {
				first = i
				break
			}
		}
		ireq := textReq(prompt, 24)
		ireq.Stopping.Conditions = []*oe.StopCondition{{Condition: &oe.StopCondition_StopTokenId{StopTokenId: id}}}
		ig, err := g.generate(ctx, ireq)
		if err != nil {
			t.Fatal(err)
		}
		if len(ig.toks) != first+1 || ig.finished.GetStopMatch().GetStopTokenId() != id || ig.usage.CompletionTokens != uint32(first+1) ||
			!strings.HasPrefix(got.text, ig.text) {
			t.Errorf("stop token %d: toks %v usage %v match %v text %q", id, ig.toks, ig.usage, ig.finished.GetStopMatch(), ig.text)
		}
	}

	recs := g.readRecords()
	var found bool
	for _, r := range recs {
		if r.RequestID == "grpc-parity-1" {
			found = true
			if r.Route != "/openengine.v1.Inference/Generate" || r.Status != 200 || r.OutputTokens != int(got.usage.CompletionTokens) || !r.Stream {
				t.Errorf("record %+v", r)
			}
		}
	}
	if !found {
		t.Errorf("no record for grpc-parity-1 among %d", len(recs))
	}
	var raw []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, g.records)), "\n") {
		var m map[string]any
		_ = json.Unmarshal([]byte(line), &m)
		raw = append(raw, m)
	}
	var grpcRecs int
	for _, m := range raw {
		if m["endpoint"] == "grpc" {
			grpcRecs++
		}
	}
	if grpcRecs < 3 {
		t.Errorf("%d records with endpoint grpc", grpcRecs)
	}
	if n := g.metric("qual_server_requests_total", `{route="/openengine.v1.Inference/Generate",status="200"}`); n != float64(grpcRecs) {
		t.Errorf("metrics count %v successful Generate calls, records %d", n, grpcRecs)
	}
}

// TestGRPCErrors: every refusal has its status code and names the field; the next valid request
// succeeds after each.
func TestGRPCErrors(t *testing.T) {
	g := startGRPCServer(t, qwenBundle(t), "--max-batch", "2", "--max-body", "65536")
	ctx := context.Background()
	f := func(v float64) *float64 { return &v }
	u := func(v uint32) *uint32 { return &v }
	valid := func() *oe.GenerateRequest { return textReq("Hello", 4) }
	with := func(m func(r *oe.GenerateRequest)) *oe.GenerateRequest { r := valid(); m(r); return r }
	cases := []struct {
		name  string
		req   *oe.GenerateRequest
		code  codes.Code
		field string
	}{
		{"no input", with(func(r *oe.GenerateRequest) { r.Input = nil }), codes.InvalidArgument, "input"},
		{"empty prompt", with(func(r *oe.GenerateRequest) { r.Input = &oe.GenerateRequest_Prompt{} }), codes.InvalidArgument, "prompt"},
		{"empty token ids", with(func(r *oe.GenerateRequest) { r.Input = &oe.GenerateRequest_TokenIds{TokenIds: &oe.TokenIds{}} }), codes.InvalidArgument, "token_ids"},
		{"token id beyond vocab", with(func(r *oe.GenerateRequest) {
			r.Input = &oe.GenerateRequest_TokenIds{TokenIds: &oe.TokenIds{Ids: []uint32{1, 1 << 30}}}
		}), codes.InvalidArgument, "token_ids"},
		{"unknown model", with(func(r *oe.GenerateRequest) { r.Model = "nope" }), codes.NotFound, "model"},
		{"max_tokens 0", with(func(r *oe.GenerateRequest) { r.Stopping.MaxTokens = u(0) }), codes.InvalidArgument, "stopping.max_tokens"},
		{"max_tokens beyond context", with(func(r *oe.GenerateRequest) { r.Stopping.MaxTokens = u(1 << 20) }), codes.InvalidArgument, "stopping.max_tokens"},
		{"over context", with(func(r *oe.GenerateRequest) {
			r.Input = &oe.GenerateRequest_Prompt{Prompt: strings.Repeat("hello world ", 3000)}
		}), codes.InvalidArgument, "prompt"},
		{"NaN temperature", with(func(r *oe.GenerateRequest) { r.Sampling.Temperature = f(math.NaN()) }), codes.InvalidArgument, "sampling.temperature"},
		{"negative temperature", with(func(r *oe.GenerateRequest) { r.Sampling.Temperature = f(-0.5) }), codes.InvalidArgument, "sampling.temperature"},
		{"top_p 0", with(func(r *oe.GenerateRequest) { r.Sampling.TopP = f(0) }), codes.InvalidArgument, "sampling.top_p"},
		{"top_p 1.5", with(func(r *oe.GenerateRequest) { r.Sampling.TopP = f(1.5) }), codes.InvalidArgument, "sampling.top_p"},
		{"two sequences", with(func(r *oe.GenerateRequest) { r.Sampling.NumSequences = u(2) }), codes.Unimplemented, "sampling.num_sequences"},
		{"prompt logprobs", with(func(r *oe.GenerateRequest) {
			t := true
			r.Response = &oe.ResponseOptions{ReturnPromptLogprobs: &t}
		}), codes.Unimplemented, "response.return_prompt_logprobs"},
		{"candidates without logprobs", with(func(r *oe.GenerateRequest) {
			r.Response = &oe.ResponseOptions{OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 2}}}
		}), codes.InvalidArgument, "response.output_candidates"},
		{"too many candidates", with(func(r *oe.GenerateRequest) {
			t := true
			r.Response = &oe.ResponseOptions{ReturnOutputLogprobs: &t, OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 21}}}
		}), codes.InvalidArgument, "response.output_candidates.top_n"},
		{"candidates by id", with(func(r *oe.GenerateRequest) {
			t := true
			r.Response = &oe.ResponseOptions{ReturnOutputLogprobs: &t, OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TokenIds{TokenIds: &oe.TokenIds{Ids: []uint32{1}}}}}
		}), codes.Unimplemented, "response.output_candidates.token_ids"},
		{"guided", with(func(r *oe.GenerateRequest) {
			r.Guided = &oe.GuidedDecoding{Guide: &oe.GuidedDecoding_Regex{Regex: "a+"}}
		}), codes.Unimplemented, "guided"},
		{"lora", with(func(r *oe.GenerateRequest) { r.LoraName = "x" }), codes.Unimplemented, "lora_name"},
		{"media", with(func(r *oe.GenerateRequest) { r.Media = []*oe.MediaItem{{Modality: oe.Modality_MODALITY_IMAGE}} }), codes.Unimplemented, "media"},
		{"bad request id", with(func(r *oe.GenerateRequest) { r.RequestId = "has space" }), codes.InvalidArgument, "request_id"},
		{"message over --max-body", with(func(r *oe.GenerateRequest) {
			r.Input = &oe.GenerateRequest_Prompt{Prompt: strings.Repeat("x", 70000)}
		}), codes.ResourceExhausted, "larger than max"},
	}
	for _, c := range cases {
		_, err := g.generate(ctx, c.req)
		st, _ := status.FromError(err)
		if st.Code() != c.code || !strings.Contains(st.Message(), c.field) {
			t.Errorf("%s: got %v %q, want %v naming %q", c.name, st.Code(), st.Message(), c.code, c.field)
		}
		ok, err := g.generate(ctx, valid())
		if err != nil || ok.finished == nil || ok.usage.GetCompletionTokens() != 4 {
			t.Fatalf("after %s: the next valid request got %v %+v", c.name, err, ok)
		}
	}

	// Invalid UTF-8 in the prompt, sent as raw bytes (a Go client cannot marshal it).
	bad := []byte{0x1a, 0x03, 'a', 0xff, 'b', 0x32, 0x02, 0x08, 0x04}
	err := g.conn.Invoke(ctx, "/openengine.v1.Inference/Generate", &rawMsg{b: bad}, &rawMsg{}, grpc.ForceCodecV2(rawCodec{}))
	if err == nil {
		// Invoke on a server-streaming method reads the one message; the status comes with it.
		t.Fatal("invalid UTF-8 prompt was accepted")
	}
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "prompt") {
		t.Errorf("invalid UTF-8: %v %q", st.Code(), st.Message())
	}
	if _, err := g.generate(ctx, valid()); err != nil {
		t.Fatalf("after invalid UTF-8: %v", err)
	}

	// Every refused call has its record with the status a gateway would map the code to.
	statuses := map[int]int{}
	for _, r := range g.readRecords() {
		if r.Route == "/openengine.v1.Inference/Generate" {
			statuses[r.Status]++
		}
	}
	if statuses[400] != 15 || statuses[404] != 1 || statuses[501] != 6 || statuses[429] != 1 || statuses[200] != len(cases)+1 {
		t.Errorf("record statuses %v", statuses)
	}
}

// TestGRPCControl: Health, GetServerInfo, GetModelInfo, GetLoad, grpc.health.v1, the API key,
// and LoRA answered UNIMPLEMENTED.
func TestGRPCControl(t *testing.T) {
	g := startGRPCServer(t, mockBundle(t, 0), "--api-key", "sekret")
	ctx := context.Background()
	if _, err := g.generate(ctx, textReq("hi", 3)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no key: %v", err)
	}
	if _, err := g.ctl.GetModelInfo(ctx, &oe.GetModelInfoRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no key, GetModelInfo: %v", err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer sekret")
	r, err := g.generate(actx, textReq("hi", 3))
	if err != nil || len(r.text) != 3 || r.usage.GetCompletionTokens() != 3 {
		t.Fatalf("with key: %q %v", r.text, err)
	}
	h, err := g.ctl.Health(ctx, &oe.HealthRequest{})
	if err != nil || h.GetState() != oe.HealthState_HEALTH_STATE_READY {
		t.Errorf("Health %v %v", h, err)
	}
	hc, err := healthpb.NewHealthClient(g.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "openengine.v1.Inference"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc.health.v1 %v %v", hc, err)
	}
	mi, err := g.ctl.GetModelInfo(actx, &oe.GetModelInfoRequest{})
	if err != nil || mi.GetServedModelName() != "test-model" || mi.GetMaxContextLength() == 0 || !mi.GetGeneration().GetOutputLogprobs().GetSupported() ||
		mi.GetGeneration().GetOutputLogprobs().GetMaxTopN() != 20 || mi.GetGeneration().GetPromptLogprobs().GetSupported() || !mi.GetGeneration().GetSupportsStopInOutput() {
		t.Errorf("GetModelInfo %v %v", mi, err)
	}
	if _, err := g.ctl.GetModelInfo(actx, &oe.GetModelInfoRequest{Model: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetModelInfo other: %v", err)
	}
	si, err := g.ctl.GetServerInfo(actx, &oe.GetServerInfoRequest{})
	if err != nil || si.GetSchemaRevision() == 0 || si.GetSupportedModels()[0] != "test-model" {
		t.Errorf("GetServerInfo %v %v", si, err)
	}
	ld, err := g.ctl.GetLoad(actx, &oe.GetLoadRequest{})
	if err != nil || ld.RunningRequests == nil || ld.GetRunningRequests() != 0 {
		t.Errorf("GetLoad %v %v", ld, err)
	}
	if _, err := g.ctl.ListLoras(actx, &oe.ListLorasRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ListLoras: %v", err)
	}
}

// TestGRPCCancelAbortDeadlineDrain: on a slow mock engine (5 ms a step), a client cancel, a
// client deadline and Control.Abort each free the slot (GetLoad says 0 running) with an honest
// record; at SIGTERM a running stream ends with a DRAINING EngineError after --drain-timeout
// and a new one gets UNAVAILABLE.
func TestGRPCCancelAbortDeadlineDrain(t *testing.T) {
	g := startGRPCServer(t, mockBundle(t, 5*time.Millisecond), "--max-batch", "1", "--queue-depth", "0", "--drain-timeout", "300ms")
	ctx := context.Background()
	running := func() uint32 {
		ld, err := g.ctl.GetLoad(ctx, &oe.GetLoadRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return ld.GetRunningRequests()
	}
	long := func(id string) *oe.GenerateRequest {
		r := textReq("go", 4000)
		r.RequestId = id
		return r
	}
	// Queue full while one runs.
	cctx, cancel := context.WithCancel(ctx)
	st, err := g.inf.Generate(cctx, long("to-cancel"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.generate(ctx, textReq("x", 2)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second stream with --max-batch 1 --queue-depth 0: %v", err)
	}
	cancel()
	eventually(t, "the cancelled stream's slot to be free", 5*time.Second, func() bool { return running() == 0 })

	dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = g.generate(dctx, long("to-deadline"))
	dcancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("client deadline: %v", err)
	}
	eventually(t, "the timed-out stream's slot to be free", 5*time.Second, func() bool { return running() == 0 })

	// Aborted once a token has streamed (an abort before the first decode step rightly ends
	// the stream with no tokens, which is not what this case checks).
	ast, r := firstToken(t, g, long("to-abort"))
	ab, err := g.ctl.Abort(ctx, &oe.AbortRequest{Target: &oe.AbortRequest_RequestId{RequestId: "to-abort"}})
	if err != nil || ab.GetStatus() != oe.AbortStatus_ABORT_STATUS_ABORTED {
		t.Fatalf("Abort: %v %v", ab, err)
	}
	if err := collect(ast, r, nil); err != nil {
		t.Fatalf("to-abort after the abort: %v", err)
	}
	if r.finished.GetReason() != oe.FinishReason_FINISH_REASON_CANCELLED || r.usage == nil || r.usage.CompletionTokens == 0 {
		t.Errorf("aborted stream ended %+v", r)
	}
	ab, err = g.ctl.Abort(ctx, &oe.AbortRequest{Target: &oe.AbortRequest_RequestId{RequestId: "to-abort"}})
	if err != nil || ab.GetStatus() != oe.AbortStatus_ABORT_STATUS_ALREADY_FINISHED {
		t.Errorf("second Abort: %v %v", ab, err)
	}
	eventually(t, "the aborted stream's slot to be free", 5*time.Second, func() bool { return running() == 0 })

	// Drained once a token has streamed, for the same reason.
	dst, rd := firstToken(t, g, long("to-drain"))
	done := make(chan genResult, 1)
	go func() {
		_ = collect(dst, rd, nil)
		done <- *rd
	}()
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new streams to be refused", 5*time.Second, func() bool {
		_, err := g.generate(ctx, textReq("x", 2))
		return status.Code(err) == codes.Unavailable
	})
	dr := <-done
	if dr.engErr.GetCode() != oe.ErrorCode_ERROR_CODE_DRAINING || !dr.engErr.GetRetryable() || dr.text == "" {
		t.Errorf("drained stream ended %+v", dr)
	}
	<-g.exited
	byID := map[string]serverRecord{}
	for _, rec := range g.readRecords() {
		byID[rec.RequestID] = rec
	}
	for id, want := range map[string]string{"to-cancel": "cancelled", "to-deadline": "cancelled", "to-abort": "cancelled", "to-drain": "error"} {
		rec, ok := byID[id]
		if !ok || rec.FinishReason != want || rec.OutputTokens == 0 && id != "to-deadline" {
			t.Errorf("record of %s: %+v (want finish %s)", id, rec, want)
		}
	}
	if byID["to-drain"].ErrorType != "shutting_down" {
		t.Errorf("drained record %+v", byID["to-drain"])
	}
}

// rawMsg and rawCodec send bytes no Go message would marshal (invalid UTF-8 in a string).
type rawMsg struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}
func (rawCodec) Unmarshal(d mem.BufferSlice, v any) error {
	v.(*rawMsg).b = d.Materialize()
	return nil
}

func readFile(t testing.TB, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
