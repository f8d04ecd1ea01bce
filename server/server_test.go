package server_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func sdk(s *testServer, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(s.url + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0)}, opts...)...)
}

// TestMockOpenAISDK drives the mock engine through the official OpenAI Go SDK: models,
// completions, streaming with usage, and stop strings.
func TestMockOpenAISDK(t *testing.T) {
	s := startServer(t, mockBundle(t, 0), "--workers", "2")
	c := sdk(s)
	ctx := context.Background()

	models, err := c.Models.List(ctx)
	if err != nil {
		t.Fatalf("models: %v", err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != s.model || models.Data[0].Object != "model" {
		t.Fatalf("models = %+v, want one model %q", models.Data, s.model)
	}

	params := openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(s.model),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hello world")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
	}
	full, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if len(full.Choices) != 1 || full.Choices[0].FinishReason != "length" || full.Usage.CompletionTokens != 12 || full.Usage.PromptTokens == 0 {
		t.Fatalf("completion = %+v; want one choice, finish length, 12 completion tokens", full)
	}
	if full.Choices[0].Text == "" {
		t.Fatal("completion text is empty")
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	var usage openai.CompletionUsage
	var finish string
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
			if ch.Choices[0].FinishReason != "" {
				finish = string(ch.Choices[0].FinishReason)
			}
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != full.Choices[0].Text {
		t.Errorf("streamed text %q != non-streamed %q", text.String(), full.Choices[0].Text)
	}
	if finish != "length" || usage.CompletionTokens != 12 || usage.PromptTokens != full.Usage.PromptTokens {
		t.Errorf("stream finish %q usage %+v; want length and %+v", finish, usage, full.Usage)
	}

	// Stop strings: generation ends before the stop text, which is not returned.
	whole := full.Choices[0].Text
	stop := whole[4:6]
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	params.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
	cut, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("completion with stop: %v", err)
	}
	if want := whole[:strings.Index(whole, stop)]; cut.Choices[0].Text != want || cut.Choices[0].FinishReason != "stop" {
		t.Errorf("stop %q: text %q finish %q; want %q, stop", stop, cut.Choices[0].Text, cut.Choices[0].FinishReason, want)
	}

	// Token-id prompts work too.
	byIDs, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model: openai.CompletionNewParamsModel(s.model), MaxTokens: openai.Int(3),
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{15496, 995}},
	})
	if err != nil || byIDs.Usage.PromptTokens != 2 || byIDs.Usage.CompletionTokens != 3 {
		t.Fatalf("token-id prompt: %+v, %v", byIDs, err)
	}
}

