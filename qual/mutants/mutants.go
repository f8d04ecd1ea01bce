// Package mutants is the planted-defect campaign: a catalog of defects a reviewer could plant
// in modelqual's own source (a wrong RoPE base, EOS ignored, a stop string missed across
// tokens, nearest-rank percentiles, ...), each applied alone to a scratch copy of the
// repository, whose premerge gate then runs. A gate is worth its cost only if it fails on
// such defects; the campaign shows which spec catches each one and which defects no gate
// sees (`qual mutants`, `make mutants`).
//
// A defect is a source edit (an exact text replaced once in one file), so what is tested is
// what a reviewer would miss in a diff, or one of the planted faults the runtime and the server
// define (MODELQUAL_FAULTS), each declared by the family whose gate must catch it.
package mutants

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Mutant is one planted defect.
type Mutant struct {
	// Name says what the defect is, e.g. "qwen3 rope_theta ×10".
	Name string
	// Family is the family suite whose premerge gate must catch it.
	Family string
	// File is the edited file (for a Fault: the file that reads it), relative to the
	// repository root.
	File string
	// Old is text that occurs exactly once in File; New replaces it.
	Old, New string
	// Fault, instead of Old and New, plants the defect through MODELQUAL_FAULTS: the name of a
	// fault switch (family.fault_name; engine.* and server.* for the shared engine and server).
	Fault string
	// Gates narrows the premerge gate run for this defect to the gates that concern it (a
	// label expression such as "parity" or "load"), so a campaign of 25 defects fits in an
	// hour on two cores; empty runs the whole premerge gate. Options.Full ignores it.
	Gates string
	// Packages are the packages of `make test` whose unit tests concern the defect (e.g.
	// "./reports"), run in the scratch copy before the family gate; a failing test there
	// catches it as a failing spec does. A defect in the harness's own numbers is often seen
	// first, or only, by them.
	Packages []string
	// Tests, when set, narrows the packages' tests to those matching it (go test -run), so a
	// campaign on two cores runs the tests that concern the defect, not a whole package.
	Tests string
}

// where names the planted file, and the fault for a Fault entry, for the campaign's output.
func (m Mutant) where() string {
	if m.Fault != "" {
		return m.File + " (MODELQUAL_FAULTS=" + m.Fault + ")"
	}
	return m.File
}

// Apply plants m in the repository copy at root. It fails when Old does not occur exactly
// once: the catalog entry went stale with the source and must be updated. A Fault entry edits
// nothing (the campaign sets MODELQUAL_FAULTS); Apply checks that File still reads the fault.
func Apply(root string, m Mutant) error {
	path := filepath.Join(root, filepath.FromSlash(m.File))
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("mutant %q: %w", m.Name, err)
	}
	if m.Fault != "" {
		return checkFault(m, b)
	}
	if n := bytes.Count(b, []byte(m.Old)); n != 1 {
		return fmt.Errorf("mutant %q: the text to replace occurs %d times in %s, want exactly once: update the catalog entry (qual/mutants/catalog.go) to the current source", m.Name, n, m.File)
	}
	if m.Old == m.New {
		return fmt.Errorf("mutant %q: New equals Old; the entry plants nothing", m.Name)
	}
	return os.WriteFile(path, bytes.Replace(b, []byte(m.Old), []byte(m.New), 1), 0o644)
}

// checkFault checks that a Fault entry is well formed and that its file (src) reads the fault:
// by its whole name, or, where the name is composed at run time (the shared Qwen3 decoder's
// <prefix>.drop_q_norm), by its last part.
func checkFault(m Mutant, src []byte) error {
	if m.Old != "" || m.New != "" {
		return fmt.Errorf("mutant %q: give either Fault or Old and New, not both", m.Name)
	}
	if !faultName.MatchString(m.Fault) {
		return fmt.Errorf("mutant %q: fault %q is not a name like family.fault_name", m.Name, m.Fault)
	}
	last := m.Fault[strings.LastIndex(m.Fault, "."):]
	if !bytes.Contains(src, []byte(`"`+m.Fault+`"`)) && !bytes.Contains(src, []byte(`"`+last+`"`)) {
		return fmt.Errorf("mutant %q: %s does not read fault %s: update the catalog entry (qual/mutants/catalog_%s.go) to the current source", m.Name, m.File, m.Fault, m.Family)
	}
	return nil
}

// faultName is what a planted fault's name looks like: family.fault_name (a family's prefix
// may have more parts, e.g. zimage.text_encoder.drop_q_norm).
var faultName = regexp.MustCompile(`^[a-z][a-z0-9]*(\.[a-z][a-z0-9_]*)+$`)

