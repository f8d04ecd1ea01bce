package server

import "strings"

// stopMatcher ends generation before any of the request's stop strings. Text that could be
// the start of a stop string is held back until it either completes the stop string (and is
// dropped) or cannot (and is released), so no stop text ever reaches a client, even when it is
// split across tokens.
type stopMatcher struct {
	stops []string
	held  string
}

// newStopMatcher matches a request's stop strings (none: every text passes through).
func newStopMatcher(stops []string) stopMatcher { return stopMatcher{stops: stops} }

// feed takes the next decoded text and returns what may be sent now, and whether a stop
// string was found (then the request must end; emit is the text before it).
func (m *stopMatcher) feed(text string) (emit string, stopped bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	s := m.held + text
	cut := -1
	for _, stop := range m.stops {
		if i := strings.Index(s, stop); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		m.held = ""
		return s[:cut], true
	}
	keep := 0
	for _, stop := range m.stops {
		// The longest suffix of s that is a proper prefix of stop.
		n := min(len(stop)-1, len(s))
		for ; n > keep; n-- {
			if strings.HasSuffix(s, stop[:n]) {
				break
			}
		}
		if n > keep {
			keep = n
		}
	}
	m.held = s[len(s)-keep:]
	return s[:len(s)-keep], false
}

// flush releases held text at the end of generation (no stop string completed).
func (m *stopMatcher) flush() string {
	h := m.held
	m.held = ""
	return h
}
