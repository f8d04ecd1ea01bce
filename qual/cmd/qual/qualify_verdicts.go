package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/onsi/ginkgo/v2/types"
)

// notCheckable is qual/spec.NotCheckable, the prefix of a skip the engine gives no way to
// check (the CLI does not link the Ginkgo DSL).
const notCheckable = "not checkable on this engine: "

// gateVerdict is one gate spec's outcome with its one-line reason (qual/spec.GateVerdict).
type gateVerdict struct {
	Gate    string `json:"gate"`
	Spec    string `json:"spec"`
	Verdict string `json:"verdict"` // passed, failed, skipped
	Reason  string `json:"reason,omitempty"`
}

// verdictOf classifies one spec report; ok is false for a spec that has no verdict (left out
// by the label filter, or never reached).
func verdictOf(sr types.SpecReport, gates []string) (gateVerdict, bool) {
	v := gateVerdict{Gate: strings.Join(gates, ","), Spec: sr.LeafNodeText, Reason: reasonLine(sr.Failure.Message)}
	switch {
	case sr.LeafNodeType != types.NodeTypeIt:
		if !sr.State.Is(types.SpecStateFailureStates) {
			return v, false
		}
		v.Gate, v.Spec, v.Verdict = "setup", sr.LeafNodeType.String(), "failed"
	case sr.State == types.SpecStatePassed:
		v.Verdict, v.Reason = "passed", ""
	case sr.State.Is(types.SpecStateFailureStates):
		v.Verdict = "failed"
	case v.Reason != "":
		v.Verdict = "skipped"
	default:
		return v, false
	}
	return v, true
}

// summaryLine is the verdict in the words of a campaign summary: passed, "engine differs from
// the reference: …" or "not checkable on this engine: …". A skip for another reason (a spec
// that needs another launcher) keeps its own words.
func (v gateVerdict) summaryLine() string {
	switch v.Verdict {
	case "passed":
		return "passed"
	case "failed":
		if v.Gate == "setup" {
			return "stopped before any gate: " + v.Reason
		}
		return "engine differs from the reference: " + v.Reason
	}
	if strings.HasPrefix(v.Reason, notCheckable) {
		return v.Reason
	}
	return "skipped: " + v.Reason
}

// printVerdicts lists a family's gate verdicts, one line each with its reason.
func printVerdicts(w io.Writer, r familyResult) {
	if len(r.Verdicts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range r.Verdicts {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", strings.ToUpper(v.Verdict), v.Gate, clipText(v.Spec, 80), v.Reason)
	}
	tw.Flush()
}

// writeSummary writes summary.md: per family, what was qualified and, per gate, passed,
// "engine differs from the reference: …" or "not checkable on this engine: …", so the
// outcome of a campaign against an engine the project did not write reads in one page.
func writeSummary(path string, results []familyResult, o qualifyOptions) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Qualification summary\n\nLauncher: %s", o.launcher)
	if o.url != "" {
		fmt.Fprintf(&b, " (%s)", o.url)
	}
	fmt.Fprintf(&b, "; label filter `%s`.\n", o.filter)
	for _, r := range results {
		fmt.Fprintf(&b, "\n## %s (%s, %s)\n\n", r.Family, r.Checkpoint, r.Precision)
		fmt.Fprintf(&b, "%d passed, %d failed, %d skipped.\n\n", r.Passed, r.Failed, r.Skipped)
		if r.Error != "" {
			fmt.Fprintf(&b, "**Error:** %s\n\n", r.Error)
		}
		if len(r.Verdicts) == 0 {
			continue
		}
		b.WriteString("| gate | spec | verdict |\n|---|---|---|\n")
		for _, v := range r.Verdicts {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", v.Gate, mdCell(v.Spec), mdCell(v.summaryLine()))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// reasonLine is a message's one-line reason: its first line, and where that line only
// introduces a list ("context contract gate:"), the list's first item and how many follow.
func reasonLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	first := strings.TrimSpace(lines[0])
	if strings.HasSuffix(first, ":") && len(lines) > 1 {
		first += " " + strings.TrimSpace(lines[1])
		if n := len(lines) - 2; n > 0 {
			first += fmt.Sprintf(" (and %d more)", n)
		}
	}
	return first
}

func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// summaryPath is where qualify writes summary.md.
func summaryPath(outDir string) string { return filepath.Join(outDir, "summary.md") }
