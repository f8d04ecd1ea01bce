package client

import (
	"encoding/binary"
	"math/bits"
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
	// textStrings counts the string values (empty ones too) among the fields the text is
	// made of (text, content, reasoning_content, reasoning) in the choices that count, and
	// textSpan is the last of them: with exactly one, the event's text is that one string,
	// which is what eventDecoder's template needs (see there).
	textStrings int
	textSpan    span
}

// span is a raw JSON string value (without quotes) inside the chunk, with whether it holds
// escapes; the zero span is "absent" (null, not a string, or empty).
type span struct {
	start, end int
	esc        bool
}

func (s span) ok() bool { return s.end > s.start }

// The scanner is a set of functions over the chunk b and a position i, each returning the
// position after what it consumed, or -1 on a syntax error. Positions travel in registers
// rather than through a scanner struct in memory, which is what the per-event cost is made of
// (about forty tokens per chunk).

// parseChunk scans data, appends the chunk's content to dst and fills info. ok is false
// when data is not exactly one valid JSON object (then dst is returned unchanged).
func parseChunk(data []byte, dst []byte, info *chunkInfo) (out []byte, ok bool) {
	*info = chunkInfo{}
	b := data
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		return dst, false
	}
	n0 := len(dst)
	dst, i = topObject(b, i+1, dst, info)
	if i < 0 || ws(b, i) != len(b) {
		return dst[:n0], false
	}
	info.hasContent = len(dst) > n0
	return dst, true
}

// ws skips JSON whitespace.
func ws(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && isSpace[b[i]] {
		i++
	}
	return i
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

// str scans the string whose opening quote is at b[i] and returns the position after its
// closing quote and the span of its raw contents. It validates escapes and rejects control
// characters, like encoding/json.
func str(b []byte, i int) (int, span) {
	i++
	sp := span{start: i}
	for {
		// Eight bytes at a time, straight to the first that needs a look; byte by byte
		// within the last eight bytes of the chunk.
		for {
			if i+8 > len(b) {
				for i < len(b) && strPlain[b[i]] {
					i++
				}
				break
			}
			if m := special8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			return -1, span{}
		}
		switch b[i] {
		case '"':
			sp.end = i
			return i + 1, sp
		case '\\':
			sp.esc = true
			if i+1 >= len(b) {
				return -1, span{}
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return -1, span{}
				}
				for _, h := range b[i+2 : i+6] {
					if hexVal(h) < 0 {
						return -1, span{}
					}
				}
				i += 6
			default:
				return -1, span{}
			}
		default: // a control character
			return -1, span{}
		}
	}
}

// special8 flags, in the high bit of each byte, the bytes of x (little-endian) that are
// '"', '\\' or a control character (below 0x20). Each test is the classic "has a zero byte"
// bit trick (Hacker's Delight 6-1): a borrow can flag bytes above a true match, never below
// one, so the lowest flag is exactly the first such byte; bytes of 0x80 and above never match.
func special8(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return ((q-ones)&^q | (bs-ones)&^bs | (x-ones*0x20)&^x) & highs
}

// member reads the key of the object member at b[i] (the key's quote) up to its value: it
// returns the key's raw bytes (decoded when it holds escapes) and the value's position.
func member(b []byte, i int) (key []byte, vi int) {
	if i >= len(b) || b[i] != '"' {
		return nil, -1
	}
	i, k := str(b, i)
	if i < 0 {
		return nil, -1
	}
	key = b[k.start:k.end]
	if k.esc {
		key = unescape(nil, key)
	}
	i = ws(b, i)
	if i >= len(b) || b[i] != ':' {
		return nil, -1
	}
	return key, ws(b, i+1)
}

// next moves past a value of a container closed by end: to the following element (more) or
// past end (done).
func next(b []byte, i int, end byte) (j int, more bool) {
	i = ws(b, i)
	if i < len(b) {
		switch b[i] {
		case ',':
			return ws(b, i+1), true
		case end:
			return i + 1, false
		}
	}
	return -1, false
}

// open consumes whitespace after an opening '{' or '[' at b[i-1] and reports whether the
// container is empty (then j is past its end).
func open(b []byte, i int, end byte) (j int, empty bool) {
	i = ws(b, i)
	if i < len(b) && b[i] == end {
		return i + 1, true
	}
	return i, false
}

