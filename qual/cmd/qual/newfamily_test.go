package main

import (
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNewFamilyCompiles scaffolds a family into a folder the ./... patterns ignore (a leading
// '_'), so concurrent `ginkgo -r ./families/...` runs never see it, and checks that it
// compiles and vets clean, that its reference stub says what to do, and that a second
// scaffold of the same name is refused.
func TestNewFamilyCompiles(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(root, "families", fmt.Sprintf("_newfamily_test_%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "zzscaffold")
	// An existing runtime family: the scaffold reuses its native file and writes none.
	if rc := runNewFamily([]string{"zzscaffold", "--owner", "alice", "--dir", dir, "--native-family", "qwen3"}); rc != 0 {
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
	if rc := runNewFamily([]string{"zzscaffold", "--dir", dir, "--native-family", "qwen3"}); rc == 0 {
		t.Error("scaffolding over an existing folder succeeded; want a refusal")
	}
	if rc := runNewFamily([]string{"Bad-Name", "--dir", filepath.Join(base, "bad")}); rc != 2 {
		t.Errorf("invalid name: exit %d, want 2", rc)
	}
}

// TestNewFamilyInScratchCopy is issue 36's promise, end to end in a scratch copy of the
// checkout: `qual new-family demo` writes families/demo, native/models/demo.cc and
// native/models/demo.cu and nothing else; the tree builds and vets; the new binary's registry
// serves the demo architecture (the native file registered itself, no list edited); and the
// family's pending specs run. Issue 48's: the CUDA file compiles in the host-only build
// (check_syntax.sh, every native/models/*.cu) and registers with the CUDA library's registry
// (the CPU emulation of the library lists it and opens it up to the scaffold's own refusal).
// Then issue 40's: editing the native file or a header rebuilds what includes it.
func TestNewFamilyInScratchCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a scratch copy of the repository")
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	run := func(dir string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "MODELQUAL_BIN=", "MODELQUAL_CACHE="+filepath.Join(scratch, "cache"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The working tree (tracked and unignored files), committed, so git status shows exactly
	// what the scaffold adds.
	files := strings.Fields(run(root, "git", "ls-files", "--cached", "--others", "--exclude-standard"))
	copyDir := filepath.Join(scratch, "repo")
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue // deleted in the working tree
		}
		p := filepath.Join(copyDir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(copyDir, "git", "init", "-q")
	run(copyDir, "git", "add", "-A")
	run(copyDir, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "scratch")

	run(copyDir, "go", "run", "./qual/cmd/qual", "new-family", "demo", "--owner", "alice", "--architecture", "DemoForCausalLM")
	status := run(copyDir, "git", "status", "--porcelain", "--untracked-files=all")
	var changed []string
	for _, l := range strings.Split(strings.TrimSpace(status), "\n") {
		changed = append(changed, strings.TrimSpace(l[2:]))
	}
	for _, c := range changed {
		if !strings.HasPrefix(c, "families/demo/") && c != "native/models/demo.cc" && c != "native/models/demo.cu" {
			t.Errorf("new-family touched %s; a family is families/demo plus native/models/demo.cc and demo.cu only", c)
		}
	}
	if !slices.Contains(changed, "native/models/demo.cc") || !slices.Contains(changed, "native/models/demo.cu") {
		t.Fatalf("new-family wrote no CPU or no CUDA native file: %v", changed)
	}
	checkCUDAScaffold(t, copyDir, scratch, run)
	run(copyDir, "go", "vet", "./families/demo/...", "./native/...")
	run(copyDir, "go", "build", "-o", filepath.Join(scratch, "bin")+"/", "./qual/cmd/qual")
	fams := run(copyDir, filepath.Join(scratch, "bin", "qual"), "families", "--json")
	if !strings.Contains(fams, `"name": "demo"`) || !strings.Contains(fams, `"DemoForCausalLM"`) {
		t.Fatalf("the new binary's registry lacks the demo family:\n%s", fams)
	}
	out := run(copyDir, "go", "run", "github.com/onsi/ginkgo/v2/ginkgo", "--label-filter=demo", "./families/demo")
	if !strings.Contains(out, "Pending") {
		t.Fatalf("the demo family's specs did not run as pending:\n%s", out)
	}

	// No stale builds (issue 40): an edit to a family's .cc is compiled into the next build,
	// and an edit to a runtime header makes both cgo packages that include it stale.
	cc := filepath.Join(copyDir, "native", "models", "demo.cc")
	src, err := os.ReadFile(cc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cc, []byte(strings.ReplaceAll(string(src), "DemoForCausalLM", "DemoV2ForCausalLM")), 0o644); err != nil {
		t.Fatal(err)
	}
	run(copyDir, "go", "build", "-o", filepath.Join(scratch, "bin")+"/", "./qual/cmd/qual")
	if fams := run(copyDir, filepath.Join(scratch, "bin", "qual"), "families", "--json"); !strings.Contains(fams, `"DemoV2ForCausalLM"`) {
		t.Fatalf("an edit of native/models/demo.cc did not reach the rebuilt binary:\n%s", fams)
	}
	hdr := filepath.Join(copyDir, "native", "include", "runtime.h")
	h, _ := os.ReadFile(hdr)
	if err := os.WriteFile(hdr, append(h, []byte("// edited\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := run(copyDir, "go", "list", "-f", "{{.ImportPath}} {{.Stale}}", "./native", "./native/models")
	if strings.Count(stale, " true") != 2 {
		t.Fatalf("after a header edit the cgo packages are not stale (their objects would be reused):\n%s", stale)
	}
}

// cudaRegistryProbe lists the CUDA library's families and opens the demo family's load hook,
// compiled against the CPU emulation of the library (native/cuda/host_test/emu_cuda.h, which
// compiles the core and the existing families' .cu files) plus the scaffolded demo.cu.
const cudaRegistryProbe = `#include "native/cuda/host_test/emu_cuda.h"
#include "native/models/demo.cu"
int main() {
  for (const char *const *f = mqb_families(); *f; ++f) printf("family %s\n", *f);
  const mqcuda::CudaFamily *d = mqcuda::find_family("demo");
  if (!d || !d->load) return 2;
  mqb_model m;
  try {
    d->load(m, mqcuda::TensorMap(nullptr, 0));
  } catch (const std::exception &e) {
    printf("load: %s\n", e.what());
  }
  return 0;
}
`

// checkCUDAScaffold compile-checks the scaffolded native/models/demo.cu as make cuda would
// compile it (check_syntax.sh: g++ with the stub CUDA headers) and proves it registers.
func checkCUDAScaffold(t *testing.T, copyDir, scratch string, run func(dir, name string, args ...string) string) {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Fatalf("g++ is needed to compile-check the CUDA scaffold (cgo needs it too): %v", err)
	}
	if out := run(copyDir, "sh", "native/cuda/check_syntax.sh"); !strings.Contains(out, "syntax ok") {
		t.Fatalf("check_syntax.sh with the scaffolded demo.cu:\n%s", out)
	}
	probe := filepath.Join(scratch, "cuda_registry.cc")
	if err := os.WriteFile(probe, []byte(cudaRegistryProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(scratch, "cuda_registry")
	run(copyDir, "g++", "-std=c++20", "-O0", "-DMQB_HOST_TEST", "-Wno-unknown-pragmas", "-Wno-comment",
		"-Inative/cuda/stub", "-Inative/include", "-I.", "-x", "c++", probe, "native/cuda/blas_pick.cc", "-o", bin, "-pthread")
	out := run(copyDir, bin)
	if !strings.Contains(out, "family demo\n") || !strings.Contains(out, "family qwen3\n") {
		t.Fatalf("the CUDA library's registry lacks the demo family (or qwen3):\n%s", out)
	}
	if !strings.Contains(out, "family demo: the GPU model is not written yet (native/models/demo.cu)") {
		t.Fatalf("the demo family's CUDA load hook did not run to its own refusal:\n%s", out)
	}
}
