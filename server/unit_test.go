package server

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "quote\" back\\slash", "ctl\x00\x01\x1f\t\n\r", "héllo 世界 🌍", "\u2028\u2029", "bad\xffutf8\xc3"} {
		got := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q encodes to invalid JSON %s: %v", s, got, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); back != want {
			t.Errorf("%q round-trips to %q, want %q", s, back, want)
		}
		if !utf8.Valid(got) {
			t.Errorf("%q encodes to invalid UTF-8", s)
		}
		if fromBytes := appendJSONStringBody(nil, []byte(s)); string(fromBytes) != string(got[1:len(got)-1]) {
			t.Errorf("%q encodes from bytes to %s, from a string to %s", s, fromBytes, got)
		}
	}
}

func TestAppendJSONStringDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 256)
	text := []byte("bytes from the stream decoder: 世界 \u2028 \xff")
	allocs := testing.AllocsPerRun(1000, func() {
		buf = appendJSONStringBody(buf[:0], "token text with \"quotes\" and 世界")
		buf = appendJSONStringBody(buf, text)
	})
	if allocs != 0 {
		t.Errorf("appendJSONStringBody allocates %v times per call", allocs)
	}
}

func TestDecodeRequestDefaultsAndFields(t *testing.T) {
	r, err := DecodeRequest([]byte(`{"model":"m","prompt":"hi","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"seed":-1,"stop":["a","b"],"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"n":1,"logprobs":null,"user":"u"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Prompt != "hi" || r.MaxTokens != 7 || r.Temperature != 0 || r.TopP != 0.5 || r.TopK != 3 || !r.HasSeed || r.Seed != ^uint64(0) ||
		len(r.Stop) != 2 || !r.IgnoreEOS || !r.Stream || !r.IncludeUsage {
		t.Errorf("decoded %+v", r)
	}
	c, err := DecodeRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9,"chat_template_kwargs":{"enable_thinking":false}}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxTokens != 9 || c.ChatTemplateKwargs["enable_thinking"] != false || !c.AddGenerationPrompt || c.Temperature != 1 {
		t.Errorf("decoded chat %+v", c)
	}
	b, err := DecodeRequest([]byte(`{"prompt":[[1,2,3]]}`), false)
	if err != nil || !b.HasPromptIDs || len(b.PromptIDs) != 3 {
		t.Errorf("batch-of-one id prompt: %+v %v", b, err)
	}
}

// FuzzDecodeRequest: the decoder never panics; it either accepts a request that satisfies the
// invariants the server relies on, or returns a 4xx error with a message. The seed corpus lives
// in testdata/fuzz/FuzzDecodeRequest.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi","max_tokens":3}`,
		`{"prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"hi"}],"stop":["x"],"top_p":0.9}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"assistant","content":"a","name":"n"}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"prompt":"x","n":2}`, `[]`, `{`, `null`, "{\"prompt\":\"\xff\"}", `{"prompt":[[1],[2]]}`,
		`{"prompt":"x","max_tokens":1e400}`, `{"prompt":"x","top_k":-1,"seed":18446744073709551615}`,
		`{"prompt":"x","logprobs":5}`, `{"prompt":"x","logprobs":0,"stream":true}`, `{"prompt":"x","logprobs":21}`,
		`{"prompt":"x","logprobs":true}`, `{"prompt":"x","logprobs":2.5}`, `{"prompt":"x","top_logprobs":3}`,
		`{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":20}`,
		`{"messages":[{"role":"user","content":"hi"}],"logprobs":false,"top_logprobs":1}`,
		`{"messages":[{"role":"user","content":"hi"}],"logprobs":1}`,
		`{"messages":[{"role":"user","content":"hi"}],"top_logprobs":null,"logprobs":null}`,
		`{"prompt":"x","stop":["a"],"include_stop_str_in_output":true}`, `{"prompt":"x","include_stop_str_in_output":"yes"}`,
		`{"prompt":"x","n":3,"presence_penalty":-2,"frequency_penalty":2,"repetition_penalty":1.1,"min_p":0.05,"min_tokens":2,"max_tokens":4}`,
		`{"prompt":"x","repetition_penalty":0}`, `{"prompt":"x","min_tokens":5,"max_tokens":4}`, `{"prompt":"x","n":129}`,
	} {
		f.Add([]byte(s), s[0] == '{' && strings.Contains(s, "messages"))
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r, err := DecodeRequest(body, chat)
		if err != nil {
			if err.Status < 400 || err.Status > 499 || err.Message == "" || !json.Valid(err.body()) {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if chat && len(r.Messages) == 0 || !chat && r.Prompt == "" && !r.HasPromptIDs && r.Prompt != "" {
			t.Fatalf("accepted request without prompt: %+v", r)
		}
		if r.MaxTokens < 0 || r.TopP <= 0 || r.TopP > 1 || r.Temperature < 0 || r.Temperature > 2 || r.TopK < 0 {
			t.Fatalf("accepted out-of-range controls: %+v", r)
		}
		if r.TopLogprobs < 0 || r.TopLogprobs > MaxTopLogprobs || r.TopLogprobs > 0 && !r.Logprobs {
			t.Fatalf("accepted logprobs %v with %d alternatives", r.Logprobs, r.TopLogprobs)
		}
		for _, m := range r.Messages {
			if _, ok := m["role"].(string); !ok {
				t.Fatalf("message without role accepted: %v", m)
			}
			if _, ok := m["content"].(string); !ok {
				t.Fatalf("message without string content accepted: %v", m)
			}
		}
		for _, s := range r.Stop {
			if s == "" {
				t.Fatal("empty stop string accepted")
			}
		}
		if r.N < 1 || r.N > MaxChoices || r.PresencePenalty < -2 || r.PresencePenalty > 2 || r.FrequencyPenalty < -2 ||
			r.FrequencyPenalty > 2 || !(r.RepetitionPenalty > 0) || r.MinP < 0 || r.MinP > 1 || r.MinTokens < 0 ||
			(r.MaxTokens > 0 && r.MinTokens > r.MaxTokens) {
			t.Fatalf("sampling controls out of range accepted: %+v", r)
		}
	})
}

// TestVendorFields: the listed vendor fields are accepted and change nothing decoded; fields
// of the same vendors that would change the output stay refused by name.
func TestVendorFields(t *testing.T) {
	base := `{"prompt":"hi","max_tokens":3,"temperature":0}`
	want, aerr := DecodeRequest([]byte(base), false)
	if aerr != nil {
		t.Fatal(aerr)
	}
	for k, v := range map[string]string{"cache_prompt": "true", "id_slot": "-1", "cache_salt": `"tenant-a"`, "priority": "5",
		"prompt_cache_key": `"k"`, "safety_identifier": `"u-1"`} {
		for _, chat := range []bool{false, true} {
			body := `{"prompt":"hi","max_tokens":3,"temperature":0,"` + k + `":` + v + `}`
			if chat {
				body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0,"` + k + `":` + v + `}`
			}
			got, aerr := DecodeRequest([]byte(body), chat)
			if aerr != nil {
				t.Errorf("%s (chat %v): %v", k, chat, aerr)
				continue
			}
			if !chat && (got.Prompt != want.Prompt || got.MaxTokens != want.MaxTokens || got.Temperature != want.Temperature) {
				t.Errorf("%s changed the decoded request: %+v", k, got)
			}
		}
	}
	for _, k := range []string{"n_probs", "samplers", "t_max_predict_ms", "skip_special_tokens", "typical_p"} {
		_, aerr := DecodeRequest([]byte(`{"prompt":"hi","`+k+`":1}`), false)
		if aerr == nil || aerr.Status != 400 || aerr.Param != k {
			t.Errorf("%s (changes the output): %v, want 400 naming it", k, aerr)
		}
	}
}
