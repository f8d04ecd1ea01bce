package reports

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Markdown renders summary.md: a heading, one line of context and GitHub-flavoured tables, so
// it can be appended to $GITHUB_STEP_SUMMARY as is.
func Markdown(s *Summary) string {
	var b strings.Builder
	name := s.Name
	if name == "" {
		name = "run"
	}
	fmt.Fprintf(&b, "### modelqual profile: %s\n\n", name)
	p := &s.Profiling
	dur, _ := p.Stat(TagBenchmarkDuration, "avg")
	fmt.Fprintf(&b, "%d profiling requests (%d errors), %d warmup requests kept apart, %s",
		p.Requests, p.Requests-count(p, TagRequestCount), s.Warmup.Requests,
		time.Duration(dur*float64(time.Second)).Round(time.Millisecond))
	if s.Sweep != nil {
		fmt.Fprintf(&b, ", %s %g", s.Sweep.Parameter, s.Sweep.Value)
	}
	if s.Seed != nil {
		fmt.Fprintf(&b, ", seed %d", s.Seed.Used)
		if s.Seed.Base != s.Seed.Used {
			fmt.Fprintf(&b, " (the sweep's seed %d + this point's index %d)", s.Seed.Base, s.Seed.Used-s.Seed.Base)
		}
	}
	if len(s.Shards) > 0 {
		fmt.Fprintf(&b, ", merged from %d shards", len(s.Shards))
	}
	b.WriteString(".\n\n")
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "Note: %s.\n\n", mdEscape(n))
	}
	if t := s.Target; t != nil {
		bundle := "none (external server)"
		if t.BundleDigest != "" {
			bundle = fmt.Sprintf("bundle_digest `%s` (as the server reports it)", t.BundleDigest)
		}
		if t.Bundle != "" {
			bundle = fmt.Sprintf("`%s` bundle_digest `%s`", t.Bundle, orUnknown(t.BundleDigest))
		}
		commit := orUnknown(t.Commit)
		if t.Dirty {
			commit += " (dirty tree)"
		}
		fmt.Fprintf(&b, "Server: %s at %s, model `%s`; bundle: %s; commit %s.\n\n", orUnknown(t.Server), orUnknown(t.URL), t.Model, bundle, commit)
		if t.Pacer != "" {
			fmt.Fprintf(&b, "Schedule kept by the client's pacer: %s.\n\n", t.Pacer)
		}
	}
	if len(p.Shards) > 1 {
		if p.ShardGapSec > 0 {
			fmt.Fprintf(&b, "The shards' measured windows do not all overlap: %s of the wall-clock span had no shard measuring and is not counted; the duration and throughputs below are over the union of the windows.\n\n",
				time.Duration(p.ShardGapSec*float64(time.Second)).Round(time.Millisecond))
		} else {
			b.WriteString("The shards' measured windows overlap: the duration and throughputs below are over the union of the windows, the shards' together.\n\n")
		}
		b.WriteString("| Shard | start (UTC) | duration s | requests | req/s | out tok/s |\n|---|---|--:|--:|--:|--:|\n")
		for _, w := range p.Shards {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s |\n", w.Shard, time.Unix(0, w.StartNs).UTC().Format("2006-01-02 15:04:05.000"),
				two(w.DurationSec), w.Requests, two(w.RequestThroughput), two(w.OutputTokenThroughput))
		}
		b.WriteString("\n")
	}

	b.WriteString("| Metric | avg | p50 | p90 | p99 | min | max | std |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	var scalars []string
	for _, tag := range p.Tags() {
		m := p.Metrics[tag]
		if m.Dist == nil {
			scalars = append(scalars, tag)
			continue
		}
		// Whole-number metrics (token lengths, byte counts) have whole min and max; their
		// mean, percentiles (interpolated) and spread keep two decimals, as in the CSV.
		d, in := m.Dist, IntegerMetric(tag)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", MetricLabel(tag, m.Unit),
			two(d.Avg), two(d.P50), two(d.P90), two(d.P99), whole(d.Min, in), whole(d.Max, in), two(d.Std))
	}
	if len(scalars) > 0 {
		b.WriteString("\n| Metric | Value |\n|---|--:|\n")
		for _, tag := range scalars {
			m := p.Metrics[tag]
			fmt.Fprintf(&b, "| %s | %s |\n", MetricLabel(tag, m.Unit), scalar(tag, m))
		}
	}
	if len(s.SLOs) > 0 {
		specs := make([]string, len(s.SLOs))
		for i, slo := range s.SLOs {
			op := "≤"
			if slo.LargerIsBetter {
				op = "≥"
			}
			specs[i] = fmt.Sprintf("`%s %s %g %s`", slo.Tag, op, slo.Threshold, slo.Unit)
		}
		fmt.Fprintf(&b, "\nGoodput SLOs: %s.\n", strings.Join(specs, ", "))
	}
	if len(p.Errors) > 0 {
		b.WriteString("\n| Error code | Type | Count | First message |\n|--:|---|--:|---|\n")
		for _, e := range p.Errors {
			fmt.Fprintf(&b, "| %d | %s | %d | %s |\n", e.Details.Code, mdEscape(e.Details.Type), e.Count, mdEscape(truncate(e.Details.Message, 120)))
		}
	}
	stepsMarkdown(&b, s.EngineSteps)
	gpuMarkdown(&b, s.GPUTelemetry)
	return b.String()
}

