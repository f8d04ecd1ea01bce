package tokenizer

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/modelqual/modelqual/fixtures"
)

// FuzzVocabMerges feeds arbitrary vocab.json, merges.txt and added-token bytes to the
// vocab.json + merges.txt loader of CLIP-style folders: it must refuse with an error or build a
// tokenizer that encodes, pads and decodes without panicking.
func FuzzVocabMerges(f *testing.F) {
	f.Add([]byte(`{"a":0,"b":1,"ab":2,"<|endoftext|>":3,"<|startoftext|>":4}`), []byte("#version: 0.2\na b\n"), []byte(`{"3":{"content":"<|endoftext|>","special":true}}`))
	f.Add([]byte(`{"a</w>":0,"<|endoftext|>":1,"<|startoftext|>":2}`), []byte("a </w>\n"), []byte(`{}`))
	f.Add([]byte(`{"#":0,"#</w>":1,"##</w>":2,"<|endoftext|>":3,"<|startoftext|>":4}`), []byte("# #</w>\r\n\n"), []byte(`{"99999999":{"content":"x"}}`))
	f.Add([]byte(`[]`), []byte("a b c"), []byte(`[`))
	f.Fuzz(func(t *testing.T, vocab, merges, added []byte) {
		var dec map[string]json.RawMessage
		if json.Unmarshal(added, &dec) != nil {
			dec = nil
		}
		tj, err := vocabMergesJSON(vocab, merges, dec)
		if err != nil {
			return
		}
		tok, err := FromBytes(tj, []byte(`{"tokenizer_class":"CLIPTokenizer","pad_token":"<|endoftext|>"}`))
		if err != nil {
			return
		}
		ids := tok.Encode("a ab ## <|endoftext|> héllo")
		tok.Decode(ids)
		if ids, mask, err := tok.EncodePadded("ab a b", 8); err == nil && (len(ids) != 8 || len(mask) != 8) {
			t.Fatalf("EncodePadded gave %d ids and %d mask entries, want 8", len(ids), len(mask))
		}
	})
}

var fluxFuzzTokenizers = sync.OnceValues(func() ([]*Tokenizer, error) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		return nil, err
	}
	var toks []*Tokenizer
	for _, d := range []string{clipDir, t5Dir} {
		tok, err := Load(filepath.Join(root, "fixtures", "tokenizers", d))
		if err != nil {
			return nil, err
		}
		toks = append(toks, tok)
	}
	return toks, nil
})

// FuzzFluxEncode runs the real CLIP and T5 tokenizers on arbitrary text: every id is in the
// vocabulary, EncodePadded always returns exactly max_length ids that begin with the unpadded
// encoding's prefix and end the real part with the tokenizer's last special token, and decoding
// returns valid UTF-8.
func FuzzFluxEncode(f *testing.F) {
	for _, s := range []string{"", " ", "a photo of a cat", "İSTANBUL ΣΟΦΟΣ", "ﬁ ＡＢＣ ①", "\x00\t\n\r", "👩\u200d👩\u200d👧", "<|startoftext|><|endoftext|></s><extra_id_0>", "e\u0301\u0301\u0301", "\xff\xfe invalid"} {
		f.Add(s, uint8(16))
	}
	f.Fuzz(func(t *testing.T, text string, n uint8) {
		toks, err := fluxFuzzTokenizers()
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range toks {
			maxLen := int(n%80) + 2
			ids := tok.Encode(text)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("id %d outside the vocabulary for %q", id, text)
				}
			}
			full, err := tok.EncodeWithSpecialTokens(text)
			if err != nil {
				t.Fatal(err)
			}
			padded, mask, err := tok.EncodePadded(text, maxLen)
			if err != nil {
				t.Fatal(err)
			}
			if len(padded) != maxLen || len(mask) != maxLen {
				t.Fatalf("EncodePadded(%q, %d): %d ids, %d mask", text, maxLen, len(padded), len(mask))
			}
			real := 0
			for _, m := range mask {
				real += int(m)
			}
			if real != min(len(full), maxLen) || padded[real-1] != full[len(full)-1] {
				t.Fatalf("EncodePadded(%q, %d) = %v mask %v; unpadded %v", text, maxLen, padded, mask, full)
			}
			if k := real - 1; k > 0 && !slices.Equal(padded[:k], full[:k]) {
				t.Fatalf("EncodePadded(%q, %d) = %v does not start as %v", text, maxLen, padded, full)
			}
			if s := tok.Decode(full); !utf8.ValidString(s) {
				t.Fatalf("Decode gave invalid UTF-8 %q", s)
			}
		}
	})
}
