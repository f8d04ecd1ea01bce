package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2/types"
)

// Each gate gets its verdict with its one-line reason in the printed table and in summary.md:
// passed, "engine differs from the reference: …", "not checkable on this engine: …"; a spec
// the label filter left out gets none; a failed setup (the identity check) reads as stopped.
func TestGateVerdictsInTableAndSummary(t *testing.T) {
	it := func(text string, state types.SpecState, msg string, labels ...string) types.SpecReport {
		return types.SpecReport{LeafNodeType: types.NodeTypeIt, LeafNodeText: text, LeafNodeLabels: labels, State: state,
			Failure: types.Failure{Message: msg}}
	}
	rep := []types.Report{{SpecReports: types.SpecReports{
		it("streams deltas", types.SpecStatePassed, "", "parity"),
		it("refuses over-context requests with 400", types.SpecStateFailed, "context gate: a 1100-token prompt was answered 200\n  details", "contract"),
		it("matches the family reference", types.SpecStateSkipped, "not checkable on this engine: needs /mq/v1/logits, which the server lacks: answered 404", "parity"),
		it("runs in a container", types.SpecStateSkipped, "", "parity", "container"),
	}}}
	dir := t.TempDir()
	b, _ := json.Marshal(rep)
	r := familyResult{Family: "qwen3", Checkpoint: "modelqual-fixtures/qwen3-tiny", JSONReport: filepath.Join(dir, "qwen.json")}
	os.WriteFile(r.JSONReport, b, 0o644)
	if err := readGinkgoReport(&r, nil); err != nil {
		t.Fatal(err)
	}
	if len(r.Verdicts) != 3 {
		t.Fatalf("%d verdicts, want 3 (the filtered-out spec has none): %+v", len(r.Verdicts), r.Verdicts)
	}
	var table strings.Builder
	printQualifyTable(&table, []familyResult{r}, 0)
	for _, want := range [][]string{{"PASSED", "parity", "streams deltas"}, {"FAILED", "contract", "refuses over-context requests with 400", "context gate: a 1100-token prompt was answered 200"},
		{"SKIPPED", "parity", "matches the family reference", "not checkable on this engine: needs /mq/v1/logits"}} {
		found := false
		for _, line := range strings.Split(table.String(), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == want[0] && strings.Contains(line, want[2]) {
				found = true
				for _, w := range want {
					if !strings.Contains(line, w) {
						t.Errorf("verdict line %q lacks %q", line, w)
					}
				}
			}
		}
		if !found {
			t.Errorf("table has no %s line for %q:\n%s", want[0], want[2], table.String())
		}
	}
	path := filepath.Join(dir, "summary.md")
	if err := writeSummary(path, []familyResult{r}, qualifyOptions{launcher: "external", url: "http://127.0.0.1:8080", filter: "!gpu"}); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(path)
	for _, want := range []string{"Launcher: external (http://127.0.0.1:8080)", "| parity | streams deltas | passed |",
		"| contract | refuses over-context requests with 400 | engine differs from the reference: context gate: a 1100-token prompt was answered 200 |",
		"| parity | matches the family reference | not checkable on this engine: needs /mq/v1/logits, which the server lacks: answered 404 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}

	setup := familyResult{Family: "qwen3", JSONReport: filepath.Join(dir, "setup.json")}
	b, _ = json.Marshal([]types.Report{{SpecReports: types.SpecReports{{LeafNodeType: types.NodeTypeSynchronizedBeforeSuite, State: types.SpecStateFailed,
		Failure: types.Failure{Message: "spec: qwen stops before any gate: identity check: the server does not serve modelqual-fixtures/qwen3-tiny"}}}}})
	os.WriteFile(setup.JSONReport, b, 0o644)
	if err := readGinkgoReport(&setup, nil); err != nil {
		t.Fatal(err)
	}
	if len(setup.Verdicts) != 1 || !strings.HasPrefix(setup.Verdicts[0].summaryLine(), "stopped before any gate: spec: qwen stops before any gate: identity check") {
		t.Errorf("a failed identity check: %+v", setup.Verdicts)
	}
}
