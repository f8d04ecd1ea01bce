// Package tokenizer loads Hugging Face tokenizer.json / tokenizer_config.json files and
// reproduces the `tokenizers` library's pipeline (added tokens, normalizer, pre-tokenizer,
// model, post-processor, decoder) and transformers' chat-template rendering, so that the
// server and the harness count and produce exactly the ids the checkpoint's own Python
// tokenizer would. fixtures/golden/tokenizer_golden.json (byte-level BPE) and
// fixtures/golden/sp_tokenizer_golden.json (SentencePiece-style BPE and Unigram), both from
// transformers 5.17 and tokenizers 0.23, are the references the tests hold it to, with
// fixtures/golden/flux_tokenizer_golden.json for FLUX's CLIP-L BPE and T5-v1.1-XXL Unigram.
//
// A Tokenizer is immutable after Load and safe for concurrent use; the per-word caches are
// internally synchronized.
//
// Supported tokenizer.json parts: models BPE (merges as "a b" or ["a", "b"], ignore_merges,
// unk_token, fuse_unk, byte_fallback, end_of_word_suffix as CLIP's "</w>") and Unigram (Viterbi
// over the piece scores, unk fused, byte_fallback); normalizers NFC, NFD, NFKC, NFKD,
// Lowercase, Prepend, Replace, Strip, Precompiled (SentencePiece charsmaps, looked up in their
// darts-clone double array) and Sequence; pre-tokenizers Sequence, Split (Regex or String
// pattern, every behavior, invert), ByteLevel, Metaspace (prepend_scheme always, first, never;
// split) and WhitespaceSplit; decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace
// and Sequence; post-processors TemplateProcessing (single), RobertaProcessing, BertProcessing,
// ByteLevel and Sequence; padding and truncation. Anything else is refused at load with an
// error naming it (an unknown post-processor only when encoding with special tokens).
// tokenizer_config.json's add_bos_token/add_eos_token, its special tokens (added as special
// tokens where tokenizer.json lacks them) and the rebuild that transformers 5's LlamaTokenizer
// and T5Tokenizer classes make of the pipeline are applied as transformers applies them
// (tokenizerclass.go; CLIPTokenizer in clip.go, whose folders may also be read from vocab.json
// + merges.txt: Load, FromVocabMerges). EncodePadded is transformers' padding="max_length", truncation=True, as
// diffusers' pipelines call their text tokenizers. Offsets (trim_offsets) are not computed. The
// GPT-2, Qwen2/3 and Llama 3 split regexes run on hand-written scanners checked against regexp2
// (scan_test.go); other regexes run on regexp2.
//
// Known difference from transformers, outside what the golden files exercise: chat-template
// inputs given as Go maps have no key order, so tojson writes their keys sorted where Python
// keeps insertion order (and cannot tell 2.0 from 2); pass json.RawMessage to keep both, see
// ApplyChatTemplate.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Tokenizer is a loaded tokenizer.json plus the parts of tokenizer_config.json that change
// what users see (chat template, special tokens, BOS/EOS, decode clean-up).
type Tokenizer struct {
	addedVocab  *addedVocabulary
	addedTokens []addedTokenJSON // as in tokenizer.json, to rebuild addedVocab for another normalizer
	normalizer  normalizer       // nil when tokenizer.json has none
	pre         []preTokenizer
	positional  bool // a pre-tokenizer depends on where its piece starts (Metaspace "first")
	model       tokenModel
	decoder     decoder
	post        *postProcessor
	padding     *padding
	truncation  *truncation

	// idToToken maps every id (model vocab and added tokens) to its token string; "" for
	// ids that exist in neither (holes are skipped by Decode, as HF does).
	idToToken []string
	// tokenToID holds the added tokens; model.vocab the rest.
	tokenToID map[string]int32
	special   map[int32]bool
	// addedDecodeText is the token text Decode gives the decoder for an added token with
	// normalized=true: its content after the normalizer, as tokenizers does (a Llama 2
	// Prepend("▁") normalizer makes "[INST]" decode as " [INST]").
	addedDecodeText map[int32]string

	// decodeWordSuffix, when set (CLIP's "</w>"), is replaced by a space in decoded text,
	// which is then stripped, as CLIPTokenizer's decode wrapper does.
	decodeWordSuffix string

	cleanUpSpaces bool
	chat          *chatTemplate // nil when tokenizer_config.json has no chat_template
	config        tokenizerConfig
}

