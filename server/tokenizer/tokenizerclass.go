package tokenizer

import "fmt"

// transformers 5 loads a tokenizer through the class tokenizer_config.json names. For
// TokenizersBackend (PreTrainedTokenizerFast) that is tokenizer.json as written. Classes with
// their own __init__ — LlamaTokenizer and T5Tokenizer among the SentencePiece ones — take only
// the vocabulary, merges, added tokens, post-processor, padding and truncation from
// tokenizer.json and rebuild the normalizer, pre-tokenizer, decoder and model options as their
// __init__ does (tokenization_utils_tokenizers.py convert_to_native_format). A Llama 2 /
// TinyLlama tokenizer.json in the legacy Prepend+Replace layout is therefore tokenized by
// transformers 5 with a Metaspace pre-tokenizer. applyTokenizerClass reproduces that for the
// classes below, from transformers 5.17's models/llama/tokenization_llama.py and
// models/t5/tokenization_t5.py; other classes keep tokenizer.json's pipeline. filePost is
// tokenizer.json's own post-processor, before tokenizer_config.json's add_bos_token /
// add_eos_token rebuilt it.
func (t *Tokenizer) applyTokenizerClass(filePost *postProcessor) error {
	switch t.config.TokenizerClass {
	case "LlamaTokenizer", "LlamaTokenizerFast":
		m, ok := t.model.(*bpeModel)
		if !ok || m.byteLevel {
			return nil // a byte-level tokenizer.json under a Llama class name: left as written
		}
		addPrefixSpace := t.config.AddPrefixSpace == nil || *t.config.AddPrefixSpace
		legacy := t.config.Legacy != nil && *t.config.Legacy
		// _get_prepend_scheme: "always" for legacy tokenizers, else "first"; "never" without a
		// prefix space.
		scheme := prependNever
		if addPrefixSpace {
			scheme = prependFirst
			if legacy {
				scheme = prependAlways
			}
		}
		t.normalizer = nil
		t.pre = []preTokenizer{&metaspacePre{repl: "▁", scheme: scheme, splitWords: false}}
		t.positional = scheme == prependFirst
		c := &chainDecoder{byteFallback: true, steps: []decodeStep{
			replaceStep{literalFinder("▁"), " "}, byteFallbackStep{}, fuseStep{},
		}}
		if addPrefixSpace {
			c.steps = append(c.steps, stripStep{content: ' ', start: 1, afterFuse: true, idx: 0})
			c.nStrip = 1
		}
		t.decoder = c
		// LlamaTokenizer takes add_bos_token / add_eos_token as its own arguments and does not
		// rebuild the post-processor from them: tokenizer.json's stays (transformers 5.17 adds
		// no </s> for add_eos_token=true; fixtures/golden/sp_tokenizer_golden.json).
		t.post = filePost
		// BPE(vocab, merges, fuse_unk=True, byte_fallback=True): no unk token.
		m.unkID = -1
		m.fuseUnk = true
		m.byteFallback = true
		for b := 0; b < 256; b++ {
			id, ok := m.vocab[byteFallbackToken(byte(b))]
			if !ok {
				id = -1
			}
			m.fallbackIDs[b] = id
		}
		m.cache.init()
	case "CLIPTokenizer", "CLIPTokenizerFast":
		return t.applyCLIPClass()
	case "T5Tokenizer", "T5TokenizerFast":
		m, ok := t.model.(*unigramModel)
		if !ok {
			return nil
		}
		// Only a Precompiled charsmap survives from tokenizer.json's normalizer.
		t.normalizer = findPrecompiled(t.normalizer)
		t.pre = []preTokenizer{whitespaceSplitPre{}, &metaspacePre{repl: "▁", scheme: prependAlways, splitWords: true}}
		t.positional = false
		t.decoder = &chainDecoder{steps: []decodeStep{metaspaceDecodeStep{repl: "▁", scheme: prependAlways}}}
		// Unigram(vocab, unk_id=2, byte_fallback=False).
		if len(m.pieces) <= 2 {
			return fmt.Errorf("tokenizer.json: a T5Tokenizer needs at least 3 pieces (<pad>, </s>, <unk>); this vocabulary has %d", len(m.pieces))
		}
		m.unkID = 2
		m.byteFallback = false
		m.cache.init()
		// The template is set after the base class's __init__: $A </s>, whatever the flags.
		eos := "</s>"
		if t.config.EOSToken.Set {
			eos = t.config.EOSToken.Content
		}
		id, ok := t.SpecialID(eos)
		if !ok {
			return fmt.Errorf("tokenizer_config.json: eos_token %q is not a token of tokenizer.json; T5Tokenizer appends it to every sequence", eos)
		}
		t.post = &postProcessor{steps: [][]templatePiece{{{sequence: true}, {ids: []int32{id}}}}}
	default:
		return nil
	}
	return t.refreshAddedVocabulary()
}

// addConfigSpecialTokens is what transformers' tokenizer __init__ does with the special tokens
// tokenizer_config.json names (bos, eos, unk, sep, pad, cls, mask, additional_special_tokens):
// one that tokenizer.json does not list as an added token is added as a special token
// (normalized=false, no stripping), so that its text in the input is matched whole and
// skip_special_tokens drops it. A tokenizer.json written by the tokenizers library alone
// (T5 layouts built from a Unigram model) often lists none. A named token that is not in the
// vocabulary either is left alone: transformers would give it a new id the model has no
// embedding for.
func (t *Tokenizer) addConfigSpecialTokens() error {
	c := &t.config
	fields := append([]specialTokenField{c.BOSToken, c.EOSToken, c.UNKToken, c.SEPToken, c.PADToken, c.CLSToken, c.MaskToken}, c.AdditionalSpecialTokens...)
	changed := false
	for _, f := range fields {
		if !f.Set || f.Content == "" {
			continue
		}
		if _, ok := t.tokenToID[f.Content]; ok {
			continue
		}
		id, ok := t.model.tokenID(f.Content)
		if !ok {
			continue
		}
		t.addedTokens = append(t.addedTokens, addedTokenJSON{ID: &id, Content: f.Content, Special: true})
		t.tokenToID[f.Content] = id
		t.special[id] = true
		changed = true
	}
	if !changed {
		return nil
	}
	return t.refreshAddedVocabulary()
}

func findPrecompiled(n normalizer) normalizer {
	switch v := n.(type) {
	case *precompiledNormalizer:
		return v
	case normalizerSeq:
		for _, e := range v {
			if p := findPrecompiled(e); p != nil {
				return p
			}
		}
	}
	return nil
}
