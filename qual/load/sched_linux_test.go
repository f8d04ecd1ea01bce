//go:build linux

package load

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPacerClockSkew: the pacer maps Go's clock onto CLOCK_MONOTONIC for its kernel sleeps, and
// the mapping can be off (a goroutine preempted between the two readings). Whichever way it is
// off, wait must neither return before its target on Go's clock nor hang (a sleep that waited
// for the kernel's idea of the target once hung the open loop for good, seen as a CI run stuck
// in TestProfileOpenLoopRecordsLateness). The skews are planted.
func TestPacerClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{-5 * time.Millisecond, 5 * time.Millisecond} {
		done := make(chan time.Duration, 1)
		go func() {
			p := newPacer(time.Now(), time.Millisecond)
			p.monoEpoch += int64(skew) // the kernel's sleeps end 5 ms early, or late
			const at = 20 * time.Millisecond
			if !p.wait(context.Background(), at) {
				done <- -1
				return
			}
			done <- time.Since(p.epoch) - at
		}()
		select {
		case late := <-done:
			if late < 0 {
				t.Fatalf("skew %v: wait returned %v before its target (or false without a cancelled context)", skew, -late)
			}
			if late > time.Second {
				t.Fatalf("skew %v: wait returned %v after its target", skew, late)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("skew %v: wait did not return", skew)
		}
	}
}

// TestPacer: the open loop's pacer never returns before a send time, notices a cancelled
// context during a long wait, and its spin margin follows the wake-ups' overshoots within its
// bounds (a fifth of the mean gap at most).
func TestPacer(t *testing.T) {
	type result struct {
		early       time.Duration
		cancelledOK bool
		spinUp      time.Duration
		spinCapped  time.Duration
		spinDown    time.Duration
	}
	done := make(chan result, 1)
	go func() {
		var r result
		epoch := time.Now()
		p := newPacer(epoch, time.Millisecond)
		for i := 1; i <= 50; i++ {
			at := time.Duration(i) * 300 * time.Microsecond
			p.wait(context.Background(), at)
			if e := at - time.Since(epoch); e > r.early {
				r.early = e
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(30*time.Millisecond, cancel)
		start := time.Now()
		ok := p.wait(ctx, time.Since(epoch)+10*time.Second)
		r.cancelledOK = !ok && time.Since(start) < time.Second
		p.nOver = 0 // a fresh window of planted overshoots
		for range len(p.over) {
			p.overshoot(120 * time.Microsecond)
		}
		r.spinUp = p.spin
		for range len(p.over) {
			p.overshoot(time.Second)
		}
		r.spinCapped = p.spin
		for range len(p.over) {
			p.overshoot(0)
		}
		r.spinDown = p.spin
		done <- r
	}()
	r := <-done
	if r.early > 0 {
		t.Errorf("wait returned %v before its send time", r.early)
	}
	if !r.cancelledOK {
		t.Error("wait did not return false within a second of its context's end")
	}
	if r.spinUp != 130*time.Microsecond || r.spinCapped != 200*time.Microsecond || r.spinDown != pacerMinSpin {
		t.Errorf("spin margins %v %v %v, want 130µs, 200µs (a fifth of 1 ms) and %v", r.spinUp, r.spinCapped, r.spinDown, pacerMinSpin)
	}
}

// The pacer's thread runs in the policy it reports (SCHED_FIFO where the process may raise
// it, the normal class otherwise), and that thread dies with the pacer's goroutine: no other
// goroutine ever runs on a real-time thread.
func TestPacerThreadPolicy(t *testing.T) {
	type result struct {
		described string
		policy    uint32
		nice      int32
		err       error
	}
	// The process's own nice (nonzero under `nice make test`): what goroutine threads keep.
	base, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatalf("sched_getattr: %v", err)
	}
	done := make(chan result, 1)
	go func() {
		p := newPacer(time.Now(), time.Millisecond)
		a, err := unix.SchedGetAttr(0, 0)
		r := result{described: p.describe(), err: err}
		if err == nil {
			r.policy, r.nice = a.Policy, a.Nice
		}
		done <- r
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("sched_getattr: %v", r.err)
	}
	fifo := r.policy == unix.SCHED_FIFO
	if fifo != strings.Contains(r.described, "thread SCHED_FIFO") || !fifo && !strings.Contains(r.described, "SCHED_OTHER") {
		t.Errorf("pacer describes itself as %q but its thread's policy is %d", r.described, r.policy)
	}
	if strings.Contains(r.described, "nice -20 (") != (r.nice == -20) {
		t.Errorf("pacer describes itself as %q but its thread's nice is %d", r.described, r.nice)
	}
	if os.Geteuid() == 0 && !fifo {
		t.Logf("running as root without SCHED_FIFO (capabilities dropped?): %s", r.described)
	}
	// Threads that run goroutines now are in the normal class.
	for range 8 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := result{}
			a, err := unix.SchedGetAttr(0, 0)
			if r.err = err; err == nil {
				r.policy, r.nice = a.Policy, a.Nice
			}
			done <- r
		}()
		if r := <-done; r.err != nil || r.policy != unix.SCHED_NORMAL || r.nice != base.Nice {
			t.Fatalf("a goroutine runs on a thread of policy %d nice %d (err %v) after the pacer ended; the process runs at nice %d", r.policy, r.nice, r.err, base.Nice)
		}
	}
}
