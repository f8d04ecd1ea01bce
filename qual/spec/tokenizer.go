package spec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/onsi/ginkgo/v2"
)

// TokenizerGolden is one text of fixtures/golden/tokenizer_golden.json with the ids
// transformers' tokenizer gives it (encode(text, add_special_tokens=False)).
type TokenizerGolden struct {
	Text string  `json:"text"`
	IDs  []int32 `json:"ids"`
}

// TokenizerInput is the input of TokenizerParity and CheckTokenizer.
type TokenizerInput struct {
	// API reaches the served model.
	API *API
	// Path is the tokenizer golden file; Key the tokenizer's entry ("qwen3", "gpt2").
	Path, Key string
}

// CheckTokenizer is TokenizerParity's core: every golden text (accents written with combining
// marks, CJK, emoji, code, whitespace runs, special-token look-alikes) sent as a plain
// completions prompt must be counted as transformers counts it (usage.prompt_tokens), and,
// where the server has /tokenize, encoded to exactly transformers' ids. The server's own
// tokenizer is what is checked: the corpus gates send token ids, which a client tokenizer made.
func CheckTokenizer(ctx context.Context, in TokenizerInput) error {
	const fn = "spec.CheckTokenizer"
	if in.API == nil {
		return fmt.Errorf("%s: TokenizerInput.API is nil", fn)
	}
	raw, err := os.ReadFile(in.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", fn, err)
	}
	var all map[string]json.RawMessage
	var gs []TokenizerGolden
	if err := json.Unmarshal(raw, &all); err != nil {
		return fmt.Errorf("%s: %s: %w", fn, in.Path, err)
	}
	if err := json.Unmarshal(all[in.Key], &gs); err != nil || len(gs) == 0 {
		return fmt.Errorf("%s: %s has no texts under %q (err %v)", fn, in.Path, in.Key, err)
	}
	caps, err := in.API.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("%s: probe the server: %w", fn, err)
	}
	// /tokenize in either shape (vLLM's {"prompt"}, llama.cpp's {"content"}); a server whose
	// /tokenize answers no tokens is judged on usage.prompt_tokens alone.
	hasTokenize := caps.TokenizeField != ""
	if !hasTokenize {
		ginkgo.GinkgoWriter.Printf("tokenizer gate: /tokenize ids not compared: %s\n", caps.Missing[CapTokenize])
	}
	var problems []string
	for _, g := range gs {
		name := fmt.Sprintf("%q", clip(g.Text, 40))
		var ans *Answer
		if len(g.IDs) > 0 { // an empty prompt is refused, as OpenAI does
			ans, err = in.API.Complete(ctx, "/v1/completions", map[string]any{"prompt": g.Text, "max_tokens": 1, "temperature": 0})
		}
		switch {
		case len(g.IDs) == 0:
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
		case ans.HasUsage && ans.PromptTokens != len(g.IDs):
			problems = append(problems, fmt.Sprintf("%s: usage.prompt_tokens %d, transformers encodes it to %d tokens", name, ans.PromptTokens, len(g.IDs)))
		}
		if !hasTokenize {
			continue
		}
		t, err := in.API.Tokenize(ctx, g.Text)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: /tokenize: %v", name, err))
		case !equalIDs(t.Tokens, g.IDs):
			problems = append(problems, fmt.Sprintf("%s: /tokenize gives %d ids, transformers %d; first difference at %d", name, len(t.Tokens), len(g.IDs), firstDiff(t.Tokens, g.IDs)))
		}
	}
	if len(problems) > 0 {
		return errors.New("tokenizer gate: the served tokenizer encodes differently from transformers:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// TokenizerParity asserts that the server tokenizes raw prompts as transformers does
// (CheckTokenizer).
func TokenizerParity(ctx context.Context, input func() TokenizerInput) {
	ginkgo.It("tokenizes raw prompts as transformers does (prompt token counts, /tokenize ids)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckTokenizer(c, input()))
	})
}
