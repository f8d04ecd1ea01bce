package reports

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// CompareSide is one side of a comparison: its runs and the names (paths) they were given by.
type CompareSide struct {
	Runs  []*Run
	Names []string
}

// CompareSweepOptions tunes CompareSweep. Zero values take the defaults of Compare and
// CompareRuns.
type CompareSweepOptions struct {
	Stats      []string
	Level      float64 // repeats: family-wise confidence per point
	Iterations int     // one run a side: bootstrap resamples
	Seed       uint64  // one run a side: bootstrap seed
	// Ignore names configuration-key fields (KeyFieldNames) allowed to differ: between the
	// two sides for a load field (compare concurrency 1 with 4 on purpose), among the runs
	// of one side for a server field (pool runs of two bundles on purpose).
	Ignore []string
}

// PointComparison is one configuration compared: the base runs of one load and the
// candidate runs of the same load.
type PointComparison struct {
	Point    string    `json:"point"` // "concurrency=4", "request_rate=10", "trace"
	Key      ConfigKey `json:"key"`   // the base's key
	BaseRuns []string  `json:"base_runs"`
	CandRuns []string  `json:"candidate_runs"`
	// Differs lists the server settings on which base and candidate differ: what this
	// comparison measures (a bundle, a flag), and any load field let through by Ignore.
	Differs []KeyDiff `json:"differs,omitempty"`
	// OverRuns: at least 2 runs a side, the runs are the observations (CompareRuns);
	// otherwise one run a side and the intervals resample requests (Compare).
	OverRuns bool            `json:"over_runs"`
	Rows     []RunComparison `json:"comparisons,omitempty"`
	// Note says why the point has no rows.
	Note string `json:"note,omitempty"`
}

// SweepComparison is a whole comparison, point by point.
type SweepComparison struct {
	Points []PointComparison `json:"points"`
	// Unpaired names the sweep points of one side with no run of the same load on the other.
	Unpaired []string `json:"unpaired,omitempty"`
}

// runGroup is the runs of one side sharing a configuration key.
type runGroup struct {
	key   ConfigKey
	runs  []*Run
	names []string
}

// CompareSweep compares two sides point by point. Each side's runs are grouped by their
// configuration key (RunKey): runs of one key are repeats, runs of different loads are
// points of a sweep, and runs of one load but different servers (bundle, flags, model) are
// refused, since pooling them would pass a difference of configuration for noise. Each base
// group is paired with the candidate group of the same load; a pair of repeats is compared
// over runs (CompareRuns), a pair of single runs within run (Compare).
func CompareSweep(base, cand CompareSide, opt CompareSweepOptions) (*SweepComparison, error) {
	bg, err := groupRuns("base", base, opt.Ignore)
	if err != nil {
		return nil, err
	}
	cg, err := groupRuns("candidate", cand, opt.Ignore)
	if err != nil {
		return nil, err
	}
	out := &SweepComparison{}
	used := make([]bool, len(cg))
	for _, b := range bg {
		ci := slices.IndexFunc(cg, func(c runGroup) bool { return len(b.key.Diff(c.key, true, false, opt.Ignore)) == 0 })
		for ci >= 0 && used[ci] {
			next := slices.IndexFunc(cg[ci+1:], func(c runGroup) bool { return len(b.key.Diff(c.key, true, false, opt.Ignore)) == 0 })
			if next < 0 {
				ci = -1
				break
			}
			ci += 1 + next
		}
		if ci < 0 {
			out.Unpaired = append(out.Unpaired, fmt.Sprintf("base %s (%s): no candidate run at the same load", b.key.Point(), GroupLabel(b.names)))
			continue
		}
		used[ci] = true
		out.Points = append(out.Points, comparePoint(b, cg[ci], opt))
	}
	for i, c := range cg {
		if !used[i] {
			out.Unpaired = append(out.Unpaired, fmt.Sprintf("candidate %s (%s): no base run at the same load", c.key.Point(), GroupLabel(c.names)))
		}
	}
	if len(out.Points) > 0 {
		return out, nil
	}
	if len(bg) == 1 && len(cg) == 1 {
		d := bg[0].key.Diff(cg[0].key, true, false, opt.Ignore)
		return nil, fmt.Errorf("base and candidate are not the same load: %s; compare runs of one configuration, or pass --ignore %s to compare them anyway",
			joinDiffs(d), diffFields(d))
	}
	// Where the two sides share sweep points, say what else differs there.
	var ds []KeyDiff
	for _, b := range bg {
		for _, c := range cg {
			if b.key.Point() != c.key.Point() {
				continue
			}
			for _, d := range b.key.Diff(c.key, true, false, opt.Ignore) {
				if !slices.ContainsFunc(ds, func(x KeyDiff) bool { return x.Field == d.Field }) {
					ds = append(ds, d)
				}
			}
		}
	}
	if len(ds) > 0 {
		return nil, fmt.Errorf("base and candidate are not the same load at any sweep point (base: %s; candidate: %s): %s; compare runs of one configuration, or pass --ignore %s to compare them anyway",
			points(bg), points(cg), joinDiffs(ds), diffFields(ds))
	}
	return nil, fmt.Errorf("no base point has a candidate run at the same load (base: %s; candidate: %s); compare runs of one configuration, or pass --ignore FIELD for a field that may differ",
		points(bg), points(cg))
}

