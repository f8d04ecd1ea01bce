package spec

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// eosEngine answers /v1/completions as a greedy engine whose free-running path takes the
// tokens path (after the prompt it was given) and that stops at eos unless ignoresEOS: a
// reduced-precision engine's path leaves transformers' at a near-tie, and the teacher-forced
// request (the prompt followed by transformers' tokens) asks it for the next token alone.
func eosEngine(t *testing.T, tok *tokenizer.Tokenizer, prompt, path, forced []int32, eos int32, ignoresEOS bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Prompt    []int32 `json:"prompt"`
			MaxTokens int     `json:"max_tokens"`
			Stream    bool    `json:"stream"`
		}
		if err := json.Unmarshal(raw, &body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		next := path // the free-running path
		if len(body.Prompt) > len(prompt) {
			next = forced // what follows transformers' tokens
		}
		var out []int32
		finish := "length"
		for _, id := range next[:min(body.MaxTokens, len(next))] {
			out = append(out, id)
			if id == eos && !ignoresEOS {
				finish = "stop"
				break
			}
		}
		visible := out
		if finish == "stop" {
			visible = out[:len(out)-1]
		}
		text := continuation(tok, body.Prompt, visible)
		usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d}`, len(body.Prompt), len(out))
		if !body.Stream {
			fmt.Fprintf(w, `{"choices":[{"text":%q,"index":0,"finish_reason":%q}],"usage":%s}`, text, finish, usage)
			return
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q,\"index\":0,\"finish_reason\":null}]}\n\n", text)
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"\",\"index\":0,\"finish_reason\":%q}]}\n\n", finish)
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestEOSAfterANearTie: on a reduced-precision run (TieMargin > 0) a served path that leaves
// transformers' at a near-tie is held to the end-of-sequence stop teacher-forced, so an engine
// that ignores EOS still fails; a divergence where transformers' choice was clear fails, and
// without the margin (a CPU run) any divergence does.
func TestEOSAfterANearTie(t *testing.T) {
	root := filepath.Join("..", "..")
	tok, err := tokenizer.Load(filepath.Join(root, "fixtures", "tokenizers", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	full, err := LoadEOSGolden(filepath.Join(root, "fixtures", "golden", "llama-tiny-eos.json"))
	if err != nil {
		t.Fatal(err)
	}
	// transformers' greedy path [103 811 495 </s> ...]: step 1's top two lie 0.03 apart, step 0's
	// 0.92 and the end-of-sequence step's 0.21, so with a margin of 0.1 only step 1 is a near-tie
	const margin = 0.1
	i := slices.IndexFunc(full.Prompts, func(p GoldenPrompt) bool { return p.Name == "eos-2-after-3-tokens-1" })
	if i < 0 {
		t.Fatal("llama-tiny-eos.json has no prompt eos-2-after-3-tokens-1")
	}
	gp := full.Prompts[i]
	eos := full.EOSTokenIDs[0]
	stop := slices.Index(gp.GreedyIDs, eos)
	if stop != 3 || !nearTie(gp.Steps[1], gp.GreedyIDs[1], margin) || nearTie(gp.Steps[0], gp.GreedyIDs[0], margin) || nearTie(gp.Steps[stop], eos, margin) {
		t.Fatalf("the golden prompt changed (greedy %v, EOS at %d): pick another near-tie prompt for this test", gp.GreedyIDs, stop)
	}
	one := *full
	one.Prompts = []GoldenPrompt{gp}
	raw, _ := json.Marshal(one)
	path := filepath.Join(t.TempDir(), "eos.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	second := gp.Steps[1].Top5IDs[1] // the near-tie's runner-up
	first := gp.Steps[0].Top5IDs[1]  // step 0's runner-up: 0.92 below transformers' choice
	rest := []int32{495, 495, 495, 495, 495, 495, 495}
	atTie := append([]int32{gp.GreedyIDs[0], second}, rest...)
	offTie := append([]int32{first}, rest...)
	forced := []int32{eos, 5, 5, 5, 5}
	cases := []struct {
		name       string
		path       []int32
		ignoresEOS bool
		margin     float64
		want       string // "" passes
	}{
		{"bf16 path leaves at the near-tie, stops teacher-forced", atTie, false, margin, ""},
		{"ignores EOS", atTie, true, margin, "followed by transformers' 3 tokens"},
		{"leaves where transformers' choice was clear", offTie, false, margin, "generation does not end where transformers' does"},
		{"CPU run: no margin", atTie, false, 0, "generation does not end where transformers' does"},
	}
	for _, c := range cases {
		srv := eosEngine(t, tok, gp.PromptIDs, c.path, forced, eos, c.ignoresEOS)
		err := CheckEOS(context.Background(), EOSInput{API: NewAPI(srv.URL, "m", "", 0), Path: path, Tokenizer: tok, TieMargin: c.margin})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
