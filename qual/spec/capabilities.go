package spec

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
)

// Capabilities is what a served model offers beyond OpenAI's completions and chat routes,
// probed once per API (API.Capabilities): the extension routes of vLLM, llama.cpp's
// llama-server and qual-server, and the optional answer fields. A gate uses what exists and
// skips, with the reason kept here, what does not: an empty or malformed answer from an
// extension route makes that capability absent, never a verdict on the engine.
type Capabilities struct {
	// MQLogits and MQBundle: qual-server's POST /mq/v1/logits and GET /mq/v1/bundle.
	MQLogits, MQBundle bool
	// TokenizeField is the body field POST /tokenize reads a raw prompt from: "prompt"
	// (vLLM, qual-server) or "content" (llama.cpp); "" when /tokenize is absent or answered
	// no tokens in either shape.
	TokenizeField string
	// TokenizeChat: POST /tokenize renders and tokenizes {"messages"} (vLLM, qual-server);
	// TokenizeRendered: its answer also carries the rendered prompt text (qual-server).
	TokenizeChat, TokenizeRendered bool
	// DetokenizeField is the field POST /detokenize answers the text in ("prompt" for vLLM,
	// "content" for llama.cpp), "" when absent.
	DetokenizeField string
	// Logprobs: /v1/completions answers `logprobs: N` with one entry per token;
	// LogprobsTopK is how many alternatives it gave for N=5 (0: the chosen token only).
	Logprobs     bool
	LogprobsTopK int
	// PromptLogprobs: vLLM's `prompt_logprobs` is answered with per-prompt-token logprobs.
	PromptLogprobs bool
	// TokenPrompts: /v1/completions takes OpenAI's token-array prompt; probed only when the
	// API can fall back to text (API.TextPrompt).
	TokenPrompts bool
	// Missing says, per capability name, why the probe found it absent.
	Missing map[string]string
}

// Capability names, the keys of Capabilities.Missing and of its summary.
const (
	CapMQLogits       = "/mq/v1/logits"
	CapMQBundle       = "/mq/v1/bundle"
	CapTokenize       = "/tokenize"
	CapTokenizeChat   = "/tokenize with messages"
	CapDetokenize     = "/detokenize"
	CapLogprobs       = "logprobs"
	CapPromptLogprobs = "prompt_logprobs"
)

// Summary is one line per capability: offered (with its shape) or absent with the reason.
func (c *Capabilities) Summary() string {
	var b strings.Builder
	line := func(name string, ok bool, shape string) {
		switch {
		case ok && shape != "":
			fmt.Fprintf(&b, "  %-24s offered (%s)\n", name, shape)
		case ok:
			fmt.Fprintf(&b, "  %-24s offered\n", name)
		default:
			fmt.Fprintf(&b, "  %-24s absent: %s\n", name, c.Missing[name])
		}
	}
	line(CapMQLogits, c.MQLogits, "")
	line(CapMQBundle, c.MQBundle, "")
	line(CapTokenize, c.TokenizeField != "", fmt.Sprintf(`{"%s"} → {"tokens"}`, c.TokenizeField))
	shape := "tokens"
	if c.TokenizeRendered {
		shape = "tokens and the rendered prompt"
	}
	line(CapTokenizeChat, c.TokenizeChat, shape)
	line(CapDetokenize, c.DetokenizeField != "", fmt.Sprintf(`{"tokens"} → {"%s"}`, c.DetokenizeField))
	line(CapLogprobs, c.Logprobs, fmt.Sprintf("top-%d alternatives", c.LogprobsTopK))
	line(CapPromptLogprobs, c.PromptLogprobs, "")
	if _, probed := c.Missing[CapTokenPrompts]; probed || c.TokenPrompts {
		line(CapTokenPrompts, c.TokenPrompts, "")
	}
	return b.String()
}