func joinDiffs(d []KeyDiff) string {
	s := make([]string, len(d))
	for i, x := range d {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}

func diffFields(d []KeyDiff) string {
	s := make([]string, len(d))
	for i, x := range d {
		s[i] = x.Field
	}
	return strings.Join(s, ",")
}

func points(gs []runGroup) string {
	s := make([]string, len(gs))
	for i, g := range gs {
		s[i] = g.key.Point()
	}
	return strings.Join(s, ", ")
}

// groupRuns splits a side into groups of one configuration key, ordered by sweep point.
func groupRuns(side string, s CompareSide, ignore []string) ([]runGroup, error) {
	if len(s.Runs) != len(s.Names) {
		return nil, fmt.Errorf("compare: %s: %d runs but %d names", side, len(s.Runs), len(s.Names))
	}
	var gs []runGroup
	for i, r := range s.Runs {
		k := RunKey(r)
		gi := slices.IndexFunc(gs, func(g runGroup) bool { return len(g.key.Diff(k, true, false, ignore)) == 0 })
		if gi < 0 {
			gs = append(gs, runGroup{key: k, runs: []*Run{r}, names: []string{s.Names[i]}})
			continue
		}
		g := &gs[gi]
		if d := g.key.Diff(k, false, true, ignore); len(d) > 0 {
			return nil, fmt.Errorf("compare: %s: %s and %s share the load (%s) but differ in %s, so they are not repeats of one configuration; give them as the two sides of a comparison, or pass --ignore %s to pool them",
				side, g.names[0], s.Names[i], g.key.Point(), joinDiffs(d), diffFields(d))
		}
		g.runs, g.names = append(g.runs, r), append(g.names, s.Names[i])
	}
	slices.SortStableFunc(gs, func(a, b runGroup) int { return comparePoints(a.key, b.key) })
	return gs, nil
}

// comparePoints orders keys by load kind, then numerically by concurrency or rate.
func comparePoints(a, b ConfigKey) int {
	la, _ := a.Get("load")
	lb, _ := b.Get("load")
	if c := strings.Compare(la, lb); c != 0 {
		return c
	}
	for _, f := range []string{"request_rate", "concurrency"} {
		va, _ := a.Get(f)
		vb, _ := b.Get(f)
		x, errA := strconv.ParseFloat(va, 64)
		y, errB := strconv.ParseFloat(vb, 64)
		if errA == nil && errB == nil && x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

func comparePoint(b, c runGroup, opt CompareSweepOptions) PointComparison {
	p := PointComparison{Point: b.key.Point(), Key: b.key, BaseRuns: b.names, CandRuns: c.names,
		Differs: b.key.Diff(c.key, true, true, nil)}
	switch {
	case len(b.runs) >= 2 && len(c.runs) >= 2:
		rows, err := CompareRuns(b.runs, c.runs, CompareRunsOptions{Stats: opt.Stats, Level: opt.Level})
		if err != nil {
			p.Note = err.Error()
		}
		p.Rows, p.OverRuns = rows, true
	case len(b.runs) == 1 && len(c.runs) == 1:
		for _, x := range Compare(b.runs[0], c.runs[0], CompareOptions{Iterations: opt.Iterations, Seed: opt.Seed, Stats: opt.Stats}) {
			p.Rows = append(p.Rows, RunComparison{Comparison: x, Verdict: withinRunVerdict(x)})
		}
		if len(p.Rows) == 0 {
			p.Note = "the two runs share no metric with valid profiling requests"
		}
	default:
		p.Note = fmt.Sprintf("%d base and %d candidate runs: an interval over runs needs at least 2 a side (qual profile --repeat N), one a side is compared within run; give as many a side",
			len(b.runs), len(c.runs))
	}
	return p
}

// withinRunVerdict calls a change where the request bootstrap's interval excludes 1,
// marked (within run) since it cannot see run-to-run variance.
func withinRunVerdict(c Comparison) string {
	switch {
	case !c.HasCI:
		return ""
	case c.Lo > 1:
		return pick(c.LargerIsBetter, "better", "worse") + " (within run)"
	case c.Hi < 1:
		return pick(c.LargerIsBetter, "worse", "better") + " (within run)"
	}
	return "same"
}

// CompareWidth is the widest line WriteSweepComparison prints without wide: a terminal of
// 120 columns, or a CI log, shows the table unwrapped.
const CompareWidth = 120

// WriteSweepComparison prints a comparison point by point: per point a header (the point,
// how many runs a side, what differs between the sides) and a table of metric, statistic,
// base, candidate, ratio, interval and verdict. Without wide every line fits CompareWidth
// (long metric names and run names are cut); wide prints full names, every run's value and
// the configuration key.
func WriteSweepComparison(w io.Writer, sc *SweepComparison, wide bool) error {
	var b strings.Builder
	fit := func(s string) string {
		if wide {
			return s
		}
		return shorten(s, CompareWidth)
	}
	withinRun, tooFew := false, false
	for i, p := range sc.Points {
		if i > 0 {
			b.WriteString("\n")
		}
		how := "one run a side, intervals over requests"
		if p.OverRuns {
			level := 0.95
			if len(p.Rows) > 0 {
				level = p.Rows[0].Level
			}
			how = fmt.Sprintf("%d base and %d candidate runs, %s%% intervals over runs (family-wise)", len(p.BaseRuns), len(p.CandRuns), strconv.FormatFloat(level*100, 'g', 4, 64))
		} else if p.Note == "" {
			withinRun = true
		}
		fmt.Fprintf(&b, "%s\n", fit(fmt.Sprintf("== %s: %s", p.Point, how)))
		if wide {
			fmt.Fprintf(&b, "   key:       %s\n", p.Key)
			fmt.Fprintf(&b, "   base:      %s\n", strings.Join(p.BaseRuns, ", "))
			fmt.Fprintf(&b, "   candidate: %s\n", strings.Join(p.CandRuns, ", "))
		} else {
			fmt.Fprintf(&b, "%s\n", fit("   base:      "+GroupLabel(p.BaseRuns)))
			fmt.Fprintf(&b, "%s\n", fit("   candidate: "+GroupLabel(p.CandRuns)))
		}
		if len(p.Differs) > 0 {
			fmt.Fprintf(&b, "%s\n", fit("   differs:   "+joinDiffs(p.Differs)))
		}
		if p.Note != "" {
			fmt.Fprintf(&b, "%s\n", fit("   not compared: "+p.Note))
			continue
		}
		t := compareTable(p, wide)
		for _, r := range p.Rows {
			tooFew = tooFew || r.Verdict == VerdictTooFewRuns
		}
		t.write(&b, wide)
	}
	if len(sc.Unpaired) > 0 {
		b.WriteString("\nNot paired:\n")
		for _, u := range sc.Unpaired {
			fmt.Fprintf(&b, "%s\n", fit("  "+u))
		}
	}
	if tooFew {
		b.WriteString("\n" + wrap("needs N runs/side: the interval over these few runs would be wider than any ratio of a candidate run "+
			"to a base run, so it says nothing; N (from the runs' own spread) would resolve the change seen, or a 5 % change "+
			"when it is smaller: qual profile --repeat N.", 100))
	}
	if withinRun {
		b.WriteString("\n" + wrap("One run a side: the intervals resample requests and cannot see run-to-run variance, which is "+
			"usually larger (two runs of one config often differ beyond them). Compare repeats before trusting a verdict: "+
			"qual profile --repeat N, then qual report compare BASE CAND with the repeats a side.", 100))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks text into lines of at most width runes at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	line := 0
	for _, word := range strings.Fields(text) {
		n := utf8.RuneCountInString(word)
		if line > 0 && line+1+n > width {
			b.WriteString("\n")
			line = 0
		} else if line > 0 {
			b.WriteString(" ")
			line++
		}
		b.WriteString(word)
		line += n
	}
	return b.String() + "\n"
}

func compareTable(p PointComparison, wide bool) *textTable {
	t := &textTable{header: []string{"metric", "stat", "base", "candidate", "ratio", "interval", "verdict"},
		right: []bool{false, false, true, true, true, true, false}}
	if wide {
		t.header = append(t.header, "base runs", "candidate runs")
		t.right = append(t.right, false, false)
	}
	for _, r := range p.Rows {
		ratio, ci := "n/a", "-"
		if !math.IsNaN(r.Ratio) {
			ratio = fmtRatio(r.Ratio)
		}
		if r.HasCI {
			ci = "[" + fmtRatio(r.Lo) + ", " + fmtRatio(r.Hi) + "]"
		}
		verdict := r.Verdict
		if verdict == VerdictTooFewRuns {
			verdict = "needs >" + strconv.Itoa(maxRunsNeeded) + " runs/side"
			if r.RunsNeeded > 0 {
				verdict = "needs " + strconv.Itoa(r.RunsNeeded) + " runs/side"
			}
		}
		row := []string{MetricLabel(r.Tag, r.Unit), r.Stat, two(r.Base), two(r.Cand), ratio, ci, verdict}
		if wide {
			row = append(row, joinValues(r.BaseRuns), joinValues(r.CandRuns))
		}
		t.rows = append(t.rows, row)
	}
	return t
}

func joinValues(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = two(x)
	}
	return strings.Join(s, " ")
}

// fmtRatio writes a ratio with three significant digits (0.912, 1.07, 12.3, 123), in
// exponent form only outside [0.001, 1000).
func fmtRatio(r float64) string {
	switch {
	case math.IsNaN(r) || math.IsInf(r, 0):
		return strconv.FormatFloat(r, 'g', -1, 64)
	case r == 0:
		return "0"
	case math.Abs(r) < 0.001 || math.Abs(r) >= 1000:
		return strconv.FormatFloat(r, 'e', 2, 64)
	}
	decimals := max(0, 2-int(math.Floor(math.Log10(math.Abs(r)))))
	return strconv.FormatFloat(r, 'f', decimals, 64)
}

// textTable is a table printed with two spaces between columns; the first column is cut to
// keep lines within CompareWidth unless wide.
type textTable struct {
	header []string
	rows   [][]string
	right  []bool
}

func (t *textTable) write(b *strings.Builder, wide bool) {
	widths := make([]int, len(t.header))
	all := append([][]string{t.header}, t.rows...)
	for _, r := range all {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	if !wide {
		total := 2 * (len(widths) - 1)
		for _, w := range widths {
			total += w
		}
		if over := total - CompareWidth; over > 0 {
			widths[0] = max(12, widths[0]-over)
		}
	}
	for _, r := range all {
		var line strings.Builder
		for i, c := range r {
			c = shorten(c, widths[i])
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i > 0 {
				line.WriteString("  ")
			}
			if t.right[i] {
				line.WriteString(pad + c)
			} else if i < len(r)-1 {
				line.WriteString(c + pad)
			} else {
				line.WriteString(c)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}