// Message is one chat message as the OpenAI API and transformers see it: at least "role" and
// "content", plus anything a template reads (tool_calls, reasoning_content, ...).
type Message = map[string]any

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json and
// dir/chat_template.jinja. A folder without tokenizer.json whose tokenizer_config.json names
// CLIPTokenizer is read from vocab.json and merges.txt instead, as transformers reads it (no
// chat template then). A missing tokenizer_config.json is not an error (GPT-2 ships none);
// the tokenizer then has no chat template (unless chat_template.jinja gives one) and decodes
// without clean-up.
func Load(dir string) (*Tokenizer, error) {
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cj, err := os.ReadFile(cfgPath)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: read %s: %w", cfgPath, err)
		}
		cj = nil
	}
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, verr := os.Stat(filepath.Join(dir, "vocab.json")); verr == nil {
			return loadVocabMerges(dir, cj) // CLIP-style BPE folders ship no tokenizer.json
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %s: %w; pass a checkpoint or tokenizer directory that contains tokenizer.json (or, for CLIPTokenizer, vocab.json and merges.txt)", filepath.Join(dir, "tokenizer.json"), err)
	}
	// transformers writes the chat template to chat_template.jinja (save_pretrained since 4.50)
	// and, loading, lets that file win over tokenizer_config.json's chat_template.
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	jinja, err := os.ReadFile(jinjaPath)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: read %s: %w", jinjaPath, err)
		}
		jinja = nil
	}
	t, err := fromBytes(tj, cj, jinja)
	if err != nil {
		return nil, fmt.Errorf("%w (directory %s)", err, dir)
	}
	return t, nil
}

// SectionReader is the part of a bundle (native/bundle.Bundle) that carries checkpoint files
// by name. It is an interface so this package does not depend on the bundle format.
type SectionReader interface {
	Section(name string) ([]byte, error)
}

// FromBundle builds a Tokenizer from a bundle's "tokenizer.json" and "tokenizer_config.json"
// sections, or, where the checkpoint kept its tokenizer as vocab.json and merges.txt (CLIP's,
// in FLUX.1's tokenizer/: the tokenizer.json section is then empty), from those sections as
// FromVocabMerges. The Tokenizer keeps no reference to the section bytes, so the bundle may be
// closed afterwards.
func FromBundle(b SectionReader) (*Tokenizer, error) {
	return FromBundleFolder(b, "")
}

// FromBundleFolder is FromBundle for the tokenizer a pipeline keeps in folder (the bundle's
// sections folder + "/tokenizer.json" and folder + "/tokenizer_config.json"; "" is the first
// tokenizer): "tokenizer_2" is FLUX.1's T5 tokenizer.
func FromBundleFolder(b SectionReader, folder string) (*Tokenizer, error) {
	pre := ""
	if folder != "" {
		pre = folder + "/"
	}
	tj, err := b.Section(pre + "tokenizer.json")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cj, err := b.Section(pre + "tokenizer_config.json")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if len(tj) == 0 && folder == "" {
		vocab, err := b.Section("vocab.json")
		if err != nil {
			return nil, fmt.Errorf("tokenizer: the bundle's tokenizer.json is empty and %w", err)
		}
		merges, err := b.Section("merges.txt")
		if err != nil {
			return nil, fmt.Errorf("tokenizer: the bundle's tokenizer.json is empty and %w", err)
		}
		return FromVocabMerges(vocab, merges, cj)
	}
	return FromBytes(tj, cj)
}

// FromBytes builds a Tokenizer from the contents of tokenizer.json and tokenizer_config.json
// (which may be nil or empty). It copies what it keeps, so the inputs may be reused or unmapped.
func FromBytes(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	return fromBytes(tokenizerJSON, tokenizerConfigJSON, nil)
}

// fromBytes is FromBytes with the contents of chat_template.jinja (nil when absent), which
// replaces tokenizer_config.json's default chat template.
func fromBytes(tokenizerJSON, tokenizerConfigJSON, chatTemplateJinja []byte) (*Tokenizer, error) {
	var cfg tokenizerConfig
	if len(tokenizerConfigJSON) > 0 {
		if err := json.Unmarshal(tokenizerConfigJSON, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: parse tokenizer_config.json: %w", err)
		}
	}
	if chatTemplateJinja != nil {
		if cfg.ChatTemplate == nil {
			cfg.ChatTemplate = &chatTemplateSpec{}
		}
		cfg.ChatTemplate.Default = string(chatTemplateJinja)
	}
	t, err := build(tokenizerJSON)
	if err != nil {
		return nil, err
	}
	t.config = cfg
	if cfg.CleanUpTokenizationSpaces != nil {
		// transformers 5 ignores clean_up_tokenization_spaces for a BPE model (it would strip
		// real spaces before punctuation: CLIP decodes "hello world !") unless the config
		// insists with clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output.
		_, bpe := t.model.(*bpeModel)
		t.cleanUpSpaces = *cfg.CleanUpTokenizationSpaces && (!bpe || cfg.CleanUpBPEAnyway)
	}
	filePost := t.post
	if pp, err := t.configPostProcessor(); err != nil {
		return nil, err
	} else if pp != nil {
		t.post = pp
	}
	if err := t.applyTokenizerClass(filePost); err != nil {
		return nil, err
	}
	if err := t.addConfigSpecialTokens(); err != nil {
		return nil, err
	}
	if cfg.ChatTemplate != nil {
		ct, err := newChatTemplate(cfg.ChatTemplate, &cfg)
		if err != nil {
			return nil, err
		}
		t.chat = ct
	}
	return t, nil
}

