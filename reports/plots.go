package reports

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot file names in a run directory and in a sweep directory.
const (
	LatencyCDFPNG      = "latency_cdf.png"
	TTFTHistogramPNG   = "ttft_histogram.png"
	SweepThroughputPNG = "sweep_throughput.png"
	SweepP99LatencyPNG = "sweep_p99_latency.png"
	// SweepTradeoffPNG plots output token throughput against request latency, one point
	// per sweep point labelled with its concurrency or rate: where a sweep's knee lies.
	SweepTradeoffPNG = "sweep_throughput_latency.png"
)

var (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.5 * vg.Inch
	palette    = []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
)

// frame keeps what a plot draws off the image's edges: gonum sets the axes to the data's
// exact range, so the last point, the top of a line and a legend in a corner are drawn on
// the border and cut in half. The x range gains 4 % a side, the y range headroom above the
// data (headroom of its span) where the legend goes, top left, clear of the lines; the title
// gets padding above it.
//
// Ticks: gonum's default gives two or three labelled ticks on a 7-inch axis, too few to
// read a value off; every linear axis gets denseTicks instead (a log axis keeps the ticks
// its caller set).
func frame(p *plot.Plot, headroom float64) {
	if _, log := p.X.Scale.(plot.LogScale); log {
		// A log axis pads by a factor: 4 % of the span in log space, each side.
		f := math.Pow(p.X.Max/p.X.Min, 0.04)
		if f <= 1 {
			f = 1.5
		}
		p.X.Min, p.X.Max = p.X.Min/f, p.X.Max*f
	} else {
		dx := p.X.Max - p.X.Min
		if dx == 0 {
			dx = math.Max(math.Abs(p.X.Max), 1)
		}
		p.X.Min, p.X.Max = p.X.Min-0.04*dx, p.X.Max+0.04*dx
		p.X.Tick.Marker = denseTicks{n: 12}
	}
	p.Y.Tick.Marker = denseTicks{n: 10}
	dy := p.Y.Max - p.Y.Min
	if dy == 0 {
		dy = math.Max(math.Abs(p.Y.Max), 1)
	}
	p.Y.Max += headroom * dy
	p.Title.Padding = vg.Points(8)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(6)
}

// recordValues collects a scalar metric over the valid records of a phase.
func recordValues(recs []ExportRecord, phase, tag string) []float64 {
	var out []float64
	for i := range recs {
		r := &recs[i]
		if r.Metadata.BenchmarkPhase != phase || !r.Valid() {
			continue
		}
		if v, ok := r.Value(tag); ok {
			out = append(out, v)
		}
	}
	return out
}

// ecdf returns the empirical CDF of values as a step-free line of (value, fraction ≤ value).
func ecdf(values []float64) plotter.XYs {
	x := append([]float64(nil), values...)
	sort.Float64s(x)
	xy := make(plotter.XYs, len(x))
	for i, v := range x {
		xy[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(x))}
	}
	return xy
}

// PlotLatencyCDF writes the empirical CDFs of request latency, TTFT and (when present) the
// native task wall time of the profiling phase to path as PNG.
func PlotLatencyCDF(path string, recs []ExportRecord) error {
	return plotLatencyCDF(path, recs, "")
}

// plotLatencyCDF is PlotLatencyCDF with the run named in the title (about: runAbout's words).
// The fraction axis ends at 1, the most a fraction can be: the legend goes bottom right,
// where a CDF leaves room (its curves are high on the right), not in headroom above 1.
func plotLatencyCDF(path string, recs []ExportRecord, about string) error {
	p, err := latencyCDF(recs, about)
	if err != nil {
		return err
	}
	return p.Save(plotWidth, plotHeight, path)
}

func latencyCDF(recs []ExportRecord, about string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = titled("Latency CDF", about)
	p.X.Label.Text = "ms"
	p.Y.Label.Text = "fraction of requests"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	n := 0
	for i, tag := range []string{TagRequestLatency, TagTTFT, TagTaskWallTime} {
		v := recordValues(recs, PhaseProfiling, tag)
		if len(v) == 0 {
			continue
		}
		l, err := plotter.NewLine(ecdf(v))
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", tag, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(MetricLabel(tag, "ms"), l)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("plot latency CDF: no valid profiling request with a latency")
	}
	frame(p, 0)
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = plot.TickerFunc(func(_, _ float64) []plot.Tick { return linearTicks(0, 1, 0.1) })
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), vg.Points(8)
	return p, nil
}

