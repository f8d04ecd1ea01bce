package modelqual_test

// The environment is read in one place: every variable of ours is declared in server/envconfig
// with its default and description (as Ollama's envconfig), and product code reads it through
// that package, so a reader finds every knob in one list. This test fails on a direct
// os.Getenv or os.LookupEnv of a declared variable, naming file:line.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/server/envconfig"
)

// envReadAreas are the folders (relative to the repository root) whose Go files must read our
// variables through envconfig: the whole product. Test files, lab/ (experiments, not the
// product) and server/envconfig itself are never checked.
var envReadAreas = []string{"."}

func TestEnvironmentIsReadThroughEnvconfig(t *testing.T) {
	declared := map[string]bool{}
	for _, v := range envconfig.All() {
		declared[v.Name] = true
	}
	checked := 0
	for _, area := range envReadAreas {
		err := filepath.WalkDir(area, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path == "lab" || path == filepath.Join("server", "envconfig") || (path != "." && strings.HasPrefix(d.Name(), ".")) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			for _, r := range directEnvReads(t, path, src, declared) {
				t.Errorf("%s: %s(%s): read our variables through server/envconfig (its Var's Get, Lookup or Bool), declaring a new one there", r.pos, r.call, r.name)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", area, err)
		}
	}
	if checked == 0 {
		t.Fatalf("no Go file found under %v: run the test from the repository root", envReadAreas)
	}
}

// TestDirectEnvReadsFindsThem checks the checker itself on a file that reads the environment
// in each way it must catch, and in ways it must let pass.
func TestDirectEnvReadsFindsThem(t *testing.T) {
	src := `package p

import "os"

const cacheVar = "MODELQUAL_CACHE"

func f() {
	_ = os.Getenv("MODELQUAL_FAULTS")
	_, _ = os.LookupEnv(cacheVar)
	_ = os.Getenv("HOME")
	_ = os.Getenv(name())
}

func name() string { return "X" }
`
	declared := map[string]bool{"MODELQUAL_FAULTS": true, "MODELQUAL_CACHE": true}
	got := directEnvReads(t, "p.go", []byte(src), declared)
	var names []string
	for _, r := range got {
		names = append(names, r.pos+" "+r.call+" "+r.name)
	}
	want := []string{"p.go:8 os.Getenv MODELQUAL_FAULTS", "p.go:9 os.LookupEnv MODELQUAL_CACHE", "p.go:11 os.Getenv name()"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("directEnvReads found %q, want %q", names, want)
	}
}

type envRead struct{ pos, call, name string }

// directEnvReads finds the os.Getenv and os.LookupEnv calls of one file whose argument is a
// declared variable, as a string literal or a constant of the file.
func directEnvReads(t *testing.T, path string, src []byte, declared map[string]bool) []envRead {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	osName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"os"` {
			osName = "os"
			if imp.Name != nil {
				osName = imp.Name.Name
			}
		}
	}
	if osName == "" || osName == "_" {
		return nil
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						consts[n.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
	}
	var out []envRead
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 1 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != osName {
			return true
		}
		// An argument the checker cannot evaluate (a call, a variable, a constant of another
		// file) is reported too: it may name one of ours, and envconfig reads it better anyway.
		name, evaluated := exprText(call.Args[0]), false
		switch a := call.Args[0].(type) {
		case *ast.BasicLit:
			name, _ = strconv.Unquote(a.Value)
			evaluated = true
		case *ast.Ident:
			if v, ok := consts[a.Name]; ok {
				name, evaluated = v, true
			}
		}
		if evaluated && !declared[name] {
			return true
		}
		p := fset.Position(call.Pos())
		out = append(out, envRead{pos: p.Filename + ":" + strconv.Itoa(p.Line), call: "os." + sel.Sel.Name, name: name})
		return true
	})
	return out
}

// exprText renders an argument the checker cannot evaluate, for the error message.
func exprText(e ast.Expr) string {
	switch a := e.(type) {
	case *ast.CallExpr:
		return exprText(a.Fun) + "()"
	case *ast.Ident:
		return a.Name
	case *ast.SelectorExpr:
		return exprText(a.X) + "." + a.Sel.Name
	}
	return "an expression"
}
