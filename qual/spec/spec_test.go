package spec

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/manifest"
)

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), want) {
			t.Errorf("panic %v, want one containing %q", r, want)
		}
	}()
	f()
}

func TestLabelVocabulary(t *testing.T) {
	if got := Family("qwen"); len(got) != 1 || got[0] != "qwen" {
		t.Errorf("Family(qwen) = %v", got)
	}
	// The known list is the families/ folders, which grow: the message must name the typo and
	// list the known ones (qwen among them).
	mustPanic(t, `spec.Family("qwne"): unknown family; known: `, func() { Family("qwne") })
	mustPanic(t, `, qwen, `, func() { Family("qwne") })
	mustPanic(t, `"parity" is a task, gate or placement label`, func() { Family("parity") })
	mustPanic(t, `spec.Task("txt"): unknown label; known: text, chat, stream, image, vision`, func() { Task("txt") })
	mustPanic(t, `spec.Gate("speed"): unknown label`, func() { Gate("speed") })
	mustPanic(t, `spec.Owner("Bad Owner")`, func() { Owner("Bad Owner") })
	if got := Owner("qwen-owners"); got[0] != "owner:qwen-owners" {
		t.Errorf("Owner = %v", got)
	}
	RegisterFamily("downstream")
	if err := CheckFamily("downstream"); err != nil {
		t.Errorf("registered family refused: %v", err)
	}
}

