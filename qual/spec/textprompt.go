package spec

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// CapTokenPrompts names OpenAI's token-array prompt on /v1/completions ({"prompt": [ids]}) in
// Capabilities' summary.
const CapTokenPrompts = "token-array prompts"

// TextPrompt is how a golden prompt's ids travel to a server that takes text prompts only: its
// text, decoded by the checkpoint's tokenizer, without the special tokens that tokenizer adds
// to any text itself (a Llama tokenizer's <s>), since the server adds them again when it
// tokenizes. The server then reads the ids the golden holds.
func TextPrompt(tok *tokenizer.Tokenizer) func(ids []int32) string {
	lead, _ := tok.EncodeWithSpecialTokens("")
	return func(ids []int32) string {
		if len(lead) > 0 && len(ids) > 0 && ids[0] == lead[0] {
			ids = ids[1:]
		}
		return tok.Decode(ids)
	}
}

// probeIDs is a token-array prompt asTextPrompt leaves alone (the probe's own).
type probeIDs []int32

// tokenPrompts answers, probing once, whether the server takes token-array prompts on
// /v1/completions. A 4xx answer to three token ids means it does not (Ollama: "cannot
// unmarshal array into … prompt of type string"); a transport error says nothing, so token
// arrays are kept.
func (a *API) tokenPrompts(ctx context.Context) (bool, string) {
	a.tpMu.Lock()
	defer a.tpMu.Unlock()
	if a.tpProbed {
		return a.tpOK, a.tpWhy
	}
	_, status, err := a.postRaw(ctx, "/v1/completions", map[string]any{"model": a.Model, "prompt": probeIDs{1, 2, 3}, "max_tokens": 1, "temperature": 0})
	switch {
	case err == nil:
		a.tpProbed, a.tpOK = true, true
	case status/100 == 4:
		a.tpProbed, a.tpOK = true, false
		a.tpWhy = fmt.Sprintf("HTTP %d to {\"prompt\": [1, 2, 3]}: %s", status, clip(err.Error(), 120))
	default:
		return true, ""
	}
	return a.tpOK, a.tpWhy
}

// asTextPrompt rewrites a /v1/completions body whose prompt is token ids into one with its
// text (API.TextPrompt) when the server takes text prompts only; any other body is returned
// as it is.
func (a *API) asTextPrompt(ctx context.Context, route string, body any) any {
	m, ok := body.(map[string]any)
	if !ok || a.TextPrompt == nil || !strings.HasSuffix(route, "/v1/completions") {
		return body
	}
	var ids []int32
	switch p := m["prompt"].(type) {
	case []int32:
		ids = p
	case []int:
		for _, x := range p {
			ids = append(ids, int32(x))
		}
	default:
		return body
	}
	if ok, _ := a.tokenPrompts(ctx); ok {
		return body
	}
	out := maps.Clone(m)
	out["prompt"] = a.TextPrompt(ids)
	return out
}

// tokenPromptsProbe records the token-array probe in c (only when the API can fall back to text).
func (a *API) tokenPromptsProbe(ctx context.Context, c *Capabilities) {
	if a.TextPrompt == nil {
		return
	}
	ok, why := a.tokenPrompts(ctx)
	c.TokenPrompts = ok
	if !ok {
		c.Missing[CapTokenPrompts] = why + "; golden prompts are sent as their text"
	}
}