// PlotTTFTHistogram writes a histogram of the profiling phase's TTFT to path as PNG.
func PlotTTFTHistogram(path string, recs []ExportRecord) error {
	return plotTTFTHistogram(path, recs, "")
}

func plotTTFTHistogram(path string, recs []ExportRecord, about string) error {
	v := recordValues(recs, PhaseProfiling, TagTTFT)
	if len(v) == 0 {
		return fmt.Errorf("plot TTFT histogram: no valid profiling request with a TTFT")
	}
	bins := min(max(len(v)/5, 1), 40)
	h, err := plotter.NewHist(plotter.Values(v), bins)
	if err != nil {
		return fmt.Errorf("plot TTFT histogram: %w", err)
	}
	h.FillColor = palette[0]
	p := plot.New()
	p.Title.Text = titled(fmt.Sprintf("Time to first token, %d requests", len(v)), about)
	p.X.Label.Text = "ms"
	p.Y.Label.Text = "requests"
	p.Add(plotter.NewGrid(), h)
	frame(p, 0.1)
	return p.Save(plotWidth, plotHeight, path)
}

// PlotRun writes a run's plots into dir and returns the file names written. A plot with no
// data (e.g. every request failed) is skipped, not an error.
func PlotRun(dir string, recs []ExportRecord) ([]string, error) {
	return plotRun(dir, recs, "")
}

// PlotRunOf is PlotRun with the plots' titles naming the run, its endpoint and its sweep
// point (concurrency or request rate).
func PlotRunOf(dir string, run *Run) ([]string, error) {
	return plotRun(dir, run.Records, runAbout(run))
}

func plotRun(dir string, recs []ExportRecord, about string) ([]string, error) {
	var written []string
	for _, pl := range []struct {
		name, needs string
		fn          func(string, []ExportRecord, string) error
	}{{LatencyCDFPNG, TagRequestLatency, plotLatencyCDF}, {TTFTHistogramPNG, TagTTFT, plotTTFTHistogram}} {
		// Non-streaming runs have no TTFT (a streaming metric), failed runs no latency.
		if len(recordValues(recs, PhaseProfiling, pl.needs)) == 0 {
			continue
		}
		if err := pl.fn(filepath.Join(dir, pl.name), recs, about); err != nil {
			return written, err
		}
		written = append(written, pl.name)
	}
	return written, nil
}

