package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// compLogprobs is /v1/completions' choices[].logprobs.
type compLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// chatLogprob is one entry of chat's choices[].logprobs.content.
type chatLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	} `json:"top_logprobs"`
}

type lpChoice struct {
	Text     string                   `json:"text"`
	Message  struct{ Content string } `json:"message"`
	Delta    struct{ Content string } `json:"delta"`
	Logprobs json.RawMessage          `json:"logprobs"`
	Finish   *string                  `json:"finish_reason"`
}

type lpAnswer struct {
	Choices []lpChoice `json:"choices"`
	Usage   struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// completionLP answers body non-streamed and streamed, and returns both answers' text and
// logprobs (the stream's concatenated over its chunks).
func completionLP(t *testing.T, s *grpcServer, path, body string) (text string, comp compLogprobs, chat []chatLogprob, ntok int) {
	t.Helper()
	code, _, b := s.post(path, body)
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, b)
	}
	var a lpAnswer
	if err := json.Unmarshal(b, &a); err != nil || len(a.Choices) != 1 {
		t.Fatalf("%s: %v", b, err)
	}
	c := a.Choices[0]
	chatRoute := strings.Contains(path, "chat")
	if chatRoute {
		var l struct{ Content []chatLogprob }
		if err := json.Unmarshal(c.Logprobs, &l); err != nil {
			t.Fatalf("chat logprobs %s: %v", c.Logprobs, err)
		}
		text, chat = c.Message.Content, l.Content
	} else {
		if err := json.Unmarshal(c.Logprobs, &comp); err != nil {
			t.Fatalf("completion logprobs %s: %v", c.Logprobs, err)
		}
		text = c.Text
	}
	ntok = a.Usage.CompletionTokens

	// The stream: the same text and, chunk by chunk, the same logprobs.
	sb := strings.Replace(body, "{", `{"stream":true,`, 1)
	resp := s.openStream(context.Background(), path, sb)
	defer resp.Body.Close()
	var stext string
	var scomp compLogprobs
	var schat []chatLogprob
	for _, ev := range sseEvents(t, resp.Body) {
		if ev == "[DONE]" {
			break
		}
		var a lpAnswer
		if err := json.Unmarshal([]byte(ev), &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		c := a.Choices[0]
		if chatRoute {
			stext += c.Delta.Content
		} else {
			stext += c.Text
		}
		if string(c.Logprobs) == "null" || len(c.Logprobs) == 0 {
			continue
		}
		if chatRoute {
			var l struct{ Content []chatLogprob }
			if err := json.Unmarshal(c.Logprobs, &l); err != nil {
				t.Fatal(err)
			}
			schat = append(schat, l.Content...)
		} else {
			var l compLogprobs
			if err := json.Unmarshal(c.Logprobs, &l); err != nil {
				t.Fatal(err)
			}
			scomp.Tokens = append(scomp.Tokens, l.Tokens...)
			scomp.TokenLogprobs = append(scomp.TokenLogprobs, l.TokenLogprobs...)
			scomp.TopLogprobs = append(scomp.TopLogprobs, l.TopLogprobs...)
			scomp.TextOffset = append(scomp.TextOffset, l.TextOffset...)
		}
	}
	if stext != text {
		t.Errorf("streamed text %q, non-streamed %q", stext, text)
	}
	if chatRoute && !reflect.DeepEqual(schat, chat) {
		t.Errorf("streamed chat logprobs differ:\n%+v\n%+v", schat, chat)
	}
	if !chatRoute && !reflect.DeepEqual(scomp, comp) {
		t.Errorf("streamed completion logprobs differ:\n%+v\n%+v", scomp, comp)
	}
	return text, comp, chat, ntok
}

