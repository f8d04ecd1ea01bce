package load

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
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
// seconds otherwise (CI logs), nothing when w is nil.
type progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	phase    string
	total    int
	duration time.Duration
	started  time.Time
	done     atomic.Int64
	errs     atomic.Int64
	quit     chan struct{}
	wg       sync.WaitGroup
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer, warmup, requests int, d time.Duration) *progress {
	p := &progress{w: w, duration: d}
	if w == nil {
		return p
	}
	p.tty = isTerminal(w)
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
	p.phase, p.total, p.started = name, total, time.Now()
	p.mu.Unlock()
	p.done.Store(0)
	p.errs.Store(0)
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

func (p *progress) draw(final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == "" {
		return
	}
	done, errs := p.done.Load(), p.errs.Load()
	el := time.Since(p.started)
	rate := float64(done) / max(el.Seconds(), 1e-9)
	frac := -1.0
	switch {
	case p.total > 0:
		frac = float64(done) / float64(p.total)
	case p.duration > 0 && p.phase == "profiling":
		frac = el.Seconds() / p.duration.Seconds()
	}
	frac = min(frac, 1)
	var line string
	if frac >= 0 {
		const width = 30
		fill := int(frac * width)
		line = fmt.Sprintf("%-9s [%s%s] %3.0f%%  %d req  %.1f req/s  %d errors", p.phase,
			strings.Repeat("=", fill), strings.Repeat(" ", width-fill), 100*frac, done, rate, errs)
	} else {
		line = fmt.Sprintf("%-9s %d req  %.1f req/s  %d errors", p.phase, done, rate, errs)
	}
	if p.tty {
		end := ""
		if final {
			end = "\n"
		}
		fmt.Fprintf(p.w, "\r%s%s", line, end)
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