// skip consumes the value at b[i], validating it.
func skip(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		i, _ = str(b, i)
		return i
	case c == '{':
		i, empty := open(b, i+1, '}')
		for more := !empty; more; {
			if _, i = member(b, i); i < 0 {
				return -1
			}
			if i = skip(b, i); i < 0 {
				return -1
			}
			if i, more = next(b, i, '}'); i < 0 {
				return -1
			}
		}
		return i
	case c == '[':
		i, empty := open(b, i+1, ']')
		for more := !empty; more; {
			if i = skip(b, i); i < 0 {
				return -1
			}
			if i, more = next(b, i, ']'); i < 0 {
				return -1
			}
		}
		return i
	case c == 't':
		return lit(b, i, "true")
	case c == 'f':
		return lit(b, i, "false")
	case c == 'n':
		return lit(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return number(b, i)
	}
	return -1
}

func lit(b []byte, i int, w string) int {
	if len(b)-i >= len(w) && string(b[i:i+len(w)]) == w {
		return i + len(w)
	}
	return -1
}

// number validates the JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	} else {
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return -1
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
			return -1
		}
	}
	return i
}

// strField reads a string-or-null field value: its span, or the zero span for null (and any
// non-string, which is skipped).
func strField(b []byte, i int) (int, span) {
	if i < len(b) && b[i] == '"' {
		return str(b, i)
	}
	return skip(b, i), span{}
}

// integer reads any value; ok only when it is a plain integer literal that fits an int.
func integer(b []byte, i int) (j, v int, ok bool) {
	j = skip(b, i)
	if j < 0 {
		return -1, 0, false
	}
	lit := b[i:j]
	neg := false
	if len(lit) > 0 && lit[0] == '-' {
		neg, lit = true, lit[1:]
	}
	if len(lit) == 0 || len(lit) > 18 {
		return j, 0, false
	}
	for _, c := range lit {
		if c < '0' || c > '9' {
			return j, 0, false
		}
		v = v*10 + int(c-'0')
	}
	if neg {
		v = -v
	}
	return j, v, true
}

// topObject walks the chunk after its '{': choices, usage and error are read, everything
// else skipped.
func topObject(b []byte, i int, dst []byte, info *chunkInfo) ([]byte, int) {
	// The last occurrence of a key wins, as with encoding/json; so choices are collected per
	// occurrence and only the last "choices" array contributes.
	n0 := len(dst)
	texts := dst
	var finish string
	choicesSeen := false
	i, empty := open(b, i, '}')
	for more := !empty; more; {
		var key []byte
		if key, i = member(b, i); i < 0 {
			break
		}
		switch string(key) {
		case "choices":
			texts, finish = texts[:n0], ""
			info.textStrings, info.textSpan = 0, span{}
			if i >= len(b) || b[i] != '[' {
				i = skip(b, i)
				break
			}
			choicesSeen = true
			var emptyArr bool
			i, emptyArr = open(b, i+1, ']')
			for elem := !emptyArr; elem; {
				if i < len(b) && b[i] == '{' {
					var fr string
					if texts, fr, i = choice(b, i+1, texts, info); fr != "" {
						finish = fr
					}
				} else {
					i = skip(b, i)
				}
				if i < 0 {
					break
				}
				i, elem = next(b, i, ']')
			}
		case "usage":
			info.hasUsage = false
			info.promptTokens, info.completionTokens = 0, 0
			if i >= len(b) || b[i] != '{' {
				i = skip(b, i)
				break
			}
			var pt, ct int
			var pok, cok, emptyObj bool
			i, emptyObj = open(b, i+1, '}')
			for m := !emptyObj; m; {
				var k []byte
				if k, i = member(b, i); i < 0 {
					break
				}
				switch string(k) {
				case "prompt_tokens":
					i, pt, pok = integer(b, i)
				case "completion_tokens":
					i, ct, cok = integer(b, i)
				default:
					i = skip(b, i)
				}
				if i < 0 {
					break
				}
				i, m = next(b, i, '}')
			}
			if pok || cok {
				info.hasUsage = true
				info.promptTokens, info.completionTokens = pt, ct
			}
		case "error":
			i = errorField(b, i, info)
		default:
			i = skip(b, i)
		}
		if i < 0 {
			break
		}
		i, more = next(b, i, '}')
	}
	if !choicesSeen || i < 0 {
		return texts[:n0], i
	}
	info.finishReason = finish
	return texts, i
}

