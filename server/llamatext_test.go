package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelqual/modelqual/fixtures"
)

// spReference decodes SentencePiece-style ids by the rule of TinyLlama's tokenizer.json decoder
// (Replace "▁" by " ", ByteFallback, Fuse, Strip one leading space), written here from the
// vocabulary alone so the server's text is held to something other than its own tokenizer
// package. newSPReference checks it against transformers' decodes of the fixture's tokenizer
// golden before any test trusts it.
type spReference struct {
	pieces []string // id → piece, or an added token's content
	byteOf map[int32]byte
}

var byteFallbackPiece = regexp.MustCompile(`^<0x([0-9A-F]{2})>$`)

func newSPReference(t testing.TB, root string) *spReference {
	t.Helper()
	var tj struct {
		Model struct {
			Vocab map[string]int32 `json:"vocab"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int32  `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	readJSON(t, filepath.Join(root, "fixtures", "tokenizers", "llama-tiny", "tokenizer.json"), &tj)
	r := &spReference{byteOf: map[int32]byte{}}
	set := func(id int32, s string) {
		for int(id) >= len(r.pieces) {
			r.pieces = append(r.pieces, "")
		}
		r.pieces[id] = s
	}
	for p, id := range tj.Model.Vocab {
		set(id, p)
		if m := byteFallbackPiece.FindStringSubmatch(p); m != nil {
			b, _ := strconv.ParseUint(m[1], 16, 8)
			r.byteOf[id] = byte(b)
		}
	}
	for _, a := range tj.AddedTokens {
		set(a.ID, a.Content)
	}
	// The rule must reproduce transformers' decode of every string of the tokenizer golden
	// (transformers 5.17, tokenizers 0.23: spaces, newlines, accents, CJK and emoji spelt as
	// byte pieces, added tokens).
	var g struct {
		Llama []struct {
			IDs     []int32 `json:"ids"`
			Decoded string  `json:"decoded"`
		} `json:"llama"`
	}
	readJSON(t, filepath.Join(root, "fixtures", "golden", "llama-tiny-tokenizer.json"), &g)
	if len(g.Llama) < 10 {
		t.Fatalf("llama-tiny-tokenizer.json holds %d strings; the reference decoder needs them to be checked", len(g.Llama))
	}
	for _, e := range g.Llama {
		if got := r.decode(e.IDs); got != e.Decoded {
			t.Fatalf("the test's SentencePiece rule decodes %v to %q, transformers to %q: fix the rule before trusting it", e.IDs, got, e.Decoded)
		}
	}
	return r
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// decode is tokenizers' decode(ids) for the Llama decoder sequence: each run of byte pieces
// becomes its bytes when they are valid UTF-8, else one U+FFFD per byte; the joined text loses
// one leading space.
func (r *spReference) decode(ids []int32) string {
	var b strings.Builder
	var run []byte
	flush := func() {
		if utf8.Valid(run) {
			b.Write(run)
		} else {
			b.WriteString(strings.Repeat("\uFFFD", len(run)))
		}
		run = run[:0]
	}
	for _, id := range ids {
		if v, ok := r.byteOf[id]; ok {
			run = append(run, v)
			continue
		}
		flush()
		b.WriteString(strings.ReplaceAll(r.pieces[id], "▁", " "))
	}
	flush()
	return strings.TrimPrefix(b.String(), " ")
}

// after is the text gen adds after prompt: decode(prompt + gen) less decode(prompt), what
// vLLM and TGI answer (the prompt's text must be a prefix of the whole: the golden prompts are
// tokenized text, so they end on a whole character).
func (r *spReference) after(t testing.TB, prompt, gen []int32) string {
	t.Helper()
	pre := r.decode(prompt)
	full := r.decode(append(append([]int32(nil), prompt...), gen...))
	if !strings.HasPrefix(full, pre) {
		t.Fatalf("decode(prompt) %q is not a prefix of decode(prompt + completion) %q", pre, full)
	}
	return full[len(pre):]
}

// TestLlamaCompletionText: qual-server's completion text on a SentencePiece family is the text
// the generated ids add after the prompt, as vLLM and TGI return it, streamed or not, on both
// routes. llama-tiny's transformers golden gives each prompt's ids and greedy ids; the
// expected text is derived from them by the SentencePiece rule above (itself checked against
// transformers' decodes). A completion whose first piece carries "▁" starts with a space; the
// old server decoded the generated ids as a sequence of their own and dropped it. Every
// streamed delta is valid UTF-8 (byte pieces held until their character is complete).
func TestLlamaCompletionText(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ref := newSPReference(t, root)
	g, err := fixtures.LoadGolden(fixtures.GoldenPath(root, fixtures.LlamaTiny))
	if err != nil {
		t.Fatal(err)
	}
	bundleMu.Lock()
	bundle, err := fixtures.Bundle(cacheDir, fixtures.LlamaTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatalf("llama-tiny bundle: %v", err)
	}
	s := startServer(t, bundle)

	const steps = 12
	spaced := 0
	for _, gp := range g.Prompts {
		gen := gp.GreedyIDs[:steps]
		want := ref.after(t, gp.PromptIDs, gen)
		if strings.HasPrefix(ref.pieces[gen[0]], "▁") {
			spaced++
		}
		ids, _ := json.Marshal(gp.PromptIDs)
		body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":%d,"temperature":0,"ignore_eos":true`, s.model, ids, steps)
		got := completionText(t, s, "/v1/completions", body+"}")
		if got != want {
			t.Errorf("%s: completion %q, want %q (the golden ids' text after the prompt)", gp.Name, got, want)
		}
		if streamed := streamedText(t, s, "/v1/completions", body+`,"stream":true}`); streamed != got {
			t.Errorf("%s: streamed completion %q, non-streamed %q", gp.Name, streamed, got)
		}
	}
	if spaced < 5 {
		t.Fatalf("only %d golden prompts generate a ▁-piece first; the test no longer shows the leading space", spaced)
	}

	// Chat: the corpus conversations whose rendered ids the golden holds; the answer is the
	// text after the template's last token.
	chats := 0
	corpus := readCorpus(t, filepath.Join(root, "families", "llama", "corpus.jsonl"))
	for _, gp := range g.Prompts {
		msgs, ok := corpus[gp.Name]
		if !ok {
			continue
		}
		chats++
		gen := gp.GreedyIDs[:steps]
		want := ref.after(t, gp.PromptIDs, gen)
		body := fmt.Sprintf(`{"model":%q,"messages":%s,"max_tokens":%d,"temperature":0,"ignore_eos":true`, s.model, msgs, steps)
		got := completionText(t, s, "/v1/chat/completions", body+"}")
		if got != want {
			t.Errorf("chat %s: content %q, want %q (the golden ids' text after the rendered template)", gp.Name, got, want)
		}
		if streamed := streamedText(t, s, "/v1/chat/completions", body+`,"stream":true}`); streamed != got {
			t.Errorf("chat %s: streamed content %q, non-streamed %q", gp.Name, streamed, got)
		}
	}
	if chats < 3 {
		t.Fatalf("only %d chat prompts of the corpus are in the golden", chats)
	}
}

// readCorpus returns the chat prompts of a family corpus: name → messages (raw JSON).
func readCorpus(t testing.TB, path string) map[string]json.RawMessage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]json.RawMessage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var p struct {
			Name     string          `json:"name"`
			Messages json.RawMessage `json:"messages"`
			AddGen   bool            `json:"add_generation_prompt"`
		}
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(p.Messages) > 0 && p.AddGen {
			out[p.Name] = p.Messages
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// completionText posts a non-streamed request and returns choice 0's text (or message content).
func completionText(t testing.TB, s *testServer, path, body string) string {
	t.Helper()
	code, _, b := s.post(path, body)
	if code != 200 {
		t.Fatalf("%s: status %d: %s", path, code, b)
	}
	var r struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("%s: answer %s: %v", path, b, err)
	}
	return r.Choices[0].Text + r.Choices[0].Message.Content
}

// streamedText posts a streamed request and concatenates choice 0's deltas, each checked to be
// valid UTF-8 on its own.
func streamedText(t testing.TB, s *testServer, path, body string) string {
	t.Helper()
	code, _, b := s.post(path, body)
	if code != 200 {
		t.Fatalf("%s: status %d: %s", path, code, b)
	}
	var text strings.Builder
	for _, ev := range parseSSE(t, string(b)) {
		if ev == "[DONE]" {
			break
		}
		var c struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("%s: event %s: %v", path, ev, err)
		}
		for _, ch := range c.Choices {
			d := ch.Text + ch.Delta.Content
			if !utf8.ValidString(d) {
				t.Fatalf("%s: a delta is not valid UTF-8: %q", path, d)
			}
			text.WriteString(d)
		}
	}
	return text.String()
}
