// Command spmmodel writes the tokenizer.model (a SentencePiece ModelProto) and added_tokens.json
// that describe a SentencePiece-style BPE kept in tokenizer.json alone, so an engine whose
// converter reads SentencePiece models only from tokenizer.model (Ollama's `ollama create`)
// imports the checkpoint's tokenizer as SentencePiece BPE instead of misreading it as
// byte-level BPE.
//
//	go run ./qual/launch/foreign/ollama/spmmodel --tokenizer SNAP/tokenizer.json --out DIR
//
// The mapping is the one transformers' LlamaConverter inverts: a piece made by merge rank r
// scores -r, so "merge the adjacent pair whose joined piece scores highest" (SentencePiece
// BPE, llama.cpp's SPM tokenizer) replays the merges in rank order; pieces no merge makes
// score below every merge. <unk> is UNKNOWN, the special tokens inside the model's vocabulary
// are CONTROL, <0xNN> are BYTE. Tokens added past the model's vocabulary go to
// added_tokens.json, which the same converters read.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// SentencePiece piece types (sentencepiece_model.proto, ModelProto.SentencePiece.Type).
const (
	typeNormal  = 1
	typeUnknown = 2
	typeControl = 3
	typeByte    = 6
)

// tokenizerJSON is the part of Hugging Face tokenizers' tokenizer.json this reads.
type tokenizerJSON struct {
	Model struct {
		Type         string          `json:"type"`
		Vocab        map[string]int  `json:"vocab"`
		Merges       json.RawMessage `json:"merges"`
		UnkToken     *string         `json:"unk_token"`
		ByteFallback bool            `json:"byte_fallback"`
	} `json:"model"`
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
}

// piece is one entry of the model's vocabulary in id order.
type piece struct {
	text  string
	score float32
	typ   int
}

var bytePiece = regexp.MustCompile(`^<0x[0-9A-F]{2}>$`)

// merges reads model.merges in either form tokenizers writes: ["a b", ...] or [["a","b"], ...].
func merges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var joined []string
	if err := json.Unmarshal(raw, &joined); err != nil {
		return nil, fmt.Errorf("model.merges is neither [[left, right], ...] nor [\"left right\", ...]: %v", err)
	}
	for i, m := range joined {
		l, r, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("model.merges[%d] %q has no space between its two parts", i, m)
		}
		pairs = append(pairs, [2]string{l, r})
	}
	return pairs, nil
}

// convert maps tokenizer.json to the model's pieces in id order and the added tokens past them.
func convert(t tokenizerJSON) ([]piece, map[string]int, error) {
	if t.Model.Type != "BPE" {
		return nil, nil, fmt.Errorf("model.type is %q: only a SentencePiece-style BPE (model.type BPE with byte_fallback) has a tokenizer.model form", t.Model.Type)
	}
	if !t.Model.ByteFallback {
		return nil, nil, fmt.Errorf("model.byte_fallback is false: this is a byte-level BPE, which engines read from tokenizer.json directly; no tokenizer.model is needed")
	}
	n := len(t.Model.Vocab)
	pieces := make([]piece, n)
	seen := make([]bool, n)
	for text, id := range t.Model.Vocab {
		if id < 0 || id >= n || seen[id] {
			return nil, nil, fmt.Errorf("model.vocab: id %d of %q is out of 0..%d or repeated: the vocabulary must number its %d pieces densely", id, text, n-1, n)
		}
		seen[id] = true
		pieces[id] = piece{text: text, typ: typeNormal}
	}
	ms, err := merges(t.Model.Merges)
	if err != nil {
		return nil, nil, err
	}
	// Pieces no merge makes score below the last merge; of two merges making one piece, the
	// earlier (higher) rank wins, as the BPE model applies it.
	floor := -float32(len(ms) + 1)
	made := make([]bool, n)
	for rank, m := range ms {
		id, ok := t.Model.Vocab[m[0]+m[1]]
		if !ok {
			return nil, nil, fmt.Errorf("model.merges[%d] makes %q, which is not in model.vocab", rank, m[0]+m[1])
		}
		if !made[id] {
			made[id], pieces[id].score = true, -float32(rank)
		}
	}
	special := map[string]bool{}
	added := map[string]int{}
	for _, a := range t.AddedTokens {
		if a.ID >= n {
			added[a.Content] = a.ID
			continue
		}
		if a.Special {
			special[a.Content] = true
		}
	}
	for id := range pieces {
		p := &pieces[id]
		switch {
		case t.Model.UnkToken != nil && p.text == *t.Model.UnkToken:
			p.typ, p.score = typeUnknown, 0
		case special[p.text]:
			p.typ, p.score = typeControl, 0
		case bytePiece.MatchString(p.text):
			p.typ, p.score = typeByte, 0
		case !made[id]:
			p.score = floor
		}
	}
	for c, id := range added {
		if id >= n+len(added) {
			return nil, nil, fmt.Errorf("added_tokens: %q has id %d, but %d tokens are added after the vocabulary's %d: their ids must follow it densely (%d..%d)", c, id, len(added), n, n, n+len(added)-1)
		}
	}
	return pieces, added, nil
}