// Capabilities probes, once per API, what the server offers (see Capabilities). Only a
// transport error (the server unreachable) is returned; every answer, refusal or oddity is a
// finding.
func (a *API) Capabilities(ctx context.Context) (*Capabilities, error) {
	a.capMu.Lock()
	defer a.capMu.Unlock()
	if a.caps != nil {
		return a.caps, nil
	}
	c, err := a.probe(ctx)
	if err != nil {
		return nil, err
	}
	a.tokenPromptsProbe(ctx, c)
	a.caps = c
	if c.TokenizeField != "" {
		a.tokenizeField = c.TokenizeField
	}
	return c, nil
}

func (a *API) probe(ctx context.Context) (*Capabilities, error) {
	c := &Capabilities{Missing: map[string]string{}}
	var err error
	if c.MQLogits, err = a.HasRoute(ctx, http.MethodPost, "/mq/v1/logits"); err != nil {
		return nil, err
	} else if !c.MQLogits {
		c.Missing[CapMQLogits] = "answered 404 (a route of qual-server only)"
	}
	if c.MQBundle, err = a.HasRoute(ctx, http.MethodGet, "/mq/v1/bundle"); err != nil {
		return nil, err
	} else if !c.MQBundle {
		c.Missing[CapMQBundle] = "answered 404 (a route of qual-server only)"
	}

	// /tokenize: vLLM's and qual-server's {"prompt"}, then llama.cpp's {"content"}. An answer
	// without tokens (llama.cpp reads content and answers [] to a prompt) is not the shape.
	const probeText = "Hello, world"
	var why []string
	for _, field := range []string{"prompt", "content"} {
		toks, _, status, err := a.tokenizeRaw(ctx, map[string]any{"model": a.Model, field: probeText})
		switch {
		case err != nil && status == 0:
			return nil, err
		case status == http.StatusNotFound || status == http.StatusMethodNotAllowed:
			why = append(why, fmt.Sprintf("HTTP %d", status))
		case err != nil:
			why = append(why, fmt.Sprintf("{%q}: %v", field, err))
		case len(toks) == 0:
			why = append(why, fmt.Sprintf("{%q} answered no tokens", field))
		default:
			c.TokenizeField = field
		}
		if c.TokenizeField != "" || status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			break
		}
	}
	if c.TokenizeField == "" {
		c.Missing[CapTokenize] = strings.Join(why, "; ")
		c.Missing[CapTokenizeChat] = "no /tokenize"
	} else {
		toks, rendered, _, err := a.tokenizeRaw(ctx, map[string]any{"model": a.Model,
			"messages": []map[string]any{{"role": "user", "content": probeText}}, "add_generation_prompt": true})
		plain, _, _, _ := a.tokenizeRaw(ctx, map[string]any{"model": a.Model, c.TokenizeField: probeText})
		switch {
		case err != nil:
			c.Missing[CapTokenizeChat] = err.Error()
		case len(toks) == 0:
			c.Missing[CapTokenizeChat] = `{"messages"} answered no tokens (the route reads raw text only)`
		case len(toks) <= len(plain):
			c.Missing[CapTokenizeChat] = fmt.Sprintf(`{"messages"} answered %d tokens, no more than the bare text's %d: no chat template was applied`, len(toks), len(plain))
		default:
			c.TokenizeChat, c.TokenizeRendered = true, rendered != ""
		}
	}

	// /detokenize in either shape.
	if c.TokenizeField != "" {
		toks, _, _, _ := a.tokenizeRaw(ctx, map[string]any{"model": a.Model, c.TokenizeField: probeText})
		raw, status, err := a.postRaw(ctx, "/detokenize", map[string]any{"model": a.Model, "tokens": toks})
		var d map[string]any
		switch {
		case err != nil && status == 0:
			return nil, err
		case err != nil:
			c.Missing[CapDetokenize] = err.Error()
		case json.Unmarshal(raw, &d) != nil:
			c.Missing[CapDetokenize] = "answer is not a JSON object"
		default:
			for _, f := range []string{"prompt", "content"} {
				if s, ok := d[f].(string); ok && strings.Contains(s, "world") {
					c.DetokenizeField = f
				}
			}
			if c.DetokenizeField == "" {
				c.Missing[CapDetokenize] = fmt.Sprintf("answer %s holds no text in prompt or content", clip(string(raw), 80))
			}
		}
	} else {
		c.Missing[CapDetokenize] = "not probed without /tokenize"
	}

	// logprobs with top-k alternatives on /v1/completions.
	ans, err := a.Complete(ctx, "/v1/completions", map[string]any{"prompt": probeText, "max_tokens": 2, "temperature": 0, "logprobs": 5})
	switch {
	case err != nil && StatusOf(err) == 0:
		return nil, err
	case err != nil:
		c.Missing[CapLogprobs] = fmt.Sprintf("a request with logprobs 5 was refused: %v", err)
	case len(ans.Logprobs) == 0:
		c.Missing[CapLogprobs] = "a request with logprobs 5 was answered without logprobs"
	default:
		c.Logprobs, c.LogprobsTopK = true, len(ans.Logprobs[0].Top)
	}

	// vLLM's prompt_logprobs.
	raw, status, err := a.postRaw(ctx, "/v1/completions", map[string]any{"model": a.Model, "prompt": probeText, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1})
	var pl struct {
		Choices []struct {
			PromptLogprobs []json.RawMessage `json:"prompt_logprobs"`
		} `json:"choices"`
		PromptLogprobs []json.RawMessage `json:"prompt_logprobs"`
	}
	switch {
	case err != nil && status == 0:
		return nil, err
	case err != nil:
		c.Missing[CapPromptLogprobs] = fmt.Sprintf("refused: %v", err)
	case json.Unmarshal(raw, &pl) != nil:
		c.Missing[CapPromptLogprobs] = "answer is not JSON"
	case len(pl.PromptLogprobs) > 0 || len(pl.Choices) > 0 && len(pl.Choices[0].PromptLogprobs) > 0:
		c.PromptLogprobs = true
	default:
		c.Missing[CapPromptLogprobs] = "accepted but answered no prompt_logprobs (ignored)"
	}
	return c, nil
}

