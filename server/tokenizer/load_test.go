package tokenizer

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tinyVariant returns tiny_tokenizer.json with fn applied to its decoded form.
func tinyVariant(t *testing.T, fn func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(tinyTokenizerJSON), &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func model(m map[string]any) map[string]any { return m["model"].(map[string]any) }

func TestLoadErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty"},
		{"not json", []byte("hello"), "byte offset 0"},
		{"truncated", []byte(tinyTokenizerJSON[:len(tinyTokenizerJSON)/2]), "tokenizer.json"},
		{"no model", []byte(`{"added_tokens":[]}`), `missing "model"`},
		{"no vocab", tinyVariant(t, func(m map[string]any) { delete(model(m), "vocab") }), "missing model.vocab"},
		{"no merges", tinyVariant(t, func(m map[string]any) { delete(model(m), "merges") }), "missing model.merges"},
		{"wordpiece", tinyVariant(t, func(m map[string]any) { model(m)["type"] = "WordPiece" }), `model.type "WordPiece"`},
		{"merge without space", tinyVariant(t, func(m map[string]any) { model(m)["merges"] = []any{"Ġt"} }), "model.merges[0]"},
		{"merge of unknown token", tinyVariant(t, func(m map[string]any) { model(m)["merges"] = []any{[]any{"Ġ", "zz"}} }), `merge token "zz" is not in model.vocab`},
		{"merge result unknown", tinyVariant(t, func(m map[string]any) { model(m)["merges"] = []any{"a b"} }), `merged token "ab"`},
		{"merges entry a number", tinyVariant(t, func(m map[string]any) { model(m)["merges"] = []any{"Ġ t", 7} }), "model.merges[1]"},
		{"unknown pre-tokenizer", tinyVariant(t, func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }), `unknown pre-tokenizer type "Whitespace"`},
		{"nested unknown pre-tokenizer", tinyVariant(t, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Digits"}}}
		}), "pre_tokenizer.pretokenizers[0]"},
		{"bad regex", tinyVariant(t, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?<"}, "behavior": "Isolated"}
		}), "does not compile"},
		{"bad behavior", tinyVariant(t, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}
		}), `unknown Split behavior "Sideways"`},
		{"unknown normalizer", tinyVariant(t, func(m map[string]any) { m["normalizer"] = map[string]any{"type": "BertNormalizer"} }), `unknown normalizer type "BertNormalizer"`},
		{"unknown decoder", tinyVariant(t, func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }), `unknown decoder type "WordPiece"`},
		{"added token without id", tinyVariant(t, func(m map[string]any) { m["added_tokens"] = []any{map[string]any{"content": "<x>"}} }), "added_tokens[0]"},
		{"negative vocab id", tinyVariant(t, func(m map[string]any) { model(m)["vocab"].(map[string]any)["Ġ"] = -3 }), "negative id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromBytes(tc.data, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := FromBytes([]byte(tinyTokenizerJSON), []byte("{")); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("bad tokenizer_config.json: %v", err)
	}
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := FromBytes([]byte(tinyTokenizerJSON), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int32 {
		v, ok := tok.SpecialID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
	// " the" → merges "Ġ t" (rank 0) then "Ġt h" (rank 1); "he" (rank 2) never applies because
	// the lower-ranked merges consumed the h first.
	want := []int32{id("Ġth"), id("e"), id("<|end|>"), id("he")}
	if got := tok.Encode(" the<|end|>he"); !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if got := tok.Decode(want); got != " the<|end|>he" {
		t.Fatalf("Decode = %q", got)
	}
	if tok.VocabSize() != 260 || !tok.IsSpecial(id("<|end|>")) || tok.IsSpecial(id("he")) {
		t.Fatalf("VocabSize %d, special flags wrong", tok.VocabSize())
	}
	if s, ok := tok.TokenString(id("Ġth")); !ok || s != "Ġth" {
		t.Fatalf("TokenString = %q, %v", s, ok)
	}
	if _, ok := tok.TokenString(9999); ok {
		t.Fatal("TokenString of an unknown id succeeded")
	}
	if got := tok.Encode(""); len(got) != 0 {
		t.Fatalf("Encode(\"\") = %v", got)
	}
}

func TestAddedTokenFlags(t *testing.T) {
	build := func(tokFlags map[string]any) *Tokenizer {
		data := tinyVariant(t, func(m map[string]any) {
			a := map[string]any{"id": 259, "content": "<|end|>", "special": true}
			for k, v := range tokFlags {
				a[k] = v
			}
			m["added_tokens"] = []any{a}
		})
		tok, err := FromBytes(data, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ids := func(tok *Tokenizer, s string) string {
		var parts []string
		for _, id := range tok.Encode(s) {
			ts, _ := tok.TokenString(id)
			parts = append(parts, ts)
		}
		return strings.Join(parts, "|")
	}
	for _, tc := range []struct {
		flags map[string]any
		in    string
		want  string
	}{
		{nil, "a  <|end|>  b", "a|Ġ|Ġ|<|end|>|Ġ|Ġ|b"},
		{map[string]any{"lstrip": true}, "a  <|end|>  b", "a|<|end|>|Ġ|Ġ|b"},
		{map[string]any{"rstrip": true}, "a  <|end|>  b", "a|Ġ|Ġ|<|end|>|b"},
		{map[string]any{"lstrip": true, "rstrip": true}, "a \t<|end|>\n b", "a|<|end|>|b"},
		{map[string]any{"single_word": true}, "x<|end|>", "x|<|end|>"},
		{map[string]any{"single_word": true}, "- <|end|> -", "-|Ġ|<|end|>|Ġ|-"},
	} {
		got := ids(build(tc.flags), tc.in)
		if tc.flags["single_word"] == true && tc.in == "x<|end|>" {
			// "x" ends with a word character, so single_word refuses the match and the token
			// text is split as ordinary text.
			if strings.Contains(got, "<|end|>|") || got == tc.want {
				t.Errorf("single_word matched inside a word: %s", got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("flags %v on %q: got %s, want %s", tc.flags, tc.in, got, tc.want)
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	for _, tc := range []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Isolated", false, []string{"a", "-", "b", "-", "-", "c"}},
		{"Removed", false, []string{"a", "b", "c"}},
		{"MergedWithPrevious", false, []string{"a-", "b-", "-", "c"}}, // as tokenizers' doc: the-, final-, -, countdown
		{"MergedWithNext", false, []string{"a", "-b", "-", "-c"}},
		{"Contiguous", false, []string{"a", "-", "b", "--", "c"}},
		{"Removed", true, []string{"-", "-", "-"}},
	} {
		p := &splitPre{find: literalFinder("-"), behavior: behaviors[tc.behavior], invert: tc.invert}
		var got []string
		p.split("a-b--c", func(w string) { got = append(got, w) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s invert=%v: got %q, want %q", tc.behavior, tc.invert, got, tc.want)
		}
	}
}

// TestConcurrentUse encodes, decodes and renders from many goroutines at once; run with -race
// it checks the shared word cache and the compiled template.
func TestConcurrentUse(t *testing.T) {
	tok := fixtureTokenizer(t, "qwen3")
	g := loadGolden(t)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				e := g.Qwen3[(i+w)%len(g.Qwen3)]
				if got := tok.Encode(e.Text); !slices.Equal(got, e.IDs) {
					t.Errorf("concurrent Encode(%q) = %v", e.Text, got)
					return
				}
				c := g.Qwen3Chat[(i+w)%len(g.Qwen3Chat)]
				r, err := tok.ApplyChatTemplate(c.Messages, c.AddGenerationPrompt, map[string]any{"enable_thinking": *c.EnableThinking})
				if err != nil || r != c.Rendered {
					t.Errorf("concurrent ApplyChatTemplate = %q, %v", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

type fakeBundle map[string][]byte

func (f fakeBundle) Section(name string) ([]byte, error) {
	if b, ok := f[name]; ok {
		return b, nil
	}
	return nil, errors.New("section " + name + " is not in the bundle")
}

func TestFromBundle(t *testing.T) {
	cfg := []byte(`{"eos_token": "<|end|>", "chat_template": "{{ messages[0].content }}"}`)
	tok, err := FromBundle(fakeBundle{"tokenizer.json": []byte(tinyTokenizerJSON), "tokenizer_config.json": cfg})
	if err != nil {
		t.Fatal(err)
	}
	if tok.EOSToken() != "<|end|>" || !tok.HasChatTemplate() {
		t.Fatalf("config not applied: eos %q, template %v", tok.EOSToken(), tok.HasChatTemplate())
	}
	if _, err := FromBundle(fakeBundle{"tokenizer.json": []byte(tinyTokenizerJSON)}); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("missing config section: %v", err)
	}
}

func TestIgnoreMerges(t *testing.T) {
	encode := func(ignore bool) []int32 {
		data := tinyVariant(t, func(m map[string]any) {
			model(m)["vocab"].(map[string]any)["xyz"] = 260
			model(m)["ignore_merges"] = ignore
			m["added_tokens"] = []any{}
		})
		tok, err := FromBytes(data, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Encode("xyz")
	}
	// "xyz" is in the vocabulary but no merges build it: only ignore_merges finds it.
	if got := encode(true); !slices.Equal(got, []int32{260}) {
		t.Fatalf("ignore_merges=true: %v, want [260]", got)
	}
	if got := encode(false); len(got) != 3 {
		t.Fatalf("ignore_merges=false: %v, want three byte tokens", got)
	}
}

func TestNormalizedAddedToken(t *testing.T) {
	data := tinyVariant(t, func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "Lowercase"}}}
		m["added_tokens"] = []any{
			map[string]any{"id": 259, "content": "<END>", "normalized": true, "special": true},
			map[string]any{"id": 260, "content": "<RAW>", "normalized": false, "special": true},
		}
	})
	tok, err := FromBytes(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A normalized token is matched after normalization (its content normalized too), so
	// "<End>" lowercases to "<end>" and matches; a raw token must match the text as written.
	got := tok.Encode("<End><RAW><raw>")
	if len(got) < 3 || got[0] != 259 || got[1] != 260 || slices.Contains(got[2:], 260) {
		t.Fatalf("Encode = %v; want 259, 260, then <raw> as ordinary text", got)
	}
}
