package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer is one tokenizers normalizer. Byte-level BPE checkpoints use at most NFC (Qwen)
// or nothing (GPT-2); SentencePiece-style ones Prepend and Replace (Llama 2) or Precompiled,
// NFKC and Replace (T5).
type normalizer interface {
	normalize(s string) string
}

type unicodeForm struct{ f norm.Form }

func (u unicodeForm) normalize(s string) string {
	if u.f.IsNormalString(s) {
		return s
	}
	return u.f.String(s)
}

// lowercase is tokenizers' Lowercase: Rust's char::to_lowercase on every character. That is
// Go's unicode.ToLower except for U+0130 (İ), whose full lowercase mapping is two characters,
// "i" and U+0307; no context-dependent rule (final sigma) applies.
type lowercase struct{}

func (lowercase) normalize(s string) string {
	if strings.ContainsRune(s, 'İ') {
		s = strings.ReplaceAll(s, "İ", "i\u0307")
	}
	return strings.ToLower(s)
}

type normalizerSeq []normalizer

func (q normalizerSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

func parseNormalizer(raw []byte) (normalizer, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var head struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Prepend     *string           `json:"prepend"`
		Pattern     *patternJSON      `json:"pattern"`
		Content     *string           `json:"content"`
		Charsmap    *string           `json:"precompiled_charsmap"`
		StripLeft   bool              `json:"strip_left"`
		StripRight  bool              `json:"strip_right"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	switch head.Type {
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Prepend":
		if head.Prepend == nil {
			return nil, errors.New("tokenizer.json: normalizer Prepend needs \"prepend\"")
		}
		return prependNormalizer{*head.Prepend}, nil
	case "Replace":
		f, err := replacePattern(head.Pattern, "normalizer")
		if err != nil {
			return nil, err
		}
		if head.Content == nil {
			return nil, errors.New("tokenizer.json: normalizer Replace needs \"content\"")
		}
		return replaceNormalizer{f, *head.Content}, nil
	case "Strip":
		return stripNormalizer{left: head.StripLeft, right: head.StripRight}, nil
	case "Precompiled":
		if head.Charsmap == nil {
			return nil, errors.New("tokenizer.json: normalizer Precompiled needs \"precompiled_charsmap\" (base64)")
		}
		return newPrecompiled(*head.Charsmap)
	case "Sequence":
		var seq normalizerSeq
		for i, r := range head.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("%w (in normalizer.normalizers[%d])", err, i)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	default:
		return nil, fmt.Errorf("tokenizer.json: unknown normalizer type %q; supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Precompiled, Sequence", head.Type)
	}
}
