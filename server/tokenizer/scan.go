package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character classes of the pre-tokenizer regexes: \p{L}, \p{N}, \s (Unicode White_Space, as
// Oniguruma's \s), and "other" (neither), with an ASCII table for the common case.
const (
	clsOther = iota
	clsLetter
	clsNumber
	clsSpace
)

var asciiClass [128]uint8

func init() {
	for c := 0; c < 128; c++ {
		asciiClass[c] = uint8(classOfRune(rune(c)))
	}
}

func classOfRune(r rune) int {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.Is(unicode.White_Space, r):
		return clsSpace
	}
	return clsOther
}

// classAt returns the class and byte width of the character at s[i] (i < len(s)). Invalid
// UTF-8 bytes count as one-byte "other" characters.
func classAt(s string, i int) (int, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return int(asciiClass[c]), 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && w == 1 {
		return clsOther, 1
	}
	return classOfRune(r), w
}

// scanClass returns the end of the run of characters of class cls starting at i.
func scanClass(s string, i, cls int) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c != cls {
			return i
		}
		i += w
	}
	return i
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d right after an apostrophe at s[i-1] and returns
// its length after the apostrophe (0: no match). With fold, letters match case-insensitively
// with Unicode simple case folding, as Oniguruma's (?i:...) does: 'S' and 'ſ' (U+017F) match 's'.
func contraction(s string, i int, fold bool) int {
	lower := func(j int) (byte, int) {
		if j >= len(s) {
			return 0, 0
		}
		c := s[j]
		if fold {
			if c >= 'A' && c <= 'Z' {
				return c + 32, 1
			}
			if c == 0xC5 && j+1 < len(s) && s[j+1] == 0xBF { // U+017F LATIN SMALL LETTER LONG S
				return 's', 2
			}
		}
		return c, 1
	}
	c1, w1 := lower(i)
	switch c1 {
	case 's', 't', 'm', 'd':
		return w1
	case 'r', 'v':
		if c2, w2 := lower(i + w1); c2 == 'e' {
			return w1 + w2
		}
	case 'l':
		if c2, w2 := lower(i + w1); c2 == 'l' {
			return w1 + w2
		}
	}
	return 0
}

// scanSpaceTail handles the whitespace alternatives shared by both patterns, starting at a
// whitespace character at i: `\s+(?!\S)|\s+`. It returns the match end.
func scanSpaceTail(s string, i int) int {
	j, last := i, i
	for j < len(s) {
		c, w := classAt(s, j)
		if c != clsSpace {
			break
		}
		last = j
		j += w
	}
	if j == len(s) || last == i {
		return j // at end of text (?!\S) holds; a single space falls through to \s+
	}
	return last // back off one character so the next word can take its leading space
}

// gpt2Scanner implements GPT-2's pattern (used by ByteLevel's use_regex and by Split with the
// same pattern):
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
type gpt2Scanner struct{}

func (gpt2Scanner) findAll(s string, fn func(start, end int)) {
	for i := 0; i < len(s); {
		e := gpt2MatchAt(s, i)
		fn(i, e)
		i = e
	}
}

func gpt2MatchAt(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, false); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(s, i)
	if c != clsSpace {
		return scanClass(s, i+w, c)
	}
	if s[i] == ' ' && i+1 < len(s) {
		if c2, w2 := classAt(s, i+1); c2 != clsSpace {
			return scanClass(s, i+1+w2, c2)
		}
	}
	return scanSpaceTail(s, i)
}

// qwenScanner implements the Qwen2/Qwen3 pattern (maxDigits 1) and Llama 3's (maxDigits 3):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
type qwenScanner struct{ maxDigits int }

func (q qwenScanner) findAll(s string, fn func(start, end int)) {
	for i := 0; i < len(s); {
		e := q.matchAt(s, i)
		fn(i, e)
		i = e
	}
}

func isCRLF(b byte) bool { return b == '\r' || b == '\n' }

func (q qwenScanner) matchAt(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, true); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return scanClass(s, i+w, clsLetter)
	}
	if c != clsNumber && !isCRLF(s[i]) && i+w < len(s) {
		if c2, w2 := classAt(s, i+w); c2 == clsLetter {
			return scanClass(s, i+w+w2, clsLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if c == clsNumber {
		j := i + w
		for n := 1; n < q.maxDigits && j < len(s); n++ {
			c2, w2 := classAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += w2
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	start := -1
	if c == clsOther {
		start = i
	} else if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2 == clsOther {
			start = i + 1
		}
	}
	if start >= 0 {
		j := scanClass(s, start, clsOther)
		for j < len(s) && isCRLF(s[j]) {
			j++
		}
		return j
	}
	// Only whitespace is left. \s*[\r\n]+ : the longest whitespace run, backed off to just
	// after its last line break.
	j, lastNL := i, -1
	for j < len(s) {
		c2, w2 := classAt(s, j)
		if c2 != clsSpace {
			break
		}
		if isCRLF(s[j]) {
			lastNL = j
		}
		j += w2
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	return scanSpaceTail(s, i)
}