// stepsMarkdown adds the server's engine steps of the profiling phase: per kind the steps,
// their mean length, tokens per step and share of the engine's time.
func stepsMarkdown(b *strings.Builder, e *EngineSteps) {
	if e == nil || e.Prefill.Steps+e.Decode.Steps == 0 {
		return
	}
	total := e.Prefill.Seconds + e.Decode.Seconds
	b.WriteString("\n| Engine steps | Steps | Mean (ms) | Tokens per step | Share of engine time (%) |\n|---|--:|--:|--:|--:|\n")
	for _, k := range []struct {
		name string
		s    StepStats
	}{{"prefill", e.Prefill}, {"decode", e.Decode}} {
		if k.s.Steps == 0 {
			fmt.Fprintf(b, "| %s | 0 | | | |\n", k.name)
			continue
		}
		share := 0.0
		if total > 0 {
			share = 100 * k.s.Seconds / total
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s |\n", k.name, k.s.Steps, two(1e3*k.s.Seconds/k.s.Steps), two(k.s.Tokens/k.s.Steps), two(share))
	}
	if worst, layer, mean, ok := e.ExpertImbalance(); ok {
		experts := 0
		for _, row := range e.Experts {
			experts = max(experts, len(row))
		}
		fmt.Fprintf(b, "\nExpert load (busiest expert over the mean, 1 = balanced, %d = collapsed): worst layer %d %s, mean over layers %s\n",
			experts, layer, two(worst), two(mean))
	}
}

// gpuTelemetry is the part of the GPU telemetry blob (written by qual/gpu's sampler) that
// summary.md shows; reports reads it by its JSON keys so that it imports nothing of qual.
type gpuTelemetry struct {
	Available bool    `json:"available"`
	Reason    string  `json:"reason"`
	EnergyJ   float64 `json:"energy_j"`
	JPerToken float64 `json:"joules_per_output_token"`
	WindowS   float64 `json:"window_s"`
	Note      string  `json:"note"`
	Devices   []struct {
		Index         int     `json:"index"`
		UUID          string  `json:"uuid"`
		UtilAvg       float64 `json:"gpu_utilization_avg_pct"`
		UtilMax       float64 `json:"gpu_utilization_max_pct"`
		MemHighWater  uint64  `json:"memory_high_water_bytes"`
		PowerAvg      float64 `json:"power_avg_w"`
		PowerMax      float64 `json:"power_max_w"`
		DeviceEnergyJ float64 `json:"energy_j"`
		EnergySource  string  `json:"energy_source"`
		PowerReading  string  `json:"power_reading"`
	} `json:"devices"`
}

// gpuMarkdown adds the GPU figures of a run that recorded telemetry: per device the memory
// high-water, utilisation, power and energy (marked where it was integrated from the power
// samples rather than read from the energy counter), the run's joules per output token, and
// the sampler's note on a short window. A run that recorded telemetry as unavailable gets one
// line saying why.
func gpuMarkdown(b *strings.Builder, blob json.RawMessage) {
	if len(blob) == 0 {
		return
	}
	var t gpuTelemetry
	if err := json.Unmarshal(blob, &t); err != nil {
		fmt.Fprintf(b, "\nGPU telemetry could not be read: %s.\n", mdEscape(err.Error()))
		return
	}
	if !t.Available {
		if t.Reason != "" {
			fmt.Fprintf(b, "\nGPU telemetry unavailable: %s.\n", mdEscape(t.Reason))
		}
		return
	}
	b.WriteString("\n| GPU | Memory high-water (MiB) | Utilization avg / max (%) | Power avg / max (W) | Energy (J) |\n|---|--:|--:|--:|--:|\n")
	for _, d := range t.Devices {
		energy := two(d.DeviceEnergyJ)
		if d.EnergySource == "power_samples" {
			energy += " (from power samples)"
		}
		fmt.Fprintf(b, "| %d %s | %s | %s / %s | %s / %s | %s |\n", d.Index, mdEscape(d.UUID),
			two(float64(d.MemHighWater)/(1<<20)), two(d.UtilAvg), two(d.UtilMax), two(d.PowerAvg), two(d.PowerMax), energy)
	}
	// Joules per token run from ~0.001 (a small model at high concurrency) to ~1: three
	// significant digits, where two decimals would print 0.00.
	fmt.Fprintf(b, "\nGPU energy %s J, %s J per output token", two(t.EnergyJ), strconv.FormatFloat(t.JPerToken, 'g', 3, 64))
	if t.WindowS > 0 {
		fmt.Fprintf(b, ", over %s s", two(t.WindowS))
	}
	b.WriteString(".\n")
	if t.Note != "" {
		fmt.Fprintf(b, "\nNote: %s.\n", mdEscape(t.Note))
	}
	for _, d := range t.Devices {
		if d.PowerReading == "usage" {
			b.WriteString("\nPower is nvmlDeviceGetPowerUsage's reading, a one-second average on Ampere and newer GPUs (the driver has no instant reading).\n")
			break
		}
	}
}

func count(p *PhaseStats, tag string) int {
	v, _ := p.Stat(tag, "avg")
	return int(v)
}

// truncate shortens s to at most n runes.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

// mdEscape keeps a cell on one line and its pipes from splitting the table.
func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}