// Encode returns the ids HF's tokenizer.encode(text, add_special_tokens=False) returns: added
// and special tokens written in the text are recognized as such (split_special_tokens=False),
// and no BOS/EOS is added.
func (t *Tokenizer) Encode(text string) []int32 {
	return t.encode(text, nil)
}

// Decode returns HF's tokenizer.decode(ids, skip_special_tokens=False). Ids outside the
// vocabulary are skipped, as HF does; invalid UTF-8 produced by splitting a character across
// ids becomes U+FFFD exactly as Rust's String::from_utf8_lossy does.
func (t *Tokenizer) Decode(ids []int32) string {
	return t.decode(ids, false)
}

// DecodeSkipSpecial returns HF's tokenizer.decode(ids, skip_special_tokens=True): Decode
// without the added tokens marked special.
func (t *Tokenizer) DecodeSkipSpecial(ids []int32) string {
	return t.decode(ids, true)
}

// VocabSize is len(tokenizer) in transformers: the highest token id plus one, counting added
// tokens. A model's embedding table may be larger (Qwen3 pads to 151,936).
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenString returns the raw token string of id (e.g. "Ġhello" for byte-level BPE, or
// "<|im_end|>"), as HF's convert_ids_to_tokens does; false when no token has that id.
func (t *Tokenizer) TokenString(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.idToToken) {
		return "", false
	}
	s := t.idToToken[id]
	if s == "" {
		return "", false
	}
	return s, true
}

// TokenBytes appends the bytes one id decodes to on its own (a byte-level token's raw bytes,
// which may be part of a UTF-8 character; an added token's text), as OpenAI's logprobs
// `bytes` report them; nothing for an id without a token.
func (t *Tokenizer) TokenBytes(dst []byte, id int32) []byte {
	return t.appendID(dst, id)
}

// SpecialID returns the id of a token given by its exact string, looking at added tokens
// first and then the model vocabulary. It is meant for special tokens ("<|im_end|>",
// "<|endoftext|>") that callers need as ids: stop tokens, template markers.
func (t *Tokenizer) SpecialID(tok string) (int32, bool) {
	if id, ok := t.tokenToID[tok]; ok {
		return id, true
	}
	return t.model.tokenID(tok)
}

// IsSpecial reports whether id is an added token marked "special" in tokenizer.json, or a
// special token tokenizer_config.json names (what skip_special_tokens=True would drop).
func (t *Tokenizer) IsSpecial(id int32) bool { return t.special[id] }

// EOSToken returns tokenizer_config.json's eos_token ("" when unset). Servers use it, with
// generation_config.json, to know where generation stops.
func (t *Tokenizer) EOSToken() string { return t.config.EOSToken.Content }

// BOSToken returns tokenizer_config.json's bos_token ("" when unset).
func (t *Tokenizer) BOSToken() string { return t.config.BOSToken.Content }

// HasChatTemplate reports whether tokenizer_config.json carries a chat_template; without one a
// server must refuse chat requests rather than invent a format.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ApplyChatTemplate renders msgs with the checkpoint's own Jinja chat template, as
// transformers' apply_chat_template(msgs, tokenize=False, add_generation_prompt=...,
// **kwargs) does. kwargs are extra template variables (e.g. "enable_thinking": false,
// "tools": [...]); bos_token, eos_token and the other special tokens of tokenizer_config.json
// are provided as transformers provides them. The result is meant to be passed to Encode.
//
// Any value may be a json.RawMessage (a message's "tool_calls", the "tools" kwarg, a whole
// message): it is decoded as Python's json.loads would, keeping object key order and the
// int/float distinction, so `| tojson` writes it back exactly as transformers does. Plain Go
// maps have no key order; tojson writes their keys sorted.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool, kwargs map[string]any) (string, error) {
	if t.chat == nil {
		return "", errors.New("tokenizer: this tokenizer has no chat_template in tokenizer_config.json; use a chat checkpoint or send plain completions")
	}
	return t.chat.render(msgs, addGenerationPrompt, kwargs)
}
