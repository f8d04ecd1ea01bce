package spec

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// StreamingInput is the input of StreamingParity and CheckStreaming.
type StreamingInput struct {
	// API reaches the served model.
	API *API
	// Corpus prompts are sent as text (raw prompts to /v1/completions, conversations to
	// /v1/chat/completions), so the server's own tokenizer and template are on the path.
	Corpus []Prompt
	// MaxTokens per answer (EOS ignored, so every answer has exactly this many tokens).
	MaxTokens int
	// OpenAIOnly: the server need not honour vendor extensions (ignore_eos); both answers
	// may then end at EOS, with equal counts.
	OpenAIOnly bool
}

// CheckStreaming is StreamingParity's core: at temperature 0, for every corpus prompt, the
// streamed content deltas concatenate exactly to the non-streaming answer; the stream ends with
// a finish_reason and data: [DONE]; both answers report the same finish reason and the same
// completion token count (MaxTokens).
func CheckStreaming(ctx context.Context, in StreamingInput) error {
	const fn = "spec.CheckStreaming"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: StreamingInput.API is nil", fn)
	case len(in.Corpus) == 0:
		return fmt.Errorf("%s: StreamingInput.Corpus is empty", fn)
	case in.MaxTokens < 1:
		return fmt.Errorf("%s: StreamingInput.MaxTokens %d must be at least 1", fn, in.MaxTokens)
	}
	var problems []string
	for _, p := range in.Corpus {
		route, body := requestFor(p)
		body["max_tokens"], body["temperature"], body["ignore_eos"] = in.MaxTokens, 0, true
		whole, err := in.API.Complete(ctx, route, body)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: non-streaming request: %v", p.Name, err))
			continue
		}
		sb := map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
		for k, v := range body {
			sb[k] = v
		}
		streamed, err := in.API.Complete(ctx, route, sb)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: streaming request: %v", p.Name, err))
			continue
		}
		problems = append(problems, compareStream(in, p.Name, whole, streamed)...)
	}
	if len(problems) > 0 {
		return errors.New("streaming parity gate:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// requestFor is the route and body that send a corpus prompt as text.
func requestFor(p Prompt) (string, map[string]any) {
	if !p.IsChat() {
		return "/v1/completions", map[string]any{"prompt": p.Prompt}
	}
	body := map[string]any{"messages": p.Messages, "add_generation_prompt": p.AddGenerationPrompt}
	if p.ChatTemplateKwargs != nil {
		body["chat_template_kwargs"] = p.ChatTemplateKwargs
	}
	return "/v1/chat/completions", body
}

func compareStream(in StreamingInput, name string, whole, streamed *Answer) []string {
	maxTokens := in.MaxTokens
	var out []string
	if streamed.Text != whole.Text {
		msg := fmt.Sprintf("prompt %q: streamed deltas (%d of them) concatenate to %d bytes, the non-streaming answer has %d bytes",
			name, len(streamed.Deltas), len(streamed.Text), len(whole.Text))
		switch {
		case strings.HasPrefix(whole.Text, streamed.Text):
			msg += fmt.Sprintf("; the stream lacks the answer's tail %q (a swallowed final delta?)", whole.Text[len(streamed.Text):])
		case strings.HasPrefix(streamed.Text, whole.Text):
			msg += fmt.Sprintf("; the stream has extra text %q", streamed.Text[len(whole.Text):])
		default:
			i := 0
			for i < len(whole.Text) && i < len(streamed.Text) && whole.Text[i] == streamed.Text[i] {
				i++
			}
			msg += fmt.Sprintf("; they differ from byte %d: streamed %q, whole %q", i, clip(streamed.Text[i:], 40), clip(whole.Text[i:], 40))
		}
		out = append(out, msg)
	}
	if !streamed.SawDone {
		out = append(out, fmt.Sprintf("prompt %q: the stream did not end with data: [DONE]", name))
	}
	if streamed.FinishReason != whole.FinishReason || streamed.FinishReason == "" {
		out = append(out, fmt.Sprintf("prompt %q: finish_reason streamed %q, non-streaming %q", name, streamed.FinishReason, whole.FinishReason))
	}
	switch {
	case !whole.HasUsage || !streamed.HasUsage:
		out = append(out, fmt.Sprintf("prompt %q: usage missing (non-streaming %v, streaming with include_usage %v)", name, whole.HasUsage, streamed.HasUsage))
	case whole.CompletionTokens != streamed.CompletionTokens:
		out = append(out, fmt.Sprintf("prompt %q: completion_tokens non-streaming %d, streaming %d", name, whole.CompletionTokens, streamed.CompletionTokens))
	case whole.CompletionTokens != maxTokens && (whole.FinishReason != "stop" || !in.OpenAIOnly):
		// ignore_eos is a vendor extension: a server without it (OpenAIOnly) may end both
		// answers at EOS alike, which is still parity; otherwise every answer has max_tokens.
		out = append(out, fmt.Sprintf("prompt %q: completion_tokens %d (finish_reason %q), want %d (ignore_eos)", name, whole.CompletionTokens, whole.FinishReason, maxTokens))
	case whole.PromptTokens != streamed.PromptTokens:
		out = append(out, fmt.Sprintf("prompt %q: prompt_tokens non-streaming %d, streaming %d", name, whole.PromptTokens, streamed.PromptTokens))
	}
	return out
}