// postRaw posts body to route and returns the raw 2xx body; a non-2xx answer is an *APIError
// with its status, a transport error has status 0.
func (a *API) postRaw(ctx context.Context, route string, body any) ([]byte, int, error) {
	resp, err := a.do(ctx, http.MethodPost, route, body)
	if err != nil {
		return nil, StatusOf(err), err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, 0, fmt.Errorf("POST %s: read response: %w", route, err)
	}
	return raw, resp.StatusCode, nil
}

// tokenizeRaw posts body to /tokenize and reads the ids in either shape ({"tokens": [ids]}, or
// llama.cpp's with_pieces [{"id", "piece"}]) and qual-server's rendered prompt. A 2xx answer
// whose tokens are not ids is an error naming what came.
func (a *API) tokenizeRaw(ctx context.Context, body map[string]any) (ids []int32, rendered string, status int, err error) {
	raw, status, err := a.postRaw(ctx, "/tokenize", body)
	if err != nil {
		return nil, "", status, err
	}
	var t struct {
		Tokens   []json.RawMessage `json:"tokens"`
		Rendered string            `json:"rendered"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, "", status, fmt.Errorf("POST /tokenize: answer %s is not {\"tokens\": [...]}", clip(string(raw), 80))
	}
	for _, r := range t.Tokens {
		var id int32
		if json.Unmarshal(r, &id) != nil {
			var piece struct {
				ID *int32 `json:"id"`
			}
			if json.Unmarshal(r, &piece) != nil || piece.ID == nil {
				return nil, "", status, fmt.Errorf("POST /tokenize: token %s is not an id", clip(string(r), 40))
			}
			id = *piece.ID
		}
		ids = append(ids, id)
	}
	return ids, t.Rendered, status, nil
}

// missingList is the capabilities a gate lacks, in a stable order, for a skip reason.
func (c *Capabilities) missingList(names ...string) string {
	var out []string
	for _, n := range names {
		if r, ok := c.Missing[n]; ok {
			out = append(out, n+" ("+r+")")
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
