package modelqual_test

// This test enforces the CUDA side's layout (DESIGN.md, issue 48): a family is its files in
// native/models (<f>.cc on the CPU, <f>.cu on the GPU), each registering itself; the CUDA core
// (native/cuda) and the shared native files (native/*.cc, native/include) name no family, no
// product CUDA file grows past maxCUDALines, and the lab's debug entry points stay in lab/.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// maxCUDALines is the most lines a product CUDA file may have: past it, split it by op or stage.
const maxCUDALines = 1200

var (
	cpuRegistration  = regexp.MustCompile(`MQ_REGISTER_FAMILY\(\s*Family\{\s*"([^"]+)"`)
	cudaRegistration = regexp.MustCompile(`CudaFamily\s+\w+\{\s*"([^"]+)"\s*\}`)
	blockComment     = regexp.MustCompile(`(?s)/\*.*?\*/`)
	lineComment      = regexp.MustCompile(`//[^\n]*|(?m)^\s*#[^\n]*`)
)

// registeredFamilies reads the family names from the registration lines of native/models: the
// CPU side's MQ_REGISTER_FAMILY(Family{"name", ...}) and the CUDA side's CudaFamily f{"name"}
// (inside MQB_REGISTER_FAMILY).
func registeredFamilies(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, pattern := range []string{"*.cc", "*.cu"} {
		files, err := filepath.Glob(filepath.Join(root, "native", "models", pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			re := cpuRegistration
			if strings.HasSuffix(f, ".cu") {
				if !strings.Contains(string(b), "MQB_REGISTER_FAMILY") {
					continue
				}
				re = cudaRegistration
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				seen[m[1]] = true
			}
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// codeOf is src without its comments and preprocessor lines' text (a file may say in prose
// which family uses an op; it may not name one in code: a string, an identifier, an include).
func codeOf(src string) string {
	return lineComment.ReplaceAllString(blockComment.ReplaceAllString(src, " "), " ")
}

// coreFiles lists the files that must not name a family: native/cuda/** (but its emulation
// test, host_test, which runs the families' models on the CPU, and the stub headers), and the
// shared native files native/*.cc and native/include/*.
func coreFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "native", "cuda"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "host_test" || d.Name() == "stub" || d.Name() == "build" {
				return filepath.SkipDir
			}
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, pattern := range []string{"native/*.cc", "native/include/*"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

// familyNamed returns the first family in names that code names: as a whole word (an
// identifier, any case, so an enum GPT2 counts) or as a string ("qwen3", "qwen3.drop_q_norm").
func familyNamed(code string, names []string) (string, string) {
	for _, n := range names {
		re := regexp.MustCompile(`(?i)\b` + regexp.QuoteMeta(n) + `\b`)
		if loc := re.FindStringIndex(code); loc != nil {
			lo, hi := max(0, loc[0]-30), min(len(code), loc[1]+30)
			return n, strings.Join(strings.Fields(code[lo:hi]), " ")
		}
	}
	return "", ""
}

func TestDesignCUDACoreNamesNoFamily(t *testing.T) {
	checkCoreNamesNoFamily(t, ".")
}

func checkCoreNamesNoFamily(t *testing.T, root string) {
	names := registeredFamilies(t, root)
	if len(names) < 2 {
		t.Fatalf("found %d registered families (%v) in native/models: the registration lines changed shape; update cpuRegistration/cudaRegistration", len(names), names)
	}
	for _, f := range coreFiles(t, root) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n, at := familyNamed(codeOf(string(b)), names); n != "" {
			rel, _ := filepath.Rel(root, f)
			t.Errorf("%s names family %q (%q): a family's code and names belong in native/models/%s.cc or .cu, registered and reached through hooks", rel, n, at, n)
		}
	}
}

// productCUDAFiles: the .cu, .cuh, .cc and .h files under native/cuda and the .cu/.cuh files of
// native/models (the stub headers and build output aside).
func productCUDAFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "native"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "stub" || d.Name() == "build" {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(p)
		inCUDA := strings.Contains(filepath.ToSlash(p), "native/cuda/")
		if ext == ".cu" || ext == ".cuh" || (inCUDA && (ext == ".cc" || ext == ".h")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestDesignCUDAFileSize(t *testing.T) {
	files := productCUDAFiles(t, ".")
	if len(files) < 10 {
		t.Fatalf("found %d product CUDA files under native/: the walk is wrong", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > maxCUDALines {
			t.Errorf("%s has %d lines, more than %d: split it (ops one per file under native/cuda/ops, a family's model in native/models)", f, n, maxCUDALines)
		}
	}
}

// TestDesignCUDANoDebugEntryPoints: the lab's entry points (lab/cuda/debug_abi.cu) are compiled
// only into the lab's builds; the product tree (everything but lab/) never mentions them.
func TestDesignCUDANoDebugEntryPoints(t *testing.T) {
	checkNoDebugEntryPoints(t, ".")
}

func checkNoDebugEntryPoints(t *testing.T, root string) {
	const needle = "mqb_debug_" + "set" // spelled apart so that this file does not match itself
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == "lab" || rel == ".git" || rel == ".cache" || rel == "bin" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 4<<20 {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), needle) {
			t.Errorf("%s mentions %s: the debug entry points belong to the lab (its debug_abi.cu), compiled only into the lab's builds", rel, needle)
		}
		return nil
	})
	if err != nil {
		t.Fatal(fmt.Errorf("walking the tree: %w", err))
	}
}