// CopyTree copies the files git tracks in the repository at src (their working-tree
// content, so uncommitted edits are included) to dst, and commits them there in a fresh git
// repository, so the copy builds and fingerprints like a checkout and a planted defect shows
// as a dirty file.
func CopyTree(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "git", "-C", src, "ls-files", "-z", "--cached").Output()
	if err != nil {
		return fmt.Errorf("mutants: git ls-files in %s: %w", src, err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if rel == "" {
			continue
		}
		if err := copyFile(filepath.Join(src, rel), filepath.Join(dst, rel)); err != nil {
			return fmt.Errorf("mutants: copy %s: %w", rel, err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"},
		{"-c", "user.name=mutants", "-c", "user.email=mutants@localhost", "commit", "-q", "--no-verify", "-m", "scratch copy"}} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dst
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("mutants: git %s in %s: %w\n%s", args[0], dst, err, b)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil // deleted in the working tree but still tracked
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Options configure a campaign.
type Options struct {
	// Root is the repository whose tracked files are copied.
	Root string
	// Work holds the scratch copies and the campaign's fixture and bundle cache.
	Work string
	// Match selects mutants by name (a regular expression; empty: all).
	Match string
	// Family selects the mutants of one family (empty: all).
	Family string
	// LabelFilter is the gate run on each copy (default "premerge && !container").
	LabelFilter string
	// Timeout bounds one mutant's gate run (default 20 minutes).
	Timeout time.Duration
	// Keep leaves the scratch copies in place (to rerun a gate by hand).
	Keep bool
	// Full runs the whole premerge gate for every defect, ignoring Mutant.Gates.
	Full bool
	// FirstCatch skips the family gate of a defect its packages' tests already caught (a
	// cheaper campaign that still shows every defect caught).
	FirstCatch bool
	// Log receives progress and each gate's output tail on a miss.
	Log io.Writer
}

// Result is what happened to one mutant.
type Result struct {
	Mutant Mutant
	// Caught: the gate failed with the defect planted.
	Caught bool
	// By lists the failed specs (or the suite setup) that caught it.
	By []string
	// Problem is set when the mutant could not be tried (it did not apply or build).
	Problem  string
	Duration time.Duration
}

// Run plants each selected mutant alone in a fresh copy of opt.Root and runs the premerge
// gate of its family there: `go test ./families/<f>` with the label filter, the planted-defect
// proofs ("gates bite") skipped since they plant defects of their own, binaries and bundles
// built from the copy, and a Ginkgo JSON report telling which specs failed.
func Run(ctx context.Context, catalog []Mutant, opt Options) ([]Result, error) {
	if opt.Root == "" || opt.Work == "" {
		return nil, errors.New("mutants.Run: Options.Root and Options.Work are required")
	}
	if opt.LabelFilter == "" {
		opt.LabelFilter = "premerge && !container"
	}
	if opt.Timeout == 0 {
		opt.Timeout = 20 * time.Minute
	}
	if opt.Log == nil {
		opt.Log = io.Discard
	}
	var match *regexp.Regexp
	if opt.Match != "" {
		var err error
		if match, err = regexp.Compile(opt.Match); err != nil {
			return nil, fmt.Errorf("mutants.Run: Options.Match: %w", err)
		}
	}
	if err := os.MkdirAll(opt.Work, 0o755); err != nil {
		return nil, err
	}
	var out []Result
	for i, m := range catalog {
		if match != nil && !match.MatchString(m.Name) || opt.Family != "" && m.Family != opt.Family {
			continue
		}
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		start := time.Now()
		r := runOne(ctx, m, opt)
		r.Duration = time.Since(start)
		status := "MISSED"
		switch {
		case r.Problem != "":
			status = "NOT TRIED: " + r.Problem
		case r.Caught:
			status = "caught by " + strings.Join(r.By, "; ")
		}
		fmt.Fprintf(opt.Log, "mutants: [%d/%d] %s (%s, %.0fs): %s\n", i+1, len(catalog), m.Name, m.where(), r.Duration.Seconds(), status)
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, m Mutant, opt Options) Result {
	r := Result{Mutant: m}
	// Every mutant is tried in the same folder: cgo bakes the package folder into its
	// compile flags, so a copy at a new path would rebuild the C++ runtime even when the
	// defect is elsewhere.
	dir := filepath.Join(opt.Work, "copy")
	_ = os.RemoveAll(dir)
	if !opt.Keep {
		defer os.RemoveAll(dir)
	}
	if err := CopyTree(ctx, opt.Root, dir); err != nil {
		r.Problem = err.Error()
		return r
	}
	if err := Apply(dir, m); err != nil {
		r.Problem = err.Error()
		return r
	}
	cctx, cancel := context.WithTimeout(ctx, opt.Timeout)
	defer cancel()
	env := append(os.Environ(), "GOFLAGS=-trimpath", "MODELQUAL_CACHE="+filepath.Join(opt.Work, "cache"),
		"MODELQUAL_BIN="+filepath.Join(dir, "bin"), "MODELQUAL_ARTIFACTS="+filepath.Join(dir, "artifacts"), "MODELQUAL_FAULTS="+m.Fault)
	if len(m.Packages) > 0 {
		failed, problem := runPackages(cctx, dir, env, m.Packages, m.Tests, opt.Timeout)
		if problem != "" {
			r.Problem = problem
			return r
		}
		if len(failed) > 0 {
			r.Caught, r.By = true, failed
			if opt.FirstCatch {
				return r
			}
		}
	}
	report := filepath.Join(dir, "mutant-report.json")
	filter := opt.LabelFilter
	if m.Gates != "" && !opt.Full {
		filter = "(" + filter + ") && (" + m.Gates + ")"
	}
	cmd := exec.CommandContext(cctx, "go", "test", "-count=1", "-timeout", opt.Timeout.String(), "./families/"+m.Family,
		"-ginkgo.label-filter="+filter, "-ginkgo.skip=gates bite", "-ginkgo.json-report="+report)
	cmd.Dir = dir
	// -trimpath keeps build cache keys free of the copy's folder, so only what the mutant
	// changed is rebuilt; the fixture and bundle cache is the campaign's own.
	cmd.Env = env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	runErr := cmd.Run()
	failed, err := failedSpecs(report)
	switch {
	case err != nil && runErr != nil:
		// No report: the test binary did not build or run.
		r.Problem = fmt.Sprintf("the gate did not run (%v): %s", runErr, tail(buf.String(), 12))
	case err != nil:
		r.Problem = err.Error()
	case len(failed) > 0:
		r.Caught, r.By = true, append(r.By, failed...)
	case runErr != nil:
		r.Problem = fmt.Sprintf("go test failed (%v) but no spec failed: %s", runErr, tail(buf.String(), 12))
	case !r.Caught:
		fmt.Fprintf(opt.Log, "mutants: %s was not caught; the gate's output ends:\n%s\n", m.Name, tail(buf.String(), 8))
	}
	if r.Caught {
		r.Problem = "" // a gate that did not run cleanly does not undo a package's catch
	}
	return r
}

// runPackages runs the unit tests of pkgs in the copy at dir and names the failed tests
// ("pkg: TestName"); problem is set when a package did not build (the defect is then not
// tried: a planted defect must compile).
func runPackages(ctx context.Context, dir string, env, pkgs []string, run string, timeout time.Duration) (failed []string, problem string) {
	args := []string{"test", "-count=1", "-json", "-timeout", timeout.String()}
	if run != "" {
		args = append(args, "-run", run)
	}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	seen := map[string]bool{}
	pkgFailed := map[string]bool{}
	buildFailed := false
	dec := json.NewDecoder(&out)
	for {
		var ev struct {
			Action, Package, Test, Output string
		}
		if err := dec.Decode(&ev); err != nil {
			break
		}
		pkg := strings.TrimPrefix(ev.Package, "github.com/modelqual/modelqual/")
		switch {
		case ev.Action == "fail" && ev.Test != "" && !strings.Contains(ev.Test, "/"):
			if name := pkg + ": " + ev.Test; !seen[name] {
				seen[name] = true
				failed = append(failed, name)
			}
		case ev.Action == "fail" && ev.Test == "":
			pkgFailed[pkg] = true
		case ev.Action == "build-fail", ev.Action == "output" && strings.Contains(ev.Output, "[build failed]"):
			buildFailed = true
		}
	}
	for pkg := range pkgFailed { // failed outside any test (TestMain, a panic, a timeout)
		named := false
		for _, f := range failed {
			named = named || strings.HasPrefix(f, pkg+": ")
		}
		if !named {
			failed = append(failed, pkg+": (the package's test binary)")
		}
	}
	sort.Strings(failed)
	switch {
	case buildFailed || runErr != nil && len(failed) == 0 && errb.Len() > 0:
		return failed, fmt.Sprintf("go test %s did not build or run (%v): %s", strings.Join(pkgs, " "), runErr, tail(errb.String()+out.String(), 12))
	}
	return failed, ""
}

// failedSpecs reads a Ginkgo JSON report and names each failed node: "gate: spec text".
func failedSpecs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the gate's report: %w", err)
	}
	var reports []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
		}
	}
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, fmt.Errorf("decode the gate's report %s: %w", path, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, rep := range reports {
		for _, s := range rep.SpecReports {
			switch s.State {
			case "failed", "panicked", "timedout", "aborted", "interrupted":
			default:
				continue
			}
			name := s.LeafNodeText
			if name == "" {
				name = s.LeafNodeType
			}
			if len(s.ContainerHierarchyTexts) > 0 {
				name = s.ContainerHierarchyTexts[len(s.ContainerHierarchyTexts)-1] + ": " + name
			}
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Table renders results as a Markdown table: defect, file, caught or missed, by which specs.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| # | defect | file | result | caught by |\n|---|---|---|---|---|\n")
	caught := 0
	for i, r := range rs {
		res, by := "MISSED", ""
		switch {
		case r.Problem != "":
			res, by = "not tried", strings.ReplaceAll(strings.SplitN(r.Problem, "\n", 2)[0], "|", "\\|")
		case r.Caught:
			res, by = "caught", strings.Join(r.By, "<br>")
			caught++
		}
		fmt.Fprintf(&b, "| %d | %s | `%s` | %s | %s |\n", i+1, r.Mutant.Name, r.Mutant.where(), res, by)
	}
	fmt.Fprintf(&b, "\n%d of %d defects caught.\n", caught, len(rs))
	return b.String()
}
