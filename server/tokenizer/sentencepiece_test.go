package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The expected values in this file come from the tokenizers crate's and the spm_precompiled
// crate's own unit tests (models/unigram/model.rs, models/bpe/model.rs, decoders/*.rs,
// pre_tokenizers/metaspace.rs, spm_precompiled src/tests.rs), or follow from the semantics
// those files define, spelled out per case.

// spTinyMerges are the merges of spTiny, in rank order.
var spTinyMerges = [][2]string{
	{"▁", "t"}, {"h", "e"}, {"▁t", "he"}, {"▁", "a"}, {"i", "n"}, {"▁", "in"}, {"e", "r"},
	{"l", "l"}, {"▁", "he"}, {"ll", "o"}, {"▁he", "llo"}, {"▁", "h"}, {"▁h", "i"},
}

// spTinyJSON is a SentencePiece-style BPE tokenizer.json in TinyLlama's layout ("llama":
// Prepend + Replace normalizer) or transformers 5's ("metaspace": a Metaspace pre-tokenizer
// with prepend_scheme first and split false): <unk> <s> </s>, the 256 byte tokens, ▁ and a-z,
// and the merged tokens of spTinyMerges.
func spTinyJSON(t testing.TB, layout string) []byte {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	add := func(s string) {
		if _, ok := vocab[s]; !ok {
			vocab[s] = len(vocab)
		}
	}
	for b := 0; b < 256; b++ {
		add(byteFallbackToken(byte(b)))
	}
	add("▁")
	for c := 'a'; c <= 'z'; c++ {
		add(string(c))
	}
	var merges [][]string
	for _, m := range spTinyMerges {
		add(m[0] + m[1])
		merges = append(merges, []string{m[0], m[1]})
	}
	doc := map[string]any{
		"version": "1.0",
		"added_tokens": []any{
			map[string]any{"id": 0, "content": "<unk>", "special": true, "normalized": false},
			map[string]any{"id": 1, "content": "<s>", "special": true, "normalized": false},
			map[string]any{"id": 2, "content": "</s>", "special": true, "normalized": false},
		},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":   []any{},
			"special_tokens": map[string]any{
				"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}},
			},
		},
		"model": map[string]any{
			"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
			"vocab": vocab, "merges": merges,
		},
	}
	switch layout {
	case "llama":
		doc["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}}
		doc["decoder"] = llamaDecoder
	case "metaspace":
		doc["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}
		doc["decoder"] = llamaDecoder
	default:
		t.Fatalf("unknown layout %q", layout)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// llamaDecoder is the decoder both layouts declare (transformers 5's LlamaTokenizer writes it
// too): ▁ to space, byte runs to text, one leading space stripped.
var llamaDecoder = map[string]any{"type": "Sequence", "decoders": []any{
	map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
	map[string]any{"type": "ByteFallback"},
	map[string]any{"type": "Fuse"},
	map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
}}

func spTiny(t testing.TB, layout string, config string) *Tokenizer {
	t.Helper()
	var cfg []byte
	if config != "" {
		cfg = []byte(config)
	}
	tok, err := FromBytes(spTinyJSON(t, layout), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// pieces spells ids as their token strings, for readable failures.
func pieces(tok *Tokenizer, ids []int32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i], _ = tok.TokenString(id)
	}
	return out
}

func TestSentencePieceBPE(t *testing.T) {
	llama := spTiny(t, "llama", "")
	meta := spTiny(t, "metaspace", "")
	for _, tc := range []struct {
		text        string
		llama, meta []string
	}{
		// Merges by rank: ▁t, he (twice), ▁the, ..., ll, ▁he, llo, ▁hello.
		{"hello the", []string{"▁hello", "▁the"}, []string{"▁hello", "▁the"}},
		// A leading space: Prepend adds ▁ before the replaced space; Metaspace "first" does
		// not prepend to text that already starts with ▁.
		{" in", []string{"▁", "▁in"}, []string{"▁in"}},
		// Byte fallback: é is not in the vocabulary, its UTF-8 bytes are.
		{"é", []string{"▁", "<0xC3>", "<0xA9>"}, []string{"▁", "<0xC3>", "<0xA9>"}},
		// Text after an added token: the legacy layout normalizes every piece (▁ again),
		// Metaspace "first" prepends only at the start of the original text.
		{"hi<s>the", []string{"▁hi", "<s>", "▁the"}, []string{"▁hi", "<s>", "t", "he"}},
		{"<s>the", []string{"<s>", "▁the"}, []string{"<s>", "t", "he"}},
		// Newline and tab have no piece: bytes.
		{"a\nb", []string{"▁a", "<0x0A>", "b"}, []string{"▁a", "<0x0A>", "b"}},
		{"", nil, nil},
	} {
		if got := pieces(llama, llama.Encode(tc.text)); !slices.Equal(got, tc.llama) {
			t.Errorf("llama layout Encode(%q) = %q, want %q", tc.text, got, tc.llama)
		}
		if got := pieces(meta, meta.Encode(tc.text)); !slices.Equal(got, tc.meta) {
			t.Errorf("metaspace layout Encode(%q) = %q, want %q", tc.text, got, tc.meta)
		}
	}
	// Decoding: Replace ▁→space, bytes joined, one leading space stripped.
	ids := llama.Encode("hello  é\tthe")
	if got := llama.Decode(ids); got != "hello  é\tthe" {
		t.Errorf("llama Decode = %q", got)
	}
	ids = meta.Encode("hello  é\tthe")
	if got := meta.Decode(ids); got != "hello  é\tthe" {
		t.Errorf("metaspace Decode = %q", got)
	}
	// With special tokens: <s> from TemplateProcessing; skip_special_tokens drops it.
	withBOS, err := llama.EncodeWithSpecialTokens("hello")
	if err != nil {
		t.Fatal(err)
	}
	if got := pieces(llama, withBOS); !slices.Equal(got, []string{"<s>", "▁hello"}) {
		t.Errorf("EncodeWithSpecialTokens = %q", got)
	}
	if got := llama.Decode(withBOS); got != "<s> hello" {
		t.Errorf("Decode with <s> = %q, want %q (Strip applies to the fused text's start only)", got, "<s> hello")
	}
	if got := llama.DecodeSkipSpecial(withBOS); got != "hello" {
		t.Errorf("DecodeSkipSpecial = %q", got)
	}
	// A broken byte sequence decodes to one U+FFFD per byte (ByteFallback), not per sequence.
	c3, _ := llama.SpecialID("<0xE6>")
	x97, _ := llama.SpecialID("<0x97>")
	a, _ := llama.SpecialID("a")
	if got := llama.Decode([]int32{a, c3, x97, a}); got != "a\uFFFD\uFFFDa" {
		t.Errorf("Decode of a truncated character = %q, want two U+FFFD", got)
	}
}

func TestAddBOSEOSFromConfig(t *testing.T) {
	// transformers' update_post_processor: either flag present rebuilds [bos] $A [eos].
	for _, tc := range []struct {
		config string
		want   []string
	}{
		{``, []string{"<s>", "▁a"}},
		{`{"bos_token": "<s>", "eos_token": "</s>"}`, []string{"<s>", "▁a"}},
		{`{"add_bos_token": true, "add_eos_token": true, "bos_token": "<s>", "eos_token": "</s>"}`, []string{"<s>", "▁a", "</s>"}},
		{`{"add_bos_token": false, "bos_token": "<s>", "eos_token": "</s>"}`, []string{"▁a"}},
		{`{"add_eos_token": true, "bos_token": "<s>", "eos_token": "</s>"}`, []string{"▁a", "</s>"}},
		{`{"add_bos_token": true, "bos_token": null}`, []string{"▁a"}},
	} {
		tok := spTiny(t, "llama", tc.config)
		ids, err := tok.EncodeWithSpecialTokens("a")
		if err != nil {
			t.Fatal(err)
		}
		if got := pieces(tok, ids); !slices.Equal(got, tc.want) {
			t.Errorf("config %s: %q, want %q", tc.config, got, tc.want)
		}
	}
	if _, err := FromBytes(spTinyJSON(t, "llama"), []byte(`{"add_bos_token": true, "bos_token": "<bos>"}`)); err == nil || !strings.Contains(err.Error(), "bos_token") {
		t.Errorf("a bos_token missing from the vocabulary: %v", err)
	}
}

func TestBPEByteFallbackUpstream(t *testing.T) {
	// models/bpe/model.rs test_bpe_byte_fallback and test_bpe_byte_fallback_newline.
	tok, err := FromBytes([]byte(`{"model":{"type":"BPE","unk_token":"<unk>","byte_fallback":true,"vocab":{"<unk>":0,"<0x61>":1,"<0x0A>":2},"merges":[]}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Without fuse_unk each unknown character is one unk; a byte-fallback character does not
	// release a pending unk (merge_word's `continue`), so "cac" puts the byte first.
	for text, want := range map[string][]int32{"c": {0}, "a": {1}, "\n": {2}, "cc": {0, 0}, "cac": {1, 0, 0}} {
		if got := tok.Encode(text); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
	fused, err := FromBytes([]byte(`{"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"vocab":{"<unk>":0,"<0x61>":1,"b":2},"merges":[]}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]int32{"cc": {0}, "ccbcc": {0, 2, 0}, "cac": {1, 0}} {
		if got := fused.Encode(text); !slices.Equal(got, want) {
			t.Errorf("fuse_unk: Encode(%q) = %v, want %v", text, got, want)
		}
	}
}

func unigramJSON(t testing.TB, pieces [][2]any, byteFallback bool) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": map[string]any{"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": byteFallback}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnigramUpstream(t *testing.T) {
	run := func(name string, vocab [][2]any, byteFallback bool, cases map[string][]string) {
		t.Helper()
		tok, err := FromBytes(unigramJSON(t, vocab, byteFallback), nil)
		if err != nil {
			t.Fatal(err)
		}
		for text, want := range cases {
			if got := pieces(tok, tok.Encode(text)); !slices.Equal(got, want) {
				t.Errorf("%s: Encode(%q) = %q, want %q", name, text, got, want)
			}
		}
	}
	run("test_encode", [][2]any{{"<unk>", 0.0}, {"a", 0.0}, {"b", 0.0}, {"c", 0.0}, {"d", 0.0}, {"cd", 1.0}, {"ab", 2.0}, {"abc", 5.0}, {"abcd", 10.0}}, false,
		map[string][]string{"abcd": {"abcd"}})
	// test_encode2 with fuse_unk (tokenizer.json Unigram models always fuse); a fused unknown
	// run that is not a piece is the unk token.
	run("test_encode2", [][2]any{{"<unk>", 0.0}, {"ab", 0.0}, {"cd", -0.1}, {"abc", -0.2}, {"a", -0.3}, {"b", -0.4}, {"c", -0.5}, {"ABC", -0.5}, {"abcdabcd", 20.0}, {"q", 20.5}, {"r", 20.5}, {"qr", -0.5}}, false,
		map[string][]string{
			"abc":          {"abc"},
			"AB":           {"<unk>"},
			"abcd":         {"ab", "cd"},
			"abcc":         {"abc", "c"},
			"xabcabaabcdd": {"<unk>", "abc", "ab", "a", "ab", "cd", "<unk>"},
			"xyz東京":        {"<unk>"},
			"ABC":          {"ABC"},
			"abABCcd":      {"ab", "ABC", "cd"},
			"ababcdabcdcd": {"ab", "abcdabcd", "cd"},
			"abqrcd":       {"ab", "q", "r", "cd"},
		})
	// test_unigram_bytefallback.
	run("test_unigram_bytefallback", [][2]any{{"<unk>", 0.0}, {"<0xC3>", -0.01}, {"<0xA9>", -0.03}}, true,
		map[string][]string{"é": {"<0xC3>", "<0xA9>"}, "?é": {"<unk>"}})
}

// recordingModel captures the words the pre-tokenizers hand to the model.
type recordingModel struct {
	*bpeModel
	words *[]string
}

func (r recordingModel) tokenizeWord(w string, out []int32) []int32 {
	*r.words = append(*r.words, w)
	return out
}

func preTokenized(t *testing.T, tj string, text string) []string {
	t.Helper()
	tok, err := FromBytes([]byte(tj), nil)
	if err != nil {
		t.Fatal(err)
	}
	var words []string
	tok.model = recordingModel{tok.model.(*bpeModel), &words}
	// Added tokens are not words; mark where they were.
	for _, id := range tok.Encode(text) {
		s, _ := tok.TokenString(id)
		words = append(words, "#"+s)
	}
	return words
}

func TestMetaspacePreTokenizerUpstream(t *testing.T) {
	withMeta := func(scheme string, split bool) string {
		return fmt.Sprintf(`{"added_tokens":[{"id":0,"content":"<s>","special":true,"normalized":false}],
			"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":%q,"split":%v},
			"model":{"type":"BPE","vocab":{"<s>":0},"merges":[]}}`, scheme, split)
	}
	// The added-token ids are appended after the words by preTokenized ("#<s>"); the words
	// themselves are in order.
	for _, tc := range []struct {
		scheme string
		split  bool
		text   string
		want   []string
	}{
		{"always", true, "Hey friend!", []string{"▁Hey", "▁friend!"}},
		{"always", true, "Hey   friend!", []string{"▁Hey", "▁", "▁", "▁friend!"}},
		{"first", false, "Hey my friend <s>how▁are you", []string{"▁Hey▁my▁friend▁", "how▁are▁you", "#<s>"}},
		{"first", false, " Hey <s>how", []string{"▁Hey▁", "how", "#<s>"}},
		{"first", false, " Hey <s>how <s>are <s> you", []string{"▁Hey▁", "how▁", "are▁", "▁you", "#<s>", "#<s>", "#<s>"}},
		{"always", false, "a<s>b", []string{"▁a", "▁b", "#<s>"}},
		{"never", true, "a b", []string{"a", "▁b"}},
		{"always", true, "", nil},
	} {
		if got := preTokenized(t, withMeta(tc.scheme, tc.split), tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("Metaspace(%s, split=%v) on %q: %q, want %q", tc.scheme, tc.split, tc.text, got, tc.want)
		}
	}
	// WhitespaceSplit then Metaspace(always), T5's pre-tokenizer.
	t5 := `{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}]},
		"model":{"type":"BPE","vocab":{},"merges":[]}}`
	if got, want := preTokenized(t, t5, "  Hey\tmy \n friend  "), []string{"▁Hey", "▁my", "▁friend"}; !slices.Equal(got, want) {
		t.Errorf("WhitespaceSplit+Metaspace: %q, want %q", got, want)
	}
	// Metaspace "first" after WhitespaceSplit: a word that does not begin the original text
	// is not prepended.
	first := strings.Replace(t5, `"always"`, `"first"`, 1)
	if got, want := preTokenized(t, first, "Hey my"), []string{"▁Hey", "my"}; !slices.Equal(got, want) {
		t.Errorf("WhitespaceSplit+Metaspace(first): %q, want %q", got, want)
	}
	if got, want := preTokenized(t, first, " Hey"), []string{"Hey"}; !slices.Equal(got, want) {
		t.Errorf("WhitespaceSplit+Metaspace(first) after leading space: %q, want %q", got, want)
	}
}

func TestDecoderStepsUpstream(t *testing.T) {
	chain := func(steps ...string) *chainDecoder {
		t.Helper()
		d, err := parseDecoder([]byte(`{"type":"Sequence","decoders":[` + strings.Join(steps, ",") + `]}`))
		if err != nil {
			t.Fatal(err)
		}
		return d.(*chainDecoder)
	}
	apply := func(d *chainDecoder, toks ...string) []string {
		st := &decodeState{first: true, final: true, stripped: make([]int, d.nStrip), started: make([]bool, d.nStrip)}
		cur := slices.Clone(toks)
		for _, s := range d.steps {
			cur = s.apply(cur, st)
		}
		return cur
	}
	bf := chain(`{"type":"ByteFallback"}`)
	for _, tc := range []struct{ in, want []string }{
		{[]string{"Hey", "friend!"}, []string{"Hey", "friend!"}},
		{[]string{"<0x61>"}, []string{"a"}},
		{[]string{"<0xE5>"}, []string{"�"}},
		{[]string{"<0xE5>", "<0x8f>"}, []string{"�", "�"}},
		{[]string{"<0xE5>", "<0x8f>", "<0xab>"}, []string{"叫"}},
		{[]string{"<0xE5>", "<0x8f>", "<0xab>", "a"}, []string{"叫", "a"}},
		{[]string{"<0xE5>", "<0x8f>", "a"}, []string{"�", "�", "a"}},
	} {
		if got := apply(bf, tc.in...); !slices.Equal(got, tc.want) {
			t.Errorf("ByteFallback %q = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := apply(chain(`{"type":"Fuse"}`), "Hey", " friend!"); !slices.Equal(got, []string{"Hey friend!"}) {
		t.Errorf("Fuse = %q", got)
	}
	if got := apply(chain(`{"type":"Strip","content":"H","start":1,"stop":0}`), "Hey", " friend!", "HHH"); !slices.Equal(got, []string{"ey", " friend!", "HH"}) {
		t.Errorf("Strip H 1 0 = %q", got)
	}
	if got := apply(chain(`{"type":"Strip","content":"y","start":0,"stop":1}`), "Hey", " friend!"); !slices.Equal(got, []string{"He", " friend!"}) {
		t.Errorf("Strip y 0 1 = %q", got)
	}
	if got := apply(chain(`{"type":"Metaspace","replacement":"▁","prepend_scheme":"always"}`), "▁Hey", "▁friend!"); !slices.Equal(got, []string{"Hey", " friend!"}) {
		t.Errorf("Metaspace always = %q", got)
	}
	if got := apply(chain(`{"type":"Metaspace","replacement":"▁","prepend_scheme":"never"}`), "▁Hey", "▁friend!"); !slices.Equal(got, []string{" Hey", " friend!"}) {
		t.Errorf("Metaspace never = %q", got)
	}
	if got := apply(chain(`{"type":"Replace","pattern":{"String":"▁"},"content":" "}`), "▁a▁b", "c"); !slices.Equal(got, []string{" a b", "c"}) {
		t.Errorf("Replace = %q", got)
	}
}

func nmtNFKC(t testing.TB) *precompiledNormalizer {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "nmt_nfkc.bin"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePrecompiledCharsmap(raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrecompiledUpstream(t *testing.T) {
	p := nmtNFKC(t)
	// spm_precompiled src/tests.rs.
	if v, ok := p.firstPrefixValue("\uFB01"); !ok || v != 2130 || p.normalized[2130:2133] != "fi\x00" {
		t.Errorf("ﬁ: value %d %v", v, ok)
	}
	if _, ok := p.firstPrefixValue(" "); ok {
		t.Error("space has a replacement")
	}
	if v, ok := p.firstPrefixValue("𝔾"); !ok || v != 1786 {
		t.Errorf("𝔾: value %d %v", v, ok)
	}
	for in, want := range map[string]string{"𝔾": "G", "𝕠": "o", "\u200d": " "} {
		if got, ok := p.transform(in); !ok || got != want {
			t.Errorf("transform(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"เขาไม่ได้พูดสักคำ", "เขาไม\u0e48ได\u0e49พ\u0e39ดส\u0e31กค\u0e4dา"}, // test_precompiled_failure_mode
		{"ड़ी दुख", "ड\u093cी द\u0941ख"},                                     // test_precompiled_hindi
		{"\u0627\u0653", "آ"}, // test_precompiled_multi_char_replace_bug: one grapheme of 2 chars
		{"plain ascii", "plain ascii"},
	} {
		if got := p.normalize(tc.in); got != tc.want {
			t.Errorf("normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Corrupt charsmaps are errors, never panics.
	for _, raw := range [][]byte{nil, {1, 0, 0, 0}, {8, 0, 0, 0, 1, 2, 3, 4}, {4, 0, 0, 0, 0, 0, 0, 0, 0xff}} {
		if _, err := parsePrecompiledCharsmap(raw); err == nil {
			t.Errorf("charsmap %v loaded", raw)
		}
	}
}

func TestUnigramPadTruncate(t *testing.T) {
	doc := map[string]any{
		"model":          map[string]any{"type": "Unigram", "unk_id": 2, "vocab": [][2]any{{"<pad>", 0.0}, {"</s>", 0.0}, {"<unk>", 0.0}, {"▁a", -1.0}, {"▁b", -1.0}}},
		"added_tokens":   []any{map[string]any{"id": 0, "content": "<pad>", "special": true}, map[string]any{"id": 1, "content": "</s>", "special": true}},
		"pre_tokenizer":  map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"decoder":        map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"post_processor": map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "</s>", "type_id": 0}}}, "special_tokens": map[string]any{"</s>": map[string]any{"id": "</s>", "ids": []int{1}, "tokens": []string{"</s>"}}}},
		"truncation":     map[string]any{"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0},
		"padding":        map[string]any{"strategy": map[string]any{"Fixed": 4}, "direction": "Right", "pad_to_multiple_of": nil, "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"},
	}
	b, _ := json.Marshal(doc)
	tok, err := FromBytes(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]int32{"a": {3, 1, 0, 0}, "a b": {3, 4, 1, 0}, "a b a b": {3, 4, 3, 1}, "": {1, 0, 0, 0}} {
		got, mask, err := tok.EncodeDeclared(text, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("EncodeDeclared(%q) = %v, want %v", text, got, want)
		}
		for i, id := range got {
			if (mask[i] == 0) != (id == 0) {
				t.Errorf("EncodeDeclared(%q) mask %v for ids %v", text, mask, got)
			}
		}
	}
	// transformers pads and truncates only when asked.
	if got, _ := tok.EncodeWithSpecialTokens("a b a b"); !slices.Equal(got, []int32{3, 4, 3, 4, 1}) {
		t.Errorf("EncodeWithSpecialTokens = %v", got)
	}
	if got := tok.DecodeSkipSpecial([]int32{3, 4, 1, 0}); got != "a b" {
		t.Errorf("DecodeSkipSpecial = %q", got)
	}
}

// streamAll decodes ids one at a time, checking that every piece is valid UTF-8.
func streamChecked(t testing.TB, tok *Tokenizer, ids []int32, skipSpecial bool) string {
	t.Helper()
	d := tok.NewStreamDecoder()
	if skipSpecial {
		d.SkipSpecialTokens()
	}
	var b strings.Builder
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("stream emitted invalid UTF-8 %q at id %d of %v", s, id, ids)
		}
		b.WriteString(s)
	}
	s := d.Flush()
	if !utf8.ValidString(s) {
		t.Fatalf("stream flush emitted invalid UTF-8 %q", s)
	}
	b.WriteString(s)
	return b.String()
}

func TestSentencePieceStream(t *testing.T) {
	texts := []string{"hello the", " in", "é日本😀", "a\nb\tc", "  lead", "trail  ", "<s>x</s>y", ""}
	for _, layout := range []string{"llama", "metaspace"} {
		tok := spTiny(t, layout, "")
		for _, text := range texts {
			ids, err := tok.EncodeWithSpecialTokens(text)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := streamChecked(t, tok, ids, false), tok.Decode(ids); got != want {
				t.Errorf("%s: stream of %q = %q, Decode = %q", layout, text, got, want)
			}
			if got, want := streamChecked(t, tok, ids, true), tok.DecodeSkipSpecial(ids); got != want {
				t.Errorf("%s: skip-special stream of %q = %q, DecodeSkipSpecial = %q", layout, text, got, want)
			}
		}
		// Broken byte runs: held until the run ends, then one U+FFFD per byte.
		e6, _ := tok.SpecialID("<0xE6>")
		x97, _ := tok.SpecialID("<0x97>")
		a5, _ := tok.SpecialID("<0xA5>")
		a, _ := tok.SpecialID("a")
		for _, ids := range [][]int32{{e6, x97, a}, {e6, x97, a5, e6}, {a, e6}, {e6, x97, a5, a}} {
			if got, want := streamChecked(t, tok, ids, false), tok.Decode(ids); got != want {
				t.Errorf("%s: stream of %v = %q, Decode = %q", layout, ids, got, want)
			}
		}
	}
}

func TestTokenizerClassLlama(t *testing.T) {
	// transformers 5's LlamaTokenizer rebuilds the pipeline: Metaspace(first) unless legacy,
	// whatever layout tokenizer.json has.
	for _, tc := range []struct {
		config string
		want   []string
	}{
		{``, []string{"▁hi", "<s>", "▁the"}}, // tokenizer.json as written (Prepend+Replace)
		{`{"tokenizer_class": "LlamaTokenizer"}`, []string{"▁hi", "<s>", "t", "he"}},
		{`{"tokenizer_class": "LlamaTokenizerFast", "legacy": true}`, []string{"▁hi", "<s>", "▁the"}},
		{`{"tokenizer_class": "LlamaTokenizer", "add_prefix_space": false}`, []string{"h", "i", "<s>", "t", "he"}},
		{`{"tokenizer_class": "PreTrainedTokenizerFast"}`, []string{"▁hi", "<s>", "▁the"}},
	} {
		tok := spTiny(t, "llama", tc.config)
		if got := pieces(tok, tok.Encode("hi<s>the")); !slices.Equal(got, tc.want) {
			t.Errorf("config %s: %q, want %q", tc.config, got, tc.want)
		}
		ids := tok.Encode("hi the")
		if got := tok.Decode(ids); got != "hi the" {
			t.Errorf("config %s: Decode = %q", tc.config, got)
		}
	}
}

func TestLoadChatTemplateJinja(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", string(spTinyJSON(t, "llama")))
	write("tokenizer_config.json", `{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "config {{ messages[0].content }}"}`)
	write("chat_template.jinja", "{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]")
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tok.ApplyChatTemplate([]Message{{"role": "user", "content": "hi"}}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got != "<s>[INST] hi [/INST]" {
		t.Errorf("chat_template.jinja not used: %q", got)
	}
}

func TestStripAfterFuseStream(t *testing.T) {
	// A Strip after Fuse cuts the start and end of the whole text, however the stream splits
	// it: start 2 spans two tokens here, and stop 1 holds the text back until Flush.
	for _, tc := range []struct {
		start, stop int
		ids         []int32
		want        string
	}{
		{2, 0, []int32{0, 1}, "a"},
		{2, 0, []int32{0, 0, 1}, " a"},
		{1, 0, []int32{2, 0, 1}, "b  a"},
		{0, 1, []int32{1, 0}, " a"},
		{1, 1, []int32{0, 1, 0, 2}, " a b"},
	} {
		doc := fmt.Sprintf(`{"model":{"type":"BPE","vocab":{"▁":0,"▁a":1,"b":2},"merges":[]},
			"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"Fuse"},{"type":"Strip","content":" ","start":%d,"stop":%d}]}}`, tc.start, tc.stop)
		tok, err := FromBytes([]byte(doc), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Decode(tc.ids); got != tc.want {
			t.Errorf("Strip(%d, %d) Decode(%v) = %q, want %q", tc.start, tc.stop, tc.ids, got, tc.want)
		}
		if got := streamChecked(t, tok, tc.ids, false); got != tc.want {
			t.Errorf("Strip(%d, %d) stream of %v = %q, want %q", tc.start, tc.stop, tc.ids, got, tc.want)
		}
	}
}
