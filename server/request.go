package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"
)

// APIError is an error answered with OpenAI's error body
// {"error":{"message","type","param","code"}}. Message names the offending field and says
// what to send instead; Param is the field's JSON path.
type APIError struct {
	Status  int
	Message string
	Type    string // invalid_request_error, not_found_error, rate_limit_error, server_error, ...
	Param   string // "" → null
	Code    string // "" → null
}

func (e *APIError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// body renders the error body; built by hand so that a null param or code reads as null.
func (e *APIError) body() []byte {
	b := make([]byte, 0, 128+len(e.Message))
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, e.Message)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"param":`...)
	b = appendNullableString(b, e.Param)
	b = append(b, `,"code":`...)
	b = appendNullableString(b, e.Code)
	b = append(b, "}}"...)
	return b
}

func appendNullableString(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendJSONString(b, s)
}

// Message is one chat message as the tokenizer's template expects it.
type Message = map[string]any

// GenRequest is a decoded, validated /v1/completions or /v1/chat/completions body. Fields
// that need the bundle (vocabulary, context) are checked later by the server.
type GenRequest struct {
	Chat                bool
	Model               string
	Prompt              string  // completions with a text prompt
	PromptIDs           []int32 // completions with a token-id prompt
	HasPromptIDs        bool
	Messages            []Message
	Images              []*ImagePart // a chat request's images in message order (chat_image.go)
	ChatTemplateKwargs  map[string]any
	AddGenerationPrompt bool
	MaxTokens           int // 0: not set
	Temperature         float64
	TopP                float64
	TopK                int
	Seed                uint64
	HasSeed             bool
	Stop                []string
	IgnoreEOS           bool
	Stream              bool
	IncludeUsage        bool
	// Logprobs: every output token's log-probability (completions `logprobs` set, chat
	// `logprobs: true`) with TopLogprobs alternatives (completions `logprobs` N, chat
	// `top_logprobs` N; 0..MaxTopLogprobs).
	Logprobs    bool
	TopLogprobs int
	// TokensAsIDs (vLLM's return_tokens_as_token_ids): logprobs name every token and
	// alternative "token_id:<id>" instead of its text, so two ids of one text (byte-fallback
	// pieces, which each read U+FFFD alone) stay apart; `bytes` and text_offset keep the text's.
	TokensAsIDs bool
	// IncludeStopStr keeps a matched stop string at the end of the output (vLLM's
	// include_stop_str_in_output; OpenAI drops it).
	IncludeStopStr bool
	// N is the number of choices (OpenAI's n, 1..MaxChoices): each its own sampled sequence.
	N int
	// Logits processors: OpenAI's presence and frequency penalties (-2..2, over generated
	// tokens), transformers' repetition penalty (> 0, 1 = off, over prompt + generated ids),
	// min_p (0..1, 0 = off) and vLLM's min_tokens (EOS suppressed until that many tokens).
	PresencePenalty   float64
	FrequencyPenalty  float64
	RepetitionPenalty float64
	MinP              float64
	MinTokens         int
	// Timings asks for llama.cpp's "timings" object in the response (its timings_per_token).
	Timings bool
}

// MaxChoices bounds n (OpenAI's limit): every choice holds an engine slot while it runs.
const MaxChoices = 128

// neutral reports whether the raw value of an unsupported control asks for nothing (null,
// false, 0, 1 for n/best_of, an empty list or object), so clients that send defaults work.
type neutralFunc func(raw json.RawMessage) bool

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

func neutralValues(vals ...string) neutralFunc {
	return func(raw json.RawMessage) bool {
		s := string(bytes.TrimSpace(raw))
		if s == "null" {
			return true
		}
		for _, v := range vals {
			if s == v {
				return true
			}
		}
		// Compare numbers by value (1.0 == 1).
		var f float64
		if json.Unmarshal(raw, &f) == nil {
			for _, v := range vals {
				var g float64
				if json.Unmarshal([]byte(v), &g) == nil && f == g {
					return true
				}
			}
		}
		return false
	}
}

func emptyContainer(raw json.RawMessage) bool {
	s := string(bytes.Join(bytes.Fields(raw), nil))
	return s == "null" || s == "[]" || s == "{}"
}

// Controls of the OpenAI API that qual-server does not implement yet. A request that sets one
// to anything but its neutral value is refused by name rather than silently ignored.
var (
	unsupportedCommon = map[string]neutralFunc{
		"logit_bias": emptyContainer,
		"user":       func(json.RawMessage) bool { return true }, // metadata only
	}
	// Vendor fields that clients of llama.cpp, vLLM and OpenAI send by habit and that change
	// nothing qual-server answers or measures: accepted with any value and ignored (README
	// "Vendor fields"). A field that would change the output is not on this list.
	ignoredVendor = map[string]string{
		"cache_prompt":      "llama.cpp: reuse the KV cache of a previous prompt (a cache policy; same tokens out)",
		"id_slot":           "llama.cpp: which server slot runs the request (placement only)",
		"cache_salt":        "vLLM: isolates prefix-cache entries between tenants (a cache policy)",
		"priority":          "vLLM: scheduling order under the priority policy (when, not what)",
		"prompt_cache_key":  "OpenAI: routing hint for prompt caching",
		"safety_identifier": "OpenAI: an end-user id for abuse monitoring (metadata, like user)",
	}
	unsupportedCompletion = map[string]neutralFunc{
		"best_of": neutralValues("1"),
		"echo":    neutralValues("false"),
		"suffix":  neutralValues(`""`),
	}
	unsupportedChat = map[string]neutralFunc{
		"tools":               emptyContainer,
		"tool_choice":         neutralValues(`"none"`, `"auto"`),
		"functions":           emptyContainer,
		"function_call":       neutralValues(`"none"`, `"auto"`),
		"parallel_tool_calls": func(json.RawMessage) bool { return true },
		"response_format":     neutralValues(`{"type":"text"}`),
		"modalities":          neutralValues(`["text"]`),
		"audio":               isNull,
		"prediction":          isNull,
		"reasoning_effort":    isNull,
		"web_search_options":  isNull,
		"store":               neutralValues("false"),
		"metadata":            emptyContainer,
		"service_tier":        neutralValues(`"auto"`, `"default"`),
	}
)

// MaxStopStrings bounds the stop list (OpenAI allows 4; a few more cost nothing).
const MaxStopStrings = 16

// ChatLimits bound what a chat request may ask the chat template to render: rendering costs
// memory and time in proportion to the messages, before the context check can refuse them.
// Zero: no limit.
type ChatLimits struct {
	MaxMessages     int // --max-messages
	MaxContentBytes int // --max-chat-bytes: all messages' content together
	MaxImages       int // --max-images-per-request (0: 1)
}

// reservedTemplateVars are the chat template's variables that chat_template_kwargs must not
// replace: the request's own messages and controls, and inputs qual-server does not take.
var reservedTemplateVars = []string{"messages", "add_generation_prompt", "tools", "documents"}

// DecodeRequest parses and validates a generation request body. It never panics; every error
// is an *APIError naming the field.
func DecodeRequest(body []byte, chat bool) (*GenRequest, *APIError) {
	return DecodeRequestLimited(body, chat, ChatLimits{})
}

// DecodeRequestLimited is DecodeRequest with limits on chat messages.
func DecodeRequestLimited(body []byte, chat bool, lim ChatLimits) (*GenRequest, *APIError) {
	if !utf8.Valid(body) {
		return nil, badRequest("", "request body is not valid UTF-8; send UTF-8 encoded JSON")
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, badRequest("", "request body is empty; send a JSON object")
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, badRequest("", "request body is not valid JSON")
		}
		return nil, badRequest("", "request body must be a JSON object, not %s", jsonKind(trimmed))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return nil, badRequest("", "request body is not valid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	r := &GenRequest{Chat: chat, Temperature: 1, TopP: 1, AddGenerationPrompt: true, N: 1, RepetitionPenalty: 1}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic: the first bad field in name order is reported
	var havePrompt, haveTop bool
	var maxCompletion int
	for _, k := range keys {
		raw := fields[k]
		var err *APIError
		switch k {
		case "model":
			r.Model, err = str(raw, k)
		case "prompt":
			if chat {
				err = badRequest(k, "`prompt` is a /v1/completions field; /v1/chat/completions takes `messages`")
				break
			}
			havePrompt = !isNull(raw)
			err = r.decodePrompt(raw)
		case "messages":
			if !chat {
				err = badRequest(k, "`messages` is a /v1/chat/completions field; /v1/completions takes `prompt`")
				break
			}
			havePrompt = !isNull(raw)
			r.Messages, r.Images, err = decodeMessages(raw, lim)
		case "max_tokens":
			r.MaxTokens, err = positiveInt(raw, k)
		case "max_completion_tokens":
			if !chat {
				err = badRequest(k, "`max_completion_tokens` is a /v1/chat/completions field; use `max_tokens`")
				break
			}
			maxCompletion, err = positiveInt(raw, k)
		case "temperature":
			if r.Temperature, err = number(raw, k, 1); err == nil && (r.Temperature < 0 || r.Temperature > 2) {
				err = badRequest(k, "`temperature` must be between 0 and 2, got %v", r.Temperature)
			}
		case "top_p":
			if r.TopP, err = number(raw, k, 1); err == nil && (r.TopP <= 0 || r.TopP > 1) {
				err = badRequest(k, "`top_p` must be in (0, 1], got %v", r.TopP)
			}
		case "top_k":
			var f float64
			if f, err = number(raw, k, 0); err == nil {
				if f != math.Trunc(f) || f < -1 || f > math.MaxInt32 {
					err = badRequest(k, "`top_k` must be an integer >= -1 (-1 or 0: off), got %v", f)
				} else if f > 0 {
					r.TopK = int(f)
				}
			}
		case "n":
			var f float64
			if f, err = number(raw, k, 1); err == nil && (f != math.Trunc(f) || f < 1 || f > MaxChoices) {
				err = badRequest(k, "`n` must be an integer from 1 to %d, got %v", MaxChoices, f)
			} else if err == nil {
				r.N = int(f)
			}
		case "presence_penalty", "frequency_penalty":
			var f float64
			if f, err = number(raw, k, 0); err == nil && (f < -2 || f > 2) {
				err = badRequest(k, "`%s` must be between -2 and 2, got %v", k, f)
			} else if k == "presence_penalty" {
				r.PresencePenalty = f
			} else {
				r.FrequencyPenalty = f
			}
		case "repetition_penalty":
			if r.RepetitionPenalty, err = number(raw, k, 1); err == nil && !(r.RepetitionPenalty > 0 && r.RepetitionPenalty <= 100) {
				err = badRequest(k, "`repetition_penalty` must be greater than 0 (1: off) and at most 100, got %v", r.RepetitionPenalty)
			}
		case "min_p":
			if r.MinP, err = number(raw, k, 0); err == nil && (r.MinP < 0 || r.MinP > 1) {
				err = badRequest(k, "`min_p` must be between 0 and 1 (0: off), got %v", r.MinP)
			}
		case "min_tokens":
			var f float64
			if f, err = number(raw, k, 0); err == nil && (f != math.Trunc(f) || f < 0 || f > math.MaxInt32) {
				err = badRequest(k, "`min_tokens` must be an integer >= 0, got %v", f)
			} else if err == nil {
				r.MinTokens = int(f)
			}
		case "timings_per_token":
			r.Timings, err = boolean(raw, k)
		case "seed":
			if !isNull(raw) {
				var s int64
				if e := json.Unmarshal(raw, &s); e != nil {
					err = badRequest(k, "`seed` must be an integer")
				} else {
					r.Seed, r.HasSeed = uint64(s), true
				}
			}
		case "stop":
			r.Stop, err = decodeStop(raw)
		case "ignore_eos":
			r.IgnoreEOS, err = boolean(raw, k)
		case "return_tokens_as_token_ids":
			r.TokensAsIDs, err = boolean(raw, k)
		case "include_stop_str_in_output":
			r.IncludeStopStr, err = boolean(raw, k)
		case "logprobs":
			if chat {
				r.Logprobs, err = boolean(raw, k)
				break
			}
			if !isNull(raw) {
				r.Logprobs = true
				if r.TopLogprobs, err = topCount(raw, k); err != nil {
					err.Message += "; on /v1/completions `logprobs` is the number of alternatives per token (chat takes `logprobs: true` and `top_logprobs`)"
				}
			}
		case "top_logprobs":
			if !chat {
				err = badRequest(k, "`top_logprobs` is a /v1/chat/completions field; /v1/completions takes `logprobs` as the number of alternatives")
				break
			}
			if !isNull(raw) {
				haveTop = true
				r.TopLogprobs, err = topCount(raw, k)
			}
		case "stream":
			r.Stream, err = boolean(raw, k)
		case "stream_options":
			err = r.decodeStreamOptions(raw)
		case "chat_template_kwargs":
			if !chat {
				err = badRequest(k, "`chat_template_kwargs` is a /v1/chat/completions field")
				break
			}
			if !isNull(raw) {
				if e := json.Unmarshal(raw, &r.ChatTemplateKwargs); e != nil {
					err = badRequest(k, "`chat_template_kwargs` must be an object, e.g. {\"enable_thinking\": false}")
					break
				}
				for _, v := range reservedTemplateVars {
					if _, ok := r.ChatTemplateKwargs[v]; ok {
						err = badRequest(k+"."+v, "`chat_template_kwargs.%s` would replace the template's own `%s`; send it as the request's own field (or not at all)", v, v)
						break
					}
				}
			}
		case "add_generation_prompt":
			if !chat {
				err = badRequest(k, "`add_generation_prompt` is a /v1/chat/completions field")
				break
			}
			if !isNull(raw) {
				r.AddGenerationPrompt, err = boolean(raw, k)
			}
		default:
			if _, ok := ignoredVendor[k]; ok {
				if !json.Valid(raw) {
					err = badRequest(k, "`%s` is not valid JSON", k)
				}
				break
			}
			neutral, known := unsupportedCommon[k]
			if !known {
				if chat {
					neutral, known = unsupportedChat[k]
				} else {
					neutral, known = unsupportedCompletion[k]
				}
			}
			switch {
			case !known:
				err = badRequest(k, "unknown field `%s`; qual-server does not silently ignore fields it does not implement", k)
			case !json.Valid(raw):
				err = badRequest(k, "`%s` is not valid JSON", k)
			case !neutral(raw):
				err = badRequest(k, "`%s` is not supported by qual-server yet; remove it or send its default", k)
				err.Code = "unsupported_parameter"
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if !havePrompt {
		if chat {
			return nil, badRequest("messages", "`messages` is required: a non-empty list of {\"role\", \"content\"}")
		}
		return nil, badRequest("prompt", "`prompt` is required: a string or a list of token ids")
	}
	if maxCompletion > 0 {
		r.MaxTokens = maxCompletion
	}
	if r.MaxTokens > 0 && r.MinTokens > r.MaxTokens {
		return nil, badRequest("min_tokens", "`min_tokens` (%d) must not exceed `max_tokens` (%d)", r.MinTokens, r.MaxTokens)
	}
	if haveTop && !r.Logprobs {
		return nil, badRequest("top_logprobs", "`top_logprobs` needs `logprobs: true`; set it or remove `top_logprobs`")
	}
	if r.IncludeUsage && !r.Stream {
		return nil, badRequest("stream_options", "`stream_options` is only allowed with `stream: true`")
	}
	return r, nil
}

func jsonKind(b []byte) string {
	switch b[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

func str(raw json.RawMessage, k string) (string, *APIError) {
	var s string
	if isNull(raw) {
		return "", nil
	}
	if json.Unmarshal(raw, &s) != nil {
		return "", badRequest(k, "`%s` must be a string", k)
	}
	return s, nil
}

func boolean(raw json.RawMessage, k string) (bool, *APIError) {
	var v bool
	if isNull(raw) {
		return false, nil
	}
	if json.Unmarshal(raw, &v) != nil {
		return false, badRequest(k, "`%s` must be true or false", k)
	}
	return v, nil
}

func number(raw json.RawMessage, k string, def float64) (float64, *APIError) {
	if isNull(raw) {
		return def, nil
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil {
		return 0, badRequest(k, "`%s` must be a number", k)
	}
	return f, nil
}

// topCount reads a number of logprobs alternatives: an integer 0..MaxTopLogprobs.
func topCount(raw json.RawMessage, k string) (int, *APIError) {
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f < 0 || f > MaxTopLogprobs {
		return 0, badRequest(k, "`%s` must be an integer from 0 to %d", k, MaxTopLogprobs)
	}
	return int(f), nil
}

func positiveInt(raw json.RawMessage, k string) (int, *APIError) {
	if isNull(raw) {
		return 0, nil
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil {
		return 0, badRequest(k, "`%s` must be a positive integer", k)
	}
	if f != math.Trunc(f) || f < 1 || f > math.MaxInt32 {
		return 0, badRequest(k, "`%s` must be a positive integer, got %v", k, f)
	}
	return int(f), nil
}

func (r *GenRequest) decodePrompt(raw json.RawMessage) *APIError {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) > 0 && t[0] == '"':
		if json.Unmarshal(t, &r.Prompt) != nil {
			return badRequest("prompt", "`prompt` must be a string or a list of token ids")
		}
		return nil
	case len(t) > 0 && t[0] == '[':
		var items []json.RawMessage
		if json.Unmarshal(t, &items) != nil {
			return badRequest("prompt", "`prompt` must be a string or a list of token ids")
		}
		if len(items) == 0 {
			return badRequest("prompt", "`prompt` is an empty list; send a string or a non-empty list of token ids")
		}
		first := bytes.TrimSpace(items[0])
		if len(items) == 1 && len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			// A batch of one prompt: ["text"] or [[ids]].
			return r.decodePrompt(first)
		}
		ids := make([]int32, len(items))
		for i, it := range items {
			var f float64
			if json.Unmarshal(it, &f) != nil || f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
				if len(items) > 1 && len(first) > 0 && (first[0] == '"' || first[0] == '[') {
					return badRequest("prompt", "`prompt` holds %d prompts; qual-server takes one prompt per request", len(items))
				}
				return badRequest(fmt.Sprintf("prompt[%d]", i), "`prompt[%d]` must be an integer token id", i)
			}
			ids[i] = int32(f)
		}
		r.PromptIDs, r.HasPromptIDs = ids, true
		return nil
	}
	return badRequest("prompt", "`prompt` must be a string or a list of token ids")
}

var allowedRoles = map[string]bool{"system": true, "user": true, "assistant": true, "developer": true}

func decodeMessages(raw json.RawMessage, lim ChatLimits) ([]Message, []*ImagePart, *APIError) {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, nil, badRequest("messages", "`messages` must be a list of {\"role\", \"content\"} objects")
	}
	if len(items) == 0 {
		return nil, nil, badRequest("messages", "`messages` is empty; send at least one message")
	}
	if lim.MaxMessages > 0 && len(items) > lim.MaxMessages {
		return nil, nil, badRequest("messages", "`messages` has %d messages; this server takes at most %d (--max-messages)", len(items), lim.MaxMessages)
	}
	contentBytes := 0
	msgs := make([]Message, len(items))
	var imgs []*ImagePart
	for i, it := range items {
		p := fmt.Sprintf("messages[%d]", i)
		var m map[string]json.RawMessage
		if t := bytes.TrimSpace(it); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &m) != nil {
			return nil, nil, badRequest(p, "`%s` must be an object with \"role\" and \"content\"", p)
		}
		roleRaw, ok := m["role"]
		if !ok {
			return nil, nil, badRequest(p+".role", "`%s.role` is missing; use one of system, user, assistant", p)
		}
		var role string
		if json.Unmarshal(roleRaw, &role) != nil {
			return nil, nil, badRequest(p+".role", "`%s.role` must be a string", p)
		}
		if !allowedRoles[role] {
			return nil, nil, badRequest(p+".role", "`%s.role` %q is not supported; use one of system, user, assistant", p, role)
		}
		contentRaw, ok := m["content"]
		if !ok {
			return nil, nil, badRequest(p+".content", "`%s.content` is missing", p)
		}
		var content any
		var str string
		if json.Unmarshal(contentRaw, &str) == nil {
			content = str
		} else {
			c, ims, aerr := decodeContentParts(p, role, contentRaw, len(imgs), lim.MaxImages)
			if aerr != nil {
				return nil, nil, aerr
			}
			content = c
			imgs = append(imgs, ims...)
		}
		if contentBytes += textBytes(content); lim.MaxContentBytes > 0 && contentBytes > lim.MaxContentBytes {
			return nil, nil, badRequest(p+".content", "the messages' content reaches %d bytes at `%s`; this server takes at most %d bytes in all (--max-chat-bytes)", contentBytes, p, lim.MaxContentBytes)
		}
		msg := Message{"role": role, "content": content}
		for k, v := range m {
			switch k {
			case "role", "content":
			case "name":
				var name string
				if json.Unmarshal(v, &name) != nil {
					return nil, nil, badRequest(p+".name", "`%s.name` must be a string", p)
				}
				msg["name"] = name
			default:
				return nil, nil, badRequest(p+"."+k, "`%s.%s` is not supported by qual-server yet", p, k)
			}
		}
		msgs[i] = msg
	}
	return msgs, imgs, nil
}

// textBytes is the text a message content holds: the string, or its text parts (an image is
// bounded by --max-body and the image checks, not by --max-chat-bytes).
func textBytes(content any) int {
	switch c := content.(type) {
	case string:
		return len(c)
	case []any:
		n := 0
		for _, p := range c {
			if m, ok := p.(map[string]any); ok {
				if t, ok := m["text"].(string); ok {
					n += len(t)
				}
			}
		}
		return n
	}
	return 0
}

func decodeStop(raw json.RawMessage) ([]string, *APIError) {
	t := bytes.TrimSpace(raw)
	if isNull(t) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(t, &one) == nil {
		if one == "" {
			return nil, badRequest("stop", "`stop` must not be an empty string")
		}
		return []string{one}, nil
	}
	var list []string
	if json.Unmarshal(t, &list) != nil {
		return nil, badRequest("stop", "`stop` must be a string or a list of strings")
	}
	if len(list) > MaxStopStrings {
		return nil, badRequest("stop", "`stop` has %d strings; at most %d are allowed", len(list), MaxStopStrings)
	}
	for i, s := range list {
		if s == "" {
			return nil, badRequest(fmt.Sprintf("stop[%d]", i), "`stop[%d]` must not be empty", i)
		}
	}
	return list, nil
}

func (r *GenRequest) decodeStreamOptions(raw json.RawMessage) *APIError {
	if isNull(raw) {
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return badRequest("stream_options", "`stream_options` must be an object like {\"include_usage\": true}")
	}
	for k, v := range m {
		switch k {
		case "include_usage":
			var err *APIError
			if r.IncludeUsage, err = boolean(v, "stream_options.include_usage"); err != nil {
				return err
			}
		case "include_obfuscation":
			// OpenAI pads deltas against side channels; qual-server never does, so either value
			// gets the same (unpadded) stream.
			if _, err := boolean(v, "stream_options.include_obfuscation"); err != nil {
				return err
			}
		case "continuous_usage_stats":
			if b, err := boolean(v, "stream_options.continuous_usage_stats"); err != nil || b {
				return badRequest("stream_options."+k, "`stream_options.continuous_usage_stats` is not supported by qual-server yet")
			}
		default:
			return badRequest("stream_options."+k, "unknown field `stream_options.%s`", k)
		}
	}
	return nil
}
