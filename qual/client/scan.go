package client

import (
	"unicode/utf16"
	"unicode/utf8"
)

// chunkInfo holds the few fields of an OpenAI response or stream chunk the harness needs.
// A targeted scanner fills it without building a document: it validates the whole JSON
// text (an invalid event is dropped, as METRICS.md requires) but decodes only the strings
// it keeps. Its results are checked against encoding/json by FuzzParseChunk.
type chunkInfo struct {
	hasContent       bool // the chunk carried non-empty text, content or reasoning content
	finishReason     string
	hasUsage         bool
	promptTokens     int
	completionTokens int
	hasError         bool
	errMessage       string
	errType          string
	errCode          int
}

// span is a raw JSON string value (without quotes) inside the chunk.
type span struct{ start, end int }

func (s span) ok() bool { return s.end > s.start }

type scanner struct {
	b   []byte
	i   int
	bad bool
}

// parseChunk scans data, appends the chunk's content to dst and fills info. ok is false
// when data is not exactly one valid JSON object (then dst is returned unchanged).
func parseChunk(data []byte, dst []byte, info *chunkInfo) (out []byte, ok bool) {
	*info = chunkInfo{}
	s := scanner{b: data}
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return dst, false
	}
	n0 := len(dst)
	dst = s.topObject(dst, info)
	s.ws()
	if s.bad || s.i != len(s.b) {
		return dst[:n0], false
	}
	info.hasContent = len(dst) > n0
	return dst, true
}

func (s *scanner) ws() {
	b, i := s.b, s.i
	for i < len(b) && isSpace[b[i]] {
		i++
	}
	s.i = i
}

// isSpace and strPlain are byte classes: JSON whitespace, and bytes a string may hold
// without ending or escaping (not '"', not '\\', not a control character).
var isSpace, strPlain = func() (sp, plain [256]bool) {
	for _, c := range " \t\n\r" {
		sp[c] = true
	}
	for c := 0x20; c < 256; c++ {
		plain[c] = c != '"' && c != '\\'
	}
	return
}()

// expect consumes c after whitespace.
func (s *scanner) expect(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	s.bad = true
	return false
}

// nextKey advances to the next key of an object whose '{' was consumed (first is true
// before the first key) and leaves the scanner at the key's value. It returns false at the
// closing '}' (consumed) or on a syntax error (s.bad).
func (s *scanner) nextKey(first *bool) ([]byte, bool) {
	s.ws()
	if s.i >= len(s.b) {
		s.bad = true
		return nil, false
	}
	c := s.b[s.i]
	if c == '}' {
		s.i++
		return nil, false
	}
	if !*first {
		if c != ',' {
			s.bad = true
			return nil, false
		}
		s.i++
		s.ws()
	}
	*first = false
	k, esc := s.str()
	if s.bad || !s.expect(':') {
		s.bad = true
		return nil, false
	}
	s.ws()
	key := s.b[k.start:k.end]
	if esc {
		key = unescape(nil, key)
	}
	return key, true
}

// nextElem advances to the next element of an array whose '[' was consumed; false at the
// closing ']' (consumed) or on a syntax error.
func (s *scanner) nextElem(first *bool) bool {
	s.ws()
	if s.i >= len(s.b) {
		s.bad = true
		return false
	}
	c := s.b[s.i]
	if c == ']' {
		s.i++
		return false
	}
	if !*first {
		if c != ',' {
			s.bad = true
			return false
		}
		s.i++
		s.ws()
	}
	*first = false
	if s.i >= len(s.b) {
		s.bad = true
		return false
	}
	return true
}

// isStart reports whether the value at the scanner starts with c.
func (s *scanner) isStart(c byte) bool { return s.i < len(s.b) && s.b[s.i] == c }

