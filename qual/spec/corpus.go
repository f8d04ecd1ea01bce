package spec

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Prompt is one line of a family's corpus.jsonl: either a raw completion prompt or a chat
// conversation rendered with the checkpoint's own template.
type Prompt struct {
	Name                string           `json:"name"`
	Prompt              string           `json:"prompt,omitempty"`
	Messages            []map[string]any `json:"messages,omitempty"`
	AddGenerationPrompt bool             `json:"add_generation_prompt,omitempty"`
	ChatTemplateKwargs  map[string]any   `json:"chat_template_kwargs,omitempty"`
	// Image is a vision-language prompt's image file, relative to the repository root: the
	// prompt is sent as one user message of the image and the text.
	Image string `json:"image,omitempty"`
}

// IsChat reports whether the prompt is a chat conversation.
func (p Prompt) IsChat() bool { return len(p.Messages) > 0 }

// LoadCorpus reads a corpus.jsonl, refusing duplicate names and lines that are neither a
// prompt nor a conversation, with the line number in the message.
func LoadCorpus(path string) ([]Prompt, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spec.LoadCorpus: %w", err)
	}
	var out []Prompt
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var p Prompt
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("spec.LoadCorpus: %s:%d: %w", path, line, err)
		}
		switch {
		case p.Name == "":
			return nil, fmt.Errorf("spec.LoadCorpus: %s:%d: field name is empty; every prompt needs a unique name", path, line)
		case seen[p.Name] != 0:
			return nil, fmt.Errorf("spec.LoadCorpus: %s:%d: name %q already used on line %d", path, line, p.Name, seen[p.Name])
		case p.Prompt == "" && len(p.Messages) == 0:
			return nil, fmt.Errorf("spec.LoadCorpus: %s:%d: prompt %q has neither prompt nor messages", path, line, p.Name)
		case p.Prompt != "" && len(p.Messages) > 0:
			return nil, fmt.Errorf("spec.LoadCorpus: %s:%d: prompt %q has both prompt and messages; use one", path, line, p.Name)
		}
		seen[p.Name] = line
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("spec.LoadCorpus: %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("spec.LoadCorpus: %s holds no prompts", path)
	}
	return out, nil
}
