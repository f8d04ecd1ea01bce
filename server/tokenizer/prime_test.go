package tokenizer

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"
)

// primedStream decodes ids through a stream primed with context, as the server decodes a
// completion after its prompt, checking that every delta is valid UTF-8.
func primedStream(t testing.TB, tok *Tokenizer, context, ids []int32, skipSpecial bool) string {
	t.Helper()
	d := tok.NewStreamDecoder()
	if skipSpecial {
		d.SkipSpecialTokens()
	}
	d.Prime(context)
	var b strings.Builder
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("primed stream emitted invalid UTF-8 %q at id %d of %v (context %v)", s, id, ids, context)
		}
		b.WriteString(s)
	}
	s := d.Flush()
	if !utf8.ValidString(s) {
		t.Fatalf("primed stream flush emitted invalid UTF-8 %q", s)
	}
	b.WriteString(s)
	return b.String()
}

// TestPrimedStreamGolden holds the completion text of SentencePiece-style tokenizers to
// transformers: for every golden string whose ids with special tokens are a prefix P (the
// BOS that TemplateProcessing adds) followed by its plain ids, tokenizers decoded P + ids to
// `decoded` and P alone (the golden's "" string) to decoded(""); the text the ids add after P
// is `decoded` less that prefix, and a stream primed with P must return exactly it, with every
// delta valid UTF-8 (the golden strings hold emoji, CJK and accents that the byte fallback
// spells as <0xXX> runs). This is the case the server meets when a prompt is followed by the
// generation: "▁Hello" after "<s>" reads " Hello" (Decode of the ids alone strips that space,
// which is what an unprimed stream returned). With skip_special_tokens the skipped prefix adds
// no text and no position, so the stream returns decoded_skip.
func TestPrimedStreamGolden(t *testing.T) {
	g := loadSPGolden(t)
	root := repoRoot(t)
	names := make([]string, 0, len(g.Tokenizers))
	for n := range g.Tokenizers {
		names = append(names, n)
	}
	sort.Strings(names)
	checked, spaced := 0, 0
	for _, name := range names {
		rec := g.Tokenizers[name]
		t.Run(name, func(t *testing.T) {
			var prefixText string
			var prefix []int32
			for _, e := range rec.Strings {
				if e.Text == "" {
					prefix, prefixText = e.IDsSpecial, e.Decoded
				}
			}
			n := len(prefix)
			leads := func(e spGoldenString) bool {
				return len(e.IDsSpecial) == n+len(e.IDs) && slices.Equal(e.IDsSpecial[:n], prefix) && slices.Equal(e.IDsSpecial[n:], e.IDs)
			}
			if n == 0 || !slices.ContainsFunc(rec.Strings, func(e spGoldenString) bool { return len(e.IDs) > 0 && leads(e) }) {
				t.Skipf("%s adds no special token before the ids (its golden \"\" encodes to %v, appended): nothing precedes them to prime with", name, prefix)
			}
			tok := rawTokenizerJSON(t, filepath.Join(root, "fixtures", "tokenizers", name))
			for _, e := range rec.Strings {
				if !leads(e) {
					continue // an appended special token (EOS) too: not prompt + completion
				}
				if !strings.HasPrefix(e.Decoded, prefixText) {
					t.Fatalf("golden: decode(%v) = %q does not start with decode(%v) = %q", e.IDsSpecial, e.Decoded, prefix, prefixText)
				}
				want := e.Decoded[len(prefixText):]
				if got := primedStream(t, tok, prefix, e.IDs, false); got != want {
					t.Errorf("%q: stream of %v primed with %v = %q, want %q (transformers' decode of both, less the prefix's)", e.Text, e.IDs, prefix, got, want)
				}
				if got := primedStream(t, tok, prefix, e.IDs, true); got != e.DecodedSkip {
					t.Errorf("%q: skip-special stream of %v primed with %v = %q, want %q (decoded_skip)", e.Text, e.IDs, prefix, got, e.DecodedSkip)
				}
				checked++
				if want != e.DecodedPlain {
					spaced++ // the context changes the text: the case the fix is about
				}
			}
		})
	}
	if checked < 20 || spaced < 5 {
		t.Fatalf("only %d golden strings checked, %d of them read otherwise in context; the golden no longer exercises primed decoding", checked, spaced)
	}
}

// TestPrimedStreamLlamaWords: the case users see, spelt out on the small test vocabulary
// (lowercase letters and a few merges). A model that continues "the capital of france is"
// writes the pieces of "▁paris" (what the normalizer makes of the word); in context they read
// " paris", for both SentencePiece layouts (Strip decoder; Metaspace decoder), while the same
// ids as a sequence of their own read "paris". A context whose tokens are all skipped
// (skip_special_tokens and a lone <s>) leaves the sequence start where it was.
func TestPrimedStreamLlamaWords(t *testing.T) {
	for _, layout := range []string{"llama", "metaspace"} {
		tok := spTiny(t, layout, "")
		prompt := tok.Encode("the capital of france is")
		gen := tok.Encode("paris")
		if p, _ := tok.TokenString(gen[0]); !strings.HasPrefix(p, "▁") {
			t.Fatalf("%s: the first piece of \"paris\" is %q; the test needs a piece with a leading ▁", layout, p)
		}
		if got := primedStream(t, tok, prompt, gen, false); got != " paris" {
			t.Errorf("%s: completion %q after %q = %q, want \" paris\"", layout, pieces(tok, gen), pieces(tok, prompt), got)
		}
		if got := primedStream(t, tok, nil, gen, false); got != "paris" {
			t.Errorf("%s: unprimed stream of %q = %q, want \"paris\" (a sequence's own start)", layout, pieces(tok, gen), got)
		}
		if layout == "llama" {
			// Prompts of spaces alone: the Strip takes one space off the prompt's text, none off
			// the completion's (decode("▁▁▁paris") = "  paris" after decode("▁▁") = " ").
			for _, p := range []string{" ", "  ", "   x"} {
				if got := primedStream(t, tok, tok.Encode(p), gen, false); got != " paris" {
					t.Errorf("%s: completion %q after %q = %q, want \" paris\"", layout, pieces(tok, gen), pieces(tok, tok.Encode(p)), got)
				}
			}
		}
		if got := primedStream(t, tok, []int32{1}, gen, true); got != "paris" {
			t.Errorf("%s: skip-special stream of %q after a skipped <s> = %q, want \"paris\"", layout, pieces(tok, gen), got)
		}
		if got := primedStream(t, tok, []int32{1}, gen, false); got != " paris" {
			t.Errorf("%s: stream of %q after <s> = %q, want \" paris\" (decode(<s>▁paris) = \"<s> paris\")", layout, pieces(tok, gen), got)
		}
	}
}

// TestPrimedStreamByteLevelUnchanged: byte-level BPE (GPT-2, Qwen) decodes the same wherever
// a token stands, so priming changes nothing: the primed stream of every golden string's ids
// equals transformers' decode of those ids alone, after any context.
func TestPrimedStreamByteLevelUnchanged(t *testing.T) {
	g := loadGolden(t)
	for _, fam := range []struct {
		name  string
		cases []goldenEncode
	}{{"gpt2", g.GPT2}, {"qwen3", g.Qwen3}} {
		tok := fixtureTokenizer(t, fam.name)
		context := tok.Encode("The capital of France is")
		for _, c := range fam.cases {
			if got := primedStream(t, tok, context, c.IDs, false); got != c.Decoded {
				t.Errorf("%s: stream of %v primed with %v = %q, want %q (transformers' decode)", fam.name, c.IDs, context, got, c.Decoded)
			}
		}
	}
}
