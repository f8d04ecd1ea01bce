//go:build linux

package load

import (
	"context"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The pacer's early wake-up margin (the spin before each send) adapts to how late the
// kernel's wake-ups land on this machine: it starts at pacerSpin and is set, every
// len(pacer.over) sleeps, to the second-largest overshoot of the last window plus
// pacerSpinPad, within [pacerMinSpin, pacerMaxSpin] and never above a fifth of the mean gap
// between sends. On a quiet 2-core VM (H200 host, pinned with taskset) a fixed 50 µs gave a
// lateness p50 of 5 µs but a p99 of 114-131 µs at 1,000 req/s: wake-ups of an idle vCPU
// sometimes land 100-200 µs late, which only an earlier wake-up hides. The cost is bounded by
// the fifth of the gap: at most 20 % of a core spent spinning whatever the rate.
const (
	pacerSpin    = 50 * time.Microsecond
	pacerMinSpin = 20 * time.Microsecond
	pacerMaxSpin = 250 * time.Microsecond
	pacerSpinPad = 10 * time.Microsecond
)

// heldNap is how close to a send the pacer sleeps without giving its processor (Go's P) back:
// the last stretch of each wait is a raw clock_nanosleep, which the Go runtime does not see as
// a system call, so the goroutine wakes already holding its processor. Through the normal
// call the runtime hands an idle processor to others during the sleep, and the goroutine, back
// from the kernel on time, then queues for one behind the workers; on 2 busy cores that wait
// was the lateness tail. Measured against the mock at 10,000 req/s on this project's 2-core
// machine, 5 runs each, alternating: lateness p99 155 µs-4.3 ms (2 of 5 above 3 ms) through
// the normal call, 94-118 µs held. While held the processor runs nothing else, so the process
// has one processor fewer for that time (client CPU was unchanged: 52-55 % against 57-61 %);
// a wait longer than heldNap sleeps through the normal call up to heldNap before the send. A
// signal (the runtime's preemption request, a stop-the-world) ends the raw sleep early with
// EINTR, so the runtime is never kept waiting on it.
const heldNap = time.Millisecond

// maxNap bounds one sleep of the pacer so that the end of the run's context is noticed
// within it (clock_nanosleep cannot be woken by a context).
const maxNap = 20 * time.Millisecond

// pacer is an open loop's clock: its goroutine is locked to its OS thread, whose timer slack
// is set to 1 ns (the default 50 µs lets the kernel defer a sleeper's wake-up that long, to
// batch it with others), and it sleeps in clock_nanosleep until an absolute CLOCK_MONOTONIC
// time, spin before the send, and spins the rest on Go's clock. The sleep is a blocking
// system call on a thread of its own, in the real-time class where allowed (raisePriority): no
// Go timer (woken by the runtime's poller, which can be a millisecond late), no goroutine
// hand-off and no wait behind the machine's other threads stand between the kernel's wake-up
// and the send.
type pacer struct {
	// policy says how the pacer's thread is scheduled (raisePriority), for the run's record.
	policy    string
	epoch     time.Time
	monoEpoch int64 // CLOCK_MONOTONIC ns at epoch; 0 when the kernel clock is not used
	spin      time.Duration
	maxSpin   time.Duration
	over      [64]time.Duration // overshoots of the last sleeps that aimed at a send's margin
	nOver     int
}

// newPacer returns the pacer for a schedule whose mean gap between sends is meanGap. It locks
// the calling goroutine to its thread for good: the caller must be a goroutine of its own that
// ends with the schedule, so that the thread, with its changed timer slack, ends too.
func newPacer(epoch time.Time, meanGap time.Duration) *pacer {
	p := &pacer{epoch: epoch, maxSpin: max(1, min(pacerMaxSpin, meanGap/5))}
	p.spin = min(pacerSpin, p.maxSpin)
	runtime.LockOSThread()
	// Best effort: without it the wake-ups are up to 50 µs later, which the spin partly hides.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	p.policy = raisePriority()
	var ts unix.Timespec
	before := time.Since(epoch)
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return p
	}
	after := time.Since(epoch)
	// As in newSchedClock: the mapping is off by at most half the readings' gap, which the
	// spin on Go's own clock absorbs.
	p.monoEpoch = ts.Nano() - int64(before+after)/2
	return p
}

