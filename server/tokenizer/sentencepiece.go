package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// This file holds the parts of tokenizers that SentencePiece-style checkpoints (Llama 2,
// TinyLlama, Mistral, T5, Gemma) declare in tokenizer.json: the Prepend and Replace
// normalizers, the Metaspace and WhitespaceSplit pre-tokenizers and the Replace, ByteFallback,
// Fuse, Strip and Metaspace decoders, each as the tokenizers crate defines it.

// prependNormalizer is tokenizers' Prepend: the string goes in front of non-empty text only.
type prependNormalizer struct{ prefix string }

func (p prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

// replaceNormalizer is tokenizers' Replace: every non-overlapping match, left to right, becomes
// content. The pattern is a literal string or a regex.
type replaceNormalizer struct {
	find    finder
	content string
}

func (r replaceNormalizer) normalize(s string) string {
	var b strings.Builder
	prev := 0
	r.find.findAll(s, func(start, end int) {
		if b.Len() == 0 && prev == 0 {
			b.Grow(len(s) + 8)
		}
		b.WriteString(s[prev:start])
		b.WriteString(r.content)
		prev = end
	})
	if prev == 0 && b.Len() == 0 {
		return s
	}
	b.WriteString(s[prev:])
	return b.String()
}

// stripNormalizer is tokenizers' Strip normalizer: leading and/or trailing whitespace removed.
type stripNormalizer struct{ left, right bool }

func (p stripNormalizer) normalize(s string) string {
	if p.left {
		s = s[spaceRightmostAtStart(s):]
	}
	if p.right {
		s = s[:spaceLeftmostAtEnd(s)]
	}
	return s
}

// replacePattern reads tokenizers' {"String": "..."} or {"Regex": "..."} pattern object.
func replacePattern(p *patternJSON, where string) (finder, error) {
	if p == nil || (p.Regex == nil) == (p.String == nil) {
		return nil, fmt.Errorf("tokenizer.json: %s: Replace needs a pattern with exactly one of \"Regex\" or \"String\"", where)
	}
	if p.String != nil {
		if *p.String == "" {
			return nil, fmt.Errorf("tokenizer.json: %s: Replace with an empty String pattern", where)
		}
		return literalFinder(*p.String), nil
	}
	f, err := compileRegexFinder(*p.Regex)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %s: %w", where, err)
	}
	return f, nil
}

// prependScheme is Metaspace's prepend_scheme.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// parsePrependScheme reads prepend_scheme and the legacy add_prefix_space as tokenizers'
// Metaspace deserializer does: absent means "always"; add_prefix_space=false means "never"
// and contradicts any other declared scheme.
func parsePrependScheme(scheme *string, addPrefixSpace *bool, where string) (prependScheme, error) {
	ps := prependAlways
	if scheme != nil {
		switch *scheme {
		case "always":
		case "first":
			ps = prependFirst
		case "never":
			ps = prependNever
		default:
			return 0, fmt.Errorf("tokenizer.json: %s: unknown Metaspace prepend_scheme %q; want always, first or never", where, *scheme)
		}
	}
	if addPrefixSpace != nil && !*addPrefixSpace {
		if scheme != nil && ps != prependNever {
			return 0, fmt.Errorf("tokenizer.json: %s: Metaspace add_prefix_space=false does not match prepend_scheme %q", where, *scheme)
		}
		ps = prependNever
	}
	return ps, nil
}

// metaspacePre is tokenizers' Metaspace pre-tokenizer: spaces become the replacement
// character, which is put in front of the piece (always; or, with "first", only for the piece
// that begins the original text), and with split each replacement character starts a new word.
type metaspacePre struct {
	repl       string
	scheme     prependScheme
	splitWords bool
}

