//go:build linux

package load

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// schedClock waits for absolute points of a run's schedule with a timerfd. Go's own timers
// are woken by the network poller, which sleeps in whole milliseconds, so a timer can fire
// up to a millisecond late; a timerfd set to an absolute CLOCK_MONOTONIC time makes the
// poller return as soon as the kernel's high-resolution timer expires (tens of µs), without
// spinning a core.
type schedClock struct {
	epoch     time.Time
	monoEpoch int64 // CLOCK_MONOTONIC ns at epoch
	fd        int
	f         *os.File
}

func newSchedClock(epoch time.Time) (*schedClock, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("clock_gettime: %w", err)
	}
	// Map the epoch onto CLOCK_MONOTONIC through the two readings taken now.
	now := time.Since(epoch)
	c := &schedClock{epoch: epoch, monoEpoch: ts.Nano() - int64(now), fd: fd}
	c.f = os.NewFile(uintptr(fd), "schedule-timerfd") // non-blocking: parked in the poller
	return c, nil
}

// wait blocks until epoch+at or ctx ends (false).
func (c *schedClock) wait(ctx context.Context, at time.Duration) bool {
	if time.Since(c.epoch) >= at {
		return ctx.Err() == nil
	}
	abs := unix.NsecToTimespec(c.monoEpoch + int64(at))
	if err := unix.TimerfdSettime(c.fd, unix.TFD_TIMER_ABSTIME, &unix.ItimerSpec{Value: abs}, nil); err != nil {
		return sleepUntil(ctx, c.epoch, at)
	}
	stop := context.AfterFunc(ctx, func() {
		// Wake the read: fire the timer now.
		_ = unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{Value: unix.Timespec{Nsec: 1}}, nil)
	})
	defer stop()
	var buf [8]byte
	for {
		if _, err := c.f.Read(buf[:]); err != nil {
			return sleepUntil(ctx, c.epoch, at)
		}
		if ctx.Err() != nil {
			return false
		}
		if time.Since(c.epoch) >= at {
			return true
		}
	}
}

func (c *schedClock) close() { c.f.Close() }