// TestLogprobsHTTPAndGRPC: on qwen3-tiny, greedy logprobs in OpenAI's shapes: one entry per
// completion token, the chosen token first among its alternatives (greedy), the requested
// number of alternatives, text_offset the running length of the token strings, streamed
// chunks adding up to the non-streamed answer, and gRPC's TokenInfo carrying the same values.
func TestLogprobsHTTPAndGRPC(t *testing.T) {
	s := startGRPCServer(t, qwenBundle(t), "--max-batch", "2")
	defer s.stop()
	const prompt = "The capital of France is"

	text, comp, _, ntok := completionLP(t, s, "/v1/completions", `{"prompt":"`+prompt+`","max_tokens":8,"temperature":0,"ignore_eos":true,"logprobs":5}`)
	if len(comp.Tokens) != ntok || len(comp.TokenLogprobs) != ntok || len(comp.TopLogprobs) != ntok || len(comp.TextOffset) != ntok || ntok != 8 {
		t.Fatalf("logprobs of %d tokens for %d completion tokens: %+v", len(comp.Tokens), ntok, comp)
	}
	if strings.Join(comp.Tokens, "") != text {
		t.Errorf("tokens %q do not join to the text %q", comp.Tokens, text)
	}
	off := 0
	for i, tok := range comp.Tokens {
		top := comp.TopLogprobs[i]
		if len(top) < 5 || len(top) > 6 {
			t.Errorf("token %d: %d alternatives, want 5 (6 with the chosen one)", i, len(top))
		}
		best := math.Inf(-1)
		for _, v := range top {
			best = math.Max(best, v)
		}
		if got, ok := top[tok]; !ok || got != comp.TokenLogprobs[i] || got != best || got > 0 {
			t.Errorf("token %d %q: logprob %v, alternatives %v: the greedy choice must be the likeliest", i, tok, comp.TokenLogprobs[i], top)
		}
		if comp.TextOffset[i] != off {
			t.Errorf("text_offset[%d] = %d, want %d", i, comp.TextOffset[i], off)
		}
		off += len([]rune(tok))
	}

	// logprobs 0: the chosen token's logprob only.
	_, c0, _, _ := completionLP(t, s, "/v1/completions", `{"prompt":"`+prompt+`","max_tokens":3,"temperature":0,"ignore_eos":true,"logprobs":0}`)
	for i, top := range c0.TopLogprobs {
		if len(top) != 1 || top[c0.Tokens[i]] != c0.TokenLogprobs[i] {
			t.Errorf("logprobs 0, token %d: alternatives %v", i, top)
		}
	}

	// Chat.
	msgs := `"messages":[{"role":"user","content":"Name a color."}]`
	_, _, chat, cn := completionLP(t, s, "/v1/chat/completions", `{`+msgs+`,"max_tokens":6,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":3}`)
	if len(chat) != cn || cn != 6 {
		t.Fatalf("chat: %d logprobs for %d tokens", len(chat), cn)
	}
	for i, e := range chat {
		if len(e.TopLogprobs) != 3 || e.TopLogprobs[0].Token != e.Token || e.TopLogprobs[0].Logprob != e.Logprob || len(e.Bytes) == 0 {
			t.Errorf("chat token %d: %+v", i, e)
		}
		for j := 1; j < len(e.TopLogprobs); j++ {
			if e.TopLogprobs[j].Logprob > e.TopLogprobs[j-1].Logprob {
				t.Errorf("chat token %d: alternatives not descending %+v", i, e.TopLogprobs)
			}
		}
	}
	_, _, plain, _ := completionLP(t, s, "/v1/chat/completions", `{`+msgs+`,"max_tokens":2,"temperature":0,"logprobs":true}`)
	for _, e := range plain {
		if len(e.TopLogprobs) != 0 {
			t.Errorf("logprobs without top_logprobs: %+v", e)
		}
	}
	// Without logprobs the answer says null.
	_, _, b := s.post("/v1/completions", `{"prompt":"`+prompt+`","max_tokens":2}`)
	if !strings.Contains(string(b), `"logprobs":null`) {
		t.Errorf("no logprobs asked, got %s", b)
	}

	// return_tokens_as_token_ids: the same logprobs, every token and alternative named by its
	// id, which gRPC's TokenInfo carries (byte-fallback pieces that share a text stay apart).
	_, ids, _, _ := completionLP(t, s, "/v1/completions", `{"prompt":"`+prompt+`","max_tokens":8,"temperature":0,"ignore_eos":true,"logprobs":5,"return_tokens_as_token_ids":true}`)
	_, _, chatIDs, _ := completionLP(t, s, "/v1/chat/completions", `{`+msgs+`,"max_tokens":6,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":3,"return_tokens_as_token_ids":true}`)
	if !reflect.DeepEqual(ids.TokenLogprobs, comp.TokenLogprobs) || !reflect.DeepEqual(ids.TextOffset, comp.TextOffset) {
		t.Errorf("return_tokens_as_token_ids changed the logprobs or offsets: %+v vs %+v", ids, comp)
	}
	for i, e := range chatIDs {
		if !strings.HasPrefix(e.Token, "token_id:") || !reflect.DeepEqual(e.Bytes, chat[i].Bytes) || e.Logprob != chat[i].Logprob {
			t.Errorf("chat token %d with ids: %+v, with text: %+v", i, e, chat[i])
		}
	}

	// gRPC: the same tokens, logprobs (float32 exact) and candidates, with their text.
	yes := true
	req := textReq(prompt, 8)
	ig := true
	req.Stopping.IgnoreEos = &ig
	req.Response = &oe.ResponseOptions{ReturnOutputLogprobs: &yes, OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 5}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := s.inf.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var infos []*oe.TokenInfo
	for {
		ev, err := st.Recv()
		if err != nil {
			break
		}
		infos = append(infos, ev.GetToken().GetTokens()...)
	}
	if len(infos) != 8 {
		t.Fatalf("gRPC: %d tokens, want 8", len(infos))
	}
	for i, ti := range infos {
		if ti.GetToken() != comp.Tokens[i] || float32(ti.GetLogprob()) != float32(comp.TokenLogprobs[i]) || ti.GetRank() != 1 || len(ti.GetCandidates()) != 5 {
			t.Errorf("gRPC token %d: %v; HTTP %q %v", i, ti, comp.Tokens[i], comp.TokenLogprobs[i])
			continue
		}
		if want := fmt.Sprintf("token_id:%d", ti.GetTokenId()); ids.Tokens[i] != want {
			t.Errorf("token %d: return_tokens_as_token_ids names it %q, gRPC %q", i, ids.Tokens[i], want)
		}
		for j, c := range ti.GetCandidates() {
			if v, ok := comp.TopLogprobs[i][c.GetToken()]; !ok || float32(v) != float32(c.GetLogprob()) || c.GetRank() != uint32(j+1) {
				t.Errorf("gRPC token %d candidate %v not in HTTP's %v", i, c, comp.TopLogprobs[i])
			}
			if v, ok := ids.TopLogprobs[i][fmt.Sprintf("token_id:%d", c.GetTokenId())]; !ok || float32(v) != float32(c.GetLogprob()) {
				t.Errorf("gRPC token %d candidate %v not in HTTP's by id %v", i, c, ids.TopLogprobs[i])
			}
		}
	}
}

