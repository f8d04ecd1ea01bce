package load

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelqual/modelqual/qual/records"
)

func runtimeGosched() { runtime.Gosched() }

func sortBySeq(recs []records.Request) {
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].SessionNum < recs[j].SessionNum })
}

// progress shows how far a run is: a redrawn bar on a terminal, a plain line every few
// seconds otherwise (CI logs, --progress), nothing when w is nil. The bar names the point
// (Config.ProgressLabel), carries the phase's ETA inside it, and ends with what
// Config.ProgressSweep says of the whole sweep.
type progress struct {
	w        io.Writer
	tty      bool
	label    string
	sweep    func(pointLeft time.Duration) string
	mu       sync.Mutex
	phase    string
	total    int
	duration time.Duration
	ramp     time.Duration
	later    time.Duration // the known length of the phases after this one (a ramp's measured --duration)
	started  time.Time
	done     atomic.Int64
	errs     atomic.Int64
	quit     chan struct{}
	wg       sync.WaitGroup
}

// IsTerminal reports whether w is a character device (a terminal), where a progress bar is
// redrawn in place; elsewhere progress is written only when asked for.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(cfg *Config) *progress {
	p := &progress{w: cfg.Progress, duration: cfg.Duration, label: cfg.ProgressLabel, sweep: cfg.ProgressSweep}
	if p.w == nil {
		return p
	}
	p.tty = IsTerminal(p.w)
	p.quit = make(chan struct{})
	every := 5 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(false)
			case <-p.quit:
				return
			}
		}
	}()
	return p
}

func (p *progress) setPhase(name string, total int) {
	if p.w == nil {
		return
	}
	p.draw(true)
	p.mu.Lock()
	p.phase, p.total, p.started, p.later = name, total, time.Now(), 0
	p.mu.Unlock()
	p.done.Store(0)
	p.errs.Store(0)
}

// setRamp says the phase just set is a ramp of length d (its progress is its time), followed
// by a measured phase of --duration when one was given.
func (p *progress) setRamp(d time.Duration) {
	p.mu.Lock()
	p.ramp, p.later = d, p.duration
	p.mu.Unlock()
}

// addIn counts a request of the given record phase, unless the bar has moved on to another
// phase (a ramp's request ending after the measured phase began).
func (p *progress) addIn(phase string, failed bool) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	current := p.phase
	p.mu.Unlock()
	if (current == "profiling") != (phase == records.PhaseProfiling) {
		return
	}
	p.add(failed)
}

func (p *progress) add(failed bool) {
	if p.w == nil {
		return
	}
	p.done.Add(1)
	if failed {
		p.errs.Add(1)
	}
}

// barWidth is the bar's width in characters; the ETA is written over its middle.
const barWidth = 30

// fraction is how far the phase is (-1: unknown) and the time it has left (-1: unknown).
func (p *progress) fraction(el time.Duration, done int64) (float64, time.Duration) {
	switch {
	case p.phase == "ramp-up" && p.ramp > 0:
		return min(el.Seconds()/p.ramp.Seconds(), 1), max(p.ramp-el, 0)
	case p.total > 0:
		f := min(float64(done)/float64(p.total), 1)
		if done == 0 {
			return 0, -1
		}
		return f, time.Duration(float64(el) / f * (1 - f))
	case p.duration > 0 && p.phase == "profiling":
		return min(el.Seconds()/p.duration.Seconds(), 1), max(p.duration-el, 0)
	}
	return -1, -1
}

// bar draws frac of barWidth with text centred over it.
func bar(frac float64, text string) string {
	b := []byte(strings.Repeat("=", int(frac*barWidth)) + strings.Repeat(" ", barWidth-int(frac*barWidth)))
	if len(text) <= barWidth-2 {
		copy(b[(barWidth-len(text))/2:], text)
	}
	return "[" + string(b) + "]"
}

// etaText writes a time left as 1m05s, 42s or 0.4s.
func etaText(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= 10*time.Second:
		return strconv.Itoa(int(d.Round(time.Second).Seconds())) + "s"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
}

func (p *progress) line() string {
	done, errs := p.done.Load(), p.errs.Load()
	el := time.Since(p.started)
	rate := float64(done) / max(el.Seconds(), 1e-9)
	frac, left := p.fraction(el, done)
	var b strings.Builder
	if p.label != "" {
		b.WriteString(p.label + " ")
	}
	fmt.Fprintf(&b, "%-9s ", p.phase)
	if frac >= 0 {
		eta := ""
		if left >= 0 {
			eta = " ETA " + etaText(left) + " "
		}
		fmt.Fprintf(&b, "%s %3.0f%%  ", bar(frac, eta), 100*frac)
	}
	fmt.Fprintf(&b, "%d req  %.1f req/s  %d errors", done, rate, errs)
	if p.sweep != nil {
		pointLeft := time.Duration(-1)
		if left >= 0 {
			pointLeft = left + p.later
		}
		if s := p.sweep(pointLeft); s != "" {
			b.WriteString("  · " + s)
		}
	}
	return b.String()
}

func (p *progress) draw(final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == "" {
		return
	}
	line := p.line()
	if p.tty {
		end := ""
		if final {
			end = "\n"
		}
		fmt.Fprintf(p.w, "\r\033[K%s%s", line, end)
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progress) stop() {
	if p.w == nil {
		return
	}
	close(p.quit)
	p.wg.Wait()
	p.draw(true)
	p.mu.Lock()
	p.phase = ""
	p.mu.Unlock()
}

// sweepClock estimates a sweep's time left for the progress bar: the running point's time
// left plus, for each point not started, the mean wall time of the finished ones (or the
// running point's own estimate before any finished). total < 0: the count is not known in
// advance (a find-max search), at most -total points.
type sweepClock struct {
	mu       sync.Mutex
	total    int
	finished int
	spent    time.Duration
	started  time.Time
}

func (c *sweepClock) start() {
	c.mu.Lock()
	c.started = time.Now()
	c.mu.Unlock()
}

func (c *sweepClock) finish() {
	c.mu.Lock()
	c.finished++
	c.spent += time.Since(c.started)
	c.mu.Unlock()
}

// label names point i (0-based) of the sweep: "concurrency 4 (2/5)", "request_rate 8 (3/≤10)".
func (c *sweepClock) label(name string, i int) string {
	if c.total < 0 {
		return fmt.Sprintf("%s (%d/≤%d)", name, i+1, -c.total)
	}
	return fmt.Sprintf("%s (%d/%d)", name, i+1, c.total)
}

// eta is what the bar prints of the sweep; pointLeft < 0 when the running point's time left
// is not known yet.
func (c *sweepClock) eta(pointLeft time.Duration) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	total, upTo := c.total, ""
	if total < 0 {
		total, upTo = -total, "≤"
	}
	after := time.Duration(total - c.finished - 1)
	if after < 0 {
		after = 0
	}
	var per time.Duration
	switch {
	case c.finished > 0:
		per = c.spent / time.Duration(c.finished)
	case pointLeft >= 0:
		per = time.Since(c.started) + pointLeft
	default:
		return ""
	}
	if pointLeft < 0 {
		pointLeft = max(per-time.Since(c.started), 0)
	}
	if after == 0 && upTo == "" {
		return ""
	}
	return "sweep ETA " + upTo + etaText(pointLeft+per*after)
}