// str scans a string at s.i (which must be '"') and returns its raw span and whether it
// holds escapes. It validates escapes and rejects control characters, like encoding/json.
func (s *scanner) str() (span, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		s.bad = true
		return span{}, false
	}
	s.i++
	start := s.i
	esc := false
	for s.i < len(s.b) {
		// Fast path over plain bytes with locals the compiler keeps in registers. (Eight
		// bytes at a time with SWAR tricks measured no faster on these short strings.)
		b, i := s.b, s.i
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		s.i = i
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			sp := span{start, s.i}
			s.i++
			return sp, esc
		case c == '\\':
			esc = true
			if s.i+1 >= len(s.b) {
				s.bad = true
				return span{}, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					s.bad = true
					return span{}, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if hexVal(h) < 0 {
						s.bad = true
						return span{}, false
					}
				}
				s.i += 6
			default:
				s.bad = true
				return span{}, false
			}
		case c < 0x20:
			s.bad = true
			return span{}, false
		default:
			s.i++
		}
	}
	s.bad = true
	return span{}, false
}

// strOrNull scans a string or null; for null it returns an empty span and isStr false.
func (s *scanner) strOrNull() (sp span, esc, isStr bool) {
	if s.i < len(s.b) && s.b[s.i] == '"' {
		sp, esc = s.str()
		return sp, esc, !s.bad
	}
	s.skip()
	return span{}, false, false
}

// strField reads a string-or-null field value: its span and escape flag, or zero values
// for null (and any non-string, which is skipped).
func (s *scanner) strField() (span, bool) {
	sp, esc, isStr := s.strOrNull()
	if !isStr {
		return span{}, false
	}
	return sp, esc
}

// integer scans a JSON number; ok only when it is a plain integer that fits an int.
func (s *scanner) integer() (int, bool) {
	start := s.i
	s.skip()
	if s.bad {
		return 0, false
	}
	lit := s.b[start:s.i]
	neg := false
	if len(lit) > 0 && lit[0] == '-' {
		neg, lit = true, lit[1:]
	}
	if len(lit) == 0 || len(lit) > 18 {
		return 0, false
	}
	v := 0
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// skip consumes any JSON value, validating it.
func (s *scanner) skip() {
	s.ws()
	if s.i >= len(s.b) {
		s.bad = true
		return
	}
	switch c := s.b[s.i]; {
	case c == '{':
		s.i++
		first := true
		for _, ok := s.nextKey(&first); ok; _, ok = s.nextKey(&first) {
			s.skip()
			if s.bad {
				return
			}
		}
	case c == '[':
		s.i++
		first := true
		for s.nextElem(&first) {
			s.skip()
			if s.bad {
				return
			}
		}
	case c == '"':
		s.str()
	case c == 't':
		s.lit("true")
	case c == 'f':
		s.lit("false")
	case c == 'n':
		s.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		s.number()
	default:
		s.bad = true
	}
}

func (s *scanner) lit(w string) {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return
	}
	s.bad = true
}

// number validates the JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		s.bad = true
		return
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	} else {
		s.bad = true
		return
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			s.bad = true
			return
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			s.bad = true
			return
		}
	}
	s.i = i
}

// topObject walks the chunk (its '{' not yet consumed): choices, usage and error are read,
// everything else skipped.
func (s *scanner) topObject(dst []byte, info *chunkInfo) []byte {
	// The last occurrence of a key wins, as with encoding/json; so choices are collected per
	// occurrence and only the last "choices" array contributes.
	n0 := len(dst)
	texts := dst
	var finish string
	choicesSeen := false
	s.i++ // '{'
	first := true
	for key, ok := s.nextKey(&first); ok; key, ok = s.nextKey(&first) {
		switch string(key) {
		case "choices":
			texts, finish = texts[:n0], ""
			if !s.isStart('[') {
				s.skip()
				break
			}
			choicesSeen = true
			s.i++
			firstElem := true
			for s.nextElem(&firstElem) {
				if s.isStart('{') {
					var fr string
					texts, fr = s.choice(texts)
					if fr != "" {
						finish = fr
					}
				} else {
					s.skip()
				}
				if s.bad {
					break
				}
			}
		case "usage":
			info.hasUsage = false
			info.promptTokens, info.completionTokens = 0, 0
			if !s.isStart('{') {
				s.skip()
				break
			}
			s.i++
			var pt, ct int
			var pok, cok bool
			f := true
			for k, ok := s.nextKey(&f); ok; k, ok = s.nextKey(&f) {
				switch string(k) {
				case "prompt_tokens":
					pt, pok = s.integer()
				case "completion_tokens":
					ct, cok = s.integer()
				default:
					s.skip()
				}
				if s.bad {
					break
				}
			}
			if pok || cok {
				info.hasUsage = true
				info.promptTokens, info.completionTokens = pt, ct
			}
		case "error":
			info.hasError, info.errMessage, info.errType, info.errCode = false, "", "", 0
			switch {
			case s.isStart('{'):
				info.hasError = true
				s.i++
				f := true
				for k, ok := s.nextKey(&f); ok; k, ok = s.nextKey(&f) {
					switch string(k) {
					case "message":
						info.errMessage = s.decode(s.strField())
					case "type":
						info.errType = s.decode(s.strField())
					case "code":
						if s.i < len(s.b) && (s.b[s.i] == '-' || (s.b[s.i] >= '0' && s.b[s.i] <= '9')) {
							if v, ok := s.integer(); ok {
								info.errCode = v
							}
						} else {
							s.skip()
						}
					default:
						s.skip()
					}
					if s.bad {
						break
					}
				}
			case s.isStart('"'):
				sp, esc := s.str()
				info.hasError = true
				info.errMessage = s.decode(sp, esc)
			default:
				s.skip()
			}
		default:
			s.skip()
		}
		if s.bad {
			break
		}
	}
	if !choicesSeen || s.bad {
		return texts[:n0]
	}
	info.finishReason = finish
	return texts
}

