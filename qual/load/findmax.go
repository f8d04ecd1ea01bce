package load

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/modelqual/modelqual/qual/metrics"
	"github.com/modelqual/modelqual/reports"
)

// FindMax asks Profile to search, instead of sweeping a fixed list, for the highest request
// rate (ProfileInput.RequestRates holds the first one to try) or concurrency
// (ProfileInput.Concurrencies) at which every SLO holds: an exponential bracket from the
// first value (doubling while points pass, halving while they fail), then bisection between
// the highest passing and the lowest failing value until they are Resolution apart, in at
// most MaxPoints points. Every point is profiled and written like a sweep point; the search
// itself goes into <OutDir>/<Name>-sweep/summary.json and summary.md (reports.FindMax).
type FindMax struct {
	// SLOs are the objectives, e.g. "ttft_p99:200ms,itl_p99:50ms" (ParseFindMaxSLOs).
	SLOs string
	// Resolution ends the bisection: the answer and the lowest failing value above it are at
	// most this far apart, in the swept unit (req/s, clients), or as a fraction of the answer
	// when Relative. Zero: 1 client for a concurrency, 5 % for a rate.
	Resolution float64
	Relative   bool
	// MaxPoints bounds the points profiled (default 10).
	MaxPoints int
	// Limit, when > 0, is the highest value the bracket tries.
	Limit float64
}

// findMaxSLO is a find-max objective's name: a metric (tag or --slo alias, or e2e for
// request_latency), then _p<N>, _avg (or _mean) or _max.
var findMaxSLO = regexp.MustCompile(`^(.+?)_(p[0-9]+(?:\.[0-9]+)?|avg|mean|max)$`)

// ParseFindMaxSLOs parses a find-max SLO list: comma-separated NAME_STAT:THRESHOLD items,
// e.g. "ttft_p99:200ms,itl_p99:50ms,e2e_p50:2s,output_token_throughput_per_user_p90:20".
// NAME is a metric tag or an alias --slo takes (ttft, ttst, itl, tpot, e2el, latency, tps,
// queue_wait; also e2e); STAT is p<N> (0 < N <= 100), avg (mean) or max. A NAME without a
// STAT must hold for every measured request (max). THRESHOLD is read as --slo reads it.
func ParseFindMaxSLOs(spec string) ([]reports.FindMaxSLO, error) {
	var out []reports.FindMaxSLO
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("find-max slo %q: want NAME_STAT:THRESHOLD, e.g. ttft_p99:200ms", item)
		}
		name = strings.TrimSpace(name)
		stat := "max"
		if m := findMaxSLO.FindStringSubmatch(name); m != nil {
			name, stat = m[1], m[2]
		}
		if stat == "mean" {
			stat = "avg"
		}
		if name == "e2e" {
			name = reports.TagRequestLatency
		}
		one, err := metrics.ParseSLOs(name + ":" + val)
		if err != nil {
			return nil, fmt.Errorf("find-max slo %q: %w", item, err)
		}
		s := reports.FindMaxSLO{SLO: one[0], Stat: stat}
		s.Spec = item
		if strings.HasPrefix(stat, "p") {
			p, err := strconv.ParseFloat(stat[1:], 64)
			if err != nil || !(p > 0 && p <= 100) {
				return nil, fmt.Errorf("find-max slo %q: percentile %s must be within (0, 100]", item, stat)
			}
			s.Percentile = p
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, errors.New("find-max needs at least one SLO, e.g. ttft_p99:200ms")
	}
	return out, nil
}

// findMaxSearch chooses the next value of a search from the points so far.
type findMaxSearch struct {
	integer    bool // a concurrency
	start      float64
	resolution float64
	relative   bool
	limit      float64
	lo, hi     float64 // highest passing (0: none yet), lowest failing above it (+Inf: none yet)
	tried      map[float64]bool
}

