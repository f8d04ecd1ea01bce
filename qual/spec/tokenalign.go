package spec

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// Served tokens are compared with a reference's by token text and byte offset, never by
// position: an engine may report one logprobs entry for several reference tokens (llama.cpp
// folds a lone byte-fallback token into the next entry, so the two bytes of "é" come as one
// entry) or hold back an incomplete UTF-8 character at the end of its answer. Such an answer
// generated the reference's tokens and only reports them differently; a token whose bytes are
// not the reference's at that offset is a real difference.

// tokenPair is one served entry and the reference tokens [Ref, RefEnd) whose bytes it carries.
type tokenPair struct {
	Served      int
	Ref, RefEnd int
}

// Merged reports whether the entry carries more than one reference token.
func (p tokenPair) Merged() bool { return p.RefEnd-p.Ref != 1 }

// tokenAlignment is the outcome of alignTokens.
type tokenAlignment struct {
	// Pairs are the served entries matched to reference tokens, in order.
	Pairs []tokenPair
	// Differs, when not empty, says where the served tokens leave the reference's: the
	// engine generated something else. At is that reference token's index.
	Differs string
	At      int
	// Reported lists how the answer reports the reference's tokens differently (entries that
	// carry several tokens, an incomplete tail held back): not differences of generation.
	Reported []string
}

// alignTokens pairs served logprobs entries with the reference tokens ref by their bytes: each
// entry must carry exactly the bytes of one or more consecutive reference tokens, starting
// where the previous entry ended. An entry whose text holds U+FFFD (part of a UTF-8 character,
// which an answer cannot carry exactly) matches reference tokens whose bytes render so.
func alignTokens(tok *tokenizer.Tokenizer, ref []int32, served []TokenLogprob) tokenAlignment {
	var al tokenAlignment
	refBytes := make([][]byte, len(ref))
	for i, id := range ref {
		refBytes[i] = tok.TokenBytes(nil, id)
	}
	j := 0
	for i, e := range served {
		if j >= len(ref) {
			al.Differs, al.At = fmt.Sprintf("%d entries past the reference's %d tokens (first extra %q)", len(served)-i, len(ref), e.Token), len(ref)
			return al
		}
		k := matchEntry(refBytes, j, e.Token)
		if k < 0 {
			want, _ := tokenText(tok, ref[j])
			al.Differs, al.At = fmt.Sprintf("at token %d the engine generated %q, the reference %q (id %d)", j, e.Token, want, ref[j]), j
			return al
		}
		al.Pairs = append(al.Pairs, tokenPair{Served: i, Ref: j, RefEnd: k})
		if k-j > 1 {
			al.Reported = append(al.Reported, fmt.Sprintf("entry %d %q carries reference tokens %d..%d (byte pieces reported as one token)", i, e.Token, j, k-1))
		}
		j = k
	}
	if j < len(ref) {
		var tail []byte
		for _, b := range refBytes[j:] {
			tail = append(tail, b...)
		}
		if incompleteTail(tail) {
			al.Reported = append(al.Reported, fmt.Sprintf("the last %d reference tokens, an incomplete UTF-8 character, were held back", len(ref)-j))
			return al
		}
		al.Differs, al.At = fmt.Sprintf("the answer ends after %d of the reference's %d tokens (next %q)", j, len(ref), strings.ToValidUTF8(string(refBytes[j]), "\uFFFD")), j
	}
	return al
}

// matchEntry returns the end k of the reference tokens [j, k) whose bytes the entry's text
// carries, or -1.
func matchEntry(refBytes [][]byte, j int, text string) int {
	lossy := strings.ContainsRune(text, utf8.RuneError)
	var acc []byte
	for k := j; k < len(refBytes) && k < j+8; k++ {
		acc = append(acc, refBytes[k]...)
		if lossy {
			if collapseFFFD(strings.ToValidUTF8(string(acc), "\uFFFD")) == collapseFFFD(text) {
				return k + 1
			}
			continue
		}
		if string(acc) == text {
			return k + 1
		}
		if len(acc) >= len(text) || !strings.HasPrefix(text, string(acc)) {
			return -1
		}
	}
	return -1
}

// collapseFFFD folds runs of U+FFFD into one: engines write one per byte or one per run.
func collapseFFFD(s string) string {
	for strings.Contains(s, "\uFFFD\uFFFD") {
		s = strings.ReplaceAll(s, "\uFFFD\uFFFD", "\uFFFD")
	}
	return s
}

// incompleteTail reports whether b is valid UTF-8 up to a final character cut short.
func incompleteTail(b []byte) bool {
	for n := 1; n <= 3 && n <= len(b); n++ {
		head, last := b[:len(b)-n], b[len(b)-n:]
		if utf8.Valid(head) && !utf8.FullRune(last) && utf8.RuneStart(last[0]) {
			return true
		}
	}
	return false
}