// TestSSEFraming checks the raw wire format of both streaming forms.
func TestSSEFraming(t *testing.T) {
	s := startServer(t, qwenBundle(t))
	for _, tc := range []struct {
		path, body, object string
	}{
		{"/v1/completions", `{"prompt":"Hello","max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`, "text_completion"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hello"}],"max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false}}`, "chat.completion.chunk"},
	} {
		resp := s.openStream(context.Background(), tc.path, tc.body, "X-Request-Id", "framing-"+tc.object)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("%s: Content-Type %q", tc.path, ct)
		}
		if id := resp.Header.Get("X-Request-Id"); id != "framing-"+tc.object {
			t.Errorf("%s: X-Request-Id %q not echoed", tc.path, id)
		}
		events := sseEvents(t, resp.Body)
		resp.Body.Close()
		if events[len(events)-1] != "[DONE]" {
			t.Fatalf("%s: last event %q, want [DONE]", tc.path, events[len(events)-1])
		}
		var chunks []map[string]any
		for _, e := range events[:len(events)-1] {
			var m map[string]any
			if err := json.Unmarshal([]byte(e), &m); err != nil {
				t.Fatalf("%s: event %q is not JSON: %v", tc.path, e, err)
			}
			if m["object"] != tc.object {
				t.Fatalf("%s: event object %v, want %s", tc.path, m["object"], tc.object)
			}
			chunks = append(chunks, m)
		}
		usage := chunks[len(chunks)-1]
		if u, ok := usage["usage"].(map[string]any); !ok || u["completion_tokens"].(float64) != 5 || len(usage["choices"].([]any)) != 0 {
			t.Errorf("%s: last chunk %v is not the usage chunk", tc.path, usage)
		}
		final := chunks[len(chunks)-2]["choices"].([]any)[0].(map[string]any)
		if final["finish_reason"] != "length" {
			t.Errorf("%s: final chunk %v lacks finish_reason length", tc.path, final)
		}
		if tc.object == "chat.completion.chunk" {
			first := chunks[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
			if first["role"] != "assistant" {
				t.Errorf("chat: first chunk %v is not the role chunk", first)
			}
		}
	}
}

// TestQwenTiny checks the real engine: chat through the SDK, streaming text equal to the
// non-streaming text at temperature 0, and the extension routes.
func TestQwenTiny(t *testing.T) {
	s := startServer(t, qwenBundle(t))
	c := sdk(s)
	ctx := context.Background()
	noThink := option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})

	chat := openai.ChatCompletionNewParams{
		Model:               s.model,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Say hello in 世界 🌍 style")},
		MaxCompletionTokens: openai.Int(24),
		Temperature:         openai.Float(0),
	}
	full, err := c.Chat.Completions.New(ctx, chat, noThink)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if full.Choices[0].Message.Role != "assistant" || full.Usage.CompletionTokens == 0 {
		t.Fatalf("chat = %+v", full)
	}
	stream := c.Chat.Completions.NewStreaming(ctx, chat, noThink)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	if got, want := acc.Choices[0].Message.Content, full.Choices[0].Message.Content; got != want {
		t.Errorf("chat: streamed %q != non-streamed %q", got, want)
	}

	comp := openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(s.model),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The capital of France is")},
		MaxTokens:   openai.Int(32),
		Temperature: openai.Float(0),
	}
	one, err := c.Completions.New(ctx, comp, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	cs := c.Completions.NewStreaming(ctx, comp, option.WithJSONSet("ignore_eos", true))
	var text strings.Builder
	for cs.Next() {
		if ch := cs.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatalf("completion stream: %v", err)
	}
	if text.String() != one.Choices[0].Text || one.Usage.CompletionTokens != 32 {
		t.Errorf("completions: streamed %q != non-streamed %q (usage %+v)", text.String(), one.Choices[0].Text, one.Usage)
	}

	// /tokenize renders chat with the checkpoint's template.
	st, _, body := s.post("/tokenize", `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}`)
	var tok struct {
		Tokens   []int32 `json:"tokens"`
		Count    int     `json:"count"`
		MaxLen   int     `json:"max_model_len"`
		Rendered string  `json:"rendered"`
	}
	if err := json.Unmarshal(body, &tok); st != 200 || err != nil || tok.Count != len(tok.Tokens) || tok.Count == 0 {
		t.Fatalf("/tokenize: %d %s", st, body)
	}
	if !strings.Contains(tok.Rendered, "<|im_start|>user\nhi<|im_end|>") || !strings.HasSuffix(tok.Rendered, "<|im_start|>assistant\n<think>\n\n</think>\n\n") {
		t.Errorf("/tokenize rendered %q", tok.Rendered)
	}
	st, _, body = s.post("/detokenize", fmt.Sprintf(`{"tokens":%s}`, mustJSON(tok.Tokens)))
	var detok struct{ Prompt string }
	if json.Unmarshal(body, &detok); st != 200 || detok.Prompt != tok.Rendered {
		t.Errorf("/detokenize: %d %q, want %q", st, detok.Prompt, tok.Rendered)
	}

	// /mq/v1/logits returns positions × vocab float32s.
	st, _, body = s.post("/mq/v1/logits", `{"prompt_token_ids":[9707,11,1879]}`)
	var lg struct {
		Object    string `json:"object"`
		Vocab     int    `json:"vocab_size"`
		Positions int    `json:"positions"`
		Data      string `json:"data"`
	}
	if err := json.Unmarshal(body, &lg); st != 200 || err != nil || lg.Positions != 3 || lg.Vocab == 0 {
		t.Fatalf("/mq/v1/logits: %d %.300s", st, body)
	}
	raw, err := base64.StdEncoding.DecodeString(lg.Data)
	if err != nil || len(raw) != 4*3*lg.Vocab {
		t.Fatalf("/mq/v1/logits data: %d bytes (%v), want %d", len(raw), err, 4*3*lg.Vocab)
	}

	// /mq/v1/bundle names the served file and its sha256.
	resp, err := http.Get(s.url + "/mq/v1/bundle")
	if err != nil {
		t.Fatal(err)
	}
	var bi struct {
		Header map[string]any `json:"header"`
		SHA    string         `json:"bundle_digest"`
		Path   string         `json:"bundle_path"`
	}
	json.NewDecoder(resp.Body).Decode(&bi)
	resp.Body.Close()
	fileBytes, _ := os.ReadFile(bi.Path)
	sum := sha256.Sum256(fileBytes[:56]) // the digest: sha256 of the prefix (native/bundle)
	if bi.SHA != hex.EncodeToString(sum[:]) || bi.Header["family"] != "qwen3" {
		t.Errorf("/mq/v1/bundle: sha %s family %v; file sha %x", bi.SHA, bi.Header["family"], sum)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestCancelOnDisconnectFreesSlot: a client that goes away mid-stream must free its batch
// slot at the engine's next step, so the next request is served at once.
func TestCancelOnDisconnectFreesSlot(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--max-batch", "1", "--queue-depth", "0")
	ctx, cancel := context.WithCancel(context.Background())
	resp := s.openStream(ctx, "/v1/completions", `{"prompt":"Hello","max_tokens":2000,"stream":true}`, "X-Request-Id", "to-cancel")
	if _, err := readEvent(bufio.NewReader(resp.Body)); err != nil {
		t.Fatalf("first event: %v", err)
	}
	if v := s.metric("qual_server_engine_slots_in_use", ""); v != 1 {
		t.Fatalf("slots in use while streaming = %v, want 1", v)
	}
	// With the only slot taken and no queue, a second request is refused.
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 429 {
		t.Fatalf("second request while slot busy: %d %s, want 429", st, body)
	}
	cancel()
	resp.Body.Close()
	eventually(t, "the engine to free the cancelled request's slot", 5*time.Second, func() bool {
		return s.metric("qual_server_engine_slots_in_use", "") == 0
	})
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 200 {
		t.Fatalf("request after cancellation: %d %s, want 200", st, body)
	}
	s.stop()
	for _, r := range s.readRecords() {
		if r.RequestID == "to-cancel" {
			if r.FinishReason != "cancelled" || r.OutputTokens >= 2000 || r.TaskWallNs == 0 {
				t.Errorf("cancelled request record %+v", r)
			}
			return
		}
	}
	t.Error("no record for the cancelled request")
}

// TestQueueFull429: beyond the bounded queue, requests get 429 with an OpenAI error body.
func TestQueueFull429(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--max-batch", "1", "--queue-depth", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := s.openStream(ctx, "/v1/completions", `{"prompt":"Hello","max_tokens":2000,"stream":true}`)
	defer first.Body.Close()
	queued := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", strings.NewReader(`{"prompt":"Hello","max_tokens":2}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			queued <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		queued <- resp.StatusCode
	}()
	eventually(t, "the second request to wait in the queue", 5*time.Second, func() bool {
		return s.metric("qual_server_queue_depth", "") == 1
	})
	st, _, body := s.post("/v1/completions", `{"prompt":"Hello","max_tokens":2}`)
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); st != 429 || err != nil || e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "queue") {
		t.Fatalf("third request: %d %s, want 429 with an OpenAI error body", st, body)
	}
	cancel() // the first stream ends; the queued request gets the slot... or is cancelled with ctx
	<-queued
}