func (p *metaspacePre) pieceAt(s string, atStart bool, emit func(string)) {
	s = strings.ReplaceAll(s, " ", p.repl)
	// tokenizers' NormalizedString::prepend does nothing on an empty string.
	if s != "" && !strings.HasPrefix(s, p.repl) && (p.scheme == prependAlways || (p.scheme == prependFirst && atStart)) {
		s = p.repl + s
	}
	if !p.splitWords {
		if s != "" {
			emit(s)
		}
		return
	}
	// SplitDelimiterBehavior::MergedWithNext: each replacement character begins a word.
	prev := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], p.repl)
		if j < 0 {
			break
		}
		if i+j > prev {
			emit(s[prev : i+j])
			prev = i + j
		}
		i += j + len(p.repl)
	}
	if prev < len(s) {
		emit(s[prev:])
	}
}

func (p *metaspacePre) split(s string, emit func(string)) { p.pieceAt(s, true, emit) }

// whitespaceSplitPre is tokenizers' WhitespaceSplit: words are the runs of non-whitespace.
type whitespaceSplitPre struct{}

func (whitespaceSplitPre) split(s string, emit func(string)) {
	start := -1
	for i, r := range s {
		if isRustWhitespace(r) {
			if start >= 0 {
				emit(s[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		emit(s[start:])
	}
}

// positional pre-tokenizers depend on whether a piece begins the original text (Metaspace
// with prepend_scheme "first", whose tokenizers test is offsets_original().0 == 0).
type positional interface {
	pieceAt(s string, atStart bool, emit func(string))
}

// splitAt runs the pre-tokenizer chain from i on s; atStart says whether s begins the
// original text. Every pre-tokenizer emits substrings of its input (Metaspace aside, which
// is handled by pieceAt), so a word begins its parent exactly when it shares its first byte's
// address.
func (q preSeq) splitAt(i int, s string, atStart bool, emit func(string)) {
	if i == len(q) {
		emit(s)
		return
	}
	if p, ok := q[i].(positional); ok {
		first := true
		p.pieceAt(s, atStart, func(w string) {
			q.splitAt(i+1, w, atStart && first, emit)
			first = false
		})
		return
	}
	q[i].split(s, func(w string) {
		q.splitAt(i+1, w, atStart && len(w) > 0 && len(s) > 0 && unsafe.StringData(w) == unsafe.StringData(s), emit)
	})
}

// ---- decoders ----

// decodeState tells a decoder where the tokens it is given stand in the sequence, so that a
// stream of windows decodes to what one call over all the tokens gives.
type decodeState struct {
	first bool // the window's first token is the sequence's first token
	final bool // no token follows the window
	// stripped counts, per Strip-after-Fuse step, the leading characters removed so far, and
	// started records that such a step has produced text (it strips only the text's start).
	stripped []int
	started  []bool
}

// settled reports whether the tokens decoded so far leave nothing that later tokens could
// still change: the sequence's first token is behind, and every Strip after a Fuse has met
// text (it strips only the text's start).
func (st *decodeState) settled() bool {
	if st.first {
		return false
	}
	for _, s := range st.started {
		if !s {
			return false
		}
	}
	return true
}

// decoder turns token strings back into text.
type decoder interface {
	// appendTokens appends the bytes toks decode to (raw bytes for ByteLevel, which may split
	// a character; text otherwise).
	appendTokens(dst []byte, toks []string, st *decodeState) []byte
	// holdAfter reports whether a stream must wait for the next token before decoding a
	// window that ends with tok (a byte-fallback token may be followed by the rest of its
	// character).
	holdAfter(tok string) bool
}

// byteLevelDecoder is tokenizers' ByteLevel decoder.
type byteLevelDecoder struct{}

func (byteLevelDecoder) appendTokens(dst []byte, toks []string, _ *decodeState) []byte {
	for _, tok := range toks {
		dst = appendTokenBytes(dst, tok)
	}
	return dst
}

func (byteLevelDecoder) holdAfter(string) bool { return false }

// joinDecoder is what tokenizers does without a decoder: tokens joined by single spaces.
type joinDecoder struct{}

func (joinDecoder) appendTokens(dst []byte, toks []string, st *decodeState) []byte {
	for i, tok := range toks {
		if i > 0 || !st.first {
			dst = append(dst, ' ')
		}
		dst = append(dst, tok...)
	}
	return dst
}

func (joinDecoder) holdAfter(string) bool { return false }

// decodeStep is one decoder of a chain: tokenizers' decode_chain on a list of strings.
type decodeStep interface {
	apply(toks []string, st *decodeState) []string
}

// chainDecoder is a decoder Sequence (or a single non-ByteLevel decoder): each step rewrites
// the token list, and the result is joined.
type chainDecoder struct {
	steps        []decodeStep
	byteFallback bool // a ByteFallback step groups consecutive byte tokens
	holdAll      bool // a Strip after Fuse cuts the end of the text: nothing is final before Flush
	nStrip       int
}

func (c *chainDecoder) appendTokens(dst []byte, toks []string, st *decodeState) []byte {
	if len(st.stripped) < c.nStrip {
		st.stripped = make([]int, c.nStrip)
		st.started = make([]bool, c.nStrip)
	}
	cur := append([]string(nil), toks...)
	for _, s := range c.steps {
		cur = s.apply(cur, st)
	}
	for _, t := range cur {
		dst = append(dst, t...)
	}
	return dst
}

func (c *chainDecoder) holdAfter(tok string) bool {
	if c.holdAll {
		return true
	}
	if !c.byteFallback {
		return false
	}
	_, ok := byteFallbackValue(tok)
	return ok
}

type replaceStep struct {
	find    finder
	content string
}

func (r replaceStep) apply(toks []string, _ *decodeState) []string {
	n := replaceNormalizer(r)
	for i, t := range toks {
		toks[i] = n.normalize(t)
	}
	return toks
}

// byteFallbackStep is tokenizers' ByteFallback decoder: each run of <0xXX> tokens becomes the
// text of its bytes when they are valid UTF-8, else one U+FFFD per byte.
type byteFallbackStep struct{}

func (byteFallbackStep) apply(toks []string, _ *decodeState) []string {
	out := toks[:0:0]
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range toks {
		if b, ok := byteFallbackValue(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseStep struct{}

func (fuseStep) apply(toks []string, _ *decodeState) []string {
	return []string{strings.Join(toks, "")}
}

// stripStep is tokenizers' Strip decoder: up to start leading and stop trailing copies of
// content removed from each token. After a Fuse there is one token, the whole text, so the
// start applies once at the beginning of the sequence and the stop at its end.
type stripStep struct {
	content     rune
	start, stop int
	afterFuse   bool
	idx         int // index into decodeState.stripped/started
}

func (s stripStep) apply(toks []string, st *decodeState) []string {
	for i, t := range toks {
		startBudget, stop := s.start, s.stop
		if s.afterFuse {
			if st.started[s.idx] {
				startBudget = 0
			} else {
				startBudget -= st.stripped[s.idx]
			}
			if !st.final {
				stop = 0
			}
		}
		cut := 0
		for n := 0; n < startBudget && cut < len(t); n++ {
			r, w := utf8.DecodeRuneInString(t[cut:])
			if r != s.content {
				break
			}
			cut += w
			if s.afterFuse {
				st.stripped[s.idx]++
			}
		}
		end := len(t)
		for n := 0; n < stop && end > cut; n++ {
			r, w := utf8.DecodeLastRuneInString(t[cut:end])
			if r != s.content {
				break
			}
			end -= w
		}
		toks[i] = t[cut:end]
		if s.afterFuse && end > cut {
			st.started[s.idx] = true
		}
	}
	return toks
}

// metaspaceDecodeStep is tokenizers' Metaspace decoder: the replacement character becomes a
// space, except in the sequence's first token, where it is dropped (unless the scheme is
// "never").
type metaspaceDecodeStep struct {
	repl   string
	scheme prependScheme
}

func (m metaspaceDecodeStep) apply(toks []string, st *decodeState) []string {
	for i, t := range toks {
		if i == 0 && st.first && m.scheme != prependNever {
			toks[i] = strings.ReplaceAll(t, m.repl, "")
		} else {
			toks[i] = strings.ReplaceAll(t, m.repl, " ")
		}
	}
	return toks
}

type decoderJSON struct {
	Type           string            `json:"type"`
	Decoders       []json.RawMessage `json:"decoders"`
	Pattern        *patternJSON      `json:"pattern"`
	Content        *string           `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Replacement    *string           `json:"replacement"`
	PrependScheme  *string           `json:"prepend_scheme"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
}

func parseDecoder(raw []byte) (decoder, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return joinDecoder{}, nil
	}
	var d decoderJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("tokenizer.json: decoder: %w", err)
	}
	list := []decoderJSON{d}
	where := "decoder"
	if d.Type == "Sequence" {
		list = list[:0]
		for i, r := range d.Decoders {
			var e decoderJSON
			if err := json.Unmarshal(r, &e); err != nil {
				return nil, fmt.Errorf("tokenizer.json: decoder.decoders[%d]: %w", i, err)
			}
			list = append(list, e)
		}
		where = "decoder.decoders"
	}
	if len(list) == 1 && list[0].Type == "ByteLevel" {
		return byteLevelDecoder{}, nil
	}
	c := &chainDecoder{}
	fused := false
	for i, e := range list {
		at := fmt.Sprintf("%s[%d]", where, i)
		if where == "decoder" {
			at = where
		}
		switch e.Type {
		case "Replace":
			f, err := replacePattern(e.Pattern, at)
			if err != nil {
				return nil, err
			}
			if e.Content == nil {
				return nil, fmt.Errorf("tokenizer.json: %s: Replace needs \"content\"", at)
			}
			c.steps = append(c.steps, replaceStep{f, *e.Content})
		case "ByteFallback":
			c.byteFallback = true
			c.steps = append(c.steps, byteFallbackStep{})
		case "Fuse":
			fused = true
			c.steps = append(c.steps, fuseStep{})
		case "Strip":
			if e.Content == nil || utf8.RuneCountInString(*e.Content) != 1 {
				return nil, fmt.Errorf("tokenizer.json: %s: Strip needs \"content\", one character", at)
			}
			if e.Start < 0 || e.Stop < 0 {
				return nil, fmt.Errorf("tokenizer.json: %s: Strip start and stop must not be negative", at)
			}
			r, _ := utf8.DecodeRuneInString(*e.Content)
			s := stripStep{content: r, start: e.Start, stop: e.Stop, afterFuse: fused, idx: c.nStrip}
			if fused {
				c.nStrip++
				if e.Stop > 0 {
					c.holdAll = true
				}
			}
			c.steps = append(c.steps, s)
		case "Metaspace":
			repl := "▁"
			if e.Replacement != nil {
				if utf8.RuneCountInString(*e.Replacement) != 1 {
					return nil, fmt.Errorf("tokenizer.json: %s: Metaspace replacement %q must be one character", at, *e.Replacement)
				}
				repl = *e.Replacement
			}
			ps, err := parsePrependScheme(e.PrependScheme, e.AddPrefixSpace, at)
			if err != nil {
				return nil, err
			}
			c.steps = append(c.steps, metaspaceDecodeStep{repl: repl, scheme: ps})
		case "ByteLevel":
			return nil, fmt.Errorf("tokenizer.json: %s: a ByteLevel decoder combined with other decoders is not supported; ByteLevel alone (or alone in a Sequence) is", at)
		default:
			return nil, fmt.Errorf("tokenizer.json: unknown decoder type %q at %s; supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and a Sequence of them", e.Type, at)
		}
	}
	return c, nil
}
