package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// preTokenizer splits one piece of (normalized) text into words, calling emit for each
// non-empty word in order.
type preTokenizer interface {
	split(s string, emit func(string))
}

// finder yields the non-overlapping matches of a pattern, left to right, as byte offsets.
type finder interface {
	findAll(s string, fn func(start, end int))
}

// splitBehavior is tokenizers' SplitDelimiterBehavior.
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviors = map[string]splitBehavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// splitPre is tokenizers' Split pre-tokenizer.
type splitPre struct {
	find     finder
	behavior splitBehavior
	invert   bool
}

type segment struct {
	start, end int
	match      bool
}

func (p *splitPre) split(s string, emit func(string)) {
	if p.behavior == behaviorIsolated {
		// Hot path (Qwen, Llama 3): every match and every gap is its own word, and inversion
		// does not change which segments exist.
		prev := 0
		p.find.findAll(s, func(start, end int) {
			if prev < start {
				emit(s[prev:start])
			}
			if start < end {
				emit(s[start:end])
			}
			prev = end
		})
		if prev < len(s) {
			emit(s[prev:])
		}
		return
	}
	// General path: tokenizers' find_matches then the behavior's fold (normalizer.rs split).
	var segs []segment
	prev := 0
	p.find.findAll(s, func(start, end int) {
		if prev != start {
			segs = append(segs, segment{prev, start, false})
		}
		segs = append(segs, segment{start, end, true})
		prev = end
	})
	if prev != len(s) {
		segs = append(segs, segment{prev, len(s), false})
	}
	if p.invert {
		for i := range segs {
			segs[i].match = !segs[i].match
		}
	}
	var out []segment
	switch p.behavior {
	case behaviorRemoved:
		for _, g := range segs {
			if !g.match {
				out = append(out, g)
			}
		}
	case behaviorMergedWithPrevious:
		prevMatch := false
		for _, g := range segs {
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
	case behaviorMergedWithNext:
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			g := segs[i]
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = g.start
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case behaviorContiguous:
		prevMatch := false
		for _, g := range segs {
			if g.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, g)
			}
			prevMatch = g.match
		}
	}
	for _, g := range out {
		if g.start < g.end {
			emit(s[g.start:g.end])
		}
	}
}

// byteLevelPre is tokenizers' ByteLevel pre-tokenizer. The byte → character mapping itself is
// implicit: the BPE model reads raw bytes when any ByteLevel pre-tokenizer is present.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
	re             finder
}

func (p *byteLevelPre) split(s string, emit func(string)) {
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !p.useRegex {
		emit(s)
		return
	}
	prev := 0
	p.re.findAll(s, func(start, end int) {
		if prev < start {
			emit(s[prev:start])
		}
		emit(s[start:end])
		prev = end
	})
	if prev < len(s) {
		emit(s[prev:])
	}
}

// preSeq chains pre-tokenizers: each word of one is split further by the next.
type preSeq []preTokenizer

func (q preSeq) split(s string, emit func(string)) {
	q.splitFrom(0, s, emit)
}

func (q preSeq) splitFrom(i int, s string, emit func(string)) {
	if i == len(q) {
		emit(s)
		return
	}
	q[i].split(s, func(w string) { q.splitFrom(i+1, w, emit) })
}

type preTokenizerJSON struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Replacement    *string           `json:"replacement"`
	PrependScheme  *string           `json:"prepend_scheme"`
	SplitWords     *bool             `json:"split"`
}

type patternJSON struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

// parsePreTokenizer returns the flattened list of pre-tokenizers (a Sequence is flattened).
func parsePreTokenizer(raw []byte) ([]preTokenizer, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var out []preTokenizer
	if err := appendPreTokenizer(raw, "pre_tokenizer", &out); err != nil {
		return nil, err
	}
	for i, p := range out {
		if _, ok := p.(*byteLevelPre); ok && i != len(out)-1 {
			return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: a pre-tokenizer after ByteLevel is not supported (it would see byte characters)")
		}
	}
	return out, nil
}