// TestWorkerKilledDuringStreams: SIGKILL of one worker fails only its own in-flight requests
// (streaming clients get an error event), the worker is replaced, and serving continues.
func TestWorkerKilledDuringStreams(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--workers", "2", "--max-batch", "4")
	var health struct {
		PIDs []int `json:"worker_pids"`
	}
	resp, err := http.Get(s.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if len(health.PIDs) != 2 {
		t.Fatalf("health worker_pids = %v", health.PIDs)
	}
	const n = 6
	type result struct {
		id     string
		events []string
		err    error
	}
	results := make(chan result, n)
	started := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			id := fmt.Sprintf("kill-%d", i)
			resp := s.openStream(context.Background(), "/v1/completions", `{"prompt":"Hello","max_tokens":100,"stream":true}`, "X-Request-Id", id)
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			var evs []string
			first := true
			for {
				ev, err := readEvent(r)
				if err != nil {
					if err == io.EOF {
						err = nil
					}
					results <- result{id, evs, err}
					return
				}
				if first {
					started <- struct{}{}
					first = false
				}
				evs = append(evs, ev)
			}
		}(i)
	}
	for i := 0; i < n; i++ {
		<-started
	}
	victim := health.PIDs[0]
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill worker %d: %v", victim, err)
	}
	failed, completed := map[string]bool{}, map[string]bool{}
	for i := 0; i < n; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v", r.id, r.err)
		}
		last, before := r.events[len(r.events)-1], r.events[len(r.events)-2]
		switch {
		case last == "[DONE]" && strings.Contains(before, `"error"`) && strings.Contains(before, "worker_crashed"):
			failed[r.id] = true
		case last == "[DONE]" && strings.Contains(before, `"finish_reason":"length"`):
			completed[r.id] = true
		default:
			t.Fatalf("%s: stream ended with %q, %q", r.id, before, last)
		}
	}
	if len(failed) == 0 || len(completed) == 0 {
		t.Fatalf("failed %v completed %v: want the killed worker's streams failed and the others completed", failed, completed)
	}
	eventually(t, "the killed worker to be replaced", 20*time.Second, func() bool {
		return s.metric("qual_server_workers_ready", "") == 2 && s.metric("qual_server_worker_restarts_total", "") == 1
	})
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 200 {
		t.Fatalf("after replacement: %d %s", st, body)
	}
	s.stop()
	// Records: the failed requests all came from one worker, the completed ones from the other.
	workerOf := map[string]int{}
	for _, r := range s.readRecords() {
		workerOf[r.RequestID] = r.WorkerID
	}
	for id := range failed {
		for id2 := range completed {
			if workerOf[id] == workerOf[id2] {
				t.Errorf("%s failed and %s completed on the same worker %d", id, id2, workerOf[id])
			}
		}
	}
}

