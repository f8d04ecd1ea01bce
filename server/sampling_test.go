package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/server/tokenizer"
)

type choicesAnswer struct {
	Choices []struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
		Total      int `json:"total_tokens"`
	} `json:"usage"`
	Timings map[string]float64 `json:"timings"`
}

func (a choicesAnswer) texts() []string {
	out := make([]string, len(a.Choices))
	for i, c := range a.Choices {
		out[i] = c.Text + c.Message.Content
	}
	return out
}

func postChoices(t *testing.T, s *testServer, path, body string) (choicesAnswer, string) {
	t.Helper()
	st, hdr, out := s.post(path, body)
	if st != 200 {
		t.Fatalf("status %d: %s", st, out)
	}
	var a choicesAnswer
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatalf("answer %s: %v", out, err)
	}
	return a, hdr.Get("X-Request-Id")
}

// recordOf is the one record of request id (failing unless there is exactly one).
func recordOf(t *testing.T, s *testServer, id string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(s.records)
	if err != nil {
		t.Fatal(err)
	}
	var found []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["request_id"] == id {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("request %s has %d records, want exactly 1", id, len(found))
	}
	return found[0]
}

// TestChoices: n > 1 answers n choices indexed 0..n-1, each its own sequence (equal at
// temperature 0, different when sampled), usage summed as OpenAI sums it, one record whose
// token counts are the choices' sum; a seeded request reproduces every choice; a stream
// carries each choice's deltas under its index and they add up to the non-streamed texts.
func TestChoices(t *testing.T) {
	s := startServer(t, qwenBundle(t), "--max-batch", "4")
	const comp, chat = "/v1/completions", "/v1/chat/completions"

	a, id := postChoices(t, s, comp, `{"prompt":"The capital of France is","n":3,"max_tokens":6,"temperature":0,"ignore_eos":true}`)
	if len(a.Choices) != 3 {
		t.Fatalf("%d choices, want 3", len(a.Choices))
	}
	for i, c := range a.Choices {
		if c.Index != i || c.FinishReason != "length" {
			t.Errorf("choice %d: index %d, finish %q", i, c.Index, c.FinishReason)
		}
	}
	tx := a.texts()
	if tx[0] == "" || tx[1] != tx[0] || tx[2] != tx[0] {
		t.Errorf("greedy choices differ: %q", tx)
	}
	if a.Usage.Completion != 18 || a.Usage.Total != a.Usage.Prompt+18 {
		t.Errorf("usage %+v, want 18 completion tokens (3 x 6) and the prompt once", a.Usage)
	}
	rec := recordOf(t, s, id)
	if rec["output_tokens"] != float64(18) || rec["input_tokens"] != float64(a.Usage.Prompt) {
		t.Errorf("record tokens in %v out %v, want %d and 18", rec["input_tokens"], rec["output_tokens"], a.Usage.Prompt)
	}
	if rec["output_bytes"] != float64(3*len(tx[0])) {
		t.Errorf("record output_bytes %v, want the 3 choices' %d", rec["output_bytes"], 3*len(tx[0]))
	}

	body := `{"messages":[{"role":"user","content":"Tell me a story"}],"n":4,"max_tokens":8,"temperature":1,"seed":11,"ignore_eos":true}`
	b1, _ := postChoices(t, s, chat, body)
	b2, _ := postChoices(t, s, chat, body)
	t1, t2 := b1.texts(), b2.texts()
	distinct := map[string]bool{}
	for i := range t1 {
		if t1[i] != t2[i] {
			t.Errorf("seeded choice %d: %q then %q", i, t1[i], t2[i])
		}
		distinct[t1[i]] = true
	}
	if len(distinct) < 3 {
		t.Errorf("4 sampled choices have %d distinct texts: %q", len(distinct), t1)
	}

	// The same request streamed, with usage.
	resp := s.openStream(context.Background(), chat, strings.TrimSuffix(body, "}")+`,"stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	got := make([]string, 4)
	finished := make([]int, 4)
	usage := -1
	for _, ev := range sseEvents(t, resp.Body) {
		if ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		for _, ch := range c.Choices {
			got[ch.Index] += ch.Delta.Content
			if ch.FinishReason != nil {
				finished[ch.Index]++
			}
		}
		if c.Usage != nil {
			usage = c.Usage.Completion
		}
	}
	for i := range got {
		if got[i] != t1[i] || finished[i] != 1 {
			t.Errorf("streamed choice %d: %q (%d finish chunks), non-streamed %q", i, got[i], finished[i], t1[i])
		}
	}
	if usage != 32 {
		t.Errorf("streamed usage completion_tokens %d, want 32 (4 x 8)", usage)
	}
}

// TestTimingsEqualRecord: timings_per_token answers llama.cpp's timings object whose every
// value is computed from the request's record (non-streamed and streamed).
func TestTimingsEqualRecord(t *testing.T) {
	s := startServer(t, qwenBundle(t))
	check := func(t *testing.T, tm map[string]float64, rec map[string]any) {
		t.Helper()
		f := func(k string) float64 { v, _ := rec[k].(float64); return v }
		prompt, out := f("input_tokens"), f("output_tokens")
		promptMs, predMs := f("task_ttft_ns")/1e6, (f("task_wall_ns")-f("task_ttft_ns"))/1e6
		want := map[string]float64{
			"prompt_n": prompt, "prompt_ms": promptMs, "prompt_per_token_ms": promptMs / prompt, "prompt_per_second": 1e3 * prompt / promptMs,
			"predicted_n": out, "predicted_ms": predMs, "predicted_per_token_ms": predMs / out, "predicted_per_second": 1e3 * out / predMs,
			"queue_ms": f("queue_wait_ns") / 1e6, "preprocess_ms": f("preprocess_ns") / 1e6,
		}
		if len(tm) != len(want) {
			t.Errorf("timings has %d fields, want %d: %v", len(tm), len(want), tm)
		}
		for k, w := range want {
			if g, ok := tm[k]; !ok || math.Abs(g-w) > 1e-9*math.Max(1, math.Abs(w)) {
				t.Errorf("timings.%s = %v, the record gives %v", k, g, w)
			}
		}
		if f("preprocess_ns") <= 0 || f("task_ttft_ns") <= 0 || out != 5 {
			t.Errorf("record preprocess_ns %v task_ttft_ns %v output_tokens %v", rec["preprocess_ns"], rec["task_ttft_ns"], out)
		}
	}
	body := `{"prompt":"Once upon a time","max_tokens":5,"temperature":0,"ignore_eos":true,"timings_per_token":true}`
	t.Run("whole", func(t *testing.T) {
		a, id := postChoices(t, s, "/v1/completions", body)
		check(t, a.Timings, recordOf(t, s, id))
	})
	t.Run("stream", func(t *testing.T) {
		resp := s.openStream(context.Background(), "/v1/completions", strings.TrimSuffix(body, "}")+`,"stream":true}`)
		defer resp.Body.Close()
		var tm map[string]float64
		for _, ev := range sseEvents(t, resp.Body) {
			var c struct {
				Timings map[string]float64 `json:"timings"`
			}
			if ev != "[DONE]" && json.Unmarshal([]byte(ev), &c) == nil && c.Timings != nil {
				if tm != nil {
					t.Fatal("two timings chunks")
				}
				tm = c.Timings
			}
		}
		if tm == nil {
			t.Fatal("no timings chunk")
		}
		check(t, tm, recordOf(t, s, resp.Header.Get("X-Request-Id")))
	})
	t.Run("off by default", func(t *testing.T) {
		a, _ := postChoices(t, s, "/v1/completions", strings.Replace(body, `"timings_per_token":true`, `"seed":1`, 1))
		if a.Timings != nil {
			t.Errorf("timings without timings_per_token: %v", a.Timings)
		}
	})
}

// TestRepetitionPenaltyMatchesTransformers: greedy decoding with repetition_penalty (and
// min_tokens, which generate()'s min_new_tokens applies) on qwen3-tiny gives the tokens
// transformers' generate() gives on the same checkpoint (make_sampling_golden.py), and
// without the penalty the plain greedy tokens: the penalty changes the output and ours
// changes it the same way.
func TestRepetitionPenaltyMatchesTransformers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "fixtures", "golden", "sampling_golden.json"))
	if os.IsNotExist(err) {
		t.Skip("fixtures/golden/sampling_golden.json not generated yet (make_sampling_golden.py on the GPU host)")
	}
	if err != nil {
		t.Fatalf("sampling golden: %v", err)
	}
	var g struct {
		Greedy []struct {
			Prompt            []int32 `json:"prompt"`
			RepetitionPenalty float64 `json:"repetition_penalty"`
			MaxTokens         int     `json:"max_tokens"`
			Tokens            []int32 `json:"tokens"`
		} `json:"greedy_repetition_penalty"`
		Error string `json:"greedy_repetition_penalty_error"`
	}
	// Python's json writes -inf as -Infinity (not JSON; only in the processor cases).
	if err := json.Unmarshal(bytes.ReplaceAll(b, []byte("-Infinity"), []byte("-1e308")), &g); err != nil {
		t.Fatal(err)
	}
	if g.Error != "" || len(g.Greedy) != 2 {
		t.Fatalf("the golden has no greedy runs (%s)", g.Error)
	}
	if fmt.Sprint(g.Greedy[0].Tokens) == fmt.Sprint(g.Greedy[1].Tokens) {
		t.Fatal("the golden's penalty changes no token: the test would not tell")
	}
	snap, _, err := fixtures.Ensure(cacheDir, fixtures.Qwen3Tiny)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(snap)
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, qwenBundle(t))
	for _, run := range g.Greedy {
		ids, _ := json.Marshal(run.Prompt)
		body := fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"min_tokens":%d,"temperature":0,"repetition_penalty":%v}`,
			ids, run.MaxTokens, run.MaxTokens, run.RepetitionPenalty)
		a, _ := postChoices(t, s, "/v1/completions", body)
		d := tok.NewStreamDecoder()
		var want strings.Builder
		for _, id := range run.Tokens {
			want.WriteString(d.Add(id))
		}
		want.WriteString(d.Flush())
		if got := a.texts()[0]; got != want.String() {
			t.Errorf("repetition_penalty %v: %q, transformers %q (%v)", run.RepetitionPenalty, got, want.String(), run.Tokens)
		}
	}
}
