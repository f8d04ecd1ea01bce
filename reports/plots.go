package reports

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"

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
func frame(p *plot.Plot, headroom float64) {
	dx := p.X.Max - p.X.Min
	if dx == 0 {
		dx = math.Max(math.Abs(p.X.Max), 1)
	}
	p.X.Min, p.X.Max = p.X.Min-0.04*dx, p.X.Max+0.04*dx
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
	p := plot.New()
	p.Title.Text = "Latency CDF (profiling requests)"
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
			return fmt.Errorf("plot %s: %w", tag, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(MetricLabel(tag, "ms"), l)
		n++
	}
	if n == 0 {
		return fmt.Errorf("plot latency CDF: no valid profiling request with a latency")
	}
	frame(p, 0.25)
	return p.Save(plotWidth, plotHeight, path)
}

// PlotTTFTHistogram writes a histogram of the profiling phase's TTFT to path as PNG.
func PlotTTFTHistogram(path string, recs []ExportRecord) error {
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
	p.Title.Text = fmt.Sprintf("Time to first token (%d requests)", len(v))
	p.X.Label.Text = "ms"
	p.Y.Label.Text = "requests"
	p.Add(plotter.NewGrid(), h)
	frame(p, 0.1)
	return p.Save(plotWidth, plotHeight, path)
}

// PlotRun writes a run's plots into dir and returns the file names written. A plot with no
// data (e.g. every request failed) is skipped, not an error.
func PlotRun(dir string, recs []ExportRecord) ([]string, error) {
	var written []string
	for _, pl := range []struct {
		name, needs string
		fn          func(string, []ExportRecord) error
	}{{LatencyCDFPNG, TagRequestLatency, PlotLatencyCDF}, {TTFTHistogramPNG, TagTTFT, PlotTTFTHistogram}} {
		// Non-streaming runs have no TTFT (a streaming metric), failed runs no latency.
		if len(recordValues(recs, PhaseProfiling, pl.needs)) == 0 {
			continue
		}
		if err := pl.fn(filepath.Join(dir, pl.name), recs); err != nil {
			return written, err
		}
		written = append(written, pl.name)
	}
	return written, nil
}

// PlotSweep writes, for runs of one sweep (each Summary with a Sweep point, all of one
// parameter), output token throughput and p99 request latency against the swept parameter
// into dir. It returns the file names written.
func PlotSweep(dir string, runs []*Summary) ([]string, error) {
	type pt struct{ x, tput, p99, ttft99 float64 }
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
		p99, _ := s.Profiling.Stat(TagRequestLatency, "p99")
		t99, _ := s.Profiling.Stat(TagTTFT, "p99")
		pts = append(pts, pt{s.Sweep.Value, tput, p99, t99})
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("plot sweep: no runs")
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].x < pts[j].x })
	line := func(title, ylabel, file string, series map[string]func(pt) float64, order []string) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = param
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
	if err := line("Output token throughput vs "+param, "tokens/sec", SweepThroughputPNG,
		map[string]func(pt) float64{"output token throughput": func(q pt) float64 { return q.tput }},
		[]string{"output token throughput"}); err != nil {
		return nil, err
	}
	if err := line("p99 latency vs "+param, "ms", SweepP99LatencyPNG,
		map[string]func(pt) float64{"request latency p99": func(q pt) float64 { return q.p99 }, "TTFT p99": func(q pt) float64 { return q.ttft99 }},
		[]string{"request latency p99", "TTFT p99"}); err != nil {
		return []string{SweepThroughputPNG}, err
	}
	return []string{SweepThroughputPNG, SweepP99LatencyPNG}, nil
}
