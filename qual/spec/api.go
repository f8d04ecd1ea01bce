package spec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
)

// API is the gates' correctness client for a served model: plain encoding/json, every field of
// a response decoded, because a gate must see what the server said, not measure it (qual/client
// is the measuring client). It speaks the OpenAI routes and modelqual's extension routes
// (/tokenize, /mq/v1/logits, /mq/v1/bundle).
type API struct {
	BaseURL string // server root, without /v1
	Model   string
	APIKey  string
	HTTP    *http.Client

	// What the server offers, probed once (Capabilities); tokenizeField is the /tokenize
	// body field it reads ("prompt" until a probe found llama.cpp's "content").
	capMu         sync.Mutex
	caps          *Capabilities
	tokenizeField string

	// TextPrompt, when set (TextPrompt(tokenizer)), turns a token-id prompt into the text a
	// server that refuses token-array prompts reads instead; tp* hold that probe's answer.
	TextPrompt func(ids []int32) string
	tpMu       sync.Mutex
	tpProbed   bool
	tpOK       bool
	tpWhy      string
}

// NewAPI returns an API with a client whose timeout is requestTimeout (0: 2 minutes).
func NewAPI(baseURL, model, apiKey string, requestTimeout time.Duration) *API {
	if requestTimeout <= 0 {
		requestTimeout = 2 * time.Minute
	}
	return &API{BaseURL: strings.TrimRight(baseURL, "/"), Model: model, APIKey: apiKey,
		HTTP: &http.Client{Timeout: requestTimeout}}
}

// APIError is a non-2xx answer: the status and the OpenAI error body.
type APIError struct {
	Route   string
	Status  int
	Type    string
	Param   string
	Code    any
	Message string
	Body    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s: %s", e.Route, e.Status, e.Type, e.Message)
}

// StatusOf returns the HTTP status of an *APIError, 200 for nil, and 0 for other errors.
func StatusOf(err error) int {
	var ae *APIError
	switch {
	case err == nil:
		return 200
	case errors.As(err, &ae):
		return ae.Status
	}
	return 0
}

func (a *API) do(ctx context.Context, method, route string, body any) (*http.Response, error) {
	return a.doHeader(ctx, method, route, body, nil)
}

