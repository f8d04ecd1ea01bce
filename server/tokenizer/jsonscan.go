package tokenizer

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonScanner is a minimal JSON reader used for the two big parts of tokenizer.json
// (model.vocab: ~150k string→int pairs, model.merges: ~150k pairs). encoding/json spends most
// of a Qwen3 load in reflection and per-value allocation there; this reader walks the bytes once
// and lets Load stay well under the 300 ms every server start can afford. Every small part of
// the file still goes through encoding/json (see load.go).
type jsonScanner struct {
	b   []byte
	pos int
	buf []byte // scratch for strings with escapes
}

func (s *jsonScanner) errorf(format string, args ...any) error {
	return fmt.Errorf("tokenizer.json: byte offset %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *jsonScanner) skipSpace() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at end of input.
func (s *jsonScanner) peek() byte {
	s.skipSpace()
	if s.pos >= len(s.b) {
		return 0
	}
	return s.b[s.pos]
}

func (s *jsonScanner) expect(c byte) error {
	if s.peek() != c {
		if s.pos >= len(s.b) {
			return s.errorf("unexpected end of input, want %q", c)
		}
		return s.errorf("found %q, want %q", s.b[s.pos], c)
	}
	s.pos++
	return nil
}

// str reads a JSON string. The returned bytes alias the input when the string has no escapes
// and the scratch buffer otherwise, so callers copy what they keep.
func (s *jsonScanner) str() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := s.pos
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		if c == '"' {
			out := s.b[start:s.pos]
			s.pos++
			return out, nil
		}
		if c == '\\' {
			return s.strSlow(start)
		}
		if c < 0x20 {
			return nil, s.errorf("control character 0x%02x in string", c)
		}
		s.pos++
	}
	return nil, s.errorf("unterminated string")
}

func (s *jsonScanner) strSlow(start int) ([]byte, error) {
	s.buf = append(s.buf[:0], s.b[start:s.pos]...)
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		switch {
		case c == '"':
			s.pos++
			return s.buf, nil
		case c < 0x20:
			return nil, s.errorf("control character 0x%02x in string", c)
		case c != '\\':
			s.buf = append(s.buf, c)
			s.pos++
			continue
		}
		if s.pos+1 >= len(s.b) {
			return nil, s.errorf("unterminated escape")
		}
		e := s.b[s.pos+1]
		s.pos += 2
		switch e {
		case '"', '\\', '/':
			s.buf = append(s.buf, e)
		case 'b':
			s.buf = append(s.buf, '\b')
		case 'f':
			s.buf = append(s.buf, '\f')
		case 'n':
			s.buf = append(s.buf, '\n')
		case 'r':
			s.buf = append(s.buf, '\r')
		case 't':
			s.buf = append(s.buf, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return nil, s.errorf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A valid pair becomes one rune; a lone surrogate becomes U+FFFD as in encoding/json.
				save := s.pos
				if s.pos+1 < len(s.b) && s.b[s.pos] == '\\' && s.b[s.pos+1] == 'u' {
					s.pos += 2
					if r2, ok := s.hex4(); ok {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							s.buf = utf8.AppendRune(s.buf, dec)
							continue
						}
					}
				}
				s.pos = save
				r = utf8.RuneError
			}
			s.buf = utf8.AppendRune(s.buf, r)
		default:
			return nil, s.errorf("bad escape \\%c", e)
		}
	}
	return nil, s.errorf("unterminated string")
}

func (s *jsonScanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.pos : s.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	s.pos += 4
	return r, true
}

// integer reads a JSON number that must be an integer fitting in int32.
func (s *jsonScanner) integer() (int32, error) {
	s.skipSpace()
	start := s.pos
	if s.pos < len(s.b) && s.b[s.pos] == '-' {
		s.pos++
	}
	for s.pos < len(s.b) && s.b[s.pos] >= '0' && s.b[s.pos] <= '9' {
		s.pos++
	}
	if s.pos == start {
		return 0, s.errorf("want an integer")
	}
	if s.pos < len(s.b) {
		switch s.b[s.pos] {
		case '.', 'e', 'E':
			return 0, s.errorf("want an integer, found a fractional number")
		}
	}
	v, err := strconv.ParseInt(string(s.b[start:s.pos]), 10, 32)
	if err != nil {
		return 0, s.errorf("integer %s out of range", s.b[start:s.pos])
	}
	return int32(v), nil
}

// skipValue steps over any JSON value and returns its raw bytes, for encoding/json to decode.
// It checks bracket nesting and string syntax, which is what keeps later slicing safe;
// encoding/json validates the rest of the captured value.
func (s *jsonScanner) skipValue() ([]byte, error) {
	s.skipSpace()
	start := s.pos
	if s.pos >= len(s.b) {
		return nil, s.errorf("unexpected end of input, want a value")
	}
	switch s.b[s.pos] {
	case '"':
		if _, err := s.str(); err != nil {
			return nil, err
		}
	case '{', '[':
		var stack []byte
		for {
			if s.pos >= len(s.b) {
				return nil, s.errorf("unexpected end of input inside a value that started at offset %d", start)
			}
			switch c := s.b[s.pos]; c {
			case '"':
				if _, err := s.str(); err != nil {
					return nil, err
				}
				continue
			case '{':
				stack = append(stack, '}')
			case '[':
				stack = append(stack, ']')
			case '}', ']':
				if len(stack) == 0 || stack[len(stack)-1] != c {
					return nil, s.errorf("mismatched %q", c)
				}
				stack = stack[:len(stack)-1]
			}
			s.pos++
			if len(stack) == 0 {
				break
			}
		}
	default:
		for s.pos < len(s.b) {
			switch s.b[s.pos] {
			case ',', '}', ']', ' ', '\t', '\n', '\r', ':', '{', '[', '"':
				goto done
			}
			s.pos++
		}
	done:
		if s.pos == start {
			return nil, s.errorf("unexpected %q, want a value", s.b[s.pos])
		}
	}
	return s.b[start:s.pos], nil
}

// object iterates over the members of a JSON object, calling fn with each key (valid only
// during the call) while the scanner sits at the value, which fn must consume.
func (s *jsonScanner) object(fn func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	for {
		k, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := fn(k); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return s.errorf("want ',' or '}' in object")
		}
	}
}

// array iterates over the elements of a JSON array; fn consumes each element.
func (s *jsonScanner) array(fn func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := fn(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return s.errorf("want ',' or ']' in array")
		}
	}
}

func (s *jsonScanner) isNull() bool {
	if s.peek() == 'n' && s.pos+4 <= len(s.b) && string(s.b[s.pos:s.pos+4]) == "null" {
		s.pos += 4
		return true
	}
	return false
}
