package tokenizer

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// precompiledNormalizer is tokenizers' Precompiled normalizer (the spm_precompiled crate): the
// normalization rules a SentencePiece model carries (nmt_nfkc for T5), compiled into a
// darts-clone double-array trie over UTF-8 keys whose values index NUL-terminated
// replacements. The charsmap is [u32 LE trie size in bytes][trie units, u32 LE][replacements].
//
// The text is rewritten grapheme by grapheme, as the crate does: a grapheme shorter than 6
// bytes is looked up whole, and when the shortest key that prefixes it has a replacement the
// whole grapheme becomes that replacement; otherwise each character is looked up alone.
type precompiledNormalizer struct {
	trie       []uint32
	normalized string
}

func newPrecompiled(b64 string) (*precompiledNormalizer, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer Precompiled: precompiled_charsmap is not base64: %w", err)
	}
	return parsePrecompiledCharsmap(raw)
}

func parsePrecompiledCharsmap(raw []byte) (*precompiledNormalizer, error) {
	if len(raw) < 4 {
		return nil, errors.New("tokenizer.json: normalizer Precompiled: precompiled_charsmap is shorter than its 4-byte header")
	}
	size := binary.LittleEndian.Uint32(raw)
	n := int(size / 4)
	if uint64(n)*4 > uint64(len(raw)-4) {
		return nil, fmt.Errorf("tokenizer.json: normalizer Precompiled: charsmap declares a %d-byte trie but holds %d bytes", size, len(raw)-4)
	}
	p := &precompiledNormalizer{trie: make([]uint32, n)}
	for i := range p.trie {
		p.trie[i] = binary.LittleEndian.Uint32(raw[4+4*i:])
	}
	rest := raw[4+4*n:]
	if !utf8.Valid(rest) {
		return nil, errors.New("tokenizer.json: normalizer Precompiled: the charsmap's replacement strings are not valid UTF-8")
	}
	if n == 0 {
		return nil, errors.New("tokenizer.json: normalizer Precompiled: the charsmap's trie is empty")
	}
	p.normalized = string(rest)
	return p, nil
}

// Double-array unit fields, as darts-clone lays them out.
func unitHasLeaf(u uint32) bool  { return (u>>8)&1 == 1 }
func unitValue(u uint32) int     { return int(u & (1<<31 - 1)) }
func unitLabel(u uint32) uint32  { return u & (1<<31 | 0xFF) }
func unitOffset(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }

// firstPrefixValue is the value of the shortest key that prefixes key (the first result of
// the crate's common_prefix_search); ok=false when none does. A NUL byte ends the key.
// Indices outside the array (a corrupt charsmap) end the search instead of panicking.
func (p *precompiledNormalizer) firstPrefixValue(key string) (int, bool) {
	pos := uint32(0)
	pos ^= unitOffset(p.trie[0])
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == 0 {
			return 0, false
		}
		pos ^= uint32(c)
		if int(pos) >= len(p.trie) {
			return 0, false
		}
		u := p.trie[pos]
		if unitLabel(u) != uint32(c) {
			return 0, false
		}
		pos ^= unitOffset(u)
		if unitHasLeaf(u) {
			if int(pos) >= len(p.trie) {
				return 0, false
			}
			return unitValue(p.trie[pos]), true
		}
	}
	return 0, false
}

// transform returns the replacement of chunk, if any.
func (p *precompiledNormalizer) transform(chunk string) (string, bool) {
	v, ok := p.firstPrefixValue(chunk)
	if !ok || v > len(p.normalized) {
		return "", false
	}
	end := strings.IndexByte(p.normalized[v:], 0)
	if end < 0 {
		end = len(p.normalized) - v
	}
	return p.normalized[v : v+end], true
}

