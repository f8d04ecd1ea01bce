package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedVocabulary finds added tokens in text before normalization and pre-tokenization, as
// tokenizers' AddedVocabulary.extract_and_normalize does: tokens with normalized=false are
// matched on the raw text, the others on the normalized text, each with leftmost-longest
// matching, and lstrip/rstrip/single_word adjust or veto each match.
type addedVocabulary struct {
	raw, normalized *tokenMatcher // nil when the group is empty
}

type addedToken struct {
	content                    string
	id                         int32
	singleWord, lstrip, rstrip bool
}

func newAddedVocabulary(tokens []addedTokenJSON, n normalizer) (*addedVocabulary, error) {
	var raw, normd []addedToken
	for _, a := range tokens {
		t := addedToken{content: a.Content, id: *a.ID, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip}
		if a.Normalized {
			if n != nil {
				t.content = n.normalize(t.content)
			}
			normd = append(normd, t)
		} else {
			raw = append(raw, t)
		}
	}
	return &addedVocabulary{raw: newTokenMatcher(raw), normalized: newTokenMatcher(normd)}, nil
}

// refreshAddedVocabulary rebuilds what depends on the added tokens and the normalizer: the
// matcher Encode uses and the normalized token texts Decode uses.
func (t *Tokenizer) refreshAddedVocabulary() error {
	var err error
	if t.addedVocab, err = newAddedVocabulary(t.addedTokens, t.normalizer); err != nil {
		return err
	}
	t.addedDecodeText = nil
	if t.normalizer == nil {
		return nil
	}
	for _, a := range t.addedTokens {
		if !a.Normalized {
			continue
		}
		if n := t.normalizer.normalize(a.Content); n != a.Content {
			if t.addedDecodeText == nil {
				t.addedDecodeText = map[int32]string{}
			}
			t.addedDecodeText[*a.ID] = n
		}
	}
	return nil
}

// tokenMatcher is a leftmost-longest multi-string matcher for the handful of added tokens a
// checkpoint has (Qwen3: 26, all starting with '<'), indexed by first byte.
type tokenMatcher struct {
	tokens  []addedToken
	byFirst [256][]int // token indices, longest first
	// oneFirst is the only first byte when all tokens share one, so the scan can use IndexByte.
	oneFirst int
}

func newTokenMatcher(tokens []addedToken) *tokenMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &tokenMatcher{tokens: tokens, oneFirst: -1}
	firsts := map[byte]bool{}
	for i, t := range tokens {
		c := t.content[0]
		m.byFirst[c] = append(m.byFirst[c], i)
		firsts[c] = true
	}
	for c := range m.byFirst {
		l := m.byFirst[c]
		sort.SliceStable(l, func(a, b int) bool { return len(tokens[l[a]].content) > len(tokens[l[b]].content) })
	}
	if len(firsts) == 1 {
		for c := range firsts {
			m.oneFirst = int(c)
		}
	}
	return m
}

// next finds the leftmost-longest token occurrence at or after from.
func (m *tokenMatcher) next(s string, from int) (start, end, tok int) {
	for i := from; i < len(s); i++ {
		if m.oneFirst >= 0 {
			j := strings.IndexByte(s[i:], byte(m.oneFirst))
			if j < 0 {
				return -1, -1, -1
			}
			i += j
		}
		for _, k := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], m.tokens[k].content) {
				return i, i + len(m.tokens[k].content), k
			}
		}
	}
	return -1, -1, -1
}

// split cuts s into plain-text pieces and added-token ids, calling text for each non-empty
// piece and token for each id, in order. It follows tokenizers' find_matches, including its
// treatment of lstrip (spaces before the token are absorbed, never before the previous split)
// and rstrip (spaces after it are absorbed).
func (m *tokenMatcher) split(s string, text func(string), token func(int32)) {
	if m == nil {
		if s != "" {
			text(s)
		}
		return
	}
	startOffset := 0
	for pos := 0; pos < len(s); {
		start, stop, k := m.next(s, pos)
		if k < 0 {
			break
		}
		pos = stop
		t := &m.tokens[k]
		if t.singleWord {
			startSpace := start == 0 || !endsWithWordChar(s[:start])
			stopSpace := stop == len(s) || !startsWithWordChar(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if t.lstrip {
			newStart := spaceLeftmostAtEnd(s[:start])
			start = max(newStart, startOffset)
		}
		if t.rstrip {
			stop += spaceRightmostAtStart(s[stop:])
		}
		if startOffset < start {
			text(s[startOffset:start])
		}
		token(t.id)
		startOffset = stop
	}
	if startOffset < len(s) {
		text(s[startOffset:])
	}
}

// isWordChar is Rust's char::is_alphanumeric (Alphabetic or Numeric) or '_', which tokenizers
// uses for single_word boundaries.
func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Other_Alphabetic, r)
}

func endsWithWordChar(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

func isRustWhitespace(r rune) bool { return unicode.Is(unicode.White_Space, r) }

// spaceLeftmostAtEnd returns the offset where the trailing whitespace of s begins.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, w := utf8.DecodeLastRuneInString(s[:i])
		if !isRustWhitespace(r) {
			break
		}
		i -= w
	}
	return i
}

// spaceRightmostAtStart returns the length of the leading whitespace of s.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, w := utf8.DecodeRuneInString(s[i:])
		if !isRustWhitespace(r) {
			break
		}
		i += w
	}
	return i
}
