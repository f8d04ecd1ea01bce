package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestBadInputCatalog sends every kind of bad request of issue 3 to a real server: each gets
// its 4xx with an OpenAI error body whose message names the field, and the next valid request
// still succeeds.
func TestBadInputCatalog(t *testing.T) {
	s := startServer(t, qwenBundle(t), "--max-body", "65536")
	const comp, chat = "/v1/completions", "/v1/chat/completions"
	big := `{"prompt":"` + strings.Repeat("a", 70000) + `"}`
	cases := []struct {
		name, method, path, body string
		status                   int
		param                    string // "" → null
		mention                  string // the message must contain this
	}{
		{"malformed JSON", "POST", comp, `{"prompt": "hi",`, 400, "", "not valid JSON"},
		{"body is an array", "POST", comp, `["prompt"]`, 400, "", "JSON object"},
		{"body is a string", "POST", chat, `"hello"`, 400, "", "JSON object"},
		{"empty body", "POST", comp, ``, 400, "", "empty"},
		{"prompt wrong type", "POST", comp, `{"prompt": 12}`, 400, "prompt", "prompt"},
		{"prompt ids not integers", "POST", comp, `{"prompt": [1, 2.5]}`, 400, "prompt[1]", "prompt[1]"},
		{"missing prompt", "POST", comp, `{"max_tokens": 3}`, 400, "prompt", "prompt"},
		{"missing messages", "POST", chat, `{"max_tokens": 3}`, 400, "messages", "messages"},
		{"empty messages", "POST", chat, `{"messages": []}`, 400, "messages", "messages"},
		{"messages not a list", "POST", chat, `{"messages": "hi"}`, 400, "messages", "messages"},
		{"unknown role", "POST", chat, `{"messages": [{"role": "wizard", "content": "hi"}]}`, 400, "messages[0].role", "wizard"},
		{"message without role", "POST", chat, `{"messages": [{"content": "hi"}]}`, 400, "messages[0].role", "role"},
		{"content not a string", "POST", chat, `{"messages": [{"role": "user", "content": 5}]}`, 400, "messages[0].content", "content"},
		{"content missing", "POST", chat, `{"messages": [{"role": "user"}]}`, 400, "messages[0].content", "content"},
		{"invalid UTF-8", "POST", comp, "{\"prompt\": \"caf\xe9\"}", 400, "", "UTF-8"},
		{"body over the limit", "POST", comp, big, 413, "", "limit"},
		{"unknown model", "POST", comp, `{"model": "gpt-9", "prompt": "hi"}`, 404, "model", "gpt-9"},
		{"negative max_tokens", "POST", comp, `{"prompt": "hi", "max_tokens": -1}`, 400, "max_tokens", "max_tokens"},
		{"non-numeric max_tokens", "POST", comp, `{"prompt": "hi", "max_tokens": "ten"}`, 400, "max_tokens", "max_tokens"},
		{"fractional max_tokens", "POST", comp, `{"prompt": "hi", "max_tokens": 2.5}`, 400, "max_tokens", "max_tokens"},
		{"non-numeric temperature", "POST", comp, `{"prompt": "hi", "temperature": "hot"}`, 400, "temperature", "temperature"},
		{"negative temperature", "POST", comp, `{"prompt": "hi", "temperature": -0.5}`, 400, "temperature", "temperature"},
		{"top_p zero", "POST", comp, `{"prompt": "hi", "top_p": 0}`, 400, "top_p", "top_p"},
		{"top_p above one", "POST", comp, `{"prompt": "hi", "top_p": 1.5}`, 400, "top_p", "top_p"},
		{"top_k wrong type", "POST", comp, `{"prompt": "hi", "top_k": "many"}`, 400, "top_k", "top_k"},
		{"stream wrong type", "POST", comp, `{"prompt": "hi", "stream": "yes"}`, 400, "stream", "stream"},
		{"stop wrong type", "POST", comp, `{"prompt": "hi", "stop": 3}`, 400, "stop", "stop"},
		{"seed wrong type", "POST", comp, `{"prompt": "hi", "seed": "x"}`, 400, "seed", "seed"},
		{"max_tokens beyond context", "POST", comp, `{"prompt": "hi", "max_tokens": 100000}`, 400, "max_tokens", "context"},
		{"prompt beyond context", "POST", comp, `{"prompt": "` + strings.Repeat("hello ", 5000) + `"}`, 400, "prompt", "context"},
		{"chat max_completion_tokens beyond context", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}`, 400, "max_tokens", "context"},
		{"token id outside vocabulary", "POST", comp, `{"prompt": [1, 99999999]}`, 400, "prompt[1]", "vocabulary"},
		{"negative token id", "POST", comp, `{"prompt": [-3]}`, 400, "prompt[0]", "vocabulary"},
		{"n above 128", "POST", comp, `{"prompt": "hi", "n": 129}`, 400, "n", "`n`"},
		{"n zero", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "n": 0}`, 400, "n", "`n`"},
		{"n fractional", "POST", comp, `{"prompt": "hi", "n": 1.5}`, 400, "n", "`n`"},
		{"presence_penalty above 2", "POST", comp, `{"prompt": "hi", "presence_penalty": 2.5}`, 400, "presence_penalty", "between -2 and 2"},
		{"frequency_penalty below -2", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": -3}`, 400, "frequency_penalty", "between -2 and 2"},
		{"frequency_penalty not a number", "POST", comp, `{"prompt": "hi", "frequency_penalty": "x"}`, 400, "frequency_penalty", "number"},
		{"repetition_penalty zero", "POST", comp, `{"prompt": "hi", "repetition_penalty": 0}`, 400, "repetition_penalty", "greater than 0"},
		{"min_p above 1", "POST", comp, `{"prompt": "hi", "min_p": 1.5}`, 400, "min_p", "between 0 and 1"},
		{"min_tokens negative", "POST", comp, `{"prompt": "hi", "min_tokens": -1}`, 400, "min_tokens", "min_tokens"},
		{"min_tokens above max_tokens", "POST", comp, `{"prompt": "hi", "max_tokens": 4, "min_tokens": 5}`, 400, "min_tokens", "max_tokens"},
		{"min_tokens above the default max_tokens", "POST", comp, `{"prompt": "hi", "min_tokens": 17}`, 400, "min_tokens", "max_tokens"},
		{"timings_per_token not boolean", "POST", comp, `{"prompt": "hi", "timings_per_token": 1}`, 400, "timings_per_token", "true or false"},
		{"best_of", "POST", comp, `{"prompt": "hi", "best_of": 3}`, 400, "best_of", "best_of"},
		{"logprobs above 20", "POST", comp, `{"prompt": "hi", "logprobs": 21}`, 400, "logprobs", "logprobs"},
		{"negative logprobs", "POST", comp, `{"prompt": "hi", "logprobs": -1}`, 400, "logprobs", "logprobs"},
		{"boolean logprobs on completions", "POST", comp, `{"prompt": "hi", "logprobs": true}`, 400, "logprobs", "logprobs"},
		{"chat logprobs not boolean", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "logprobs": 5}`, 400, "logprobs", "logprobs"},
		{"chat top_logprobs above 20", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}`, 400, "top_logprobs", "top_logprobs"},
		{"chat top_logprobs fractional", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2.5}`, 400, "top_logprobs", "top_logprobs"},
		{"chat top_logprobs without logprobs", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`, 400, "top_logprobs", "logprobs: true"},
		{"top_logprobs on completions", "POST", comp, `{"prompt": "hi", "top_logprobs": 2}`, 400, "top_logprobs", "logprobs"},
		{"include_stop_str_in_output not boolean", "POST", comp, `{"prompt": "hi", "include_stop_str_in_output": 1}`, 400, "include_stop_str_in_output", "include_stop_str_in_output"},
		{"tools", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`, 400, "tools", "tools"},
		{"response_format json", "POST", chat, `{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}`, 400, "response_format", "response_format"},
		{"echo", "POST", comp, `{"prompt": "hi", "echo": true}`, 400, "echo", "echo"},
		{"unknown field", "POST", comp, `{"prompt": "hi", "frobnicate": 1}`, 400, "frobnicate", "frobnicate"},
		{"prompt on chat route", "POST", chat, `{"prompt": "hi"}`, 400, "prompt", "messages"},
		{"GET on POST route", "GET", comp, ``, 405, "", "POST"},
		{"GET on chat route", "GET", chat, ``, 405, "", "POST"},
		{"POST on GET route", "POST", "/v1/models", `{}`, 405, "", "GET"},
		{"unknown route", "POST", "/v1/embeddings", `{}`, 404, "", "/v1/embeddings"},
		{"tokenize unknown field", "POST", "/tokenize", `{"text": "hi"}`, 400, "text", "text"},
		{"detokenize bad ids", "POST", "/detokenize", `{"tokens": [1e12]}`, 400, "tokens", "tokens"},
		{"logits beyond vocabulary", "POST", "/mq/v1/logits", `{"prompt_token_ids": [999999999]}`, 400, "prompt_token_ids[0]", "vocabulary"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, s.url+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    any     `json:"code"`
				} `json:"error"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (%+v)", resp.StatusCode, tc.status, body.Error)
			}
			if derr != nil || body.Error == nil || body.Error.Message == "" || body.Error.Type == "" {
				t.Fatalf("not an OpenAI error body: %v %+v", derr, body.Error)
			}
			gotParam := ""
			if body.Error.Param != nil {
				gotParam = *body.Error.Param
			}
			if gotParam != tc.param {
				t.Errorf("param %q, want %q (message %q)", gotParam, tc.param, body.Error.Message)
			}
			if !strings.Contains(body.Error.Message, tc.mention) {
				t.Errorf("message %q does not mention %q", body.Error.Message, tc.mention)
			}
			// The capacity contract: after any refusal the next valid request succeeds.
			path, valid := comp, `{"prompt":"Hello","max_tokens":2}`
			if tc.path == chat {
				path, valid = chat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
			}
			if st, _, b := s.post(path, valid); st != 200 {
				t.Fatalf("next valid request: %d %s", st, b)
			}
		})
	}
}
