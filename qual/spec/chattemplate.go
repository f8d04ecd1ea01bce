package spec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ChatGolden is one chat rendering produced by transformers' apply_chat_template for the
// checkpoint's tokenizer (fixtures/golden/tokenizer_golden.json).
type ChatGolden struct {
	Messages            []map[string]any `json:"messages"`
	AddGenerationPrompt bool             `json:"add_generation_prompt"`
	EnableThinking      *bool            `json:"enable_thinking"`
	Rendered            string           `json:"rendered"`
	IDs                 []int32          `json:"ids"`
}

// Prompt turns the golden's inputs into a corpus-style prompt.
func (g ChatGolden) Prompt(name string) Prompt {
	p := Prompt{Name: name, Messages: g.Messages, AddGenerationPrompt: g.AddGenerationPrompt}
	if g.EnableThinking != nil {
		p.ChatTemplateKwargs = map[string]any{"enable_thinking": *g.EnableThinking}
	}
	return p
}

// LoadChatGoldens reads the renderings under key (e.g. "qwen3_chat") of a tokenizer golden
// file.
func LoadChatGoldens(path, key string) ([]ChatGolden, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spec.LoadChatGoldens: %w", err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("spec.LoadChatGoldens: %s: %w", path, err)
	}
	var out []ChatGolden
	if err := json.Unmarshal(all[key], &out); err != nil || len(out) == 0 {
		return nil, fmt.Errorf("spec.LoadChatGoldens: %s has no chat renderings under %q (err %v)", path, key, err)
	}
	return out, nil
}

// ChatTemplateInput is the input of ChatTemplateParity and CheckChatTemplate.
type ChatTemplateInput struct {
	// API reaches the served model.
	API *API
	// Goldens are transformers' renderings of conversations with this checkpoint's template.
	Goldens []ChatGolden
}

// CheckChatTemplate is ChatTemplateParity's core: for every golden conversation the server's
// /tokenize with messages renders exactly the golden text and the golden token ids, template
// options (enable_thinking) included.
func CheckChatTemplate(ctx context.Context, in ChatTemplateInput) error {
	const fn = "spec.CheckChatTemplate"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ChatTemplateInput.API is nil", fn)
	case len(in.Goldens) == 0:
		return fmt.Errorf("%s: ChatTemplateInput.Goldens is empty; load them with LoadChatGoldens", fn)
	}
	var problems []string
	for i, g := range in.Goldens {
		name := describeChat(i, g)
		got, err := in.API.TokenizeChat(ctx, g.Prompt(name))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: /tokenize: %v", name, err))
			continue
		}
		if got.Rendered == "" && len(got.Tokens) > 0 {
			// vLLM's /tokenize answers ids without the rendered text: the ids are the verdict.
			if !equalIDs(got.Tokens, g.IDs) {
				problems = append(problems, fmt.Sprintf("%s: token ids differ from transformers' at index %d (served %d ids, golden %d; the server gives no rendered text to show where)",
					name, firstDiff(got.Tokens, g.IDs), len(got.Tokens), len(g.IDs)))
			}
			continue
		}
		if got.Rendered != g.Rendered {
			problems = append(problems, fmt.Sprintf("%s: %s", name, renderingDiff(got.Rendered, g.Rendered)))
			continue
		}
		if !equalIDs(got.Tokens, g.IDs) {
			problems = append(problems, fmt.Sprintf("%s: rendering matches but token ids differ from transformers' at index %d (served %d ids, golden %d)",
				name, firstDiff(got.Tokens, g.IDs), len(got.Tokens), len(g.IDs)))
		}
	}
	if len(problems) > 0 {
		return errors.New("chat template gate: the served chat prompt does not render as the checkpoint's template:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

func describeChat(i int, g ChatGolden) string {
	s := fmt.Sprintf("conversation %d (%d messages, add_generation_prompt %v", i, len(g.Messages), g.AddGenerationPrompt)
	if g.EnableThinking != nil {
		s += fmt.Sprintf(", enable_thinking %v", *g.EnableThinking)
	}
	return s + ")"
}

// renderingDiff says where a served rendering leaves the golden one.
func renderingDiff(served, golden string) string {
	if strings.HasPrefix(golden, served) {
		return fmt.Sprintf("served rendering stops where the golden continues with %q (the generation prompt is missing?)", golden[len(served):])
	}
	if strings.HasPrefix(served, golden) {
		return fmt.Sprintf("served rendering has extra trailing text %q", served[len(golden):])
	}
	i := 0
	for i < len(served) && i < len(golden) && served[i] == golden[i] {
		i++
	}
	return fmt.Sprintf("renderings differ from byte %d: served %q, golden %q", i, clip(served[i:], 60), clip(golden[i:], 60))
}
