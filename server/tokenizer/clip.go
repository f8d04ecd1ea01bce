package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// CLIP's tokenizer as transformers 5.17 runs it (models/clip/tokenization_clip.py, class
// CLIPTokenizer, a TokenizersBackend; CLIPTokenizerFast is the same class). Its __init__ keeps
// only the vocabulary, merges and added tokens of whatever it loaded (tokenizer.json, or
// vocab.json + merges.txt) and builds the rest itself:
//
//	model          BPE(continuing_subword_prefix="", end_of_word_suffix="</w>", fuse_unk=False,
//	               unk_token=unk_token)                                  byte-level symbols
//	normalizer     NFC, Replace(\s+ → " "), Lowercase
//	pre_tokenizer  Split(clipSplitPattern, Removed, invert=True), ByteLevel(add_prefix_space=False)
//	post           RobertaProcessing: <|startoftext|> $A <|endoftext|>
//	decoder        ByteLevel, then "</w>" → " " and strip (its _wrap_decode_method_backend_tokenizer)
//
// There is no ftfy step in transformers 5: the ftfy.fix_text / BasicTokenizer branch belonged to
// the slow Python CLIPTokenizer of transformers 4, which no longer exists. Whitespace clean-up is
// the Replace normalizer plus the Split, which drops the whitespace between words.

// clipSplitPattern is CLIP's word regex. OpenAI's SimpleTokenizer compiles it with IGNORECASE;
// the Lowercase normalizer that runs first makes that moot.
const clipSplitPattern = `<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+`

// clipWordSuffix marks the last symbol of every word in CLIP's vocabulary ("dog</w>").
const clipWordSuffix = "</w>"

// applyCLIPClass rebuilds the pipeline as CLIPTokenizer.__init__ does (see above).
func (t *Tokenizer) applyCLIPClass() error {
	m, ok := t.model.(*bpeModel)
	if !ok {
		return errors.New("tokenizer_config.json: tokenizer_class CLIPTokenizer needs a BPE model; this tokenizer.json holds a Unigram model")
	}
	special := func(f specialTokenField, def string) string {
		if f.Set {
			return f.Content
		}
		return def
	}
	c := &t.config
	unk := special(c.UNKToken, "<|endoftext|>")
	bos := special(c.BOSToken, "<|startoftext|>")
	eos := special(c.EOSToken, "<|endoftext|>")

	unkID, ok := m.vocab[unk]
	if !ok {
		return fmt.Errorf("tokenizer_config.json: unk_token %q is not in the vocabulary; CLIPTokenizer maps unknown bytes to it", unk)
	}
	m.unkID = unkID
	m.fuseUnk = false
	m.byteFallback = false
	m.ignoreMerges = false
	m.suffix = clipWordSuffix
	m.byteLevel = true
	if err := m.initByteIDs(); err != nil {
		return err
	}
	m.cache.init()

	ws, err := compileRegexFinder(`\s+`)
	if err != nil {
		return err
	}
	t.normalizer = normalizerSeq{unicodeForm{norm.NFC}, replaceNormalizer{ws, " "}, lowercase{}}
	words, err := newRegexFinder(clipSplitPattern)
	if err != nil {
		return err
	}
	t.pre = []preTokenizer{
		&splitPre{find: words, behavior: behaviorRemoved, invert: true},
		&byteLevelPre{useRegex: true, re: gpt2Scanner{}},
	}
	t.positional = false
	t.decoder = byteLevelDecoder{}
	t.decodeWordSuffix = clipWordSuffix

	bosID, ok := t.SpecialID(bos)
	if !ok {
		return fmt.Errorf("tokenizer_config.json: bos_token %q is not a token of this tokenizer; CLIPTokenizer starts every sequence with it", bos)
	}
	eosID, ok := t.SpecialID(eos)
	if !ok {
		return fmt.Errorf("tokenizer_config.json: eos_token %q is not a token of this tokenizer; CLIPTokenizer ends every sequence with it", eos)
	}
	t.post = &postProcessor{steps: [][]templatePiece{{{ids: []int32{bosID}}, {sequence: true}, {ids: []int32{eosID}}}}}
	return t.refreshAddedVocabulary()
}

// cleanDecodedWords is the decode wrapper CLIPTokenizer installs: every word-end marker becomes
// a space and the text is stripped as Python's str.strip() does.
func cleanDecodedWords(s, suffix string) string {
	s = strings.ReplaceAll(s, suffix, " ")
	return strings.TrimFunc(s, isPythonSpace)
}

// isPythonSpace is Python's str.isspace for one character: Unicode White_Space plus the
// information separators U+001C..U+001F, which Python counts and Go's unicode.IsSpace does not.
func isPythonSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1C && r <= 0x1F)
}