// TestSIGTERMDrain: on SIGTERM in-flight streams finish, new requests are refused, every
// record is written and the exit status is 0.
func TestSIGTERMDrain(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond))
	resp := s.openStream(context.Background(), "/v1/completions", `{"prompt":"Hello","max_tokens":40,"stream":true}`, "X-Request-Id", "drain-inflight")
	r := bufio.NewReader(resp.Body)
	if _, err := readEvent(r); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("in-flight stream broken by drain: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `"finish_reason":"length"`) {
		t.Fatalf("in-flight stream did not finish: %q", tail(string(rest)))
	}
	<-s.exited
	if s.exitErr != nil {
		t.Fatalf("exit after drain: %v, want status 0", s.exitErr)
	}
	recs := s.readRecords()
	if len(recs) != 1 || recs[0].RequestID != "drain-inflight" || recs[0].OutputTokens != 40 {
		t.Fatalf("records after drain: %+v", recs)
	}
}

// TestOneRecordPerRequest: every request to a recorded route, errors included, ends with
// exactly one record carrying its id, and records hold digests rather than text.
func TestOneRecordPerRequest(t *testing.T) {
	s := startServer(t, mockBundle(t, 0))
	type call struct {
		method, path, body string
		status             int
	}
	calls := []call{
		{"POST", "/v1/completions", `{"prompt":"Hello","max_tokens":3}`, 200},
		{"POST", "/v1/completions", `{"prompt":"Hello","max_tokens":3,"stream":true}`, 200},
		{"POST", "/v1/completions", `{"prompt":`, 400},
		{"POST", "/v1/completions", `{"prompt":"x","model":"nope"}`, 404},
		{"GET", "/v1/completions", ``, 405},
		{"GET", "/v1/models", ``, 200},
		{"POST", "/v1/nothing", `{}`, 404},
		{"POST", "/tokenize", `{"prompt":"Hello"}`, 200},
		{"POST", "/detokenize", `{"tokens":[15496]}`, 200},
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		for j := 0; j < 3; j++ {
			wg.Add(1)
			go func(i, j int, c call) {
				defer wg.Done()
				req, _ := http.NewRequest(c.method, s.url+c.path, strings.NewReader(c.body))
				req.Header.Set("X-Request-Id", fmt.Sprintf("rec-%d-%d", i, j))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.status {
					t.Errorf("%s %s %s: %d, want %d", c.method, c.path, c.body, resp.StatusCode, c.status)
				}
			}(i, j, c)
		}
	}
	wg.Wait()
	s.stop()
	seen := map[string]int{}
	for _, r := range s.readRecords() {
		seen[r.RequestID]++
		if r.Route == "/v1/completions" && r.Status == 200 && (r.OutputSHA == "" || r.PromptSHA == "" || r.OutputTokens != 3) {
			t.Errorf("record %+v lacks digests or tokens", r)
		}
		// The frontend's TTFT: set when content was written, within the request's latency.
		if wrote := r.Route == "/v1/completions" && r.Status == 200; wrote != (r.TTFTNs > 0) || r.TTFTNs > r.HTTPLatency {
			t.Errorf("record %s (%s %d): ttft_ns %d with http_latency_ns %d", r.RequestID, r.Route, r.Status, r.TTFTNs, r.HTTPLatency)
		}
	}
	for i := range calls {
		for j := 0; j < 3; j++ {
			if id := fmt.Sprintf("rec-%d-%d", i, j); seen[id] != 1 {
				t.Errorf("request %s has %d records, want 1", id, seen[id])
			}
		}
	}
	if len(seen) != 3*len(calls) {
		t.Errorf("%d distinct record ids, want %d", len(seen), 3*len(calls))
	}
	data, _ := os.ReadFile(s.records)
	if strings.Contains(string(data), "Hello") {
		t.Error("records contain prompt text")
	}
}

