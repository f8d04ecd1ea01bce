package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/modelqual/modelqual/fixtures"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/native/bundle"
)

func tokenizeFixtureDir(t *testing.T, name string) string {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "fixtures", "tokenizers", name)
}

func runTokenize(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := tokenizeMain(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestTokenizeText(t *testing.T) {
	code, out, errs := runTokenize(t, "Hello world, this is a test.", "--tokenizer", tokenizeFixtureDir(t, "qwen3"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct{ IDs []int32 }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// The first entry of fixtures/golden/tokenizer_golden.json.
	if want := []int32{9707, 1879, 11, 419, 374, 264, 1273, 13}; !slices.Equal(got.IDs, want) {
		t.Fatalf("ids %v, want %v", got.IDs, want)
	}
	if code, out, _ := runTokenize(t, "", "--tokenizer", tokenizeFixtureDir(t, "gpt2")); code != 0 || strings.TrimSpace(out) != `{"ids":[]}` {
		t.Fatalf("empty input: exit %d, output %q", code, out)
	}
}

func TestTokenizeChat(t *testing.T) {
	req := `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}`
	code, out, errs := runTokenize(t, req, "--tokenizer", tokenizeFixtureDir(t, "qwen3"), "--chat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Rendered string
		IDs      []int32
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; got.Rendered != want {
		t.Fatalf("rendered %q, want %q", got.Rendered, want)
	}
	if want := []int32{151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271}; !slices.Equal(got.IDs, want) {
		t.Fatalf("ids %v, want %v", got.IDs, want)
	}
	if !strings.Contains(out, "<|im_start|>") {
		t.Fatalf("output HTML-escapes the special tokens: %s", out)
	}
}

func TestTokenizeErrors(t *testing.T) {
	qwen := tokenizeFixtureDir(t, "qwen3")
	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		msg         string
	}{
		{"no source", "x", nil, 2, "exactly one of --tokenizer"},
		{"both sources", "x", []string{"--tokenizer", qwen, "--bundle", "b.mqb"}, 2, "exactly one of --tokenizer"},
		{"missing dir", "x", []string{"--tokenizer", filepath.Join(t.TempDir(), "none")}, 1, "tokenizer.json"},
		{"invalid utf-8", "\xff\xfe", []string{"--tokenizer", qwen}, 1, "not valid UTF-8"},
		{"chat not json", "hello", []string{"--tokenizer", qwen, "--chat"}, 1, "not a chat request"},
		{"chat no messages", `{"messages":[]}`, []string{"--tokenizer", qwen, "--chat"}, 1, "no messages"},
		{"gpt2 has no template", `{"messages":[{"role":"user","content":"x"}]}`, []string{"--tokenizer", tokenizeFixtureDir(t, "gpt2"), "--chat"}, 1, "no chat_template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runTokenize(t, tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.msg) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errs, tc.code, tc.msg)
			}
		})
	}
}

func TestTokenizeBundle(t *testing.T) {
	// A mock bundle built around the GPT-2 tokenizer files.
	tokDir := t.TempDir()
	tj, err := os.ReadFile(filepath.Join(tokenizeFixtureDir(t, "gpt2"), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tokDir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tokDir, "tokenizer_config.json"), []byte(`{"eos_token":"<|endoftext|>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "mock.mqb")
	if _, err := bundle.Build(context.Background(), bundle.BuildOptions{Mock: true, TokenizerDir: tokDir, Out: out}); err != nil {
		t.Fatal(err)
	}
	code, stdout, errs := runTokenize(t, "Hello world", "--bundle", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.TrimSpace(stdout) != `{"ids":[15496,995]}` {
		t.Fatalf("output %q", stdout)
	}
}

// TestTokenizeChatKeepsKeyOrder: tool definitions are written back by the template's tojson in
// the order the request gave them, as transformers does.
func TestTokenizeChatKeepsKeyOrder(t *testing.T) {
	req := `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`
	code, out, errs := runTokenize(t, req, "--tokenizer", tokenizeFixtureDir(t, "qwen3"), "--chat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct{ Rendered string }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if want := `{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}`; !strings.Contains(got.Rendered, want) {
		t.Fatalf("rendering lacks %s:\n%s", want, got.Rendered)
	}
}