func appendPreTokenizer(raw []byte, where string, out *[]preTokenizer) error {
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("tokenizer.json: %s: %w", where, err)
	}
	switch p.Type {
	case "Sequence":
		for i, r := range p.Pretokenizers {
			if err := appendPreTokenizer(r, fmt.Sprintf("%s.pretokenizers[%d]", where, i), out); err != nil {
				return err
			}
		}
	case "Split":
		if p.Pattern == nil || (p.Pattern.Regex == nil) == (p.Pattern.String == nil) {
			return fmt.Errorf("tokenizer.json: %s: Split needs a pattern with exactly one of \"Regex\" or \"String\"", where)
		}
		b, ok := behaviors[p.Behavior]
		if !ok {
			return fmt.Errorf("tokenizer.json: %s: unknown Split behavior %q; want one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", where, p.Behavior)
		}
		var f finder
		if p.Pattern.String != nil {
			if *p.Pattern.String == "" {
				return fmt.Errorf("tokenizer.json: %s: Split with an empty String pattern", where)
			}
			f = literalFinder(*p.Pattern.String)
		} else {
			var err error
			if f, err = newRegexFinder(*p.Pattern.Regex); err != nil {
				return fmt.Errorf("tokenizer.json: %s: %w", where, err)
			}
		}
		*out = append(*out, &splitPre{find: f, behavior: b, invert: p.Invert})
	case "ByteLevel":
		useRegex := true
		if p.UseRegex != nil {
			useRegex = *p.UseRegex
		}
		*out = append(*out, &byteLevelPre{addPrefixSpace: p.AddPrefixSpace != nil && *p.AddPrefixSpace, useRegex: useRegex, re: gpt2Scanner{}})
	case "Metaspace":
		repl := "▁"
		if p.Replacement != nil {
			if utf8.RuneCountInString(*p.Replacement) != 1 {
				return fmt.Errorf("tokenizer.json: %s: Metaspace replacement %q must be one character", where, *p.Replacement)
			}
			repl = *p.Replacement
		}
		ps, err := parsePrependScheme(p.PrependScheme, p.AddPrefixSpace, where)
		if err != nil {
			return err
		}
		split := p.SplitWords == nil || *p.SplitWords
		*out = append(*out, &metaspacePre{repl: repl, scheme: ps, splitWords: split})
	case "WhitespaceSplit":
		*out = append(*out, whitespaceSplitPre{})
	default:
		return fmt.Errorf("tokenizer.json: %s: unknown pre-tokenizer type %q; supported: Sequence, Split, ByteLevel, Metaspace, WhitespaceSplit", where, p.Type)
	}
	return nil
}

type literalFinder string

func (l literalFinder) findAll(s string, fn func(start, end int)) {
	if l == "" {
		return
	}
	for i := 0; i <= len(s); {
		j := strings.Index(s[i:], string(l))
		if j < 0 {
			return
		}
		fn(i+j, i+j+len(l))
		i += j + len(l)
	}
}

// Patterns with a hand-written scanner. tokenizers runs them with Oniguruma; the scanners
// implement the same leftmost-first backtracking semantics (see scan.go) and a property test
// checks them against regexp2 on random text.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

func newRegexFinder(pattern string) (finder, error) {
	switch pattern {
	case gpt2Pattern:
		return gpt2Scanner{}, nil
	case qwen2Pattern:
		return qwenScanner{maxDigits: 1}, nil
	case llama3Pattern:
		return qwenScanner{maxDigits: 3}, nil
	}
	return compileRegexFinder(pattern)
}

// regexFinder is the general fallback for patterns without a scanner.
type regexFinder struct{ re *regexp2.Regexp }

func compileRegexFinder(pattern string) (*regexFinder, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("Split regex %q does not compile: %w", pattern, err)
	}
	return &regexFinder{re: re}, nil
}

func (r *regexFinder) findAll(s string, fn func(start, end int)) {
	idx, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		// regexp2 only fails on timeouts and backtracking limits; treat the rest of the text
		// as unmatched (one gap word) rather than losing it.
		return
	}
	for _, m := range idx {
		fn(m[0], m[1])
	}
}
