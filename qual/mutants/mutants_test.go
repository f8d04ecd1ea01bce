package mutants

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

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

// The planted faults the runtime and the server define are the catalog's: a fault switch added
// to the source without a catalog entry (in its family's part) is a defect no campaign tries.
// Found here: the runtime's fault("NAME") calls (C++ and CUDA) and the server's "server.NAME"
// literals; names composed at run time (the shared Qwen3 decoder's <prefix>.drop_q_norm) are
// checked from the catalog side only (TestCatalogApplies).
func TestEveryFaultIsCatalogued(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	catalogued := map[string]string{}
	for _, m := range Catalog {
		if m.Fault == "" {
			continue
		}
		if other, dup := catalogued[m.Fault]; dup {
			t.Errorf("fault %s is catalogued twice: %q and %q", m.Fault, other, m.Name)
		}
		catalogued[m.Fault] = m.Name
	}
	nativeFault := regexp.MustCompile(`\bfault\("([^"]+)"\)`)
	serverFault := regexp.MustCompile(`"(server\.[a-z][a-z0-9_]*)"`)
	found := 0
	scan := func(dir string, ext []string, re *regexp.Regexp) {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") {
				return err
			}
			for _, e := range ext {
				if strings.HasSuffix(path, e) {
					b, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					for _, m := range re.FindAllStringSubmatch(string(b), -1) {
						found++
						if _, ok := catalogued[m[1]]; !ok {
							rel, _ := filepath.Rel(root, path)
							t.Errorf("%s defines fault %s, which no family's catalog part (qual/mutants/catalog_<family>.go) declares", rel, m[1])
						}
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	scan("native", []string{".cc", ".h", ".cu", ".cuh"}, nativeFault)
	scan("server", []string{".go"}, serverFault)
	if found == 0 {
		t.Fatal("found no fault in native/ or server/: the patterns no longer match how faults are read")
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
	err = Apply(dir, Mutant{Name: "unread fault", Family: "f", File: "f.go", Fault: "f.not_read"})
	if err == nil || !strings.Contains(err.Error(), "does not read fault f.not_read") {
		t.Fatalf("Apply of a fault its file does not read: %v, want an error saying so", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "g.go"), []byte(`on := fault("f.read")`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Apply(dir, Mutant{Name: "read fault", Family: "f", File: "g.go", Fault: "f.read"}); err != nil {
		t.Fatalf("Apply of a fault its file reads: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "g.go")); string(b) != `on := fault("f.read")` {
		t.Fatalf("Apply of a fault edited the file: %q", b)
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

// TestRunPackagesNamesFailedTests: an entry's packages are run with go test and each failed
// top-level test is named "pkg: Test" (a subtest's failure by its parent); a package that does
// not build is a problem, not a catch.
func TestRunPackagesNamesFailedTests(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("a/a_test.go", `package a

import "testing"

func TestGood(t *testing.T) {}
func TestBad(t *testing.T) { t.Run("sub", func(t *testing.T) { t.Fatal("planted") }) }
`)
	write("b/b_test.go", "package b\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) { undefined() }\n")
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	failed, problem := runPackages(context.Background(), dir, env, []string{"./a"}, "", time.Minute)
	if problem != "" || !reflect.DeepEqual(failed, []string{"example.com/m/a: TestBad"}) {
		t.Errorf("runPackages(./a) = %q, problem %q; want the one failed test named", failed, problem)
	}
	if failed, _ := runPackages(context.Background(), dir, env, []string{"./a"}, "TestGood", time.Minute); len(failed) != 0 {
		t.Errorf("runPackages(./a, -run TestGood) = %q; want no failure", failed)
	}
	if _, problem := runPackages(context.Background(), dir, env, []string{"./b"}, "", time.Minute); problem == "" {
		t.Error("a package that does not build gave no problem")
	}
}