// errorField reads the value of "error": an object (message, type, code) or a string.
func errorField(b []byte, i int, info *chunkInfo) int {
	info.hasError, info.errMessage, info.errType, info.errCode = false, "", "", 0
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '{':
		info.hasError = true
		i, empty := open(b, i+1, '}')
		for more := !empty; more; {
			var k []byte
			if k, i = member(b, i); i < 0 {
				return -1
			}
			var sp span
			switch string(k) {
			case "message":
				i, sp = strField(b, i)
				info.errMessage = decode(b, sp)
			case "type":
				i, sp = strField(b, i)
				info.errType = decode(b, sp)
			case "code":
				if i < len(b) && (b[i] == '-' || (b[i] >= '0' && b[i] <= '9')) {
					var v int
					var ok bool
					if i, v, ok = integer(b, i); ok {
						info.errCode = v
					}
				} else {
					i = skip(b, i)
				}
			default:
				i = skip(b, i)
			}
			if i < 0 {
				return -1
			}
			i, more = next(b, i, '}')
		}
		return i
	case '"':
		var sp span
		i, sp = str(b, i)
		info.hasError = true
		info.errMessage = decode(b, sp)
		return i
	}
	return skip(b, i)
}

// choice reads one element of choices after its '{': text (completions), delta or message
// (chat: reasoning_content, reasoning, content) and finish_reason. It appends the choice's
// text to texts.
func choice(b []byte, i int, texts []byte, info *chunkInfo) ([]byte, string, int) {
	var text, reasoning, reasoning2, content span
	var finish string
	i, empty := open(b, i, '}')
	for more := !empty; more; {
		var key []byte
		if key, i = member(b, i); i < 0 {
			return texts, "", -1
		}
		switch string(key) {
		case "text":
			i, text = strField(b, i)
		case "delta", "message":
			// The last key wins for the whole delta object too.
			reasoning, reasoning2, content = span{}, span{}, span{}
			if i >= len(b) || b[i] != '{' {
				i = skip(b, i)
				break
			}
			var emptyObj bool
			i, emptyObj = open(b, i+1, '}')
			for m := !emptyObj; m; {
				var k []byte
				if k, i = member(b, i); i < 0 {
					return texts, "", -1
				}
				switch string(k) {
				case "content":
					i, content = strField(b, i)
				case "reasoning_content":
					i, reasoning = strField(b, i)
				case "reasoning":
					i, reasoning2 = strField(b, i)
				default:
					i = skip(b, i)
				}
				if i < 0 {
					return texts, "", -1
				}
				i, m = next(b, i, '}')
			}
		case "finish_reason":
			var sp span
			i, sp = strField(b, i)
			finish = decode(b, sp)
		default:
			i = skip(b, i)
		}
		if i < 0 {
			return texts, "", -1
		}
		i, more = next(b, i, '}')
	}
	if i < 0 {
		return texts, "", -1
	}
	texts = appendSpan(texts, b, reasoning)
	if !reasoning.ok() {
		texts = appendSpan(texts, b, reasoning2)
	}
	texts = appendSpan(texts, b, content)
	texts = appendSpan(texts, b, text)
	for _, sp := range [...]span{reasoning, reasoning2, content, text} {
		if sp.start > 0 { // a string (a string value never starts at 0: '{' and a key come first)
			info.textStrings++
			info.textSpan = sp
		}
	}
	return texts, finish, i
}

func appendSpan(dst, b []byte, sp span) []byte {
	if !sp.ok() {
		return dst
	}
	raw := b[sp.start:sp.end]
	if !sp.esc && isASCIIorValid(raw) {
		return append(dst, raw...)
	}
	return unescape(dst, raw)
}

func decode(b []byte, sp span) string {
	if !sp.ok() {
		return ""
	}
	if !sp.esc {
		// The finish reasons servers send, without an allocation per request.
		switch raw := b[sp.start:sp.end]; string(raw) {
		case "length":
			return "length"
		case "stop":
			return "stop"
		}
	}
	return string(appendSpan(nil, b, sp))
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
