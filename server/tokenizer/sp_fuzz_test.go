package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// t5TinyJSON is a Unigram tokenizer.json in T5's layout: the nmt_nfkc charsmap (Precompiled)
// and Replace(" {2,}", " "), WhitespaceSplit + Metaspace(always), </s> appended, a Metaspace
// decoder; pieces <pad> </s> <unk>, ▁, a-z, A-Z, ▁fine and ine.
func t5TinyJSON(t testing.TB) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "nmt_nfkc.bin"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := [][2]any{{"<pad>", 0.0}, {"</s>", 0.0}, {"<unk>", 0.0}, {"▁", -2.0}, {"▁fine", -1.0}, {"ine", -3.0}}
	for c := 'a'; c <= 'z'; c++ {
		vocab = append(vocab, [2]any{string(c), -5.0}, [2]any{strings.ToUpper(string(c)), -5.5})
	}
	doc := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 0, "content": "<pad>", "special": true},
			map[string]any{"id": 1, "content": "</s>", "special": true},
			map[string]any{"id": 2, "content": "<unk>", "special": true},
		},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Precompiled", "precompiled_charsmap": base64.StdEncoding.EncodeToString(raw)},
			map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " {2,}"}, "content": " "},
		}},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "WhitespaceSplit"},
			map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "</s>", "type_id": 0}}},
			"special_tokens": map[string]any{"</s>": map[string]any{"id": "</s>", "ids": []int{1}, "tokens": []string{"</s>"}}}},
		"decoder": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"model":   map[string]any{"type": "Unigram", "unk_id": 2, "vocab": vocab, "byte_fallback": false},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestT5Unigram(t *testing.T) {
	tok, err := FromBytes(t5TinyJSON(t), []byte(`{"tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	// ﬁ → fi and 𝔾 → G by the charsmap; words split on whitespace; ▁fine beats ▁+f+ine.
	ids, err := tok.EncodeWithSpecialTokens("  \uFB01ne   𝔾od 日")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pieces(tok, ids), []string{"▁fine", "▁", "G", "o", "d", "▁", "<unk>", "</s>"}; !slices.Equal(got, want) {
		t.Errorf("T5 encode = %q, want %q", got, want)
	}
	if got := tok.DecodeSkipSpecial(ids); got != "fine God " { // <unk> is special: skipped, its ▁ stays
		t.Errorf("T5 decode = %q", got)
	}
}

// fuzzTokenizers are the SentencePiece-style tokenizers the fuzz targets exercise.
func fuzzTokenizers(t testing.TB) map[string]*Tokenizer {
	t.Helper()
	bf, err := FromBytes(unigramJSON(t, [][2]any{{"<unk>", 0.0}, {"<0xC3>", -0.01}, {"<0xA9>", -0.03}, {"▁", -1.0}, {"a", -1.0}, {"ab", -1.5}}, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	t5, err := FromBytes(t5TinyJSON(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*Tokenizer{
		"llama":         spTiny(t, "llama", ""),
		"metaspace":     spTiny(t, "metaspace", ""),
		"llama-class":   spTiny(t, "llama", `{"tokenizer_class": "LlamaTokenizer"}`),
		"unigram-bytes": bf,
		"t5":            t5,
	}
}

// FuzzSentencePiece: SentencePiece-style encoding never panics; the Llama layout gives the
// text back (byte fallback leaves nothing unknown; ▁ in the text decodes as a space); and for
// any id sequence, byte-fallback runs broken anywhere, the stream decoder emits only valid
// UTF-8 and concatenates to Decode, with and without special tokens, and primed with the
// sequence's first half it returns what the second half adds to Decode.
func FuzzSentencePiece(f *testing.F) {
	for _, s := range unicodeCorpus {
		f.Add(s)
	}
	for _, s := range []string{"", " ", "  a", "a  ", "▁x▁", "<s>x</s>", "hi<s>the", "é日本😀\n\t", "\xe6\x97", "\xff"} {
		f.Add(s)
	}
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		for name, tok := range toks {
			ids, err := tok.EncodeWithSpecialTokens(s)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got, want := streamChecked(t, tok, ids, false), tok.Decode(ids); got != want {
				t.Fatalf("%s: stream of Encode(%q) = %q, Decode = %q", name, s, got, want)
			}
			// The fuzz text's bytes as ids: arbitrary sequences, mostly byte tokens.
			raw := make([]int32, len(s))
			for i := 0; i < len(s); i++ {
				raw[i] = int32(s[i]) % int32(tok.VocabSize()+1) // VocabSize itself: no token
			}
			if got, want := streamChecked(t, tok, raw, false), tok.Decode(raw); got != want {
				t.Fatalf("%s: stream of %v = %q, Decode = %q", name, raw, got, want)
			}
			if got, want := streamChecked(t, tok, raw, true), tok.DecodeSkipSpecial(raw); got != want {
				t.Fatalf("%s: skip-special stream of %v = %q, DecodeSkipSpecial = %q", name, raw, got, want)
			}
			// The second half of raw as a completion after the first (a stream primed with
			// it, as the server decodes a generation): the text the whole decodes to after the
			// first half's, valid UTF-8 delta by delta. A cut after a byte-fallback token may
			// split a character's bytes; what the two halves make together is then not the
			// first half's text followed by more, and only validity is checked.
			cut := len(raw) / 2
			prompt, gen := raw[:cut], raw[cut:]
			for _, skip := range []bool{false, true} {
				got := primedStream(t, tok, prompt, gen, skip)
				whole, pre := tok.Decode(raw), tok.Decode(prompt)
				if skip {
					whole, pre = tok.DecodeSkipSpecial(raw), tok.DecodeSkipSpecial(prompt)
				}
				if cut > 0 && cutsByteRun(tok, prompt[cut-1]) || !strings.HasPrefix(whole, pre) {
					continue
				}
				if want := whole[len(pre):]; got != want {
					t.Fatalf("%s: stream of %v primed with %v (skip special %v) = %q, want %q (Decode of both less Decode of the prompt)", name, gen, prompt, skip, got, want)
				}
			}
			if d := tok.Decode(ids); !utf8.ValidString(d) {
				t.Fatalf("%s: Decode gave invalid UTF-8 %q", name, d)
			}
		}
		if !utf8.ValidString(s) || strings.Contains(s, "<s>") || strings.Contains(s, "</s>") || strings.Contains(s, "<unk>") {
			return
		}
		llama := toks["llama"]
		if got, want := llama.Decode(llama.Encode(s)), strings.ReplaceAll(s, "▁", " "); got != want {
			t.Fatalf("llama: Decode(Encode(%q)) = %q, want %q", s, got, want)
		}
	})
}

// cutsByteRun reports whether a cut after id may fall inside a byte-fallback run (id is a
// <0xXX> token of a decoder that groups them).
func cutsByteRun(tok *Tokenizer, id int32) bool {
	s, ok := tok.TokenString(id)
	return ok && tok.decoder.holdAfter(s)
}
