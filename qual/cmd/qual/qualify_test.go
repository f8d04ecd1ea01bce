package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/modelqual/modelqual/fixtures"
)

// TestReadGinkgoReport feeds readGinkgoReport a Ginkgo JSON report as the family suites write
// it: gates are counted by their gate label, failures are listed, and the headline figures
// come from the manifest's first profile whatever order the specs ran in.
func TestReadGinkgoReport(t *testing.T) {
	spec := func(text string, state types.SpecState, labels []string, figs []loadFigure) types.SpecReport {
		sr := types.SpecReport{LeafNodeType: types.NodeTypeIt, LeafNodeText: text, LeafNodeLabels: labels, State: state}
		if state == types.SpecStateFailed {
			sr.Failure = types.Failure{Message: "parity gate: 3 of 20 corpus prompts pass\n  details"}
		}
		if figs != nil {
			sr.ReportEntries = types.ReportEntries{{Name: loadFiguresEntry, Value: types.WrapEntryValue(figs)}}
		}
		return sr
	}
	rep := []types.Report{{SpecReports: types.SpecReports{
		spec("load stream", types.SpecStatePassed, []string{"load"}, []loadFigure{{Profile: "stream", Point: "concurrency=4", Name: "mq_http_latency.p50", Value: 50}}),
		spec("load closed", types.SpecStatePassed, []string{"load"}, []loadFigure{{Profile: "closed", Point: "concurrency=1", Name: "mq_http_latency.p50", Value: 10}}),
		spec("parity", types.SpecStateFailed, []string{"qwen", "parity"}, nil),
		spec("provenance", types.SpecStatePassed, []string{"provenance"}, nil),
		spec("container", types.SpecStateSkipped, []string{"container"}, nil),
	}}}
	dir := t.TempDir()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	r := familyResult{Family: "qwen", JSONReport: filepath.Join(dir, "qwen.json")}
	os.WriteFile(r.JSONReport, b, 0o644)
	if err := readGinkgoReport(&r, []string{"closed", "stream"}); err != nil {
		t.Fatal(err)
	}
	if r.Passed != 3 || r.Failed != 1 || r.Skipped != 1 {
		t.Errorf("passed/failed/skipped = %d/%d/%d, want 3/1/1", r.Passed, r.Failed, r.Skipped)
	}
	if strings.Join(r.GatesPassed, ",") != "provenance,load" || strings.Join(r.GatesFailed, ",") != "parity" {
		t.Errorf("gates passed %v failed %v", r.GatesPassed, r.GatesFailed)
	}
	if r.HeadlineFrom != "closed concurrency=1" || r.Headline["mq_http_latency.p50"] != 10 {
		t.Errorf("headline from %q = %v, want the first manifest profile's first point", r.HeadlineFrom, r.Headline)
	}
	var out strings.Builder
	printQualifyTable(&out, []familyResult{r}, 0)
	for _, want := range []string{"qwen", "provenance,load", "parity", "10.00", "parity gate: 3 of 20 corpus prompts pass"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestFamilyNames: a family is found by any of its names (the registry's, the folder, the
// fixture, an architecture) and printed by the registry's, as qual families lists it.
func TestFamilyNames(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	names, err := familyNames(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, alias := range []string{"qwen3", "qwen", "qwen3-tiny", "Qwen3ForCausalLM", "QWEN3"} {
		n, ok := resolveFamily(names, alias)
		if !ok || n.Canonical != "qwen3" || n.Folder != "qwen" {
			t.Errorf("--family %s: %+v %v, want qwen3 in families/qwen", alias, n, ok)
		}
	}
	if _, ok := resolveFamily(names, "falcon"); ok {
		t.Error("an unknown family resolved")
	}
	var out, errb bytes.Buffer
	if code := familiesMain(nil, &out, &errb); code != 0 || !regexp.MustCompile(`(?m)^qwen3\s+text\s+Qwen3ForCausalLM\s+families/qwen\s+qwen, qwen3-tiny$`).MatchString(out.String()) {
		t.Errorf("qual families (exit %d):\n%s%s", code, out.String(), errb.String())
	}
	errOut := captureStderr(t, func() {
		if code := runQualify([]string{"--family", "falcon"}); code != 2 {
			t.Errorf("qualify --family falcon: exit %d, want 2", code)
		}
	})
	if !strings.Contains(errOut, "qwen3 (also qwen, qwen3-tiny, Qwen3ForCausalLM)") {
		t.Errorf("unknown family error does not list the names: %s", errOut)
	}
}
