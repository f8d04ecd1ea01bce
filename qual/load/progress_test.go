package load

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressLineNamesPointAndETA: the bar names its point, writes the phase's ETA inside
// the bar and the sweep's after it.
func TestProgressLineNamesPointAndETA(t *testing.T) {
	var b bytes.Buffer
	clock := &sweepClock{total: 5, finished: 1, spent: 10 * time.Second, started: time.Now()}
	p := newProgress(&Config{Progress: &b, ProgressLabel: clock.label("concurrency 4", 1), ProgressSweep: clock.eta})
	p.setPhase("profiling", 10)
	p.mu.Lock()
	p.started = time.Now().Add(-4 * time.Second) // 5 of 10 done in 4 s: 4 s left
	p.mu.Unlock()
	for i := 0; i < 5; i++ {
		p.add(i == 0)
	}
	p.mu.Lock()
	line := p.line()
	p.mu.Unlock()
	p.stop()
	// 3 points to come after this one at the 10 s a point took so far, plus this one's 4 s.
	for _, want := range []string{"concurrency 4 (2/5) profiling", "ETA 4.0s", " 50%", "5 req", "1 errors", "· sweep ETA 34s"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
	open, end := strings.Index(line, "["), strings.Index(line, "]")
	if open < 0 || end-open-1 != barWidth || !strings.Contains(line[open:end], "ETA 4.0s") || !strings.HasPrefix(line[open+1:], "=====") {
		t.Errorf("bar %q: want %d columns, half filled, the ETA inside", line, barWidth)
	}
	if !strings.Contains(b.String(), "concurrency 4 (2/5)") {
		t.Errorf("nothing written: %q", b.String())
	}
}

func TestSweepClock(t *testing.T) {
	c := &sweepClock{total: -6}
	if got := c.label("request_rate 2.5", 2); got != "request_rate 2.5 (3/≤6)" {
		t.Errorf("find-max label %q", got)
	}
	c.start()
	if got := c.eta(-1); got != "" {
		t.Errorf("no estimate before a point's time left is known, got %q", got)
	}
	if got := c.eta(2 * time.Second); !strings.HasPrefix(got, "sweep ETA ≤1") { // 2 s + 5 more points of about 2 s
		t.Errorf("first point's estimate %q", got)
	}
	last := &sweepClock{total: 3, finished: 2, spent: 4 * time.Second, started: time.Now()}
	if got := last.eta(time.Second); got != "" {
		t.Errorf("the last point's bar holds the sweep's ETA already; got %q", got)
	}
}
