package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode: encoding never panics, and decoding gives the text back (NFC-normalized for
// Qwen3, whose normalizer is NFC; unchanged for GPT-2).
func FuzzEncode(f *testing.F) {
	for _, s := range unicodeCorpus {
		f.Add(s)
	}
	qwen := fixtureTokenizer(f, "qwen3")
	gpt2 := fixtureTokenizer(f, "gpt2")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			qwen.Encode(s) // must not panic; round trip is only defined for valid text
			gpt2.Encode(s)
			return
		}
		if got, want := qwen.Decode(qwen.Encode(s)), norm.NFC.String(s); got != want {
			t.Fatalf("qwen3: decode(encode(%q)) = %q, want %q", s, got, want)
		}
		if got := gpt2.Decode(gpt2.Encode(s)); got != s {
			t.Fatalf("gpt2: decode(encode(%q)) = %q", s, got)
		}
	})
}

// FuzzLoad: malformed tokenizer.json is an error, never a panic. The seeds are small valid
// and broken files (testdata/fuzz/FuzzLoad holds more).
func FuzzLoad(f *testing.F) {
	seeds := []string{
		tinyTokenizerJSON,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"added_tokens":[{"id":3,"content":"<x>","special":true}]}`,
		`{"model":{"type":"WordPiece","vocab":{}}}`,
		`{"model":{"vocab":{"a":-1},"merges":[]}}`,
		`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?!"},"behavior":"Isolated"},"model":{"vocab":{},"merges":[]}}`,
		`{"model":{"vocab":{"a":0},"merges":["a"]}}`,
		`[`, `{"model":`, `{"model":{"vocab":{"\ud800":0},"merges":[]}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := FromBytes(data, nil)
		if err != nil {
			return
		}
		// A file that loads must also encode and decode without panicking.
		ids := tok.Encode("ab <x> héllo")
		tok.Decode(ids)
		tok.Decode([]int32{-1, 0, 1 << 30})
	})
}

// tinyTokenizerJSON is a complete byte-level BPE tokenizer small enough to read: the 256
// byte characters, two merges and one special token.
var tinyTokenizerJSON = func() string {
	b, err := os.ReadFile(filepath.Join("testdata", "tiny_tokenizer.json"))
	if err != nil {
		panic(err)
	}
	return string(b)
}()
