package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FLUX's two tokenizers on the real files (fixtures/tokenizers/clip-vit-large-patch14 and
// t5-v1_1-xxl; fixtures/PROVENANCE.md). The expected ids here come from references that share
// no code with this package: CLIP's from OpenAI's own SimpleTokenizer (github openai/CLIP,
// clip/simple_tokenizer.py, run on its bpe_simple_vocab_16e6.txt.gz, whose vocabulary equals
// vocab.json), T5's from an exhaustive best-score segmentation over tokenizer.json's pieces
// written in Python for this test (every substring of "▁"+word tried; the texts are ASCII, which
// T5's charsmap leaves unchanged). transformers' own ids are in flux_golden_test.go.

const (
	clipDir = "clip-vit-large-patch14"
	t5Dir   = "t5-v1_1-xxl"
	clipBOS = 49406
	clipEOS = 49407 // also CLIP's pad and unk token
)

var clipKnown = []struct {
	text string
	ids  []int32
}{
	{"a photo of a cat", []int32{320, 1125, 539, 320, 2368}},
	{"A cat holding a sign that says hello world", []int32{320, 2368, 5050, 320, 2292, 682, 1563, 3306, 1002}},
	{"Hello World!", []int32{3306, 1002, 256}},
	{"it's, I'M, they'RE", []int32{585, 568, 267, 328, 880, 267, 889, 982}},
	{"numbers 12345 and 3.14", []int32{6121, 272, 273, 274, 275, 276, 537, 274, 269, 272, 275}},
	{"punctuation!!! ??? ...", []int32{47051, 995, 3824, 678}},
	{"  many     spaces\tand\nlines  ", []int32{1346, 9006, 537, 3418}},
	{"supercalifragilisticexpialidocious", []int32{1642, 2857, 13093, 2076, 5868, 26850, 835, 639, 38466}},
	{"café naïve", []int32{15304, 1097, 35689, 563}},
	{"日本語", []int32{39121, 44353, 34002, 508}},
	{"emoji 😀🎉", []int32{16327, 12832, 3986}},
	{"#hashtag ## @user", []int32{258, 9238, 15483, 287, 7031}},
}

var t5Known = []struct {
	text string
	ids  []int32 // with the </s> T5 appends
}{
	{"Hello world", []int32{8774, 296, 1}},
	{"a photo of a cat", []int32{3, 9, 1202, 13, 3, 9, 1712, 1}},
	{"A cat holding a sign that says hello world", []int32{71, 1712, 3609, 3, 9, 1320, 24, 845, 21820, 296, 1}},
	{"numbers 12345 and 3.14159", []int32{2302, 3, 14574, 2128, 11, 1877, 2534, 27904, 1}},
	{"supercalifragilisticexpialidocious", []int32{1355, 15534, 20791, 173, 3040, 994, 102, 23, 4288, 7171, 2936, 1}},
}

func fixtureDir(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(repoRoot(t), "fixtures", "tokenizers", name)
}

