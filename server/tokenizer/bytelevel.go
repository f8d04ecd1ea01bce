package tokenizer

import "strings"

// byteToRune is GPT-2's bytes_to_unicode table: printable Latin-1 bytes map to themselves,
// every other byte to U+0100 + n in byte order, so that each byte has a visible, non-space
// character and byte-level tokens can be stored as JSON strings.
var byteToRune [256]rune

// runeToByte inverts byteToRune; -1 for runes that are not byte characters.
var runeToByte = map[rune]byte{}

func init() {
	keep := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	n := 0
	for b := 0; b < 256; b++ {
		if keep(b) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelString maps raw bytes to their ByteLevel characters (what tokenizers stores).
func byteLevelString(s string) string {
	var sb strings.Builder
	sb.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}

// appendTokenBytes appends what the ByteLevel decoder makes of one token: its characters mapped
// back to bytes, or — when any character is not a byte character, as for added tokens like
// "<think>" written in plain UTF-8 — the token's own UTF-8 bytes (tokenizers' decode_chain).
func appendTokenBytes(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		if r < 0x80 && r >= '!' && r <= '~' {
			dst = append(dst, byte(r))
			continue
		}
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], tok...)
		}
		dst = append(dst, b)
	}
	return dst
}

// appendLossy appends b to dst as valid UTF-8, replacing each maximal invalid subpart with
// U+FFFD — the Unicode "substitution of maximal subparts" practice that Rust's
// String::from_utf8_lossy (used by tokenizers' ByteLevel decoder) follows. Go's
// strings.ToValidUTF8 collapses whole invalid runs instead, which would differ from HF.
func appendLossy(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			dst = append(dst, c)
			i++
			continue
		}
		n, valid := utf8Prefix(b[i:])
		if valid {
			dst = append(dst, b[i:i+n]...)
		} else {
			dst = append(dst, "\uFFFD"...)
		}
		i += n
	}
	return dst
}

// utf8Prefix inspects the sequence starting at b[0] (a non-ASCII byte). It returns the length
// of the complete character and true, or the length of the maximal invalid subpart and false.
// A subpart cut short by the end of b is reported with complete=false by utf8Incomplete.
func utf8Prefix(b []byte) (int, bool) {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1, false
	}
	for k := 1; k <= need; k++ {
		if k >= len(b) || b[k] < lo || b[k] > hi {
			return k, false
		}
		lo, hi = 0x80, 0xBF
	}
	return need + 1, true
}

// incompleteTail returns how many bytes at the end of b form the start of a UTF-8 character
// that more bytes could still complete. A StreamDecoder holds those back.
func incompleteTail(b []byte) int {
	// A character is at most 4 bytes, so only the last 3 bytes can be an unfinished start.
	for k := 1; k <= 3 && k <= len(b); k++ {
		i := len(b) - k
		c := b[i]
		if c < 0x80 {
			return 0
		}
		if c < 0xC0 {
			continue // continuation byte; look further back for the lead byte
		}
		n, valid := utf8Prefix(b[i:])
		if !valid && n == len(b)-i {
			return k // every byte so far fits; it was cut only by the end of b
		}
		return 0
	}
	return 0
}