// PlotSweep writes, for runs of one sweep (each Summary with a Sweep point, all of one
// parameter), output token throughput and p99 latencies against the swept parameter on a log
// axis (sweeps double their concurrency or rate, so a linear axis crowds the low points into
// a corner), and throughput against request latency with each point labelled, into dir. It
// returns the file names written.
func PlotSweep(dir string, runs []*Summary) ([]string, error) {
	type pt struct{ x, tput, p50, p99, ttft99 float64 }
	var pts []pt
	param := ""
	for _, s := range runs {
		if s.Sweep == nil {
			return nil, fmt.Errorf("plot sweep: run %q has no sweep point", s.Name)
		}
		if param == "" {
			param = s.Sweep.Parameter
		} else if param != s.Sweep.Parameter {
			return nil, fmt.Errorf("plot sweep: runs mix parameters %q and %q", param, s.Sweep.Parameter)
		}
		tput, _ := s.Profiling.Stat(TagOutputTokenThroughput, "avg")
		if _, ok := s.Profiling.Metrics[TagOutputTokenThroughput]; !ok {
			tput, _ = s.Profiling.Stat(TagRequestThroughput, "avg") // images: no tokens
		}
		p50, _ := s.Profiling.Stat(TagRequestLatency, "p50")
		p99, _ := s.Profiling.Stat(TagRequestLatency, "p99")
		t99, _ := s.Profiling.Stat(TagTTFT, "p99")
		pts = append(pts, pt{s.Sweep.Value, tput, p50, p99, t99})
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("plot sweep: no runs")
	}
	tputLabel, tputUnit := "output token throughput", "tokens/sec"
	if _, ok := runs[0].Profiling.Metrics[TagOutputTokenThroughput]; !ok {
		tputLabel, tputUnit = "request throughput", "requests/sec"
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].x < pts[j].x })
	about := sweepAbout(runs)
	var xs []float64
	for _, q := range pts {
		xs = append(xs, q.x)
	}
	line := func(title, ylabel, file string, series map[string]func(pt) float64, order []string) error {
		p := plot.New()
		p.Title.Text = titled(title, about)
		p.X.Label.Text = param + " (log scale)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = valueTicks(xs)
		p.Y.Label.Text = ylabel
		p.Add(plotter.NewGrid())
		for i, name := range order {
			xy := make(plotter.XYs, len(pts))
			for k, q := range pts {
				xy[k] = plotter.XY{X: q.x, Y: series[name](q)}
			}
			l, s, err := plotter.NewLinePoints(xy)
			if err != nil {
				return fmt.Errorf("plot %s: %w", file, err)
			}
			l.Color, s.Color = palette[i%len(palette)], palette[i%len(palette)]
			l.Width = vg.Points(1.5)
			p.Add(l, s)
			p.Legend.Add(name, l, s)
		}
		p.Y.Min = 0 // throughput and latency read wrong on a clipped axis
		frame(p, 0.3)
		return p.Save(plotWidth, plotHeight, filepath.Join(dir, file))
	}
	if err := line(capitalize(tputLabel)+" vs "+param, tputUnit, SweepThroughputPNG,
		map[string]func(pt) float64{tputLabel: func(q pt) float64 { return q.tput }},
		[]string{tputLabel}); err != nil {
		return nil, err
	}
	latSeries := map[string]func(pt) float64{"request latency p99": func(q pt) float64 { return q.p99 }, "TTFT p99": func(q pt) float64 { return q.ttft99 }}
	latOrder := []string{"request latency p99", "TTFT p99"}
	if _, ok := runs[0].Profiling.Metrics[TagTTFT]; !ok {
		latOrder = latOrder[:1] // not streamed: no TTFT to draw at 0
	}
	if err := line("p99 latency vs "+param, "ms", SweepP99LatencyPNG, latSeries, latOrder); err != nil {
		return []string{SweepThroughputPNG}, err
	}
	// Throughput against latency: one curve per latency percentile, each point labelled
	// with its sweep value, so the knee (latency rising, throughput flat) reads at a glance.
	p := plot.New()
	p.Title.Text = titled(capitalize(tputLabel)+" vs request latency", about)
	p.X.Label.Text = "request latency (ms)"
	p.Y.Label.Text = tputUnit
	p.Add(plotter.NewGrid())
	short := map[string]string{"concurrency": "c=", "request_rate": "r=", "fixed_schedule": "trace "}[param]
	for i, sr := range []struct {
		name string
		lat  func(pt) float64
	}{{"p50", func(q pt) float64 { return q.p50 }}, {"p99", func(q pt) float64 { return q.p99 }}} {
		xy := make(plotter.XYs, len(pts))
		labels := make([]string, len(pts))
		for k, q := range pts {
			xy[k] = plotter.XY{X: sr.lat(q), Y: q.tput}
			labels[k] = short + strconv.FormatFloat(q.x, 'g', 4, 64)
		}
		l, sc, err := plotter.NewLinePoints(xy)
		if err != nil {
			return []string{SweepThroughputPNG, SweepP99LatencyPNG}, fmt.Errorf("plot %s: %w", SweepTradeoffPNG, err)
		}
		l.Color, sc.Color = palette[i%len(palette)], palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l, sc)
		if i == 0 { // one curve labelled: both would print each label twice, side by side
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xy, Labels: labels})
			if err != nil {
				return []string{SweepThroughputPNG, SweepP99LatencyPNG}, fmt.Errorf("plot %s: %w", SweepTradeoffPNG, err)
			}
			lb.Offset = vg.Point{X: -vg.Points(4), Y: vg.Points(6)}
			p.Add(lb)
		}
		p.Legend.Add("request latency "+sr.name, l, sc)
	}
	p.X.Min, p.Y.Min = 0, 0
	frame(p, 0.3)
	if err := p.Save(plotWidth, plotHeight, filepath.Join(dir, SweepTradeoffPNG)); err != nil {
		return []string{SweepThroughputPNG, SweepP99LatencyPNG}, err
	}
	return []string{SweepThroughputPNG, SweepP99LatencyPNG, SweepTradeoffPNG}, nil
}

