package load

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// Tokenizer is what load needs of server/tokenizer's *Tokenizer (which satisfies it):
// counting tokens of what is sent and received, and cutting synthetic prompts.
type Tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) string
}

// Prompt is one input of a load run: a completions prompt or a chat conversation.
type Prompt struct {
	// Name identifies the prompt in a corpus ("" for synthetic prompts).
	Name string `json:"name,omitempty"`
	// Prompt is the completions prompt (also used as the user message for chat when
	// Messages is empty).
	Prompt string `json:"prompt,omitempty"`
	// Messages is the chat messages array as JSON.
	Messages json.RawMessage `json:"messages,omitempty"`
	// AddGenerationPrompt and ChatTemplateKwargs are passed through in chat requests.
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
	// InputTokens is the client tokenizer's count of what is sent (add_special_tokens=False;
	// for chat, the sum over message contents); 0 when no tokenizer was given.
	InputTokens int `json:"input_tokens,omitempty"`
	// OutputTokens, when above 0, is this prompt's own output length (max_tokens with
	// ignore_eos), taking precedence over Config.OutputTokens: AIPerf's per-line
	// "output_length" in an input file, or a draw of DrawOutputLengths. Lengths that differ
	// from request to request keep a closed loop's requests from finishing, and arriving
	// again, in lockstep waves.
	OutputTokens int `json:"output_length,omitempty"`
}

// ReadCorpus reads a JSONL prompt file: the families' corpus format
// ({"name","prompt"} or {"name","messages","add_generation_prompt","chat_template_kwargs"})
// or plain {"text": ...} lines. When tok is not nil every prompt's InputTokens is counted.
func ReadCorpus(path string, tok Tokenizer) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read input file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	var out []Prompt
	line := 0
	for sc.Scan() {
		line++
		b := strings.TrimSpace(sc.Text())
		if b == "" {
			continue
		}
		var raw struct {
			Prompt
			Text *string `json:"text"`
		}
		if err := json.Unmarshal([]byte(b), &raw); err != nil {
			return nil, fmt.Errorf("input file %s line %d: %v; each line must be a JSON object with \"prompt\", \"messages\" or \"text\"", path, line, err)
		}
		p := raw.Prompt
		if raw.Text != nil && p.Prompt == "" {
			p.Prompt = *raw.Text
		}
		if p.Prompt == "" && len(p.Messages) == 0 {
			return nil, fmt.Errorf("input file %s line %d: no \"prompt\", \"messages\" or \"text\"", path, line)
		}
		if p.OutputTokens < 0 {
			return nil, fmt.Errorf("input file %s line %d: output_length %d is negative; give a positive token count, or leave it out to use --output-tokens", path, line, p.OutputTokens)
		}
		if p.Name == "" {
			p.Name = fmt.Sprintf("line-%d", line)
		}
		if tok != nil {
			n, err := countPromptTokens(tok, &p)
			if err != nil {
				return nil, fmt.Errorf("input file %s line %d: %w", path, line, err)
			}
			p.InputTokens = n
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read input file %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("input file %s holds no prompts", path)
	}
	return out, nil
}

// DrawOutputLengths gives every prompt without an output length of its own (OutputTokens 0)
// one drawn from a normal distribution of the given mean and standard deviation, rounded and
// at least 1 (AIPerf's --output-tokens-mean and --output-tokens-stddev). The prompts are
// copied, not changed; the same seed gives the same lengths.
func DrawOutputLengths(prompts []Prompt, mean, stddev int, seed uint64) ([]Prompt, error) {
	if mean < 1 {
		return nil, fmt.Errorf("load.DrawOutputLengths: mean output length %d must be at least 1 token (--output-tokens)", mean)
	}
	if stddev < 0 {
		return nil, fmt.Errorf("load.DrawOutputLengths: output length stddev %d is negative", stddev)
	}
	rng := rand.New(rand.NewPCG(seed, 0x6f73))
	out := make([]Prompt, len(prompts))
	for i, p := range prompts {
		if p.OutputTokens == 0 {
			p.OutputTokens = max(1, int(math.Round(float64(mean)+rng.NormFloat64()*float64(stddev))))
		}
		out[i] = p
	}
	return out, nil
}

// countPromptTokens counts what is sent: the prompt, or the contents of the messages.
func countPromptTokens(tok Tokenizer, p *Prompt) (int, error) {
	if len(p.Messages) == 0 {
		return len(tok.Encode(p.Prompt)), nil
	}
	var msgs []struct {
		Content any `json:"content"`
	}
	if err := json.Unmarshal(p.Messages, &msgs); err != nil {
		return 0, fmt.Errorf("messages: %v", err)
	}
	n := 0
	for _, m := range msgs {
		if s, ok := m.Content.(string); ok {
			n += len(tok.Encode(s))
		}
	}
	return n, nil
}

// sourceText is the text synthetic prompts are cut from: plain English prose written for
// this repository (so it carries no license question), long enough that prompts of a few
// thousand tokens do not repeat within one prompt.
//
//go:embed source.txt
var sourceText string

// SyntheticOptions describe synthetic prompts with controlled input lengths.
type SyntheticOptions struct {
	// Count is how many distinct prompts to make (requests cycle through them).
	Count int
	// Mean and Stddev of the input length in tokens (normal, rounded, at least 1).
	Mean, Stddev int
	// Seed makes the prompts reproducible.
	Seed uint64
	// Source overrides the built-in source text.
	Source string
}

// Synthetic cuts prompts of controlled token lengths out of a source text with the real
// tokenizer: a window of L tokens at a random offset is decoded, and its length re-counted
// after re-encoding (BPE merges across the cut can change it by a token or two, so the
// window is adjusted until the count matches or three tries pass; InputTokens always holds
// the actual count).
func Synthetic(tok Tokenizer, o SyntheticOptions) ([]Prompt, error) {
	if tok == nil {
		return nil, fmt.Errorf("load.Synthetic: no tokenizer; pass --tokenizer DIR (a folder with tokenizer.json and tokenizer_config.json)")
	}
	if o.Mean < 1 {
		return nil, fmt.Errorf("load.Synthetic: mean input length %d must be at least 1 token", o.Mean)
	}
	if o.Stddev < 0 {
		return nil, fmt.Errorf("load.Synthetic: input length stddev %d is negative", o.Stddev)
	}
	if o.Count < 1 {
		o.Count = 1
	}
	src := o.Source
	if src == "" {
		src = sourceText
	}
	ids := tok.Encode(src)
	if len(ids) < 16 {
		return nil, fmt.Errorf("load.Synthetic: source text encodes to only %d tokens", len(ids))
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x6d71))
	out := make([]Prompt, 0, o.Count)
	for i := 0; i < o.Count; i++ {
		want := o.Mean
		if o.Stddev > 0 {
			want = int(math.Round(float64(o.Mean) + rng.NormFloat64()*float64(o.Stddev)))
		}
		want = max(want, 1)
		off := rng.IntN(len(ids))
		window := func(n int) []int32 {
			w := make([]int32, n)
			for k := range w {
				w[k] = ids[(off+k)%len(ids)]
			}
			return w
		}
		n := want
		text := tok.Decode(window(n))
		got := len(tok.Encode(text))
		for try := 0; try < 3 && got != want; try++ {
			n += want - got
			if n < 1 {
				n = 1
			}
			text = tok.Decode(window(n))
			got = len(tok.Encode(text))
		}
		out = append(out, Prompt{Name: fmt.Sprintf("synthetic-%d", i), Prompt: text, InputTokens: got})
	}
	return out, nil
}
