package tokenizer

import (
	"strings"
	"unicode/utf8"
	"unsafe"
)

// encode runs tokenizers' pipeline: added tokens on the raw text, then per remaining piece the
// normalizer, added tokens with normalized=true, the pre-tokenizers and the model.
func (t *Tokenizer) encode(text string, out []int32) []int32 {
	if out == nil {
		out = make([]int32, 0, len(text)/3+1)
	}
	if !utf8.ValidString(text) {
		// A Rust &str is always valid UTF-8; callers that hold bytes get what
		// String::from_utf8_lossy would have handed to HF.
		text = string(appendLossy(nil, []byte(text)))
	}
	emitID := func(id int32) { out = append(out, id) }
	word := func(w string) { out = t.model.tokenizeWord(w, out) }
	// atStart: the piece being split begins the original text (Metaspace "first" prepends
	// only there). Pieces are substrings of what they were cut from, so a piece begins its
	// parent exactly when it shares its first byte's address.
	var atStart bool
	pretok := func(piece string) {
		switch {
		case len(t.pre) == 0:
			word(piece)
		case len(t.pre) == 1 && !t.positional:
			t.pre[0].split(piece, word)
		default:
			preSeq(t.pre).splitAt(0, piece, atStart, word)
		}
	}
	t.addedVocab.raw.split(text, func(piece string) {
		rawStart := unsafe.StringData(piece) == unsafe.StringData(text)
		if t.normalizer != nil {
			piece = t.normalizer.normalize(piece)
		}
		normalized := piece
		t.addedVocab.normalized.split(piece, func(p string) {
			atStart = rawStart && unsafe.StringData(p) == unsafe.StringData(normalized)
			pretok(p)
		}, emitID)
	}, emitID)
	return out
}

// tokenOf is the token string of id for decoding; ok=false for ids without a token and, when
// skipSpecial, for special added tokens (what skip_special_tokens=True drops).
func (t *Tokenizer) tokenOf(id int32, skipSpecial bool) (string, bool) {
	if id < 0 || int(id) >= len(t.idToToken) || t.idToToken[id] == "" {
		return "", false
	}
	if skipSpecial && t.special[id] {
		return "", false
	}
	if s, ok := t.addedDecodeText[id]; ok {
		return s, true
	}
	return t.idToToken[id], true
}

// appendID appends the bytes one id decodes to on its own (not as the sequence's first token):
// a byte-fallback token's byte, a byte-level token's bytes, otherwise the decoder's text.
func (t *Tokenizer) appendID(dst []byte, id int32) []byte {
	tok, ok := t.tokenOf(id, false)
	if !ok {
		return dst
	}
	if c, isChain := t.decoder.(*chainDecoder); isChain && c.byteFallback {
		if b, ok := byteFallbackValue(tok); ok {
			return append(dst, b)
		}
	}
	return t.decoder.appendTokens(dst, []string{tok}, &decodeState{})
}

func (t *Tokenizer) decode(ids []int32, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.tokenOf(id, skipSpecial); ok {
			toks = append(toks, tok)
		}
	}
	raw := t.decoder.appendTokens(make([]byte, 0, len(ids)*4), toks, &decodeState{first: true, final: true})
	s := string(appendLossy(make([]byte, 0, len(raw)), raw))
	if t.decodeWordSuffix != "" {
		s = cleanDecodedWords(s, t.decodeWordSuffix)
	}
	if t.cleanUpSpaces {
		s = cleanUpTokenization(s)
	}
	return s
}

