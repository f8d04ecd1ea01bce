package mutants

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// Every catalog entry must plant its defect in today's source: its Old text occurs exactly
// once in its file, and the entry changes something. A refactor that moves the code makes this
// test name the stale entry.
func TestCatalogApplies(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	families := map[string]bool{}
	for _, m := range Catalog {
		if names[m.Name] {
			t.Errorf("mutant %q is listed twice", m.Name)
		}
		names[m.Name] = true
		families[m.Family] = true
		if _, err := os.Stat(filepath.Join(root, "families", m.Family)); err != nil {
			t.Errorf("mutant %q: family %q has no folder: %v", m.Name, m.Family, err)
		}
		dir := t.TempDir()
		src := filepath.Join(root, filepath.FromSlash(m.File))
		dst := filepath.Join(dir, filepath.FromSlash(m.File))
		if err := copyFile(src, dst); err != nil {
			t.Fatal(err)
		}
		if err := Apply(dir, m); err != nil {
			t.Error(err)
			continue
		}
		b, _ := os.ReadFile(dst)
		if m.New != "" && !strings.Contains(string(b), m.New) {
			t.Errorf("mutant %q: the planted text is not in the result", m.Name)
		}
	}
	if len(Catalog) < 20 {
		t.Errorf("the catalog has %d defects; keep at least 20", len(Catalog))
	}
}

func TestApplyRefusesStaleEntries(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f.go"), []byte("a := 1\na := 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Apply(dir, Mutant{Name: "twice", File: "f.go", Old: "a := 1", New: "a := 2"})
	if err == nil || !strings.Contains(err.Error(), "occurs 2 times") {
		t.Fatalf("Apply on a twice-occurring text: %v, want an error saying it occurs 2 times", err)
	}
	err = Apply(dir, Mutant{Name: "gone", File: "f.go", Old: "b := 1", New: "b := 2"})
	if err == nil || !strings.Contains(err.Error(), "occurs 0 times") {
		t.Fatalf("Apply on a missing text: %v, want an error saying it occurs 0 times", err)
	}
}

func TestFailedSpecsReadsGinkgoReport(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.json")
	report := `[{"SpecReports":[
	 {"ContainerHierarchyTexts":["qwen gates"],"LeafNodeText":"stops at EOS","LeafNodeType":"It","State":"failed"},
	 {"ContainerHierarchyTexts":["qwen gates"],"LeafNodeText":"parity","LeafNodeType":"It","State":"passed"},
	 {"LeafNodeType":"SynchronizedBeforeSuite","State":"failed"}]}]`
	if err := os.WriteFile(p, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := failedSpecs(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != "SynchronizedBeforeSuite|qwen gates: stops at EOS" {
		t.Fatalf("failedSpecs = %q", got)
	}
}
