package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewFamilyCompiles scaffolds a family into a folder the ./... patterns ignore (a leading
// '_'), so concurrent `ginkgo -r ./families/...` runs never see it, and checks that it
// compiles and vets clean, that its reference stub says what to do, and that a second
// scaffold of the same name is refused.
func TestNewFamilyCompiles(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(root, "families", fmt.Sprintf("_newfamily_test_%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "zzscaffold")
	if rc := runNewFamily([]string{"zzscaffold", "--owner", "alice", "--dir", dir}); rc != 0 {
		t.Fatalf("new-family exit %d", rc)
	}
	for _, f := range []string{"doc.go", "suite_test.go", "gates_test.go", "reference/reference.go", "manifest.yaml.example", "thresholds.yaml.example", "corpus.jsonl"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("scaffold lacks %s: %v", f, err)
		}
	}
	gates, _ := os.ReadFile(filepath.Join(dir, "gates_test.go"))
	if !strings.Contains(string(gates), `spec.Owner("alice")`) || !strings.Contains(string(gates), "PIt(") {
		t.Errorf("gates_test.go lacks the owner label or pending specs:\n%s", gates)
	}
	rel, _ := filepath.Rel(root, dir)
	cmd := exec.Command("go", "vet", "./"+filepath.ToSlash(rel)+"/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go vet of the scaffold: %v\n%s", err, out)
	}
	if rc := runNewFamily([]string{"zzscaffold", "--dir", dir}); rc == 0 {
		t.Error("scaffolding over an existing folder succeeded; want a refusal")
	}
	if rc := runNewFamily([]string{"Bad-Name", "--dir", filepath.Join(base, "bad")}); rc != 2 {
		t.Errorf("invalid name: exit %d, want 2", rc)
	}
}