// TestIncludeStopStr: include_stop_str_in_output keeps the matched stop string at the end of
// the output (HTTP, both routes' decoding, and gRPC's include_stop_in_output); without it the
// output ends before it.
func TestIncludeStopStr(t *testing.T) {
	s := startGRPCServer(t, qwenBundle(t), "--max-batch", "2")
	defer s.stop()
	const prompt = "The capital of France is"
	full := s.completion(t, `{"prompt":"`+prompt+`","max_tokens":12,"temperature":0,"ignore_eos":true}`).Choices[0].Text
	r := []rune(full)
	if len(r) < 4 {
		t.Fatalf("greedy text %q too short to pick a stop string", full)
	}
	// Two whole characters from the middle (a byte slice could cut one: a stop string is
	// text, and OpenAI's and OpenEngine's strings are UTF-8).
	stop := string(r[1:3])
	want := full[:strings.Index(full, stop)]
	body := `{"prompt":"` + prompt + `","max_tokens":12,"temperature":0,"ignore_eos":true,"stop":[` + mustJSON(stop) + `]`
	ex := s.completion(t, body+`}`).Choices[0]
	in := s.completion(t, body+`,"include_stop_str_in_output":true}`).Choices[0]
	if ex.Text != want || in.Text != want+stop || in.FinishReason != "stop" || ex.FinishReason != "stop" {
		t.Errorf("stop %q on %q: excluded %q (%s), included %q (%s); want %q and %q", stop, full, ex.Text, ex.FinishReason, in.Text, in.FinishReason, want, want+stop)
	}
	resp := s.openStream(context.Background(), "/v1/completions", strings.Replace(body, "{", `{"stream":true,`, 1)+`,"include_stop_str_in_output":true}`)
	defer resp.Body.Close()
	var streamed string
	for _, ev := range sseEvents(t, resp.Body) {
		var a lpAnswer
		if ev != "[DONE]" && json.Unmarshal([]byte(ev), &a) == nil && len(a.Choices) == 1 {
			streamed += a.Choices[0].Text
		}
	}
	if streamed != want+stop {
		t.Errorf("streamed with the stop string: %q, want %q", streamed, want+stop)
	}
	req := textReq(prompt, 12)
	yes := true
	req.Stopping.IgnoreEos = &yes
	req.Stopping.IncludeStopInOutput = &yes
	req.Stopping.Conditions = []*oe.StopCondition{{Condition: &oe.StopCondition_StopText{StopText: stop}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := s.generate(ctx, req)
	if err != nil || g.text != want+stop || g.finished.GetStopMatch().GetStopText() != stop {
		t.Errorf("gRPC include_stop_in_output: %q %v %v; want %q", g.text, g.finished, err, want+stop)
	}
}
