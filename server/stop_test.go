package server

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// runStops feeds pieces to a matcher for stops the way gen does (flushing when no stop string
// completed) and returns the released deltas and whether a stop string completed.
func runStops(stops []string, pieces []string) (deltas []string, stopped bool) {
	m := newStopMatcher(stops, false)
	for _, p := range pieces {
		emit, hit := m.feed([]byte(p))
		if len(emit) > 0 {
			deltas = append(deltas, string(emit)) // emit is only valid until the next call
		}
		if hit {
			return deltas, true
		}
	}
	if rest := m.flush(); len(rest) > 0 {
		deltas = append(deltas, string(rest))
	}
	return deltas, false
}

func TestStopMatcherHoldsPrefixes(t *testing.T) {
	cases := []struct {
		name   string
		stops  []string
		pieces []string
		want   string
		stop   bool
	}{
		{"no stop strings", nil, []string{"ab", "cd"}, "abcd", false},
		{"split across tokens", []string{"END"}, []string{"hello E", "N", "D more"}, "hello ", true},
		{"partial match released unchanged", []string{"END"}, []string{"hello E", "N", "x"}, "hello ENx", false},
		{"partial match released at the end", []string{"END"}, []string{"hello E", "N"}, "hello EN", false},
		{"one of several", []string{"</s>", "\n\n"}, []string{"a\n", "\nb"}, "a", true},
		{"overlapping prefixes", []string{"xyz", "yq"}, []string{"axy", "q"}, "ax", true},
		{"shared prefix, shorter completes", []string{"abcd", "abc"}, []string{"xab", "c", "d"}, "x", true},
		{"shared prefix, longer never completes", []string{"abcd", "abx"}, []string{"ab", "c", "e"}, "abce", false},
		{"stop inside a longer stop completes first", []string{"abcd", "bc"}, []string{"ab", "cd"}, "a", true},
		{"same text in one token", []string{"abcd", "bc"}, []string{"abcd"}, "a", true},
		{"stop at the very start", []string{"Hi"}, []string{"Hi there"}, "", true},
		{"stop at the very start, split", []string{"Hi"}, []string{"H", "i there"}, "", true},
		{"multi-byte stop split at a character", []string{"世界"}, []string{"你好世", "界!"}, "你好", true},
		{"multi-byte stop, one character a piece", []string{"世界"}, []string{"你", "好", "世", "界", "!"}, "你好", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			deltas, stopped := runStops(c.stops, c.pieces)
			if got := strings.Join(deltas, ""); got != c.want || stopped != c.stop {
				t.Errorf("stops %q pieces %q: got %q stopped=%v, want %q stopped=%v", c.stops, c.pieces, got, stopped, c.want, c.stop)
			}
			for _, d := range deltas {
				if !utf8.ValidString(d) {
					t.Errorf("stops %q pieces %q: delta %q is not valid UTF-8", c.stops, c.pieces, d)
				}
			}
		})
	}
}

func TestStopMatcherNeverEmitsStopText(t *testing.T) {
	// Whatever the split of the text into pieces, the emitted text is the prefix before the
	// first stop string.
	text := "one two <STOP> three"
	for cut1 := 0; cut1 <= len(text); cut1++ {
		for cut2 := cut1; cut2 <= len(text); cut2++ {
			deltas, stopped := runStops([]string{"<STOP>"}, []string{text[:cut1], text[cut1:cut2], text[cut2:]})
			if got := strings.Join(deltas, ""); got != "one two " || !stopped {
				t.Fatalf("cuts %d,%d: %q stopped=%v", cut1, cut2, got, stopped)
			}
		}
	}
}

// cutAtFirstStop is the reference for the matcher: text up to the stop string that completes
// first in text (ties: the one that starts first), or all of text when none occurs.
func cutAtFirstStop(text string, stops []string) (string, bool) {
	cut, end := -1, 0
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (cut < 0 || i+len(s) < end || i+len(s) == end && i < cut) {
			cut, end = i, i+len(s)
		}
	}
	if cut < 0 {
		return text, false
	}
	return text[:cut], true
}

// FuzzStopMatcher: for any text, stop strings and split of the text into pieces (one byte of
// split per piece, its value the piece's length mod 8, so pieces cut characters too), the
// released deltas concatenate to the text cut before the first stop string (all of it when
// none occurs), and each delta is valid UTF-8 when the stop strings and every piece are (as
// the stream decoder hands pieces over). The seed corpus lives in testdata/fuzz/FuzzStopMatcher.
func FuzzStopMatcher(f *testing.F) {
	f.Add("hello END more", "END", "", []byte{7, 1, 3})
	f.Add("a\n\nb", "\n\n", "</s>", []byte{2, 1})
	f.Add("你好世界!", "世界", "", []byte{4, 1, 2, 5})
	f.Add("abcd", "abcd", "bc", []byte{3})
	f.Add("abce", "abcd", "abx", []byte{1, 1, 1})
	f.Add("Hi there", "Hi", "", []byte{1})
	f.Add("caf\xc3\xa9", "é", "\xff", []byte{4})
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, split []byte) {
		var stops []string
		for _, s := range []string{stop1, stop2} {
			if s != "" { // DecodeRequest refuses empty stop strings
				stops = append(stops, s)
			}
		}
		var pieces []string
		rest := text
		for _, n := range split {
			n := min(int(n%8), len(rest))
			pieces, rest = append(pieces, rest[:n]), rest[n:]
		}
		pieces = append(pieces, rest)
		deltas, stopped := runStops(stops, pieces)
		want, wantStop := cutAtFirstStop(text, stops)
		if got := strings.Join(deltas, ""); got != want || stopped != wantStop {
			t.Fatalf("stops %q pieces %q: released %q stopped=%v, want %q stopped=%v", stops, pieces, got, stopped, want, wantStop)
		}
		if allValidUTF8(pieces) && allValidUTF8(stops) {
			for _, d := range deltas {
				if !utf8.ValidString(d) {
					t.Fatalf("stops %q pieces %q: delta %q is not valid UTF-8", stops, pieces, d)
				}
			}
		}
	})
}

func allValidUTF8(ss []string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// TestPushWithStopsDoesNotAllocate guards the streaming path's cost per token: with stop
// strings, push reuses the matcher's buffers once they have grown.
func TestPushWithStopsDoesNotAllocate(t *testing.T) {
	for _, stops := range [][]string{nil, benchPushStops} {
		g := &gen{s: &Server{}, req: &GenRequest{}, stop: newStopMatcher(stops, false), w: nopResponseWriter{},
			buf: make([]byte, 0, 4096), out: make([]byte, 0, 4096)}
		allocs := testing.AllocsPerRun(100, func() {
			for _, p := range pushPieces {
				g.push(p)
			}
			g.buf, g.out = g.buf[:0], g.out[:0]
		})
		if g.stopped {
			t.Fatal("a stop string matched; the test text must not contain one")
		}
		if allocs != 0 {
			t.Errorf("stops %q: push allocates %v times per %d tokens", stops, allocs, len(pushPieces))
		}
	}
}