func TestLoadCorpus(t *testing.T) {
	for _, f := range []string{"gpt2", "qwen"} {
		c, err := LoadCorpus(filepath.Join("..", "..", "families", f, "corpus.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if len(c) < 12 {
			t.Errorf("%s corpus has %d prompts, want at least 12", f, len(c))
		}
	}
	dir := t.TempDir()
	for content, want := range map[string]string{
		`{"name":"a","prompt":"x"}` + "\n" + `{"name":"a","prompt":"y"}`: `corpus.jsonl:2: name "a" already used on line 1`,
		`{"name":"a"}`:                       `prompt "a" has neither prompt nor messages`,
		`{"name":"a","prompt":"x","typo":1}`: `unknown field "typo"`,
		`{"prompt":"x"}`:                     `field name is empty`,
	} {
		p := filepath.Join(dir, "corpus.jsonl")
		os.WriteFile(p, []byte(content), 0o644)
		if _, err := LoadCorpus(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadCorpus(%q) = %v, want %q", content, err, want)
		}
	}
}

// TestMismatchingBundleRefused shows the check the suite runs before launching anything:
// a bundle whose provenance differs from the manifest is refused, naming the field.
func TestMismatchingBundleRefused(t *testing.T) {
	m, err := manifest.Load(filepath.Join("..", "..", "families", "qwen", "manifest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h := &bundle.Header{Family: "qwen3"}
	h.Provenance.CheckpointID = m.Checkpoint.ID
	h.Provenance.Revision = m.Checkpoint.Revision
	h.Provenance.Build = bundle.BuildSettings{Precision: "fp32", Backend: "cpu", MaxContext: m.Build.MaxContext}
	if err := CheckHeader(h, m); err != nil {
		t.Fatalf("matching header refused: %v", err)
	}
	h.Provenance.Build.MaxContext = 512
	if err := CheckHeader(h, m); err == nil || !strings.Contains(err.Error(), "provenance.build.max_context") {
		t.Errorf("max_context mismatch: %v", err)
	}
	h.Provenance.Revision = "main"
	if err := CheckHeader(h, m); err == nil || !strings.Contains(err.Error(), `provenance.revision "main" is not an immutable 40-hex commit`) {
		t.Errorf("branch revision: %v", err)
	}
}

func TestInputChecksNameFieldAndFunction(t *testing.T) {
	ctx := context.Background()
	if _, err := CheckParity(ctx, ParityInput{}); err == nil || err.Error() != "spec.CheckParity: ParityInput.API is nil; pass the suite's API" {
		t.Errorf("CheckParity: %v", err)
	}
	if err := CheckStreaming(ctx, StreamingInput{API: &API{}, Corpus: []Prompt{{Name: "a", Prompt: "b"}}}); err == nil || !strings.Contains(err.Error(), "spec.CheckStreaming: StreamingInput.MaxTokens 0") {
		t.Errorf("CheckStreaming: %v", err)
	}
	if err := CheckContext(ctx, ContextInput{API: &API{}}); err == nil || !strings.Contains(err.Error(), "spec.CheckContext: ContextInput.MaxContext 0") {
		t.Errorf("CheckContext: %v", err)
	}
	if _, err := CheckLoad(ctx, LoadInput{}); err == nil || !strings.Contains(err.Error(), "spec.CheckLoad: LoadInput.Endpoint is nil") {
		t.Errorf("CheckLoad: %v", err)
	}
	if err := CheckChatTemplate(ctx, ChatTemplateInput{API: &API{}}); err == nil || !strings.Contains(err.Error(), "spec.CheckChatTemplate: ChatTemplateInput.Goldens is empty") {
		t.Errorf("CheckChatTemplate: %v", err)
	}
}

func TestSplitSLOs(t *testing.T) {
	gates, goodput, err := splitSLOs(map[string]string{"ttft_p99": "1s", "http_p50": "20ms", "ttft": "200ms"})
	if err != nil {
		t.Fatal(err)
	}
	if len(gates) != 2 || gates[0].tag != "mq_http_latency" || gates[0].limitMs != 20 || gates[1].stat != "p99" || gates[1].limitMs != 1000 {
		t.Errorf("gates = %+v", gates)
	}
	if goodput != "ttft:200ms" {
		t.Errorf("goodput SLOs = %q", goodput)
	}
	if _, _, err := splitSLOs(map[string]string{"speed_p99": "1s"}); err == nil || !strings.Contains(err.Error(), `unknown metric "speed"`) {
		t.Errorf("unknown metric: %v", err)
	}
}

func TestStreamAndRenderingMessages(t *testing.T) {
	whole := &Answer{Text: "hello world", FinishReason: "length", HasUsage: true, CompletionTokens: 3, PromptTokens: 2}
	cut := &Answer{Text: "hello", Deltas: []string{"hel", "lo"}, FinishReason: "length", HasUsage: true, CompletionTokens: 3, PromptTokens: 2, SawDone: true}
	got := compareStream(StreamingInput{MaxTokens: 3}, "p", whole, cut)
	if len(got) != 1 || !strings.Contains(got[0], `the stream lacks the answer's tail " world" (a swallowed final delta?)`) {
		t.Errorf("compareStream = %v", got)
	}
	if msg := renderingDiff("<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"); !strings.Contains(msg, `continues with "<|im_start|>assistant\n" (the generation prompt is missing?)`) {
		t.Errorf("renderingDiff = %s", msg)
	}
}

// TestStreamEndsAtEOSWithoutIgnoreEOS: a server without the ignore_eos extension (external,
// OpenAIOnly) may end both answers at EOS alike; our own server must honour it.
func TestStreamEndsAtEOSWithoutIgnoreEOS(t *testing.T) {
	whole := &Answer{Text: "hi", FinishReason: "stop", HasUsage: true, CompletionTokens: 2}
	streamed := &Answer{Text: "hi", Deltas: []string{"h", "i"}, FinishReason: "stop", HasUsage: true, CompletionTokens: 2, SawDone: true}
	if got := compareStream(StreamingInput{MaxTokens: 8, OpenAIOnly: true}, "p", whole, streamed); len(got) != 0 {
		t.Errorf("external server stopping at EOS in both: %v", got)
	}
	if got := compareStream(StreamingInput{MaxTokens: 8}, "p", whole, streamed); len(got) != 1 || !strings.Contains(got[0], "want 8 (ignore_eos)") {
		t.Errorf("own server ignoring ignore_eos: %v", got)
	}
	streamed.CompletionTokens = 3
	if got := compareStream(StreamingInput{MaxTokens: 8, OpenAIOnly: true}, "p", whole, streamed); len(got) != 1 || !strings.Contains(got[0], "streaming 3") {
		t.Errorf("counts differ: %v", got)
	}
}