// describe is the pacer for Result.Pacer.
func (p *pacer) describe() string {
	if p.monoEpoch == 0 {
		return "Go timers (clock_gettime failed); thread " + p.policy
	}
	return "clock_nanosleep (timer slack 1 ns) with an adaptive spin; thread " + p.policy
}

// raisePriority puts the calling thread (the pacer's, locked to its goroutine) in the real-time
// class SCHED_FIFO at the lowest priority, 1, and returns the policy it runs under. In the
// normal class a woken thread waits for its turn behind whatever the machine is running (the
// server under test, on a shared runner), and those waits were the lateness tail: at 1,000
// req/s on this project's 2-core machine, against the mock, the p99 was 160-230 µs in the
// normal class and 44-53 µs in SCHED_FIFO, with the same 0.1-0.2 µs median. The pacer's thread
// sleeps in the kernel between sends and spins at most a fifth of the gap before one (the
// margin adapts to the wake-ups seen, and shrinks when they are prompt), so the real-time class
// takes no more of a core than the normal class would; the kernel's real-time throttling
// (sched_rt_runtime_us) bounds it regardless. It needs CAP_SYS_NICE and a real-time budget in
// the process's cgroup; where SCHED_FIFO is refused the thread asks for nice -20 in the normal
// class (a larger share and earlier wake-up preemption), and failing that runs as it is. The
// run records which (load.Result.Pacer), so that a lateness figure is read with the policy it
// was measured under.
func raisePriority() string {
	err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}, 0)
	if err == nil {
		return "SCHED_FIFO 1"
	}
	refused := "SCHED_FIFO refused: " + err.Error()
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), -20); err == nil {
		return "SCHED_OTHER nice -20 (" + refused + ")"
	}
	return "SCHED_OTHER (" + refused + ", nice -20 too; grant CAP_SYS_NICE for the tightest schedule)"
}

// overshoot records how late a sleep meant to end at the margin before a send woke, and
// resets the margin at the end of each window (see pacerSpin).
func (p *pacer) overshoot(d time.Duration) {
	p.over[p.nOver] = max(d, 0)
	if p.nOver++; p.nOver < len(p.over) {
		return
	}
	p.nOver = 0
	var first, second time.Duration
	for _, o := range p.over {
		if o > first {
			first, second = o, first
		} else if o > second {
			second = o
		}
	}
	p.spin = min(max(second+pacerSpinPad, pacerMinSpin), p.maxSpin)
}

// wait blocks until epoch+at on Go's clock or ctx ends (false).
func (p *pacer) wait(ctx context.Context, at time.Duration) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		now := time.Since(p.epoch)
		left := at - now
		if left <= 0 {
			return true
		}
		if left <= p.spin || p.monoEpoch == 0 {
			if p.monoEpoch == 0 {
				return sleepUntil(ctx, p.epoch, at)
			}
			for time.Since(p.epoch) < at {
			}
			return ctx.Err() == nil
		}
		wake := at - p.spin
		if wake-now > heldNap {
			// Far from the instant: a normal blocking call, which gives the processor back
			// (any delay in getting one again is absorbed by the held nap that follows).
			ts := unix.NsecToTimespec(p.monoEpoch + int64(min(wake-heldNap, now+maxNap)))
			if err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil); err != nil && err != unix.EINTR {
				p.monoEpoch = 0 // fall back to Go's timers
			}
			continue
		}
		ts := unix.NsecToTimespec(p.monoEpoch + int64(wake))
		if _, _, e := unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0); e != 0 && e != unix.EINTR {
			p.monoEpoch = 0
			continue
		}
		p.overshoot(time.Since(p.epoch) - wake)
	}
}