// record adds a judged point.
func (s *findMaxSearch) record(v float64, pass bool) {
	s.tried[v] = true
	if pass && v > s.lo {
		s.lo = v
	}
	if !pass && v < s.hi {
		s.hi = v
	}
	if s.hi <= s.lo { // a noisy point failing below one that passed: keep the bracket ordered
		s.hi = math.Inf(1)
		for t := range s.tried {
			if t > s.lo && t < s.hi {
				s.hi = t
			}
		}
	}
}

// round makes a value one a point can be named and run at: a whole concurrency, a rate of
// four significant digits.
func (s *findMaxSearch) round(v float64) float64 {
	if s.integer {
		return math.Floor(v)
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 4, 64), 64)
	return r
}

// next is the value to profile next, or why the search is over.
func (s *findMaxSearch) next() (float64, string) {
	if len(s.tried) == 0 {
		return s.start, ""
	}
	var v float64
	switch {
	case math.IsInf(s.hi, 1): // every point passed: double
		v = s.round(2 * s.lo)
		if s.limit > 0 && v > s.limit {
			v = s.round(s.limit)
		}
		if v <= s.lo {
			return 0, "reached --find-max-limit"
		}
	case s.lo == 0: // every point failed: halve
		v = s.round(s.hi / 2)
		if s.integer && v < 1 {
			return 0, "concurrency 1 fails"
		}
		if !s.integer && (s.hi/2 < s.resolutionAt(s.hi/2) || s.hi/2 < s.start/8) {
			return 0, "no rate down to an eighth of the first meets them"
		}
	default:
		if s.hi-s.lo <= s.resolutionAt(s.lo) {
			return 0, "converged to the resolution"
		}
		v = s.round((s.lo + s.hi) / 2)
	}
	if s.tried[v] || v <= 0 {
		return 0, "converged to the resolution"
	}
	return v, ""
}

func (s *findMaxSearch) resolutionAt(v float64) float64 {
	if s.relative {
		return s.resolution * v
	}
	return s.resolution
}

// resolutionText writes the resolution for the summary.
func resolutionText(f *FindMax) string {
	if f.Relative {
		return strconv.FormatFloat(100*f.Resolution, 'g', -1, 64) + "%"
	}
	return strconv.FormatFloat(f.Resolution, 'g', -1, 64)
}

// judgeFindMax measures every objective on a profiled point.
func judgeFindMax(slos []reports.FindMaxSLO, pr *PointResult) reports.FindMaxPoint {
	p := reports.FindMaxPoint{Value: pr.Sweep.Value, Dir: filepath.Base(pr.Dir), Pass: true}
	if pr.Summary == nil || pr.Err != nil {
		p.Pass = false
		why := "the point did not complete"
		if pr.Err != nil {
			why = "the point failed: " + pr.Err.Error()
		}
		p.Failed = append(p.Failed, why)
		p.Measured = make([]*float64, len(slos))
		return p
	}
	ps := &pr.Summary.Profiling
	p.Requests = ps.Requests
	for _, e := range ps.Errors {
		p.Errors += e.Count
	}
	if v, ok := ps.Stat(reports.TagGoodput, "avg"); ok {
		p.Goodput = &v
	}
	if v, ok := ps.Stat(reports.TagRequestThroughput, "avg"); ok {
		p.RequestThroughput = &v
	}
	for _, s := range slos {
		v, n := s.Measure(pr.exp)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			p.Measured = append(p.Measured, nil)
		} else {
			val := v
			p.Measured = append(p.Measured, &val)
		}
		if !s.Met(v) {
			p.Pass = false
			switch {
			case n == 0:
				p.Failed = append(p.Failed, s.Name()+": no measured request")
			case math.IsInf(v, 0):
				p.Failed = append(p.Failed, s.Name()+": failed requests (or requests without "+s.Tag+") reach the "+s.Stat)
			default:
				p.Failed = append(p.Failed, fmt.Sprintf("%s: %s", s.Name(), strconv.FormatFloat(v, 'f', 2, 64)))
			}
		}
	}
	return p
}