// clipLoadings are the ways a user gets CLIP's tokenizer: the folder (tokenizer.json and the
// CLIPTokenizer class), the folder without tokenizer.json (vocab.json + merges.txt, as FLUX's
// tokenizer/ ships), and tokenizer.json alone (the tokenizers library's pipeline as written).
func clipLoadings(t testing.TB) map[string]*Tokenizer {
	t.Helper()
	dir := fixtureDir(t, clipDir)
	auto, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	for _, f := range []string{"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vm, err := Load(tmp)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*Tokenizer{"tokenizer.json+class": auto, "vocab.json+merges.txt": vm, "tokenizer.json alone": rawTokenizerJSON(t, dir)}
}

// clipMismatches lists where tok disagrees with clipKnown (BOS/EOS added).
func clipMismatches(tok *Tokenizer) []string {
	var bad []string
	for _, c := range clipKnown {
		got, err := tok.EncodeWithSpecialTokens(c.text)
		want := append(append([]int32{clipBOS}, c.ids...), clipEOS)
		if err != nil || !slices.Equal(got, want) {
			bad = append(bad, c.text)
		}
	}
	return bad
}

func TestCLIPKnownIDs(t *testing.T) {
	for name, tok := range clipLoadings(t) {
		t.Run(name, func(t *testing.T) {
			for _, c := range clipKnown {
				if got := tok.Encode(c.text); !slices.Equal(got, c.ids) {
					t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
				}
			}
			if bad := clipMismatches(tok); len(bad) > 0 {
				t.Errorf("with special tokens, wrong for %q", bad)
			}
			if tok.VocabSize() != 49408 {
				t.Errorf("VocabSize = %d, want 49408", tok.VocabSize())
			}
			if s, _ := tok.TokenString(320); s != "a</w>" {
				t.Errorf("TokenString(320) = %q, want a</w>", s)
			}
		})
	}
}

// TestCLIPPlantedDefects shows that the known-ids check catches each CLIP-specific rule when
// it is broken: the word-end suffix, lower-casing, and the whitespace clean-up.
func TestCLIPPlantedDefects(t *testing.T) {
	plants := map[string]func(tok *Tokenizer){
		"no </w> suffix": func(tok *Tokenizer) {
			m := tok.model.(*bpeModel)
			m.suffix = ""
			m.cache.init()
		},
		"no lower-casing": func(tok *Tokenizer) {
			tok.normalizer = tok.normalizer.(normalizerSeq)[:2]
		},
		"whitespace kept as words": func(tok *Tokenizer) {
			tok.pre[0].(*splitPre).behavior = behaviorIsolated
		},
	}
	for name, plant := range plants {
		tok, err := Load(fixtureDir(t, clipDir))
		if err != nil {
			t.Fatal(err)
		}
		plant(tok)
		if bad := clipMismatches(tok); len(bad) == 0 {
			t.Errorf("planted defect %q went unnoticed by the known-ids check", name)
		}
	}
}

func TestCLIPPaddedAndDecoded(t *testing.T) {
	tok, err := Load(fixtureDir(t, clipDir))
	if err != nil {
		t.Fatal(err)
	}
	ids, mask, err := tok.EncodePadded("a photo of a cat", 77)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]int32{clipBOS}, clipKnown[0].ids...), clipEOS)
	if len(ids) != 77 || !slices.Equal(ids[:len(want)], want) {
		t.Fatalf("EncodePadded = %v, want %v then padding to 77", ids, want)
	}
	for i := len(want); i < 77; i++ {
		if ids[i] != clipEOS || mask[i] != 0 {
			t.Fatalf("position %d: id %d mask %d, want pad %d mask 0", i, ids[i], mask[i], clipEOS)
		}
	}
	for i := range want {
		if mask[i] != 1 {
			t.Fatalf("mask[%d] = 0 on a real token", i)
		}
	}
	// 100 words: truncated to BOS + 75 + EOS, all real.
	long := strings.Repeat("cat ", 100)
	ids, mask, err = tok.EncodePadded(long, 77)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 77 || ids[0] != clipBOS || ids[76] != clipEOS || ids[75] != 2368 || slices.Contains(mask, 0) {
		t.Fatalf("truncated EncodePadded = %v mask %v", ids, mask)
	}
	if _, _, err := tok.EncodePadded("x", 1); err == nil || !strings.Contains(err.Error(), "special tokens") {
		t.Errorf("max_length 1: err = %v, want one that says the special tokens do not fit", err)
	}
	if got := tok.DecodeSkipSpecial(want); got != "a photo of a cat" {
		t.Errorf("DecodeSkipSpecial = %q, want %q", got, "a photo of a cat")
	}
}