func (p *precompiledNormalizer) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	changed := false
	for i := 0; i < len(s); {
		n := graphemeLen(s[i:])
		g := s[i : i+n]
		i += n
		if len(g) < 6 {
			if r, ok := p.transform(g); ok {
				b.WriteString(r)
				changed = true
				continue
			}
		}
		for j := 0; j < len(g); {
			_, w := utf8.DecodeRuneInString(g[j:])
			c := g[j : j+w]
			j += w
			if r, ok := p.transform(c); ok {
				b.WriteString(r)
				changed = true
			} else {
				b.WriteString(c)
			}
		}
	}
	if !changed {
		return s
	}
	return b.String()
}

// graphemeLen is the byte length of the extended grapheme cluster (Unicode UAX #29) that
// begins s, for the rules that can make a cluster shorter than 6 bytes, the only clusters the
// Precompiled normalizer treats differently from their characters: CR LF (GB3), never across a
// control (GB4, GB5), any character followed by Extend, ZWJ or SpacingMark characters (GB9,
// GB9a), and Prepend followed by a character (GB9b). Hangul syllable sequences, emoji ZWJ
// sequences, regional-indicator pairs and Indic conjuncts (GB6-8, GB9c, GB11-13) always span
// 6 bytes or more, where the normalizer works per character either way, so they are left as
// separate clusters.
func graphemeLen(s string) int {
	r, n := utf8.DecodeRuneInString(s)
	if r == '\r' {
		if len(s) > 1 && s[1] == '\n' {
			return 2
		}
		return 1
	}
	if isGraphemeControl(r) {
		return n
	}
	if isGraphemePrepend(r) && n < len(s) {
		r2, _ := utf8.DecodeRuneInString(s[n:])
		if !isGraphemeControl(r2) && r2 != '\r' {
			return n + graphemeLen(s[n:])
		}
	}
	for n < len(s) {
		r2, w := utf8.DecodeRuneInString(s[n:])
		if !isGraphemeExtend(r2) && r2 != 0x200D && !isSpacingMark(r2) {
			break
		}
		n += w
	}
	return n
}

func isGraphemeControl(r rune) bool {
	switch {
	case r == '\n' || r == '\r':
		return true
	case r == 0x200C || r == 0x200D:
		return false
	case unicode.Is(unicode.Prepended_Concatenation_Mark, r), unicode.Is(unicode.Other_Grapheme_Extend, r):
		return false // Prepend, or Extend (the tag characters are Cf)
	}
	return unicode.In(r, unicode.Cc, unicode.Zl, unicode.Zp, unicode.Cf)
}

func isGraphemePrepend(r rune) bool {
	return unicode.Is(unicode.Prepended_Concatenation_Mark, r)
}

// isGraphemeExtend is Grapheme_Cluster_Break=Extend: Grapheme_Extend (Mn, Me and
// Other_Grapheme_Extend) and the emoji skin-tone modifiers.
func isGraphemeExtend(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Other_Grapheme_Extend) || (r >= 0x1F3FB && r <= 0x1F3FF)
}

// isSpacingMark is Grapheme_Cluster_Break=SpacingMark: spacing combining marks that are not
// Extend, less the listed exceptions, plus Thai and Lao SARA AM.
func isSpacingMark(r rune) bool {
	if r == 0x0E33 || r == 0x0EB3 {
		return true
	}
	if !unicode.Is(unicode.Mc, r) || unicode.Is(unicode.Other_Grapheme_Extend, r) {
		return false
	}
	switch {
	case r == 0x102B || r == 0x102C || r == 0x1038 || (r >= 0x1062 && r <= 0x1064) || (r >= 0x1067 && r <= 0x106D),
		r == 0x1083 || (r >= 0x1087 && r <= 0x108C) || r == 0x108F || (r >= 0x109A && r <= 0x109C),
		r == 0x1A61 || r == 0x1A63 || r == 0x1A64 || r == 0xAA7B || r == 0xAA7D || r == 0x11720 || r == 0x11721:
		return false
	}
	return true
}
