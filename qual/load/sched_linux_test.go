//go:build linux

package load

import (
	"context"
	"testing"
	"time"
)

// TestSchedClockExpiryBeforeTarget: the timerfd is one-shot and its expiry is mapped from Go's
// clock onto CLOCK_MONOTONIC, so it can fire a little before epoch+at by Go's reading (a
// goroutine preempted between the two clock readings makes that gap large). sleep must then
// wait out the rest on Go's clock; waiting for a second expiry hangs the open loop for good
// (seen as a CI run stuck in TestProfileOpenLoopRecordsLateness). The skew is planted here.
func TestSchedClockExpiryBeforeTarget(t *testing.T) {
	c, err := newSchedClock(time.Now())
	if err != nil {
		t.Skipf("no timerfd: %v", err)
	}
	defer c.close()
	c.monoEpoch -= int64(5 * time.Millisecond) // the kernel expires 5 ms before Go's clock says
	const at = 20 * time.Millisecond
	done := make(chan bool, 1)
	go func() { done <- c.sleep(context.Background(), at) }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("sleep returned false without a cancelled context")
		}
		if got := time.Since(c.epoch); got < at {
			t.Fatalf("sleep returned at %v, before its target %v", got, at)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sleep did not return: it waited for a second expiry of the one-shot timerfd")
	}
}
