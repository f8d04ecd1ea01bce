package spec

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
)

// GateVerdict is one gate spec's outcome with its one-line reason, as a reader of a
// qualification wants it: passed, failed (the engine differs from the reference) or skipped
// (not checkable on this engine), never a bare "skipped" without why.
type GateVerdict struct {
	Gate    string // the gate labels: parity, contract, ...
	Spec    string // the It text
	Verdict string // "passed", "failed" or "skipped"
	Reason  string // the failure's or skip's first line
}

// Verdicts reads the gate verdicts of a suite report: every It that ran or was skipped with a
// reason (specs the label filter left out are not verdicts), and a failed setup (the identity
// check, a server that did not start) as one verdict of its own.
func Verdicts(r types.Report) []GateVerdict {
	var out []GateVerdict
	for _, sr := range r.SpecReports {
		reason := firstLineOf(sr.Failure.Message)
		if sr.LeafNodeType != types.NodeTypeIt {
			if sr.State.Is(types.SpecStateFailureStates) {
				out = append(out, GateVerdict{Gate: "setup", Spec: sr.LeafNodeType.String(), Verdict: "failed", Reason: reason})
			}
			continue
		}
		var gates []string
		for _, l := range sr.Labels() {
			if slices.Contains([]string{GateProvenance, GateParity, GateContract, GateLoad}, l) {
				gates = append(gates, l)
			}
		}
		v := GateVerdict{Gate: strings.Join(gates, ","), Spec: sr.LeafNodeText, Reason: reason}
		switch {
		case sr.State == types.SpecStatePassed:
			v.Verdict = "passed"
		case sr.State.Is(types.SpecStateFailureStates):
			v.Verdict = "failed"
		case reason != "":
			v.Verdict = "skipped"
		default:
			continue // filtered out or never reached: no verdict
		}
		out = append(out, v)
	}
	return out
}

// PrintVerdicts writes one line per verdict: the outcome, the gate, the spec and the reason.
func PrintVerdicts(w io.Writer, title string, vs []GateVerdict) {
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range vs {
		reason := v.Reason
		if v.Verdict == "passed" {
			reason = ""
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", strings.ToUpper(v.Verdict), v.Gate, clip(v.Spec, 90), reason)
	}
	tw.Flush()
}

// reportVerdicts prints the suite's gate verdicts once the suite ended (Ginkgo's own output
// names skips only with -v), so every run shows each gate passed, failed or skipped with why.
func (s *Suite) reportVerdicts(r ginkgo.Report) {
	vs := Verdicts(r)
	if len(vs) == 0 {
		return
	}
	PrintVerdicts(os.Stdout, fmt.Sprintf("%s gate verdicts (launcher %s):", s.Family, s.State.Launcher), vs)
}

// firstLineOf is a message's one-line reason: its first line, and where that line only
// introduces a list ("context contract gate:"), the list's first item and how many follow.
func firstLineOf(s string) string {
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
