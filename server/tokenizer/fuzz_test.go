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
		`{"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["a",-1],["<0x62>",-2]],"byte_fallback":true},"normalizer":{"type":"Precompiled","precompiled_charsmap":"CAAAAAEAAAACAAAA"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true}]}}`,
		`{"model":{"type":"BPE","byte_fallback":true,"fuse_unk":true,"unk_token":"<unk>","vocab":{"<unk>":0,"<0x61>":1,"▁":2},"merges":[]},"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":1}]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<s>":{"ids":[0]}}},"padding":{"strategy":{"Fixed":5},"pad_id":0},"truncation":{"max_length":3}}`,
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
		if ids, err := tok.EncodeWithSpecialTokens(" a  b "); err == nil {
			d := tok.NewStreamDecoder()
			for _, id := range ids {
				d.Add(id)
			}
			d.Flush()
		}
		tok.EncodeDeclared("a b", true)
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
