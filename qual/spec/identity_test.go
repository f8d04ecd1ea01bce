package spec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// The identity check passes on a server of the family's checkpoint and stops, naming what
// differs, on a server of another checkpoint (gpt2-tiny served under the name "qwen") and on
// a model name the server does not list.
func TestIdentityCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two qual-servers")
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	g, err := LoadGolden(GoldenPath(root, "qwen3-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	qwen := launchtest.Start(t, launchtest.Bundle(t, "qwen3-tiny"), launch.WithModel("qwen"))
	res, err := CheckIdentity(ctx, IdentityInput{API: NewAPI(qwen.BaseURL, "qwen", "", 0), Checkpoint: "qwen3-tiny", Golden: g, Tokenizer: tok})
	if err != nil {
		t.Fatalf("identity of the qwen3-tiny server: %v", err)
	}
	if !strings.Contains(res.Fingerprint, "greedy tokens of 3 golden prompts (24 tokens), logprobs of 24") {
		t.Errorf("fingerprint %q; want greedy tokens and logprobs of 3 prompts × 8 tokens", res.Fingerprint)
	}

	// A model name the server does not list: named, with what it lists.
	_, err = CheckIdentity(ctx, IdentityInput{API: NewAPI(qwen.BaseURL, "other", "", 0), ModelGiven: true, Checkpoint: "qwen3-tiny", Golden: g, Tokenizer: tok})
	if !errors.Is(err, ErrIdentity) || !strings.Contains(err.Error(), `lists models ["qwen"], not "other"`) {
		t.Errorf("a model name the server does not list: %v; want the listed names", err)
	}
	// Not given by the user: the one listed model is used.
	if res, err := CheckIdentity(ctx, IdentityInput{API: NewAPI(qwen.BaseURL, "other", "", 0), Checkpoint: "qwen3-tiny", Golden: g, Tokenizer: tok}); err != nil || res.Model != "qwen" {
		t.Errorf("one listed model, none given: model %q, %v; want qwen", res.Model, err)
	}

	// Another checkpoint under the family's name.
	other := launchtest.Start(t, launchtest.Bundle(t, "gpt2-tiny"), launch.WithModel("qwen"))
	_, err = CheckIdentity(ctx, IdentityInput{API: NewAPI(other.BaseURL, "qwen", "", 0), Checkpoint: "modelqual-fixtures/qwen3-tiny", Golden: g, Tokenizer: tok})
	if !errors.Is(err, ErrIdentity) || !strings.Contains(err.Error(), "does not serve modelqual-fixtures/qwen3-tiny") {
		t.Errorf("a gpt2-tiny server checked as qwen3-tiny: %v; want ErrIdentity naming the checkpoint", err)
	}
	t.Logf("identity message: %v", err)
}

// llamaCppLike stands in front of qual-server as llama.cpp's llama-server does towards the
// harness (used where the test needs an engine that reports what it generated differently):
// /tokenize reads {"content"} and answers [] to anything else, /detokenize answers
// {"content"}, qual-server's own routes are 404, and, where merge is set, /v1/completions
// logprobs fold byte pieces into one entry per complete character. The ids of the generated
// tokens, which the answer's token strings cannot carry, come from the golden: the server
// behind generates exactly the golden's greedy tokens (its golden gate shows it).
func llamaCppLike(t *testing.T, target string, tok *tokenizer.Tokenizer, g *Golden, merge bool, alter string) *httptest.Server {
	t.Helper()
	return fronting(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		switch {
		case strings.HasPrefix(r.URL.Path, "/mq/"):
			w.WriteHeader(http.StatusNotFound)
			return
		case r.URL.Path == "/tokenize":
			content, _ := body["content"].(string)
			ids := []int32{}
			if content != "" {
				ids = tok.Encode(content)
			}
			json.NewEncoder(w).Encode(map[string]any{"tokens": ids})
			return
		case r.URL.Path == "/detokenize":
			var ids []int32
			b, _ := json.Marshal(body["tokens"])
			_ = json.Unmarshal(b, &ids)
			json.NewEncoder(w).Encode(map[string]any{"content": tok.Decode(ids)})
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
		var greedy []int32
		if p, ok := body["prompt"].([]any); ok && body["logprobs"] != nil && r.URL.Path == "/v1/completions" {
			var ids []int32
			for _, x := range p {
				f, _ := x.(float64)
				ids = append(ids, int32(f))
			}
			for _, gp := range g.Prompts {
				if slices.Equal(gp.PromptIDs, ids) {
					greedy = gp.GreedyIDs
				}
			}
		}
		if greedy == nil {
			proxy.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r)
		var resp map[string]any
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &resp) != nil {
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		lp := resp["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)
		toks, vals, tops := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any)
		var nt, nv, ntop []any
		var pending []byte
		for i := range toks {
			piece := tok.TokenBytes(nil, greedy[i])
			if merge && len(pending) == 0 && !utf8.Valid(piece) && i+1 < len(toks) {
				pending = piece
				continue // a lone byte piece: folded into the next entry, as llama.cpp does
			}
			pending = append(pending, piece...)
			s := toks[i].(string)
			if merge {
				s = string(pending)
			}
			if alter != "" && len(nt) == 3 {
				s = alter
			}
			nt, nv, ntop = append(nt, s), append(nv, vals[i]), append(ntop, tops[i])
			pending = nil
		}
		lp["tokens"], lp["token_logprobs"], lp["top_logprobs"] = nt, nv, ntop
		delete(lp, "text_offset")
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp)
	})
}