// cleanUpTokenization is transformers' clean_up_tokenization, applied by decode when
// tokenizer_config.json sets clean_up_tokenization_spaces. The replacements run one after the
// other, as in Python.
func cleanUpTokenization(s string) string {
	for _, r := range [][2]string{{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// StreamDecoder turns ids into text one id at a time for streaming responses. It holds back
// what the next id may still change — the bytes of a character split across byte-level ids,
// a run of byte-fallback ids that may continue — so every string it returns is valid UTF-8,
// and the concatenation of everything Add and Flush return equals Tokenizer.Decode of all the
// ids (DecodeSkipSpecial with SkipSpecialTokens; clean_up_tokenization_spaces excepted: it is
// not applied while streaming because it looks across token boundaries, nor is CLIP's
// word-end clean-up, which strips the whole text). A stream primed with a context (Prime)
// returns instead the text those ids add after it. Not safe for concurrent use.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	window      []string // tokens not yet decoded
	st          decodeState
	pending     []byte // decoded bytes not yet returned (an incomplete character)
	out         []byte
}

// NewStreamDecoder starts an incremental decode of one sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, st: decodeState{first: true}}
}

// Prime tells the stream that the ids it will be given follow context (a prompt, or a
// rendered chat template): they then decode as they read after it, not as a sequence of their
// own. That is the text of Decode(context + ids) after Decode(context), what tokenizers'
// DecodeStream primed with the prompt emits (vLLM's and TGI's completion text). It matters for
// SentencePiece-style decoders only, which treat a sequence's start apart: a Strip decoder
// removes the first token's leading space and a Metaspace decoder drops its "▁", so "▁Paris"
// generated after "The capital of France is" must read " Paris", not "Paris". Byte-level
// decoding does not depend on position and is left as it was. What the context leaves
// unfinished is not carried over: a character whose first bytes end the context is not
// completed by the generated bytes (those decode as they would alone, U+FFFD), so the
// completion never holds text of the prompt. Call Prime after SkipSpecialTokens and before the
// first Add; Flush forgets it. It returns d.
func (d *StreamDecoder) Prime(context []int32) *StreamDecoder {
	if _, byteLevel := d.t.decoder.(byteLevelDecoder); byteLevel {
		return d
	}
	// The context's text is decoded only for the state it leaves (first token seen, leading
	// characters stripped) and thrown away, including any bytes held for an unfinished
	// character. It is decoded as a stream would decode it, window by window, so it can stop
	// as soon as the state is settled: on a prompt that starts with a word, after its first
	// piece, whatever the prompt's length.
	for _, id := range context {
		tok, ok := d.t.tokenOf(id, d.skipSpecial)
		if !ok {
			continue
		}
		d.window = append(d.window, tok)
		if d.t.decoder.holdAfter(tok) {
			continue
		}
		d.decodeWindow(false)
		d.pending = d.pending[:0]
		if d.st.settled() {
			return d
		}
	}
	d.decodeWindow(false)
	d.pending = d.pending[:0]
	return d
}

// SkipSpecialTokens makes the stream drop special tokens, as DecodeSkipSpecial does; call it
// before the first Add. It returns d.
func (d *StreamDecoder) SkipSpecialTokens() *StreamDecoder {
	d.skipSpecial = true
	return d
}

// Add appends one id and returns the text that is now final ("" while a character is
// incomplete or the id has no token).
func (d *StreamDecoder) Add(id int32) string {
	return string(d.AddBytes(id))
}

// AddBytes is Add without a string per token, for the streaming hot path: the returned text
// (empty while a character is incomplete) is valid until the next call on d.
func (d *StreamDecoder) AddBytes(id int32) []byte {
	tok, ok := d.t.tokenOf(id, d.skipSpecial)
	if !ok {
		return nil
	}
	d.window = append(d.window, tok)
	if d.t.decoder.holdAfter(tok) {
		return nil
	}
	d.decodeWindow(false)
	keep := incompleteTail(d.pending)
	ready := d.pending[:len(d.pending)-keep]
	if len(ready) == 0 {
		return nil
	}
	d.out = appendLossy(d.out[:0], ready)
	n := copy(d.pending, d.pending[len(ready):])
	d.pending = d.pending[:n]
	return d.out
}

func (d *StreamDecoder) decodeWindow(final bool) {
	if len(d.window) == 0 {
		return
	}
	d.st.final = final
	d.pending = d.t.decoder.appendTokens(d.pending, d.window, &d.st)
	d.window = d.window[:0]
	d.st.first = false
}

// Flush returns whatever is held back (as U+FFFD for an incomplete character, as Decode
// would render it) and resets the decoder for reuse on a new sequence (unprimed).
func (d *StreamDecoder) Flush() string {
	d.decodeWindow(true)
	s := string(appendLossy(nil, d.pending))
	d.pending = d.pending[:0]
	d.st = decodeState{first: true}
	return s
}