// profileFindMax runs a find-max search (in.FindMax) and writes its summary.
func profileFindMax(ctx context.Context, in ProfileInput, out string, base uint64, res *ProfileResult) error {
	fm := *in.FindMax
	slos, err := ParseFindMaxSLOs(fm.SLOs)
	if err != nil {
		return fmt.Errorf("load.Profile: FindMax.SLOs: %w", err)
	}
	if in.Repeat > 1 {
		return errors.New("load.Profile: FindMax searches one point at a time; leave Repeat at 1")
	}
	s := findMaxSearch{resolution: fm.Resolution, relative: fm.Relative, limit: fm.Limit, hi: math.Inf(1), tried: map[float64]bool{}}
	param := "request_rate"
	switch {
	case len(in.Concurrencies) == 1:
		param, s.integer, s.start = "concurrency", true, float64(in.Concurrencies[0])
	case len(in.RequestRates) == 1:
		s.start = in.RequestRates[0]
	default:
		return errors.New("load.Profile: FindMax starts from one value: give one concurrency or one request rate")
	}
	if fm.MaxPoints <= 0 {
		fm.MaxPoints = 10
	}
	if fm.Resolution <= 0 {
		fm.Resolution, fm.Relative = 1, false
		if !s.integer {
			fm.Resolution, fm.Relative = 0.05, true
		}
		s.resolution, s.relative = fm.Resolution, fm.Relative
	}
	sweepDir := filepath.Join(out, in.Name+SweepDirSuffix)
	if !in.Overwrite {
		if err := RefuseExistingRun(sweepDir); err != nil {
			return fmt.Errorf("load.Profile: %w", err)
		}
	}
	var goodput []reports.SLO
	for _, o := range slos {
		goodput = append(goodput, o.SLO)
	}
	report := &reports.FindMax{Parameter: param, SLOs: slos, Resolution: fm.Resolution, Relative: fm.Relative, MaxPoints: fm.MaxPoints}
	clock := &sweepClock{total: -fm.MaxPoints}
	stop := "point budget spent"
	for i := 0; i < fm.MaxPoints; i++ {
		v, why := s.next()
		if why != "" {
			stop = why
			break
		}
		sp := sweepPoint{sweep: reports.SweepPoint{Parameter: param, Value: v}}
		if s.integer {
			sp.dir = fmt.Sprintf("%s-c%d", in.Name, int(v))
		} else {
			sp.dir = fmt.Sprintf("%s-r%s", in.Name, strconv.FormatFloat(v, 'f', -1, 64))
		}
		sp.dir = filepath.Join(out, sp.dir)
		if !in.Overwrite {
			if err := RefuseExistingRun(sp.dir); err != nil {
				return fmt.Errorf("load.Profile: %w", err)
			}
		}
		cfg := pointConfig(in.Load, sp.sweep, base+uint64(i))
		cfg.ProgressLabel, cfg.ProgressSweep = clock.label(pointName(sp), i), clock.eta
		clock.start()
		pr := profilePoint(ctx, in, cfg, sp.sweep, sp.dir, goodput, base, res)
		clock.finish()
		if pr.noneSucceeded != nil && s.lo == 0 {
			// Nothing succeeded and no lower load has: a wrong model, URL or request rather
			// than a load too high, so the search stops with the error. Above a passing
			// point, the same is the server giving way: a failing point.
			pr.Err = errors.Join(pr.Err, pr.noneSucceeded)
		}
		jp := judgeFindMax(slos, &pr)
		res.Points = append(res.Points, pr)
		report.Points = append(report.Points, jp)
		if ctx.Err() != nil {
			stop = "interrupted"
			break
		}
		if pr.Err != nil {
			stop = "a point failed"
			break
		}
		s.record(v, jp.Pass)
	}
	report.Conclude(fmt.Sprintf("%s after %d points, resolution %s", stop, len(report.Points), resolutionText(&fm)))
	res.FindMax = report
	if err := WriteFindMax(sweepDir, report); err != nil {
		return err
	}
	return plotSweep(sweepDir, res)
}

// WriteFindMax writes a search's summary into the sweep folder.
func WriteFindMax(dir string, f *reports.FindMax) error {
	if err := reports.WriteFindMax(dir, f); err != nil {
		return fmt.Errorf("find-max summary in %s: %w", dir, err)
	}
	return nil
}
