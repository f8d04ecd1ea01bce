package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// addedTokenJSON is one entry of tokenizer.json's "added_tokens".
type addedTokenJSON struct {
	ID         *int32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// modelOptions are the scalar fields of tokenizer.json's "model" object.
type modelOptions struct {
	Type                    string   `json:"type"`
	UnkID                   *int     `json:"unk_id"` // Unigram
	Dropout                 *float64 `json:"dropout"`
	UnkToken                *string  `json:"unk_token"`
	ContinuingSubwordPrefix *string  `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string  `json:"end_of_word_suffix"`
	FuseUnk                 bool     `json:"fuse_unk"`
	ByteFallback            bool     `json:"byte_fallback"`
	IgnoreMerges            bool     `json:"ignore_merges"`
}

// build parses tokenizer.json. The big model.vocab and model.merges are read by jsonScanner
// straight into their final tables; everything else goes through encoding/json.
func build(data []byte) (*Tokenizer, error) {
	if len(data) == 0 {
		return nil, errors.New("tokenizer.json: file is empty")
	}
	s := &jsonScanner{b: data}
	var (
		added                     []addedTokenJSON
		normRaw, preRaw, decRaw   []byte
		postRaw, padRaw, truncRaw []byte
		m                         tokenModel
		haveModel                 bool
	)
	err := s.object(func(key []byte) error {
		switch string(key) {
		case "added_tokens":
			raw, err := s.skipValue()
			if err != nil {
				return err
			}
			if string(raw) != "null" {
				if err := json.Unmarshal(raw, &added); err != nil {
					return fmt.Errorf("tokenizer.json: added_tokens: %w", err)
				}
			}
		case "normalizer":
			raw, err := s.skipValue()
			normRaw = raw
			return err
		case "pre_tokenizer":
			raw, err := s.skipValue()
			preRaw = raw
			return err
		case "decoder":
			raw, err := s.skipValue()
			decRaw = raw
			return err
		case "post_processor":
			raw, err := s.skipValue()
			postRaw = raw
			return err
		case "padding":
			raw, err := s.skipValue()
			padRaw = raw
			return err
		case "truncation":
			raw, err := s.skipValue()
			truncRaw = raw
			return err
		case "model":
			haveModel = true
			var err error
			m, err = parseModel(s)
			if err != nil {
				return err
			}
		default:
			_, err := s.skipValue()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.peek() != 0 {
		return nil, s.errorf("trailing data after the top-level object")
	}
	if !haveModel {
		return nil, errors.New("tokenizer.json: missing \"model\"; this is not a Hugging Face tokenizers file")
	}

	t := &Tokenizer{model: m, special: map[int32]bool{}}
	bpe, _ := m.(*bpeModel)
	if t.normalizer, err = parseNormalizer(normRaw); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(preRaw); err != nil {
		return nil, err
	}
	// A ByteLevel pre-tokenizer switches the model to byte symbols. Without add_prefix_space
	// and use_regex it splits nothing (Qwen's case), so it is dropped from the chain.
	pre := t.pre[:0]
	for _, p := range t.pre {
		if bl, ok := p.(*byteLevelPre); ok {
			if bpe == nil {
				return nil, errors.New("tokenizer.json: a ByteLevel pre-tokenizer needs a BPE model; this file pairs it with model.type Unigram")
			}
			bpe.byteLevel = true
			if !bl.addPrefixSpace && !bl.useRegex {
				continue
			}
		}
		pre = append(pre, p)
	}
	t.pre = pre
	for _, p := range t.pre {
		if ms, ok := p.(*metaspacePre); ok && ms.scheme == prependFirst {
			t.positional = true
		}
	}
	if t.decoder, err = parseDecoder(decRaw); err != nil {
		return nil, err
	}
	if bpe != nil && bpe.byteLevel {
		if bpe.byteFallback {
			return nil, errors.New("tokenizer.json: model.byte_fallback=true with a ByteLevel pre-tokenizer: byte-level BPE has no unknown bytes to fall back from; this file is inconsistent")
		}
		if err := bpe.initByteIDs(); err != nil {
			return nil, err
		}
	}

	// Id tables: model vocab first, then added tokens (which may reuse a vocab id or add new ones).
	modelTokens := m.tokens()
	maxID := int32(len(modelTokens)) - 1
	for i, a := range added {
		if a.ID == nil {
			return nil, fmt.Errorf("tokenizer.json: added_tokens[%d] (%q) has no id", i, a.Content)
		}
		if *a.ID < 0 {
			return nil, fmt.Errorf("tokenizer.json: added_tokens[%d] (%q) has negative id %d", i, a.Content, *a.ID)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("tokenizer.json: added_tokens[%d] (id %d) has empty content", i, *a.ID)
		}
		if *a.ID > maxID {
			maxID = *a.ID
		}
	}
	if maxID >= 1<<24 {
		return nil, fmt.Errorf("tokenizer.json: token id %d is implausibly large (over 16M); the file is corrupt", maxID)
	}
	t.idToToken = make([]string, maxID+1)
	copy(t.idToToken, modelTokens)
	t.tokenToID = make(map[string]int32, len(added))
	for _, a := range added {
		t.idToToken[*a.ID] = a.Content
		t.tokenToID[a.Content] = *a.ID
		if a.Special {
			t.special[*a.ID] = true
		}
	}
	t.addedTokens = added
	if err = t.refreshAddedVocabulary(); err != nil {
		return nil, err
	}
	if t.post, err = parsePostProcessor(postRaw, t); err != nil {
		return nil, err
	}
	if t.padding, err = parsePadding(padRaw); err != nil {
		return nil, err
	}
	if t.truncation, err = parseTruncation(truncRaw); err != nil {
		return nil, err
	}
	return t, nil
}

// parseModel reads the "model" object: BPE (byte-level as GPT-2, Qwen and Llama 3 use it, or
// SentencePiece-style with byte_fallback as Llama 2, TinyLlama and Mistral use it) or Unigram
// (T5, converted SentencePiece unigram models).
func parseModel(s *jsonScanner) (tokenModel, error) {
	var (
		opts        modelOptions
		vocab       map[string]int32
		idToToken   []string
		mergesStart = -1
		haveVocab   bool
		haveMerges  bool
		rules       []mergeRule
		unigramRaw  []byte
	)
	if s.peek() == 'n' {
		return nil, errors.New("tokenizer.json: \"model\" is null")
	}
	scalars := map[string]json.RawMessage{}
	err := s.object(func(key []byte) error {
		switch string(key) {
		case "vocab":
			haveVocab = true
			if s.peek() == '[' { // Unigram: [["piece", score], ...]
				var err error
				unigramRaw, err = s.skipValue()
				return err
			}
			var err error
			vocab, idToToken, err = parseVocab(s)
			return err
		case "merges":
			// Merges need the vocabulary to resolve ids. tokenizers writes vocab first; for
			// files that do not, remember where the merges are and parse them afterwards.
			haveMerges = true
			if haveVocab {
				var err error
				rules, err = parseMerges(s, vocab, idToToken)
				return err
			}
			mergesStart = s.pos
			_, err := s.skipValue()
			return err
		default:
			k := string(key)
			raw, err := s.skipValue()
			scalars[k] = raw
			return err
		}
	})
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(scalars) // fails on a malformed scalar, which is what to report
	if err == nil {
		err = json.Unmarshal(b, &opts)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	if opts.Type == "Unigram" {
		if !haveVocab || unigramRaw == nil {
			return nil, errors.New("tokenizer.json: a Unigram model needs model.vocab as a list of [piece, score] pairs")
		}
		return newUnigramModel(unigramRaw, opts)
	}
	if opts.Type != "" && opts.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer.json: model.type %q is not supported; supported: BPE (byte-level or SentencePiece-style with byte_fallback) and Unigram", opts.Type)
	}
	if unigramRaw != nil {
		return nil, errors.New("tokenizer.json: model.vocab is a list, as Unigram models store it, but model.type is BPE; a BPE vocab is an object {\"token\": id}")
	}
	if !haveVocab {
		return nil, errors.New("tokenizer.json: missing model.vocab")
	}
	if !haveMerges {
		return nil, errors.New("tokenizer.json: missing model.merges")
	}
	if opts.Dropout != nil && *opts.Dropout != 0 {
		return nil, fmt.Errorf("tokenizer.json: model.dropout %v is not supported (inference tokenizers use none)", *opts.Dropout)
	}
	if p := opts.ContinuingSubwordPrefix; p != nil && *p != "" {
		return nil, fmt.Errorf("tokenizer.json: model.continuing_subword_prefix %q is not supported by this byte-level BPE implementation", *p)
	}
	m := newBPEModel(vocab, idToToken, opts.IgnoreMerges)
	if p := opts.EndOfWordSuffix; p != nil {
		m.suffix = *p // CLIP's "</w>"
	}
	if opts.ByteFallback {
		m.byteFallback = true
		for b := 0; b < 256; b++ {
			id, ok := vocab[byteFallbackToken(byte(b))]
			if !ok {
				id = -1
			}
			m.fallbackIDs[b] = id
		}
	}
	if opts.UnkToken != nil {
		id, ok := vocab[*opts.UnkToken]
		if !ok {
			return nil, fmt.Errorf("tokenizer.json: model.unk_token %q is not in model.vocab", *opts.UnkToken)
		}
		m.unkID = id
		m.fuseUnk = opts.FuseUnk
	}
	if mergesStart >= 0 {
		var err error
		if rules, err = parseMerges(&jsonScanner{b: s.b, pos: mergesStart}, vocab, idToToken); err != nil {
			return nil, err
		}
	}
	m.setMerges(rules)
	return m, nil
}

// parseVocab reads model.vocab ({"token": id, ...}). Token strings share one backing string to
// spare ~150k small allocations.
func parseVocab(s *jsonScanner) (map[string]int32, []string, error) {
	type entry struct {
		off, n int
		id     int32
	}
	var (
		text    []byte
		entries []entry
		maxID   int32 = -1
	)
	err := s.object(func(key []byte) error {
		id, err := s.integer()
		if err != nil {
			return fmt.Errorf("model.vocab[%q]: %w", key, err)
		}
		if id < 0 {
			return fmt.Errorf("tokenizer.json: model.vocab[%q] has negative id %d", key, id)
		}
		if id >= 1<<24 {
			return fmt.Errorf("tokenizer.json: model.vocab[%q] id %d is implausibly large (over 16M)", key, id)
		}
		entries = append(entries, entry{len(text), len(key), id})
		text = append(text, key...)
		if id > maxID {
			maxID = id
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	all := string(text)
	vocab := make(map[string]int32, len(entries))
	idToToken := make([]string, maxID+1)
	for _, e := range entries {
		tok := all[e.off : e.off+e.n]
		vocab[tok] = e.id
		idToToken[e.id] = tok
	}
	return vocab, idToToken, nil
}

// parseMerges reads model.merges in either format tokenizers writes: "a b" strings (older
// files, GPT-2) or ["a", "b"] pairs (tokenizers >= 0.20, Qwen3).
func parseMerges(s *jsonScanner, vocab map[string]int32, idToToken []string) ([]mergeRule, error) {
	rank := int32(0)
	var a, b, ab []byte
	rules := make([]mergeRule, 0, len(vocab))
	err := s.array(func() error {
		switch s.peek() {
		case '"':
			line, err := s.str()
			if err != nil {
				return err
			}
			i := bytes.IndexByte(line, ' ')
			if i < 0 {
				return fmt.Errorf("tokenizer.json: model.merges[%d] %q is not two tokens separated by a space", rank, line)
			}
			a = append(a[:0], line[:i]...)
			b = append(b[:0], line[i+1:]...)
		case '[':
			s.pos++
			x, err := s.str()
			if err != nil {
				return fmt.Errorf("tokenizer.json: model.merges[%d]: %w", rank, err)
			}
			a = append(a[:0], x...)
			if err := s.expect(','); err != nil {
				return fmt.Errorf("tokenizer.json: model.merges[%d] is not a pair: %w", rank, err)
			}
			y, err := s.str()
			if err != nil {
				return fmt.Errorf("tokenizer.json: model.merges[%d]: %w", rank, err)
			}
			b = append(b[:0], y...)
			if err := s.expect(']'); err != nil {
				return fmt.Errorf("tokenizer.json: model.merges[%d] is not a pair: %w", rank, err)
			}
		default:
			return fmt.Errorf("tokenizer.json: model.merges[%d]: want a string \"a b\" or a pair [\"a\", \"b\"]: %w", rank, s.errorf("bad merges entry"))
		}
		guess := -1
		if len(rules) > 0 {
			last := rules[len(rules)-1]
			guess = int(last.merged) + 1
		}
		r, err := resolveMerge(vocab, idToToken, guess, a, b, &ab)
		if err != nil {
			return fmt.Errorf("tokenizer.json: model.merges[%d]: %w", rank, err)
		}
		rules = append(rules, r)
		rank++
		return nil
	})
	return rules, err
}