// Against an engine that folds byte pieces into one logprobs entry (llama.cpp), the logprobs
// gate pairs entries with the golden's tokens by bytes and passes (a position-by-position
// comparison would misalign every later step); an engine that generated another token fails
// with "tokens differ from the reference". /tokenize in llama.cpp's shape is found and used.
func TestLlamaCppShapedAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a qual-server")
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	g, err := LoadGolden(GoldenPath(root, "qwen3-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	var lossy int
	for _, gp := range g.Prompts {
		for _, id := range gp.GreedyIDs {
			if !utf8.Valid(tok.TokenBytes(nil, id)) {
				lossy++
			}
		}
	}
	if lossy == 0 {
		t.Fatal("the qwen3-tiny golden has no byte-piece tokens; the merging case is not exercised")
	}
	ctx := context.Background()
	ep := launchtest.Start(t, launchtest.Bundle(t, "qwen3-tiny"), launch.WithModel("qwen"))

	merging := NewAPI(llamaCppLike(t, ep.BaseURL, tok, g, true, "").URL, "qwen", "", 0)
	if err := CheckLogprobs(ctx, LogprobsInput{API: merging, Golden: g, Tokenizer: tok, Optional: true}); err != nil {
		t.Errorf("logprobs through an engine that folds %d byte pieces into the next entry: %v; want a pass", lossy, err)
	}
	altered := NewAPI(llamaCppLike(t, ep.BaseURL, tok, g, true, " altered").URL, "qwen", "", 0)
	err = CheckLogprobs(ctx, LogprobsInput{API: altered, Golden: g, Tokenizer: tok, Optional: true})
	if err == nil || !strings.Contains(err.Error(), "tokens differ from the reference") || !strings.Contains(err.Error(), `generated " altered"`) {
		t.Errorf("logprobs through an engine that generated another token: %v; want tokens differ", err)
	}

	caps, err := merging.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if caps.TokenizeField != "content" || caps.DetokenizeField != "content" || caps.MQLogits || caps.TokenizeChat || !caps.Logprobs || caps.LogprobsTopK < 5 {
		t.Errorf("capabilities of a llama.cpp-shaped server:\n%s", caps.Summary())
	}
	if !strings.Contains(caps.Missing[CapTokenizeChat], "no chat template was applied") && !strings.Contains(caps.Missing[CapTokenizeChat], "no tokens") {
		t.Errorf("/tokenize with messages on a server that reads content only: missing reason %q", caps.Missing[CapTokenizeChat])
	}
	if err := CheckTokenizer(ctx, TokenizerInput{API: merging, Path: root + "/fixtures/golden/tokenizer_golden.json", Key: "qwen3"}); err != nil {
		t.Errorf("tokenizer gate through llama.cpp's /tokenize shape: %v", err)
	}
	ours, err := NewAPI(ep.BaseURL, "qwen", "", 0).Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ours.TokenizeField != "prompt" || !ours.TokenizeChat || !ours.TokenizeRendered || !ours.MQLogits || !ours.MQBundle || ours.PromptLogprobs {
		t.Errorf("qual-server's capabilities:\n%s", ours.Summary())
	}
}

// include_stop_str_in_output is vLLM's, not OpenAI's: a server that drops the field (as one
// that ignores unknown fields does) makes the vendor spec not checkable, while qual-server,
// which honours it, is checked; the OpenAI stop gate passes on both.
func TestStopInclusionIsAVendorSpec(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a qual-server")
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	ep := launchtest.Start(t, launchtest.Bundle(t, "qwen3-tiny"), launch.WithModel("qwen"))
	ignoring := fronting(t, ep.BaseURL, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if json.Unmarshal(raw, &body) == nil {
			delete(body, "include_stop_str_in_output")
			raw, _ = json.Marshal(body)
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
		proxy.ServeHTTP(w, r)
	})
	ctx := context.Background()
	in := StopInput{API: NewAPI(ignoring.URL, "qwen", "", 0), Path: GoldenPath(root, "qwen3-tiny"), Tokenizer: tok}
	if why := probeStopInclusion(ctx, in); !strings.Contains(why, "was ignored") {
		t.Errorf("probe on a server that drops include_stop_str_in_output: %q; want ignored", why)
	}
	in.SkipInclude = true
	if err := CheckStops(ctx, in); err != nil {
		t.Errorf("OpenAI stop semantics on that server: %v", err)
	}
	in.SkipInclude, in.onlyInclude = false, true
	if err := CheckStops(ctx, in); err == nil {
		t.Error("include_stop_str_in_output required of a server that drops it: passed; want the vendor check to fail")
	}
	in.API = NewAPI(ep.BaseURL, "qwen", "", 0)
	if why := probeStopInclusion(ctx, in); why != "" {
		t.Errorf("probe on qual-server: %q; want offered", why)
	}
}