// loadVocabMerges builds a Tokenizer from dir/vocab.json and dir/merges.txt, the files a BPE
// checkpoint such as openai/clip-vit-large-patch14 or FLUX's tokenizer/ ships when it has no
// tokenizer.json (see FromVocabMerges).
func loadVocabMerges(dir string, cfgJSON []byte) (*Tokenizer, error) {
	if err := requireVocabMergesClass(cfgJSON); err != nil {
		return nil, fmt.Errorf("tokenizer: %s has no tokenizer.json; %w", dir, err)
	}
	vocab, err := os.ReadFile(filepath.Join(dir, "vocab.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %w; a CLIP tokenizer folder without tokenizer.json needs vocab.json and merges.txt", err)
	}
	merges, err := os.ReadFile(filepath.Join(dir, "merges.txt"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %w; a CLIP tokenizer folder without tokenizer.json needs vocab.json and merges.txt", err)
	}
	t, err := FromVocabMerges(vocab, merges, cfgJSON)
	if err != nil {
		return nil, fmt.Errorf("%w (directory %s)", err, dir)
	}
	return t, nil
}

// FromVocabMerges builds a Tokenizer from the contents of vocab.json, merges.txt and
// tokenizer_config.json, as transformers builds one for a folder without tokenizer.json (a
// bundle that carries those three files uses it as FromBytes is used for tokenizer.json). Only
// tokenizer classes whose whole pipeline follows from the class are accepted (CLIPTokenizer);
// tokenizer_config.json's added_tokens_decoder gives the added tokens, as transformers takes
// them.
func FromVocabMerges(vocabJSON, mergesTXT, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	if err := requireVocabMergesClass(tokenizerConfigJSON); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cfg struct {
		Added map[string]json.RawMessage `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(tokenizerConfigJSON, &cfg); err != nil {
		return nil, fmt.Errorf("tokenizer: parse tokenizer_config.json: %w", err)
	}
	tj, err := vocabMergesJSON(vocabJSON, mergesTXT, cfg.Added)
	if err != nil {
		return nil, err
	}
	return fromBytes(tj, tokenizerConfigJSON, nil)
}

// requireVocabMergesClass accepts the tokenizer classes FromVocabMerges can build.
func requireVocabMergesClass(cfgJSON []byte) error {
	var cfg struct {
		TokenizerClass string `json:"tokenizer_class"`
	}
	if len(cfgJSON) > 0 {
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			return fmt.Errorf("parse tokenizer_config.json: %w", err)
		}
	}
	switch cfg.TokenizerClass {
	case "CLIPTokenizer", "CLIPTokenizerFast":
		return nil
	}
	return fmt.Errorf("vocab.json + merges.txt alone are read only for tokenizer_class CLIPTokenizer (tokenizer_config.json says %q); add the checkpoint's tokenizer.json", cfg.TokenizerClass)
}

// vocabMergesJSON writes the tokenizer.json that holds vocab.json, merges.txt and the added
// tokens: the parts a class rebuild keeps, so the one tokenizer.json reader serves both layouts.
// merges.txt is tokenizers' format: an optional "#version" first line, then "a b" per line;
// later lines that start with '#' are merges ("# #</w>").
func vocabMergesJSON(vocab, merges []byte, added map[string]json.RawMessage) ([]byte, error) {
	vocab = bytes.TrimSpace(vocab)
	if len(vocab) == 0 || vocab[0] != '{' {
		return nil, errors.New("vocab.json: want a JSON object {\"token\": id, ...}")
	}
	lines := strings.Split(string(merges), "\n")
	first := 1 // line number of lines[0], for errors
	if len(lines) > 0 && strings.HasPrefix(lines[0], "#version") {
		lines = lines[1:]
		first = 2
	}
	var b bytes.Buffer
	b.WriteString(`{"model":{"type":"BPE","vocab":`)
	b.Write(vocab)
	b.WriteString(`,"merges":[`)
	n := 0
	for i, line := range lines {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		if strings.Count(line, " ") != 1 {
			return nil, fmt.Errorf("merges.txt line %d %q: want two tokens separated by one space", i+first, line)
		}
		if n > 0 {
			b.WriteByte(',')
		}
		q, err := json.Marshal(line)
		if err != nil {
			return nil, fmt.Errorf("merges.txt line %d: %w", i+first, err)
		}
		b.Write(q)
		n++
	}
	b.WriteString(`]},"added_tokens":[`)
	ids := make([]int, 0, len(added))
	byID := map[int]json.RawMessage{}
	for k, v := range added {
		id, err := strconv.Atoi(k)
		if err != nil || id < 0 || id >= 1<<24 {
			return nil, fmt.Errorf("tokenizer_config.json: added_tokens_decoder key %q is not a token id (0..16M)", k)
		}
		ids = append(ids, id)
		byID[id] = v
	}
	sort.Ints(ids)
	for i, id := range ids {
		var a addedTokenJSON
		if err := json.Unmarshal(byID[id], &a); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: added_tokens_decoder[%d]: %w", id, err)
		}
		id32 := int32(id)
		a.ID = &id32
		j, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(j)
	}
	b.WriteString(`]}`)
	return b.Bytes(), nil
}
