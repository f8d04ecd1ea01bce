package server

import "bytes"

// stopMatcher ends generation at the request's stop strings. Text that could be the start of
// a stop string is held back until it either completes one (then generation ends before it,
// and the stop text is never returned) or cannot (then it is released unchanged). So no stop
// text reaches a client, whatever the split of the text into tokens.
//
// Deltas stay valid UTF-8 without the matcher looking at characters: the stream decoder
// (tokenizer.StreamDecoder.AddBytes) hands over whole characters only, and a stop string
// (valid UTF-8, as JSON decoding leaves it) begins at a character boundary, so every cut the
// matcher makes is at one.
//
// It works on bytes in buffers it reuses, so a request with stop strings costs no allocation
// per token once the buffers have grown to the longest stop string plus a token's text: the
// streaming path's cost per token is the product qualified (issue 3).
//
// When stop strings overlap, generation ends at the one that completes first (ties: the one
// that starts first), because a streaming server cannot wait to see whether a longer stop
// string that started earlier will complete. This differs from "the earliest start" only when
// one stop string contains another after its first byte (stops "abcd" and "bc" on "abcd" end
// after "a").
type stopMatcher struct {
	stops [][]byte
	held  []byte // not yet released: a possible stop-string start
	join  []byte // scratch for held followed by the new text
	hit   int    // index of the stop string that ended generation (valid once feed reported it)
	// include keeps the matched stop string at the end of the output (vLLM's
	// include_stop_str_in_output): generation still ends where it completes.
	include bool
}

// newStopMatcher matches a request's stop strings (none: text passes through); include keeps
// the matched one in the output.
func newStopMatcher(stops []string, include bool) stopMatcher {
	m := stopMatcher{stops: make([][]byte, len(stops)), include: include}
	for i, s := range stops {
		m.stops[i] = []byte(s)
	}
	return m
}

// feed takes the next decoded text and returns what may be sent now, and whether a stop
// string completed (then the request must end; emit is the text before it). emit aliases text
// or the matcher's buffer: it is valid until the next call on m.
func (m *stopMatcher) feed(text []byte) (emit []byte, stopped bool) {
	s := text
	if len(m.held) > 0 {
		m.join = append(append(m.join[:0], m.held...), text...)
		s = m.join
	}
	if cut := m.firstStop(s); cut >= 0 {
		m.held = m.held[:0]
		if m.include {
			cut += len(m.stops[m.hit])
		}
		return s[:cut], true
	}
	keep := m.stopPrefixSuffix(s)
	m.held = m.held[:0]
	if keep > 0 {
		m.held = append(m.held, s[len(s)-keep:]...)
	}
	return s[:len(s)-keep], false
}

// firstStop is the offset in s of the stop string that completes first (ties: the longer one),
// or -1. Text held from earlier calls holds no complete stop string, so any match ends in the
// new text.
func (m *stopMatcher) firstStop(s []byte) int {
	cut, end := -1, 0
	for k, stop := range m.stops {
		i := bytes.Index(s, stop)
		if i < 0 {
			continue
		}
		if e := i + len(stop); cut < 0 || e < end || e == end && i < cut {
			cut, end = i, e
			m.hit = k
		}
	}
	return cut
}

// stopPrefixSuffix is the length of the longest suffix of s that is a proper prefix of a stop
// string: text that a later token may complete into a stop string.
func (m *stopMatcher) stopPrefixSuffix(s []byte) int {
	keep := 0
	for _, stop := range m.stops {
		// Candidate starts from the longest possible suffix down to one longer than keep.
		for i := max(0, len(s)-len(stop)+1); i < len(s)-keep; i++ {
			if s[i] == stop[0] && bytes.HasPrefix(stop, s[i:]) {
				keep = len(s) - i
				break
			}
		}
	}
	return keep
}

// flush releases held text at the end of generation (no stop string completed). The result
// is valid until the next call on m.
func (m *stopMatcher) flush() []byte {
	h := m.held
	m.held = m.held[:0]
	return h
}