// TestEngineStepMetrics: the engines' steps reach /metrics, split by kind, and their tokens
// add up with the requests': every request's prompt is prefilled once and each of its output
// tokens but the first (which its prefill made) takes one decode.
func TestEngineStepMetrics(t *testing.T) {
	s := startServer(t, mockBundle(t, 0), "--max-batch", "4")
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":"Hello there number %d","max_tokens":4,"ignore_eos":true}`, i)
			if st, _, b := s.post("/v1/completions", body); st != 200 {
				t.Errorf("request %d: %d %s", i, st, b)
			}
		}(i)
	}
	wg.Wait()
	steps := func(kind, series string) float64 {
		return s.metric("qual_server_engine_step_"+series, `{kind="`+kind+`"}`)
	}
	want := s.metric("qual_server_input_tokens_total", "") + s.metric("qual_server_output_tokens_total", "") - 6
	eventually(t, "the step metrics to count every token", 5*time.Second, func() bool {
		return steps("prefill", "tokens_sum")+steps("decode", "tokens_sum") == want
	})
	if n := steps("prefill", "duration_seconds_count"); n < 1 || n > 6 {
		t.Errorf("%v steps prefilled the 6 prompts, want 1-6", n)
	}
	if steps("decode", "duration_seconds_count") < 3 || steps("prefill", "duration_seconds_sum") <= 0 {
		t.Errorf("decode steps %v, prefill seconds %v", steps("decode", "duration_seconds_count"), steps("prefill", "duration_seconds_sum"))
	}
	if steps("prefill", "tokens_count") != steps("prefill", "duration_seconds_count") {
		t.Error("the step histograms disagree on the number of steps")
	}
	s.stop()
}

// TestRequestTimeoutAndAPIKey: --request-timeout cancels long requests (504, or an error
// event once streaming), and --api-key guards the API routes but not /health.
func TestRequestTimeoutAndAPIKey(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--request-timeout", "300ms", "--api-key", "sekret")
	auth := []string{"Authorization", "Bearer sekret"}
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 401 || !strings.Contains(string(body), "invalid_api_key") {
		t.Fatalf("without key: %d %s, want 401", st, body)
	}
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`, auth...); st != 200 {
		t.Fatalf("with key: %d %s", st, body)
	}
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":1000}`, auth...); st != 504 || !strings.Contains(string(body), "request_timeout") {
		t.Fatalf("long non-streaming request: %d %s, want 504", st, body)
	}
	resp := s.openStream(context.Background(), "/v1/completions", `{"prompt":"Hi","max_tokens":1000,"stream":true}`, auth...)
	events := sseEvents(t, resp.Body)
	resp.Body.Close()
	if n := len(events); n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], "request_timeout") {
		t.Fatalf("long stream ended with %q", events[max(0, len(events)-2):])
	}
	eventually(t, "timed-out requests to free their slots", 5*time.Second, func() bool {
		return s.metric("qual_server_engine_slots_in_use", "") == 0
	})
}
