package reports

import (
	"fmt"
	"strings"
	"time"
)

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
	if len(s.Shards) > 0 {
		fmt.Fprintf(&b, ", merged from %d shards", len(s.Shards))
	}
	b.WriteString(".\n\n")

	b.WriteString("| Metric | avg | p50 | p90 | p99 | min | max | std |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	var scalars []string
	for _, tag := range p.Tags() {
		m := p.Metrics[tag]
		if m.Dist == nil {
			scalars = append(scalars, tag)
			continue
		}
		d := m.Dist
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", MetricLabel(tag, m.Unit),
			two(d.Avg), two(d.P50), two(d.P90), two(d.P99), two(d.Min), two(d.Max), two(d.Std))
	}
	if len(scalars) > 0 {
		b.WriteString("\n| Metric | Value |\n|---|--:|\n")
		for _, tag := range scalars {
			m := p.Metrics[tag]
			fmt.Fprintf(&b, "| %s | %s |\n", MetricLabel(tag, m.Unit), two(m.Avg))
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
	return b.String()
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
