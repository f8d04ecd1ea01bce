package spec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// otherServer is a second, real OpenAI-compatible HTTP server in front of qual-server, as
// llama.cpp's llama-server or vLLM would be to the harness: it serves the OpenAI routes, answers
// 404 on qual-server's own routes (/mq/v1/*, /tokenize) and, like llama-server, silently
// ignores the `best_of` control that qual-server refuses.
func otherServer(t *testing.T, target string) *httptest.Server {
	t.Helper()
	return fronting(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		if strings.HasPrefix(r.URL.Path, "/mq/") || r.URL.Path == "/tokenize" || r.URL.Path == "/detokenize" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`)
			return
		}
		if r.Method == http.MethodPost && r.Body != nil {
			raw, _ := io.ReadAll(r.Body)
			var body map[string]any
			if json.Unmarshal(raw, &body) == nil {
				delete(body, "best_of")
				raw, _ = json.Marshal(body)
			}
			r.Body = io.NopCloser(bytes.NewReader(raw))
			r.ContentLength = int64(len(raw))
		}
		proxy.ServeHTTP(w, r)
	})
}

// fronting starts an HTTP server in front of target whose handler gets each request and a
// reverse proxy to target, to pass it on or answer it itself.
func fronting(t *testing.T, target string, handle func(w http.ResponseWriter, r *http.Request, proxy http.Handler)) *httptest.Server {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, proxy) }))
	t.Cleanup(srv.Close)
	return srv
}

// Against a server without qual-server's routes, the gates that need them are told so
// (HasRoute false: they skip "needs qual-server's ..."), the contract gate holds it to OpenAI's
// contract only, and the gates over plain OpenAI routes (stop strings, natural EOS) still run
// and pass, while qual-server itself answers every probe.
func TestExternalServerWithoutOurRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a qual-server")
	}
	ep := launchtest.Start(t, launchtest.Bundle(t, "qwen3-tiny"), launch.WithModel("qwen"))
	other := otherServer(t, ep.BaseURL)
	ctx := context.Background()
	ours, theirs := NewAPI(ep.BaseURL, "qwen", "", 0), NewAPI(other.URL, "qwen", "", 0)
	for _, r := range []struct{ method, route string }{{"POST", "/mq/v1/logits"}, {"GET", "/mq/v1/bundle"}, {"POST", "/tokenize"}} {
		if ok, err := ours.HasRoute(ctx, r.method, r.route); !ok || err != nil {
			t.Errorf("qual-server HasRoute(%s %s) = %v, %v; want true", r.method, r.route, ok, err)
		}
		if ok, err := theirs.HasRoute(ctx, r.method, r.route); ok || err != nil {
			t.Errorf("other server HasRoute(%s %s) = %v, %v; want false (it answers 404)", r.method, r.route, ok, err)
		}
	}

	served, err := ours.Tokenize(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	in := ContextInput{API: theirs, MaxContext: served.MaxModelLen, Refused: DefaultRefusedControls()}
	err = CheckContext(ctx, in)
	if err == nil || !strings.Contains(err.Error(), `control "best_of" on /v1/completions was accepted`) {
		t.Errorf("CheckContext with qual-server's policies on a server that ignores best_of: %v; want the best_of control named", err)
	}
	in.OpenAIOnly = true
	if err := CheckContext(ctx, in); err != nil {
		t.Errorf("CheckContext with OpenAI's contract only: %v", err)
	}

	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckStops(ctx, StopInput{API: theirs, Path: GoldenPath(root, "qwen3-tiny"), Tokenizer: tok}); err != nil {
		t.Errorf("CheckStops through the other server: %v", err)
	}
	if err := CheckEOS(ctx, EOSInput{API: theirs, Path: root + "/fixtures/golden/qwen3-tiny-eos.json", Tokenizer: tok}); err != nil {
		t.Errorf("CheckEOS through the other server: %v", err)
	}
	// Without /mq/v1/logits, token-level parity goes through OpenAI logprobs (values too once
	// the golden records top5_logprobs): the golden gate's fallback.
	g, err := LoadGolden(GoldenPath(root, "qwen3-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	values, _ := GoldenHasLogprobs(g)
	if err := CheckLogprobs(ctx, LogprobsInput{API: theirs, Golden: g, Tokenizer: tok, TokensOnly: !values, Optional: true}); err != nil {
		t.Errorf("token-level parity through logprobs on the other server: %v", err)
	}
	// A server without logprobs at all: not applicable, never a failure.
	none := NewAPI(noLogprobsServer(t, ep.BaseURL).URL, "qwen", "", 0)
	if err := CheckLogprobs(ctx, LogprobsInput{API: none, Golden: g, Tokenizer: tok, TokensOnly: true, Optional: true}); !errors.Is(err, ErrNoLogprobs) {
		t.Errorf("a server that refuses logprobs: %v; want ErrNoLogprobs", err)
	}
}

// noLogprobsServer refuses `logprobs` with a 400, as a server without them does.
func noLogprobsServer(t *testing.T, target string) *httptest.Server {
	t.Helper()
	return fronting(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		raw, _ := io.ReadAll(r.Body)
		if bytes.Contains(raw, []byte(`"logprobs"`)) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"logprobs is not supported","type":"invalid_request_error","param":"logprobs","code":null}}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(raw))
		proxy.ServeHTTP(w, r)
	})
}