func TestT5KnownIDsAndPadding(t *testing.T) {
	tok, err := Load(fixtureDir(t, t5Dir))
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 32100 {
		t.Errorf("VocabSize = %d, want 32100", tok.VocabSize())
	}
	for _, c := range t5Known {
		got, err := tok.EncodeWithSpecialTokens(c.text)
		if err != nil || !slices.Equal(got, c.ids) {
			t.Errorf("EncodeWithSpecialTokens(%q) = %v, %v; want %v", c.text, got, err, c.ids)
		}
		for _, n := range []int{512, 256} {
			ids, mask, err := tok.EncodePadded(c.text, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != n || !slices.Equal(ids[:len(c.ids)], c.ids) || slices.ContainsFunc(ids[len(c.ids):], func(id int32) bool { return id != 0 }) {
				t.Errorf("EncodePadded(%q, %d) = %v", c.text, n, ids)
			}
			if slices.Contains(mask[:len(c.ids)], 0) || slices.Contains(mask[len(c.ids):], 1) {
				t.Errorf("EncodePadded(%q, %d) mask = %v", c.text, n, mask)
			}
		}
	}
	// Truncation keeps room for </s>.
	ids, _, err := tok.EncodePadded(strings.Repeat("hello world ", 400), 256)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 256 || ids[255] != 1 || ids[254] != 21820 { // 255 text tokens: "hello" ends them
		t.Errorf("truncated T5 ids end %v, want ... 21820 1", ids[250:])
	}
	// Sentinels are special tokens, matched whole.
	if got := tok.Encode("<extra_id_0>"); !slices.Equal(got, []int32{32099}) {
		t.Errorf("Encode(<extra_id_0>) = %v, want [32099]", got)
	}
}

// TestUnigramViterbiNotGreedy: a hand-built model where the longest first piece loses. Scores:
// abc -1, d -5, ab -1.5, cd -1.5, single letters -4. Best path for "abcd" is ab+cd (-3.0);
// greedy longest-match would take abc+d (-6.0), letters alone score -16.
func TestUnigramViterbiNotGreedy(t *testing.T) {
	vocab := [][2]any{{"<unk>", 0.0}, {"abc", -1.0}, {"d", -5.0}, {"ab", -1.5}, {"cd", -1.5}, {"a", -4.0}, {"b", -4.0}, {"c", -4.0}}
	tok, err := FromBytes(unigramJSON(t, vocab, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]string{
		"abcd":  {"ab", "cd"},
		"abc":   {"abc"},
		"abcab": {"abc", "ab"},
		"xabcd": {"<unk>", "ab", "cd"},
		"dd":    {"d", "d"},
	} {
		if got := pieces(tok, tok.Encode(text)); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %q, want %q", text, got, want)
		}
	}
}

func TestLowercaseLikeRust(t *testing.T) {
	// Rust's char::to_lowercase: İ has a two-character full mapping; Σ lowers to σ everywhere
	// (no final-sigma rule per character).
	if got := (lowercase{}).normalize("İSTANBUL ΣΟΦΟΣ"); got != "i\u0307stanbul σοφοσ" {
		t.Errorf("lowercase = %q", got)
	}
}

func TestVocabMergesErrors(t *testing.T) {
	for _, c := range []struct {
		name, vocab, merges, cfg, want string
	}{
		{"not CLIP", `{"a":0}`, "", `{"tokenizer_class":"GPT2Tokenizer"}`, "only for tokenizer_class CLIPTokenizer"},
		{"bad merge line", `{"a":0,"b":1,"ab":2}`, "#version: 0.2\na b c\n", `{"tokenizer_class":"CLIPTokenizer"}`, "merges.txt line 2"},
		{"vocab not object", `["a"]`, "", `{"tokenizer_class":"CLIPTokenizer"}`, "vocab.json: want a JSON object"},
		{"unknown merge token", `{"a":0}`, "a z\n", `{"tokenizer_class":"CLIPTokenizer"}`, `"z" is not in model.vocab`},
		{"no unk in vocab", `{"a":0,"b":1,"ab":2}`, "a b\n", `{"tokenizer_class":"CLIPTokenizer"}`, `unk_token "<|endoftext|>" is not in the vocabulary`},
	} {
		dir := t.TempDir()
		for f, s := range map[string]string{"vocab.json": c.vocab, "merges.txt": c.merges, "tokenizer_config.json": c.cfg} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// t5TransformersIDs are the ids transformers' own tests assert for t5-base (see
// TestT5TransformersTestIDs), before padding.
var t5TransformersIDs = []struct {
	text string
	ids  []int32 // before padding to 112
}{
	{"Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
		[]int32{31220, 7, 41, 14034, 801, 38, 3, 102, 63, 17, 127, 524, 18, 7031, 2032, 277, 11, 3, 102, 63, 17, 127, 524, 18, 2026, 17, 10761, 18, 7041, 61, 795, 879, 18, 19681, 4648, 7, 41, 12920, 382, 6, 350, 6383, 4949, 6, 2158, 12920, 382, 9, 6, 3, 4, 11160, 6, 2043, 17153, 279, 49, 17, 6, 3, 4, 434, 9688, 11439, 21, 6869, 10509, 17725, 41, 567, 9138, 61, 11, 6869, 10509, 11946, 41, 18207, 517, 61, 28, 147, 3538, 1220, 7140, 10761, 2250, 16, 910, 1220, 8024, 11, 1659, 1413, 32, 883, 2020, 344, 2215, 226, 6, 12901, 382, 127, 524, 11, 4738, 7, 127, 15390, 5, 1}},
	{"BERT is designed to pre-train deep bidirectional representations from unlabeled text by jointly conditioning on both left and right context in all layers.",
		[]int32{272, 24203, 19, 876, 12, 554, 18, 9719, 1659, 2647, 26352, 6497, 7, 45, 73, 9339, 400, 26, 1499, 57, 22801, 10760, 30, 321, 646, 11, 269, 2625, 16, 66, 7500, 5, 1}},
	{"The quick brown fox jumps over the lazy dog.", []int32{37, 1704, 4216, 3, 20400, 4418, 7, 147, 8, 19743, 1782, 5, 1}},
	{"A long paragraph for summarization.", []int32{71, 307, 8986, 21, 4505, 1635, 1707, 5, 1}},
	{"Summary of the text.", []int32{20698, 13, 8, 1499, 5, 1}},
}

// TestT5TransformersTestIDs: ids that transformers' own test suite asserts for t5-base, whose
// SentencePiece model T5 v1.1 shares (huggingface/transformers
// tests/models/t5/test_tokenization_t5.py @ c3325bf5: test_tokenizer_integration's three
// sentences padded to the longest, test_prepare_batch, test_eos_in_input's target, and
// test_fast_and_slow_same_result's special tokens written in the text).
func TestT5TransformersTestIDs(t *testing.T) {
	tok, err := Load(fixtureDir(t, t5Dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range t5TransformersIDs {
		ids, mask, err := tok.EncodePadded(c.text, 112)
		if err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(c.ids), make([]int32, 112-len(c.ids))...)
		if !slices.Equal(ids, want) {
			t.Errorf("EncodePadded(%q, 112)\n got %v\nwant %v", c.text, ids, want)
		}
		if n := len(c.ids); slices.Contains(mask[:n], 0) || slices.Contains(mask[n:], 1) {
			t.Errorf("mask of %q = %v, want %d ones then zeros", c.text, mask, n)
		}
	}
	if got, want := tok.Encode("<pad> Today is <unk> nice day </s>"), []int32{0, 1960, 19, 2, 1245, 239, 1}; !slices.Equal(got, want) {
		t.Errorf("special tokens in the text: %v, want %v", got, want)
	}
}

// TestCLIPTransformersToyVocab is transformers' own CLIP test_full_tokenizer
// (tests/models/clip/test_tokenization_clip.py @ c8dfc84e): a toy vocab.json + merges.txt where
// "lower newer" must become lo w er</w> n e w er</w> — the </w> suffix only on a word's last
// symbol, merges applied by rank.
func TestCLIPTransformersToyVocab(t *testing.T) {
	words := []string{"l", "o", "w", "e", "r", "s", "t", "i", "d", "n", "lo", "l</w>", "w</w>", "r</w>", "t</w>", "low</w>", "er</w>", "lowest</w>", "newer</w>", "wider", "<unk>", "<|startoftext|>", "<|endoftext|>"}
	vocab := map[string]int{}
	for i, w := range words {
		vocab[w] = i
	}
	vj, err := json.Marshal(vocab)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromVocabMerges(vj, []byte("#version: 0.2\nl o\nlo w</w>\ne r</w>"), []byte(`{"tokenizer_class":"CLIPTokenizer","unk_token":"<unk>"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pieces(tok, tok.Encode("lower newer")), []string{"lo", "w", "er</w>", "n", "e", "w", "er</w>"}; !slices.Equal(got, want) {
		t.Errorf("lower newer = %q, want %q", got, want)
	}
	if got, want := tok.Encode("lower newer"), []int32{10, 2, 16, 9, 3, 2, 16}; !slices.Equal(got, want) {
		t.Errorf("ids %v, want %v", got, want)
	}
}

// TestT5PlantedDefects shows the T5 known-ids check failing when a rule is broken: no </s>,
// no word-start ▁, piece scores read with the wrong sign, and scores ignored (every piece
// equal: the fewest pieces win, which the short known texts do not reveal but transformers'
// integration sentences do).
func TestT5PlantedDefects(t *testing.T) {
	mismatches := func(tok *Tokenizer) int {
		n := 0
		for _, c := range t5Known {
			if got, err := tok.EncodeWithSpecialTokens(c.text); err != nil || !slices.Equal(got, c.ids) {
				n++
			}
		}
		for _, c := range t5TransformersIDs {
			if got, err := tok.EncodeWithSpecialTokens(c.text); err != nil || !slices.Equal(got, c.ids) {
				n++
			}
		}
		return n
	}
	plants := map[string]func(tok *Tokenizer){
		"no </s>":          func(tok *Tokenizer) { tok.post = &postProcessor{} },
		"no ▁ word starts": func(tok *Tokenizer) { tok.pre[1].(*metaspacePre).scheme = prependNever },
		"scores ignored": func(tok *Tokenizer) {
			m := tok.model.(*unigramModel)
			for i := range m.scores {
				m.scores[i] = -1
			}
			m.cache.init()
		},
		"scores negated": func(tok *Tokenizer) {
			m := tok.model.(*unigramModel)
			for i := range m.scores {
				m.scores[i] = -m.scores[i]
			}
			m.cache.init()
		},
	}
	for name, plant := range plants {
		tok, err := Load(fixtureDir(t, t5Dir))
		if err != nil {
			t.Fatal(err)
		}
		if n := mismatches(tok); n != 0 {
			t.Fatalf("unplanted tokenizer already wrong on %d texts", n)
		}
		plant(tok)
		if mismatches(tok) == 0 {
			t.Errorf("planted defect %q went unnoticed by the known-ids check", name)
		}
	}
}