// marshal encodes a ModelProto with the pieces, a BPE TrainerSpec (byte fallback, the special
// ids) and the NormalizerSpec of Llama's SentencePiece models (dummy prefix, whitespace escaped
// as U+2581, no other normalisation).
func marshal(pieces []piece, unk, bos, eos int) []byte {
	var b []byte
	for _, p := range pieces {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, p.text)
		m = protowire.AppendTag(m, 2, protowire.Fixed32Type)
		m = protowire.AppendFixed32(m, math.Float32bits(p.score))
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(p.typ))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	var ts []byte
	varint := func(buf []byte, field protowire.Number, v int64) []byte {
		buf = protowire.AppendTag(buf, field, protowire.VarintType)
		return protowire.AppendVarint(buf, uint64(v))
	}
	ts = varint(ts, 3, 2) // model_type BPE
	ts = varint(ts, 4, int64(len(pieces)))
	ts = varint(ts, 35, 1) // byte_fallback
	ts = varint(ts, 40, int64(unk))
	ts = varint(ts, 41, int64(bos))
	ts = varint(ts, 42, int64(eos))
	ts = varint(ts, 43, -1) // pad_id: none
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, ts)
	var ns []byte
	ns = protowire.AppendTag(ns, 1, protowire.BytesType)
	ns = protowire.AppendString(ns, "identity")
	ns = varint(ns, 3, 1) // add_dummy_prefix
	ns = varint(ns, 4, 0) // remove_extra_whitespaces
	ns = varint(ns, 5, 1) // escape_whitespaces
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	return protowire.AppendBytes(b, ns)
}

// idOf is the id of text in the pieces, or -1.
func idOf(pieces []piece, text string) int {
	for i, p := range pieces {
		if p.text == text {
			return i
		}
	}
	return -1
}

func run(tokenizerPath, out string) error {
	raw, err := os.ReadFile(tokenizerPath)
	if err != nil {
		return err
	}
	var t tokenizerJSON
	if err := json.Unmarshal(raw, &t); err != nil {
		return fmt.Errorf("%s: %v", tokenizerPath, err)
	}
	pieces, added, err := convert(t)
	if err != nil {
		return fmt.Errorf("%s: %v", tokenizerPath, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	proto := marshal(pieces, idOf(pieces, "<unk>"), idOf(pieces, "<s>"), idOf(pieces, "</s>"))
	if err := os.WriteFile(filepath.Join(out, "tokenizer.model"), proto, 0o644); err != nil {
		return err
	}
	if len(added) == 0 {
		return nil
	}
	var at bytes.Buffer
	enc := json.NewEncoder(&at)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(added); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "added_tokens.json"), at.Bytes(), 0o644)
}

func main() {
	tok := flag.String("tokenizer", "", "the checkpoint's tokenizer.json (a SentencePiece-style BPE: model.type BPE, byte_fallback true)")
	out := flag.String("out", "", "folder to write tokenizer.model and, when tokens were added past the vocabulary, added_tokens.json")
	flag.Parse()
	if *tok == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: spmmodel --tokenizer tokenizer.json --out DIR")
		os.Exit(2)
	}
	if err := run(*tok, *out); err != nil {
		fmt.Fprintln(os.Stderr, "spmmodel:", err)
		os.Exit(1)
	}
}