// choice reads one element of choices (its '{' not yet consumed): text (completions),
// delta or message (chat: reasoning_content, reasoning, content) and finish_reason. It
// appends the choice's text to texts.
func (s *scanner) choice(texts []byte) ([]byte, string) {
	var text, reasoning, reasoning2, content span
	var textEsc, rEsc, r2Esc, cEsc bool
	var finish string
	s.i++
	first := true
	for key, ok := s.nextKey(&first); ok; key, ok = s.nextKey(&first) {
		switch string(key) {
		case "text":
			text, textEsc = s.strField()
		case "delta", "message":
			// The last key wins for the whole delta object too.
			reasoning, reasoning2, content = span{}, span{}, span{}
			if !s.isStart('{') {
				s.skip()
				break
			}
			s.i++
			f := true
			for k, ok := s.nextKey(&f); ok; k, ok = s.nextKey(&f) {
				switch string(k) {
				case "content":
					content, cEsc = s.strField()
				case "reasoning_content":
					reasoning, rEsc = s.strField()
				case "reasoning":
					reasoning2, r2Esc = s.strField()
				default:
					s.skip()
				}
				if s.bad {
					break
				}
			}
		case "finish_reason":
			finish = s.decode(s.strField())
		default:
			s.skip()
		}
		if s.bad {
			break
		}
	}
	if s.bad {
		return texts, ""
	}
	texts = s.appendSpan(texts, reasoning, rEsc)
	if !reasoning.ok() {
		texts = s.appendSpan(texts, reasoning2, r2Esc)
	}
	texts = s.appendSpan(texts, content, cEsc)
	texts = s.appendSpan(texts, text, textEsc)
	return texts, finish
}

func (s *scanner) appendSpan(dst []byte, sp span, esc bool) []byte {
	if !sp.ok() {
		return dst
	}
	raw := s.b[sp.start:sp.end]
	if !esc && isASCIIorValid(raw) {
		return append(dst, raw...)
	}
	return unescape(dst, raw)
}

func (s *scanner) decode(sp span, esc bool) string {
	if !sp.ok() {
		return ""
	}
	return string(s.appendSpan(nil, sp, esc))
}

func isASCIIorValid(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return utf8.Valid(b)
		}
	}
	return true
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func hex4(b []byte) rune {
	return rune(hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3]))
}

// unescape appends the decoded form of a validated raw JSON string to dst, replacing
// invalid UTF-8 and unpaired surrogates with U+FFFD exactly as encoding/json does.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			switch raw[i+1] {
			case '"', '\\', '/':
				dst = append(dst, raw[i+1])
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(raw[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) {
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						r2 := hex4(raw[i+2 : i+6])
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							dst = utf8.AppendRune(dst, dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
				continue
			}
			i += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, raw[i:i+size]...)
			}
			i += size
		}
	}
	return dst
}
