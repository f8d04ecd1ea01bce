package spec

import (
	"testing"
	"time"
)

// The failure-records server's timeout is a quarter of the long request's time, so the long
// requests outlast it however fast the model is, and never longer than the gate's 100 ms.
func TestFailureRequestTimeout(t *testing.T) {
	for _, c := range []struct{ long, want time.Duration }{
		{90 * time.Millisecond, 22 * time.Millisecond}, // llama-tiny's whole context on a fast CPU
		{130 * time.Millisecond, 32 * time.Millisecond},
		{2 * time.Second, 100 * time.Millisecond},
		{3 * time.Millisecond, 2 * time.Millisecond},
		{0, 2 * time.Millisecond},
	} {
		got := FailureRequestTimeout(c.long)
		if got != c.want {
			t.Errorf("FailureRequestTimeout(%v) = %v, want %v", c.long, got, c.want)
		}
		if c.long >= 8*time.Millisecond && got > c.long/4 {
			t.Errorf("FailureRequestTimeout(%v) = %v: the long request would not outlast it fourfold", c.long, got)
		}
	}
}