// titled adds what a plot is of (runAbout, sweepAbout) to its title.
func titled(title, about string) string {
	if about == "" {
		return title
	}
	return title + "\n" + about
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// runAbout names a run for plot titles: its name, endpoint (and whether streamed) and sweep
// point, e.g. "profile-c4: completions, streamed, concurrency 4".
func runAbout(run *Run) string {
	if run == nil {
		return ""
	}
	parts := endpointWords(run.InputConfig)
	if run.Sweep != nil && run.Sweep.Parameter != "fixed_schedule" {
		parts = append(parts, strings.ReplaceAll(run.Sweep.Parameter, "_", " ")+" "+strconv.FormatFloat(run.Sweep.Value, 'g', -1, 64))
	}
	if len(parts) == 0 {
		return run.Name
	}
	return run.Name + ": " + strings.Join(parts, ", ")
}

// sweepAbout names a sweep for plot titles: the runs' common name (without the point
// suffixes) and endpoint, e.g. "profile: completions, streamed, 3 points".
func sweepAbout(runs []*Summary) string {
	name := runs[0].Name
	for _, s := range runs[1:] {
		for !strings.HasPrefix(s.Name, name) {
			name = name[:len(name)-1]
		}
	}
	name = strings.TrimRight(name, "-_")
	if len(runs) > 1 {
		name = strings.TrimSuffix(strings.TrimSuffix(name, "-c"), "-r")
	}
	parts := append(endpointWords(runs[0].InputConfig), fmt.Sprintf("%d runs", len(runs)))
	if name == "" {
		return strings.Join(parts, ", ")
	}
	return name + ": " + strings.Join(parts, ", ")
}

// endpointWords reads the endpoint and streaming of AIPerf's input_config
// (endpoint.type, endpoint.streaming); none when the run does not say.
func endpointWords(cfg json.RawMessage) []string {
	var c struct {
		Endpoint struct {
			Type      string `json:"type"`
			Streaming bool   `json:"streaming"`
		} `json:"endpoint"`
	}
	if len(cfg) == 0 || json.Unmarshal(cfg, &c) != nil || c.Endpoint.Type == "" {
		return nil
	}
	out := []string{c.Endpoint.Type}
	if c.Endpoint.Streaming {
		out = append(out, "streamed")
	}
	return out
}

// denseTicks is a linear axis's ticks: about n labelled ticks at a round step (1, 2, 2.5 or
// 5 times a power of ten), with an unlabelled tick halfway between.
type denseTicks struct{ n int }

func (t denseTicks) Ticks(min, max float64) []plot.Tick {
	if !(max > min) || math.IsInf(max-min, 0) {
		return plot.DefaultTicks{}.Ticks(min, max)
	}
	raw := (max - min) / float64(t.n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	return linearTicks(min, max, step)
}

// linearTicks labels the multiples of step within [min, max] (with the fewest decimals that
// show step exactly) and marks the midpoints between them.
func linearTicks(min, max, step float64) []plot.Tick {
	prec := 0
	for prec < 12 && math.Abs(step*math.Pow10(prec)-math.Round(step*math.Pow10(prec))) > 1e-9*step*math.Pow10(prec) {
		prec++
	}
	var ticks []plot.Tick
	first := math.Ceil(min/step - 1e-9)
	for i := first - 1; ; i++ {
		v := i * step
		if v > max+1e-9*step {
			break
		}
		if v >= min-1e-9*step {
			label := strconv.FormatFloat(v, 'f', prec, 64)
			if label == "-0" {
				label = "0"
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
		if mid := v + step/2; mid >= min && mid <= max {
			ticks = append(ticks, plot.Tick{Value: mid})
		}
	}
	return ticks
}

// valueTicks labels a log axis at the sweep's own values (1, 2, 4, 8, ...), the numbers a
// reader looks for, with unlabelled ticks at the powers of ten between.
func valueTicks(values []float64) plot.Ticker {
	return plot.TickerFunc(func(min, max float64) []plot.Tick {
		var ticks []plot.Tick
		seen := map[float64]bool{}
		for _, v := range values {
			if v >= min && v <= max && !seen[v] {
				seen[v] = true
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 4, 64)})
			}
		}
		for _, t := range (plot.LogTicks{}).Ticks(min, max) {
			if !seen[t.Value] && t.Value >= min && t.Value <= max {
				ticks = append(ticks, plot.Tick{Value: t.Value})
			}
		}
		return ticks
	})
}