// doHeader is do with extra request headers (such as X-Request-Id).
func (a *API) doHeader(ctx context.Context, method, route string, body any, hdr http.Header) (*http.Response, error) {
	body = a.asTextPrompt(ctx, route, body)
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s: encode request: %w", route, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.BaseURL+route, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", route, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.APIKey)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, route, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		ae := &APIError{Route: method + " " + route, Status: resp.StatusCode, Body: string(raw)}
		var eb struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   string `json:"param"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &eb) == nil {
			ae.Message, ae.Type, ae.Param, ae.Code = eb.Error.Message, eb.Error.Type, eb.Error.Param, eb.Error.Code
		}
		if ae.Message == "" {
			ae.Message = strings.TrimSpace(string(raw))
		}
		return nil, ae
	}
	return resp, nil
}

func (a *API) getJSON(ctx context.Context, method, route string, body, out any) error {
	resp, err := a.do(ctx, method, route, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, route, err)
	}
	return nil
}

// BundleInfo is GET /mq/v1/bundle: the served bundle's header (with provenance) and hash.
type BundleInfo struct {
	Header       bundle.Header `json:"header"`
	BundleDigest string        `json:"bundle_digest"`
	BundlePath   string        `json:"bundle_path"`
}

// Bundle asks the server which bundle it serves.
func (a *API) Bundle(ctx context.Context) (*BundleInfo, error) {
	var b BundleInfo
	if err := a.getJSON(ctx, http.MethodGet, "/mq/v1/bundle", nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// Logits is POST /mq/v1/logits: the engine's full-vocabulary logits at every position of ids,
// row-major (positions × vocab). The answer is large (a 300-token prompt over Qwen3's 151,936
// tokens is 180 MB of float32, base64 encoded), so the data string is cut out of the body and
// base64-decoded directly instead of going through encoding/json.
func (a *API) Logits(ctx context.Context, ids []int32) (data []float32, vocab int, err error) {
	data, vocab, _, err = a.logits(ctx, map[string]any{"model": a.Model, "prompt_token_ids": ids}, len(ids))
	return data, vocab, err
}

// LogitsChat is POST /mq/v1/logits with chat messages that the server renders with its template
// (a vision model's messages may hold the one image, which the server processes as its chat
// route does): the logits at every position of the prompt the engine ran, and their count.
func (a *API) LogitsChat(ctx context.Context, messages []any) (data []float32, vocab, positions int, err error) {
	return a.logits(ctx, map[string]any{"model": a.Model, "messages": messages}, -1)
}

// logits posts req to /mq/v1/logits and decodes the answer; want is the expected number of
// positions (-1: any).
func (a *API) logits(ctx context.Context, req map[string]any, want int) (data []float32, vocab, positions int, err error) {
	const route = "/mq/v1/logits"
	resp, err := a.do(ctx, http.MethodPost, route, req)
	if err != nil {
		return nil, 0, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("POST %s: read response: %w", route, err)
	}
	var raw []byte
	if i := bytes.Index(body, []byte(`"data":"`)); i >= 0 {
		j := bytes.IndexByte(body[i+8:], '"')
		if j < 0 {
			return nil, 0, 0, fmt.Errorf("POST %s: unterminated data string", route)
		}
		raw = body[i+8 : i+8+j]
		body = append(body[:i:i], append([]byte(`"data":""`), body[i+8+j+1:]...)...)
	}
	var r struct {
		Object    string `json:"object"`
		VocabSize int    `json:"vocab_size"`
		Positions int    `json:"positions"`
		DType     string `json:"dtype"`
		Encoding  string `json:"encoding"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, 0, 0, fmt.Errorf("POST %s: decode response: %w", route, err)
	}
	bin := make([]byte, base64.StdEncoding.DecodedLen(len(raw)))
	n, err := base64.StdEncoding.Decode(bin, raw)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("POST %s: data is not base64: %w", route, err)
	}
	bin = bin[:n]
	switch {
	case r.DType != "float32" || r.Encoding != "base64":
		return nil, 0, 0, fmt.Errorf("POST %s: dtype %q encoding %q; want float32 base64", route, r.DType, r.Encoding)
	case want >= 0 && r.Positions != want:
		return nil, 0, 0, fmt.Errorf("POST %s: %d positions for %d ids", route, r.Positions, want)
	case r.VocabSize <= 0 || len(bin) != 4*r.Positions*r.VocabSize:
		return nil, 0, 0, fmt.Errorf("POST %s: %d data bytes for %d positions × vocab %d", route, len(bin), r.Positions, r.VocabSize)
	}
	out := make([]float32, r.Positions*r.VocabSize)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(bin[4*i:]))
	}
	return out, r.VocabSize, r.Positions, nil
}

// Tokenized is POST /tokenize's answer.
type Tokenized struct {
	Tokens      []int32 `json:"tokens"`
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Rendered    string  `json:"rendered"`
}

// TokenizeChat renders and tokenizes a conversation with the served checkpoint's template.
func (a *API) TokenizeChat(ctx context.Context, p Prompt) (*Tokenized, error) {
	body := map[string]any{"model": a.Model, "messages": p.Messages, "add_generation_prompt": p.AddGenerationPrompt}
	if p.ChatTemplateKwargs != nil {
		body["chat_template_kwargs"] = p.ChatTemplateKwargs
	}
	var t Tokenized
	if err := a.getJSON(ctx, http.MethodPost, "/tokenize", body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Tokenize tokenizes a raw prompt with the served tokenizer, in the body shape the probe found
// (vLLM's and qual-server's {"prompt"}, llama.cpp's {"content"}).
func (a *API) Tokenize(ctx context.Context, text string) (*Tokenized, error) {
	field := a.tokenizeField
	if field == "" {
		field = "prompt"
	}
	var t Tokenized
	if err := a.getJSON(ctx, http.MethodPost, "/tokenize", map[string]any{"model": a.Model, field: text}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Answer is one completion or chat answer, streamed or not.
type Answer struct {
	Text             string
	Deltas           []string // streamed content deltas in order (nil when not streamed)
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
	HasUsage         bool
	SawDone          bool // the stream ended with data: [DONE]
	// Logprobs are the answer's per-token logprobs (a stream's concatenated over its chunks),
	// read from either OpenAI shape; nil when the server sent none (logprobs null).
	Logprobs []TokenLogprob
	// ID is the response's id (a stream's first event's); RequestID is the X-Request-Id the
	// server answered with.
	ID, RequestID string
}

// TokenLogprob is one output token's logprob as an OpenAI answer gives it: its text, its
// log-probability and its alternatives (most likely first).
type TokenLogprob struct {
	Token   string
	Logprob float64
	Top     []TopLogprob
	ID      int32 // the token id where the answer carries it (gRPC's TokenInfo), else 0
}

// TopLogprob is one alternative of a token.
type TopLogprob struct {
	Token   string
	Logprob float64
	ID      int32 // as TokenLogprob.ID
}

// parseLogprobs reads choices[].logprobs in /v1/completions' shape ({tokens, token_logprobs,
// top_logprobs: [{token: logprob}], text_offset}) or chat's ({content: [{token, logprob,
// bytes, top_logprobs: [{token, logprob, bytes}]}]}); null gives nil.
func parseLogprobs(raw json.RawMessage) ([]TokenLogprob, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var v struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []*float64           `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		Content       *[]struct {
			Token       string       `json:"token"`
			Logprob     float64      `json:"logprob"`
			TopLogprobs []TopLogprob `json:"top_logprobs"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("logprobs: %w", err)
	}
	out := []TokenLogprob{}
	if v.Content != nil {
		for _, c := range *v.Content {
			out = append(out, TokenLogprob{Token: c.Token, Logprob: c.Logprob, Top: c.TopLogprobs})
		}
		return out, nil
	}
	if len(v.TokenLogprobs) != len(v.Tokens) || (v.TopLogprobs != nil && len(v.TopLogprobs) != len(v.Tokens)) {
		return nil, fmt.Errorf("logprobs: %d tokens, %d token_logprobs, %d top_logprobs", len(v.Tokens), len(v.TokenLogprobs), len(v.TopLogprobs))
	}
	for i, t := range v.Tokens {
		tl := TokenLogprob{Token: t, Logprob: math.NaN()}
		if v.TokenLogprobs[i] != nil {
			tl.Logprob = *v.TokenLogprobs[i]
		}
		if v.TopLogprobs != nil {
			for tok, x := range v.TopLogprobs[i] {
				tl.Top = append(tl.Top, TopLogprob{Token: tok, Logprob: x})
			}
			sort.Slice(tl.Top, func(a, b int) bool {
				if tl.Top[a].Logprob != tl.Top[b].Logprob {
					return tl.Top[a].Logprob > tl.Top[b].Logprob
				}
				return tl.Top[a].Token < tl.Top[b].Token
			})
		}
		out = append(out, tl)
	}
	return out, nil
}

type choice struct {
	Text    string `json:"text"`
	Message *struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	} `json:"message"`
	Delta *struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	} `json:"delta"`
	FinishReason *string         `json:"finish_reason"`
	Logprobs     json.RawMessage `json:"logprobs"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type completionBody struct {
	ID      string   `json:"id"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage"`
}

// Complete posts body to route ("/v1/completions" or "/v1/chat/completions"), adding the
// model, and returns the answer. With body["stream"] true it reads the SSE stream.
func (a *API) Complete(ctx context.Context, route string, body map[string]any) (*Answer, error) {
	return a.CompleteID(ctx, route, "", body)
}

// CompleteID is Complete with the request's X-Request-Id set to id (none when empty), so a
// gate can find the request's server record.
func (a *API) CompleteID(ctx context.Context, route, id string, body map[string]any) (*Answer, error) {
	b := map[string]any{"model": a.Model}
	for k, v := range body {
		b[k] = v
	}
	var hdr http.Header
	if id != "" {
		hdr = http.Header{"X-Request-Id": {id}}
	}
	resp, err := a.doHeader(ctx, http.MethodPost, route, b, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	ans := &Answer{RequestID: resp.Header.Get("X-Request-Id")}
	if s, _ := b["stream"].(bool); !s {
		var cb completionBody
		if err := json.NewDecoder(resp.Body).Decode(&cb); err != nil {
			return nil, fmt.Errorf("POST %s: decode response: %w", route, err)
		}
		if len(cb.Choices) != 1 {
			return nil, fmt.Errorf("POST %s: %d choices, want 1", route, len(cb.Choices))
		}
		ans.Text, ans.ID = cb.Choices[0].content(), cb.ID
		if cb.Choices[0].FinishReason != nil {
			ans.FinishReason = *cb.Choices[0].FinishReason
		}
		lp, err := parseLogprobs(cb.Choices[0].Logprobs)
		if err != nil {
			return nil, fmt.Errorf("POST %s: %w", route, err)
		}
		ans.Logprobs = lp
		ans.setUsage(cb.Usage)
		return ans, nil
	}
	ans.Deltas = []string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var text strings.Builder
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			ans.SawDone = true
			break
		}
		var ev struct {
			completionBody
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return ans, fmt.Errorf("POST %s: stream event %q: %w", route, data, err)
		}
		if ev.Error != nil {
			return ans, fmt.Errorf("POST %s: error event in stream: %s: %s", route, ev.Error.Type, ev.Error.Message)
		}
		if ans.ID == "" {
			ans.ID = ev.ID
		}
		for _, c := range ev.Choices {
			if d := c.content(); d != "" {
				ans.Deltas = append(ans.Deltas, d)
				text.WriteString(d)
			}
			if c.FinishReason != nil && *c.FinishReason != "" {
				ans.FinishReason = *c.FinishReason
			}
			lp, err := parseLogprobs(c.Logprobs)
			if err != nil {
				return ans, fmt.Errorf("POST %s: stream event: %w", route, err)
			}
			if lp != nil {
				ans.Logprobs = append(ans.Logprobs, lp...)
				if ans.Logprobs == nil {
					ans.Logprobs = []TokenLogprob{}
				}
			}
		}
		ans.setUsage(ev.Usage)
	}
	if err := sc.Err(); err != nil {
		return ans, fmt.Errorf("POST %s: read stream: %w", route, err)
	}
	ans.Text = text.String()
	return ans, nil
}

func (a *Answer) setUsage(u *usage) {
	if u != nil {
		a.HasUsage = true
		a.PromptTokens, a.CompletionTokens = u.PromptTokens, u.CompletionTokens
	}
}

// content is a choice's text: completions' text, or chat's reasoning then content.
func (c choice) content() string {
	var s string
	s += c.Text
	for _, m := range []*struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	}{c.Message, c.Delta} {
		if m == nil {
			continue
		}
		if m.ReasoningContent != nil {
			s += *m.ReasoningContent
		}
		if m.Content != nil {
			s += *m.Content
		}
	}
	return s
}

// HasRoute reports whether the server serves route: false when it answers 404 (or 405, a
// route it knows for another method only) to a minimal request, true for any other answer.
// Gates that need qual-server's own routes ask first, so another OpenAI-compatible server
// gets "not applicable" instead of a failure.
func (a *API) HasRoute(ctx context.Context, method, route string) (bool, error) {
	var body any
	if method == http.MethodPost {
		body = map[string]any{"model": a.Model, "prompt_token_ids": []int32{1}, "prompt": "a"}
	}
	resp, err := a.do(ctx, method, route, body)
	switch {
	case err == nil:
		resp.Body.Close()
		return true, nil
	case StatusOf(err) == http.StatusNotFound || StatusOf(err) == http.StatusMethodNotAllowed:
		var ae *APIError
		if errors.As(err, &ae) && (ae.Param == "model" || ae.Code == "model_not_found") {
			return true, nil // the route exists; it does not know the model
		}
		return false, nil
	case StatusOf(err) != 0:
		return true, nil // the route exists and refused this probe
	}
	return false, err
}
