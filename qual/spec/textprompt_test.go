package spec

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// textOnlyServer answers /v1/completions like Ollama: a token-array prompt is a 400, a text
// prompt a completion; it keeps every prompt it was sent.
func textOnlyServer(t *testing.T, acceptIDs bool) (*httptest.Server, *[]any) {
	var mu sync.Mutex
	var got []any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		mu.Lock()
		got = append(got, body["prompt"])
		mu.Unlock()
		if _, isText := body["prompt"].(string); !isText && !acceptIDs {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"json: cannot unmarshal array into Go struct field CompletionRequest.prompt of type string","type":"invalid_request_error"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &got
}

func TestTokenPromptsSentAsTextWhereRefused(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "fixtures", "tokenizers", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("Hello world")
	withBOS := append([]int32{1}, ids...)
	for _, accept := range []bool{false, true} {
		srv, got := textOnlyServer(t, accept)
		api := NewAPI(srv.URL, "m", "", 0)
		api.TextPrompt = TextPrompt(tok)
		for i := 0; i < 2; i++ {
			if _, err := api.Complete(context.Background(), "/v1/completions", map[string]any{"prompt": withBOS, "max_tokens": 1}); err != nil {
				t.Fatalf("accept=%v: %v", accept, err)
			}
		}
		// The probe, then the two requests.
		if len(*got) != 3 {
			t.Fatalf("accept=%v: the server saw %d requests (%v); want the probe and two", accept, len(*got), *got)
		}
		for _, p := range (*got)[1:] {
			text, isText := p.(string)
			switch {
			case accept && isText:
				t.Errorf("a server that takes token arrays got text %q", text)
			case !accept && (!isText || text != "Hello world"):
				// The <s> the tokenizer adds itself is left to the server, not spelt out.
				t.Errorf("a text-only server got %#v; want \"Hello world\" without <s>", p)
			}
		}
		caps, err := api.Capabilities(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if caps.TokenPrompts != accept || (!accept && !strings.Contains(caps.Summary(), "token-array prompts")) {
			t.Errorf("accept=%v: capabilities say TokenPrompts=%v; summary:\n%s", accept, caps.TokenPrompts, caps.Summary())
		}
	}
}

// TestContinuationKeepsTheFirstSpace: a SentencePiece decoder strips a sequence's leading
// space, so llama-tiny's "▁n" after "<s> Hello" reads " n" only when decoded in context.
func TestContinuationKeepsTheFirstSpace(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "fixtures", "tokenizers", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := append([]int32{1}, tok.Encode("Hello")...)
	gen := tok.Encode(" new world")
	if alone := tok.Decode(gen); strings.HasPrefix(alone, " ") {
		t.Fatalf("decoded alone %q keeps its space: the test no longer shows the case", alone)
	}
	if got := continuation(tok, prompt, gen); got != " new world" {
		t.Fatalf("continuation = %q, want %q", got, " new world")
	}
}
