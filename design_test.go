package modelqual_test

// This test enforces the import direction of DESIGN.md:
//
//	families → qual → reports
//	qual → native/bundle, server/tokenizer, server/record, server/openengine (libraries only; never native or the rest of server)
//	every area → server/envconfig (the one list of environment variables; a leaf)
//	server → native
//	nothing imports families
//
// The only exception is qual/cmd/qual, the CLI binary, which may also import package native
// for `qual generate` (running the engine directly, without a server).

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/modelqual/modelqual"

type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func listPackages(t *testing.T) []goPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []goPackage
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// area names the top-level area of a module package: "families", "qual", "reports",
// "server", "server/tokenizer", "server/record", "native", "native/bundle", "fixtures" or ""
// (module root).
func area(path string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
	switch {
	case rel == "server/tokenizer" || strings.HasPrefix(rel, "server/tokenizer/"):
		return "server/tokenizer"
	case rel == "server/record":
		return "server/record"
	case rel == "server/envconfig":
		return "server/envconfig"
	case rel == "server/openengine" || strings.HasPrefix(rel, "server/openengine/"):
		return "server/openengine"
	case rel == "native/bundle" || strings.HasPrefix(rel, "native/bundle/"):
		return "native/bundle"
	}
	top, _, _ := strings.Cut(rel, "/")
	return top
}

// allowed reports whether a package in area from may import a package in area to.
func allowed(fromPath, to string) bool {
	from := area(fromPath)
	if from == to || to == "fixtures" {
		return true
	}
	if to == "server/envconfig" { // the one list of environment variables: a leaf every area may read
		return from != "server/envconfig"
	}
	switch from {
	case "families":
		return to == "qual" || to == "reports" || to == "native/bundle" || to == "server/tokenizer" || to == "server/record"
	case "qual":
		if to == "native" && strings.HasPrefix(fromPath, module+"/qual/cmd/qual") {
			return true
		}
		return to == "reports" || to == "native/bundle" || to == "server/tokenizer" || to == "server/record" || to == "server/openengine"
	case "reports":
		return false
	case "server", "server/tokenizer":
		return to == "native" || to == "native/bundle" || to == "server/tokenizer" || to == "server/record" || to == "server/openengine"
	case "server/openengine": // generated OpenEngine v1 bindings: a leaf library
		return false
	case "server/record", "server/envconfig":
		return false
	case "native":
		return to == "native/bundle"
	case "native/bundle":
		return false
	case "fixtures":
		return to == "native/bundle" || to == "server/tokenizer"
	case "lab": // experiments and device drivers drive the product; nothing imports lab
		// (TestLabStaysOutOfTheProduct), and lab imports no family
		return to != "families"
	case "":
		return true
	}
	return false
}

func TestImportDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		imports := append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...)
		for _, imp := range imports {
			if !strings.HasPrefix(imp, module+"/") && imp != module {
				continue
			}
			if to := area(imp); !allowed(p.ImportPath, to) {
				t.Errorf("%s imports %s: %s → %s goes against DESIGN.md's direction (families → qual → reports; qual → native/bundle, server/tokenizer; server → native; nothing imports families)",
					p.ImportPath, imp, area(p.ImportPath), to)
			}
		}
	}
}

// TestImportDirectionRules checks the rule table itself, so a loosened rule is caught.
func TestImportDirectionRules(t *testing.T) {
	bad := [][2]string{
		{module + "/qual/launch", "families"},
		{module + "/reports", "qual"},
		{module + "/qual/spec", "server"},
		{module + "/qual/spec", "native"},
		{module + "/server", "qual"},
		{module + "/native", "server"},
		{module + "/native/bundle", "native"},
		{module + "/server/record", "server"},
		{module + "/server/openengine/v1", "server"},
		{module + "/server/envconfig", "native"},
	}
	for _, b := range bad {
		if allowed(b[0], b[1]) {
			t.Errorf("rule table allows %s → %s, which DESIGN.md forbids", b[0], b[1])
		}
	}
	good := [][2]string{
		{module + "/families/qwen", "qual"},
		{module + "/qual/spec", "reports"},
		{module + "/qual/load", "server/tokenizer"},
		{module + "/server", "native"},
		{module + "/qual/cmd/qual", "native"},
		{module + "/qual/records", "server/record"},
		{module + "/qual/load", "server/openengine"},
		{module + "/qual/spec", "server/envconfig"},
		{module + "/fixtures", "server/envconfig"},
		{module + "/native", "server/envconfig"},
	}
	for _, g := range good {
		if !allowed(g[0], g[1]) {
			t.Errorf("rule table forbids %s → %s, which DESIGN.md allows", g[0], g[1])
		}
	}
}

// TestLabStaysOutOfTheProduct: lab/ holds experiments and their journal; no product source, build
// file or CI script may build, include or run anything from it (DESIGN.md's layout), so a
// product build never depends on an experiment.
func TestLabStaysOutOfTheProduct(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "lab/") || strings.HasSuffix(f, ".md") || f == "design_test.go" {
			continue
		}
		if !(strings.HasSuffix(f, ".go") || strings.HasSuffix(f, ".cc") || strings.HasSuffix(f, ".h") ||
			strings.HasSuffix(f, ".cu") || strings.HasSuffix(f, ".cuh") || strings.HasSuffix(f, ".sh") ||
			strings.HasSuffix(f, ".txt") || f == "Makefile" || strings.HasPrefix(f, ".ci/")) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if code := strings.TrimSpace(line); strings.Contains(code, "lab/") && !isComment(code) {
				t.Errorf("%s:%d uses lab/ (%q): the product must not build or run experiments; move what it needs out of lab/", f, i+1, code)
			}
		}
	}
}

func isComment(line string) bool {
	for _, p := range []string{"//", "#", "/*", "*"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}
