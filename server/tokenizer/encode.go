package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// encode runs tokenizers' pipeline: added tokens on the raw text, then per remaining piece the
// normalizer, added tokens with normalized=true, the pre-tokenizers and the BPE model.
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
	pretok := func(piece string) {
		switch len(t.pre) {
		case 0:
			word(piece)
		case 1:
			t.pre[0].split(piece, word)
		default:
			preSeq(t.pre).split(piece, word)
		}
	}
	t.addedVocab.raw.split(text, func(piece string) {
		if t.normalizer != nil {
			piece = t.normalizer.normalize(piece)
		}
		t.addedVocab.normalized.split(piece, pretok, emitID)
	}, emitID)
	return out
}

// decoder turns token strings back into text.
type decoder interface {
	// appendToken appends the bytes token contributes; first is true for the first token.
	appendToken(dst []byte, tok string, first bool) []byte
}

// byteLevelDecoder is tokenizers' ByteLevel decoder.
type byteLevelDecoder struct{}

func (byteLevelDecoder) appendToken(dst []byte, tok string, _ bool) []byte {
	return appendTokenBytes(dst, tok)
}

// joinDecoder is what tokenizers does without a decoder: tokens joined by single spaces.
type joinDecoder struct{}

func (joinDecoder) appendToken(dst []byte, tok string, first bool) []byte {
	if !first {
		dst = append(dst, ' ')
	}
	return append(dst, tok...)
}

func parseDecoder(raw []byte) (decoder, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return joinDecoder{}, nil
	}
	var d struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("tokenizer.json: decoder: %w", err)
	}
	switch d.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Sequence":
		if len(d.Decoders) == 1 {
			return parseDecoder(d.Decoders[0])
		}
	}
	return nil, fmt.Errorf("tokenizer.json: unknown decoder type %q; supported: ByteLevel (or a Sequence holding only it)", d.Type)
}

func (t *Tokenizer) decodeBytes(dst []byte, ids []int32, first bool) ([]byte, bool) {
	for _, id := range ids {
		dst, first = t.appendID(dst, id, first)
	}
	return dst, first
}

// appendID appends the raw bytes of one id; ids without a token add nothing.
func (t *Tokenizer) appendID(dst []byte, id int32, first bool) ([]byte, bool) {
	if id < 0 || int(id) >= len(t.idToToken) || t.idToToken[id] == "" {
		return dst, first
	}
	return t.decoder.appendToken(dst, t.idToToken[id], first), false
}

func (t *Tokenizer) decode(ids []int32) string {
	raw, _ := t.decodeBytes(make([]byte, 0, len(ids)*4), ids, true)
	s := string(appendLossy(make([]byte, 0, len(raw)), raw))
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
// the bytes of a character split across ids until it is complete, so every string it returns
// is valid UTF-8, and the concatenation of everything Add and Flush return equals
// Tokenizer.Decode of all the ids (clean_up_tokenization_spaces excepted: it is not applied
// while streaming because it looks across token boundaries). Not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
	first   bool
	out     []byte
}

// NewStreamDecoder starts an incremental decode of one sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, first: true}
}

// Add appends one id and returns the text that is now final ("" while a character is
// incomplete or the id has no token).
func (d *StreamDecoder) Add(id int32) string {
	return string(d.AddBytes(id))
}

// AddBytes is Add without a string per token, for the streaming hot path: the returned text
// (empty while a character is incomplete) is valid until the next call on d.
func (d *StreamDecoder) AddBytes(id int32) []byte {
	d.pending, d.first = d.t.appendID(d.pending, id, d.first)
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

// Flush returns whatever is held back (as U+FFFD for an incomplete character, as Decode
// would render it) and resets the decoder for reuse.
func (d *StreamDecoder) Flush() string {
	s := string(appendLossy(nil, d.pending))
	d.pending = d.pending[:0]
	d.first = true
	return s
}
