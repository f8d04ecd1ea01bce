package load

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/server/tokenizer"
)

func gpt2(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(filepath.Join("..", "..", "fixtures", "tokenizers", "gpt2"))
	if err != nil {
		t.Fatalf("load the gpt2 fixture tokenizer: %v", err)
	}
	return tok
}

func TestSyntheticLengths(t *testing.T) {
	tok := gpt2(t)
	ps, err := Synthetic(tok, SyntheticOptions{Count: 50, Mean: 100, Stddev: 0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	exact := 0
	for _, p := range ps {
		if got := len(tok.Encode(p.Prompt)); got != p.InputTokens {
			t.Fatalf("InputTokens %d but the prompt encodes to %d", p.InputTokens, got)
		}
		if p.InputTokens == 100 {
			exact++
		}
		if p.InputTokens < 97 || p.InputTokens > 103 {
			t.Errorf("prompt of %d tokens, want 100±3", p.InputTokens)
		}
	}
	if exact < 45 {
		t.Errorf("only %d of 50 prompts hit exactly 100 tokens", exact)
	}
	again, _ := Synthetic(tok, SyntheticOptions{Count: 50, Mean: 100, Seed: 1})
	if again[7].Prompt != ps[7].Prompt {
		t.Error("same seed gave different prompts")
	}

	// With a spread, the sample mean and spread follow the request.
	ps, err = Synthetic(tok, SyntheticOptions{Count: 400, Mean: 200, Stddev: 40, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, p := range ps {
		sum += float64(p.InputTokens)
	}
	mean := sum / float64(len(ps))
	for _, p := range ps {
		d := float64(p.InputTokens) - mean
		sq += d * d
	}
	sd := sq / float64(len(ps))
	// 400 draws: the mean's standard error is 2 tokens, so ±8 is four of them.
	if mean < 192 || mean > 208 || sd < 30*30 || sd > 50*50 {
		t.Errorf("mean %.1f variance %.1f, want about 200 and 1600", mean, sd)
	}
}

func TestSyntheticNeedsTokenizer(t *testing.T) {
	if _, err := Synthetic(nil, SyntheticOptions{Mean: 10}); err == nil || !strings.Contains(err.Error(), "--tokenizer") {
		t.Fatalf("err = %v", err)
	}
}

func TestReadCorpus(t *testing.T) {
	tok := gpt2(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.jsonl")
	os.WriteFile(path, []byte(`{"name":"short-hello","prompt":"Hello world"}

{"text":"plain text line"}
{"name":"chat","messages":[{"role":"user","content":"hi there"}],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}
`), 0o644)
	ps, err := ReadCorpus(path, tok)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[0].Name != "short-hello" || ps[0].InputTokens != 2 || ps[1].Prompt != "plain text line" ||
		ps[2].InputTokens != 2 || ps[2].AddGenerationPrompt == nil || string(ps[2].ChatTemplateKwargs) != `{"enable_thinking":false}` {
		t.Fatalf("corpus %+v", ps)
	}
	os.WriteFile(path, []byte("{\"name\":\"x\"}\n"), 0o644)
	if _, err := ReadCorpus(path, nil); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("err = %v", err)
	}
	// AIPerf's per-line output_length.
	os.WriteFile(path, []byte("{\"text\":\"a\",\"output_length\":50}\n{\"text\":\"b\"}\n"), 0o644)
	if ps, err := ReadCorpus(path, nil); err != nil || ps[0].OutputTokens != 50 || ps[1].OutputTokens != 0 {
		t.Fatalf("output_length: %+v, %v", ps, err)
	}
	os.WriteFile(path, []byte("{\"text\":\"a\"}\n{\"text\":\"b\",\"output_length\":-3}\n"), 0o644)
	if _, err := ReadCorpus(path, nil); err == nil || !strings.Contains(err.Error(), "line 2: output_length -3") {
		t.Fatalf("negative output_length: err = %v", err)
	}
}

func TestDrawOutputLengths(t *testing.T) {
	in := make([]Prompt, 400)
	in[7].OutputTokens = 3 // an input file's own length stays
	ps, err := DrawOutputLengths(in, 64, 16, 5)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := DrawOutputLengths(in, 64, 16, 5)
	other, _ := DrawOutputLengths(in, 64, 16, 6)
	if in[0].OutputTokens != 0 || ps[7].OutputTokens != 3 {
		t.Fatalf("input changed (%d) or own length replaced (%d)", in[0].OutputTokens, ps[7].OutputTokens)
	}
	var sum, sq float64
	sameSeed, otherSeed := true, true
	for i, p := range ps {
		if p.OutputTokens < 1 {
			t.Fatalf("prompt %d: length %d", i, p.OutputTokens)
		}
		sameSeed = sameSeed && p.OutputTokens == again[i].OutputTokens
		otherSeed = otherSeed && p.OutputTokens == other[i].OutputTokens
		if i != 7 {
			sum += float64(p.OutputTokens)
			sq += float64(p.OutputTokens * p.OutputTokens)
		}
	}
	n := float64(len(ps) - 1)
	mean := sum / n
	variance := sq/n - mean*mean
	// 399 draws: the mean's standard error is 0.8 tokens, so ±4 is five of them.
	if !sameSeed || otherSeed || mean < 60 || mean > 68 || variance < 12*12 || variance > 20*20 {
		t.Errorf("same seed same lengths %v, other seed other lengths %v, mean %.1f, variance %.1f (want about 64 and 256)",
			sameSeed, !otherSeed, mean, variance)
	}
	if _, err := DrawOutputLengths(in, 0, 4, 1); err == nil || !strings.Contains(err.Error(), "--output-tokens") {
		t.Errorf("mean 0: err = %v", err)
	}
	if _, err := DrawOutputLengths(in, 8, -1, 1); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("stddev -1: err = %v", err)
	}
}
