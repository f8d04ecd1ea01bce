// Package provenance makes a run trustworthy after the fact: sha256 fingerprints of
// everything a run depends on (the bundle, the input files, the tokenizer files and the
// source tree, uncommitted and untracked files included) taken before and after the run, so
// that anything changed underneath a run fails it with the file named; and an environment
// record (source revision and dirty-diff hash, Go version, OS, CPU, server flags) stored
// with the results.
package provenance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Roles of fingerprinted files.
const (
	RoleBundle    = "bundle"
	RoleInput     = "input"
	RoleTokenizer = "tokenizer"
	RoleSource    = "source"
)

// File is one fingerprinted file. Besides the content's sha256 it keeps the file's identity
// (inode, device) and its modification and change times: a file changed and changed back
// during a run (A to B to A) has its first content again but not its change time, and a file
// replaced by a copy has another inode, so the run that served B is still caught.
type File struct {
	Path    string `json:"path"`
	Role    string `json:"role"`
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
	MtimeNs int64  `json:"mtime_ns,omitempty"`
	CtimeNs int64  `json:"ctime_ns,omitempty"` // inode change time: set by the kernel on every write, rename or chmod; no user call sets it back
	Inode   uint64 `json:"inode,omitempty"`
	Dev     uint64 `json:"dev,omitempty"`
}

// sameIdentity reports whether two fingerprints of one path saw the same file, unchanged.
func (f File) sameIdentity(g File) bool {
	return f.Size == g.Size && f.MtimeNs == g.MtimeNs && f.CtimeNs == g.CtimeNs && f.Inode == g.Inode && f.Dev == g.Dev
}

// identityChange says how g's identity differs from f's, for the error message.
func (f File) identityChange(g File) string {
	var parts []string
	if f.Inode != g.Inode || f.Dev != g.Dev {
		parts = append(parts, fmt.Sprintf("inode %d -> %d (replaced)", f.Inode, g.Inode))
	}
	if f.Size != g.Size {
		parts = append(parts, fmt.Sprintf("size %d -> %d", f.Size, g.Size))
	}
	if f.MtimeNs != g.MtimeNs {
		parts = append(parts, "mtime changed")
	}
	if f.CtimeNs != g.CtimeNs {
		parts = append(parts, "ctime changed")
	}
	return strings.Join(parts, ", ")
}

// Fingerprints is a set of file fingerprints, sorted by path.
type Fingerprints struct {
	Files []File `json:"files"`
}

// Spec says what to fingerprint. Empty fields are skipped.
type Spec struct {
	// Bundle is the .mqb file served.
	Bundle string
	// Inputs are input files (corpus JSONL, prompt files).
	Inputs []string
	// TokenizerDir is a tokenizer folder; every regular file in it is fingerprinted.
	TokenizerDir string
	// SourceRoot is a git work tree whose source is fingerprinted: tracked files (as they are
	// on disk, dirty ones included) and untracked files git does not ignore. Without git or
	// outside a repository every regular file under it is taken, except .git.
	SourceRoot string
	// Exclude lists paths (files or folders) left out, such as the run's own output folder
	// when it lies inside the source tree.
	Exclude []string
}

// Take fingerprints everything spec names.
func Take(ctx context.Context, spec Spec) (*Fingerprints, error) {
	type item struct{ path, role string }
	var items []item
	if spec.Bundle != "" {
		items = append(items, item{spec.Bundle, RoleBundle})
	}
	for _, in := range spec.Inputs {
		if in != "" {
			items = append(items, item{in, RoleInput})
		}
	}
	if spec.TokenizerDir != "" {
		ents, err := os.ReadDir(spec.TokenizerDir)
		if err != nil {
			return nil, fmt.Errorf("fingerprint tokenizer folder: %w", err)
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				items = append(items, item{filepath.Join(spec.TokenizerDir, e.Name()), RoleTokenizer})
			}
		}
	}
	excl := make([]string, 0, len(spec.Exclude))
	for _, e := range spec.Exclude {
		if a, err := filepath.Abs(e); err == nil {
			excl = append(excl, a)
		}
	}
	excluded := func(p string) bool {
		a, err := filepath.Abs(p)
		if err != nil {
			return false
		}
		for _, e := range excl {
			if a == e || strings.HasPrefix(a, e+string(filepath.Separator)) {
				return true
			}
		}
		return false
	}
	if spec.SourceRoot != "" {
		files, err := SourceFiles(ctx, spec.SourceRoot)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			items = append(items, item{f, RoleSource})
		}
	}
	var kept []item
	seen := map[string]bool{}
	for _, it := range items {
		if excluded(it.path) || seen[it.path] {
			continue
		}
		seen[it.path] = true
		kept = append(kept, it)
	}
	out := make([]File, len(kept))
	errs := make([]error, len(kept))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(2, runtime.NumCPU()))
	for i, it := range kept {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f, err := fingerprintFile(it.path, it.role)
			if err != nil {
				// A tracked file deleted in the work tree is part of the state: record it.
				if errors.Is(err, fs.ErrNotExist) && it.role == RoleSource {
					out[i] = File{Path: it.path, Role: it.role, Size: -1, SHA256: "deleted"}
					return
				}
				errs[i] = fmt.Errorf("fingerprint %s file %s: %w", it.role, it.path, err)
				return
			}
			out[i] = f
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return &Fingerprints{Files: out}, nil
}

// fingerprintFile hashes path and keeps its identity. The identity is read before and after
// hashing; a file that changed meanwhile is hashed again (a few times at most), so the sum and
// the identity describe the same content.
func fingerprintFile(path, role string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	for attempt := 0; ; attempt++ {
		before, err := statIdentity(f, path, role)
		if err != nil {
			return File{}, err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return File{}, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return File{}, err
		}
		after, err := statIdentity(f, path, role)
		if err != nil {
			return File{}, err
		}
		if before.sameIdentity(after) && n == after.Size || attempt == 3 {
			after.SHA256 = hex.EncodeToString(h.Sum(nil))
			after.Size = n
			return after, nil
		}
	}
}

// statIdentity is an open file's identity, without its sha256.
func statIdentity(f *os.File, path, role string) (File, error) {
	st, err := f.Stat()
	if err != nil {
		return File{}, err
	}
	if !st.Mode().IsRegular() {
		return File{}, fmt.Errorf("not a regular file (%v)", st.Mode())
	}
	out := File{Path: path, Role: role, Size: st.Size(), MtimeNs: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		out.Inode, out.Dev = sys.Ino, uint64(sys.Dev)
		out.CtimeNs = sys.Ctim.Sec*1e9 + sys.Ctim.Nsec
	}
	return out, nil
}

// statPath is statIdentity by path (the Watcher's cheap pass).
func statPath(path, role string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	return statIdentity(f, path, role)
}

// SourceFiles lists the source files of a work tree: `git ls-files --cached --others
// --exclude-standard` (tracked plus untracked-but-not-ignored), as absolute paths. Outside a
// git repository it walks the folder, skipping .git.
func SourceFiles(ctx context.Context, root string) ([]string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("source tree %s: %w", root, err)
	}
	cmd := exec.CommandContext(ctx, "git", "-C", abs, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	out, gitErr := cmd.Output()
	if gitErr == nil {
		var files []string
		for _, p := range bytes.Split(out, []byte{0}) {
			if len(p) == 0 {
				continue
			}
			full := filepath.Join(abs, string(p))
			// Submodules and symlinks to folders are not files; skip what is a folder.
			if st, err := os.Lstat(full); err == nil && !st.Mode().IsRegular() {
				continue
			}
			files = append(files, full)
		}
		return dedupe(files), nil
	}
	var files []string
	err = filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("source tree %s: not a git work tree (%v) and walking it failed: %w", abs, gitErr, err)
	}
	return files, nil
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// ChangedError is returned by Compare; it names every changed, added or removed file.
type ChangedError struct {
	Changes []Change
}

// Change is one difference between two fingerprint sets.
type Change struct {
	Path   string `json:"path"`
	Role   string `json:"role"`
	Kind   string `json:"kind"` // "modified", "added", "removed"
	Before string `json:"before,omitempty"`
	After  string `json:"after,omitempty"`
	// Detail says what else changed: the identity (inode, size, mtime, ctime) of a
	// "rewritten" file, or when a Watcher saw a change during the run.
	Detail string `json:"detail,omitempty"`
}

func (e *ChangedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d fingerprinted file(s) changed during the run, so its results cannot be trusted (raw records were kept): ", len(e.Changes))
	for i, c := range e.Changes {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(e.Changes)-10)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		switch c.Kind {
		case "modified":
			fmt.Fprintf(&b, "%s file %s modified (sha256 %.12s -> %.12s)", c.Role, c.Path, c.Before, c.After)
		case "rewritten":
			fmt.Fprintf(&b, "%s file %s rewritten with its first content (%s); it may have held other content meanwhile", c.Role, c.Path, c.Detail)
		case "changed during the run":
			fmt.Fprintf(&b, "%s file %s changed during the run (%s)", c.Role, c.Path, c.Detail)
		default:
			fmt.Fprintf(&b, "%s file %s %s", c.Role, c.Path, c.Kind)
		}
	}
	b.WriteString("; rerun with nothing editing these files")
	return b.String()
}

// Compare returns a *ChangedError naming every difference between before and after, or nil.
func Compare(before, after *Fingerprints) error {
	if before == nil || after == nil {
		return errors.New("provenance.Compare: missing fingerprint set")
	}
	a := map[string]File{}
	for _, f := range after.Files {
		a[f.Path] = f
	}
	var ch []Change
	b := map[string]bool{}
	for _, f := range before.Files {
		b[f.Path] = true
		g, ok := a[f.Path]
		switch {
		case !ok:
			ch = append(ch, Change{Path: f.Path, Role: f.Role, Kind: "removed", Before: f.SHA256})
		case g.SHA256 != f.SHA256:
			kind := "modified"
			if g.SHA256 == "deleted" {
				kind = "removed"
			}
			ch = append(ch, Change{Path: f.Path, Role: f.Role, Kind: kind, Before: f.SHA256, After: g.SHA256})
		case f.SHA256 != "deleted" && !f.sameIdentity(g):
			// Same content, another write: changed and changed back, or replaced by a copy.
			ch = append(ch, Change{Path: f.Path, Role: f.Role, Kind: "rewritten", Before: f.SHA256, After: g.SHA256, Detail: f.identityChange(g)})
		}
	}
	for _, f := range after.Files {
		if !b[f.Path] {
			ch = append(ch, Change{Path: f.Path, Role: f.Role, Kind: "added", After: f.SHA256})
		}
	}
	if len(ch) == 0 {
		return nil
	}
	return &ChangedError{Changes: ch}
}

// Environment is where and from what a run was made.
type Environment struct {
	SourceRevision string `json:"source_revision"` // git HEAD, or "unknown"
	Dirty          bool   `json:"dirty"`
	// DirtyDiffSHA256 hashes `git diff HEAD` plus the names and contents of untracked files,
	// so two runs from the same dirty tree can be told apart from runs from another.
	DirtyDiffSHA256 string   `json:"dirty_diff_sha256,omitempty"`
	GoVersion       string   `json:"go_version"`
	OS              string   `json:"os"`
	Arch            string   `json:"arch"`
	Kernel          string   `json:"kernel,omitempty"`
	CPUModel        string   `json:"cpu_model"`
	NumCPU          int      `json:"num_cpu"`
	Hostname        string   `json:"hostname,omitempty"`
	ServerArgs      []string `json:"server_args,omitempty"`
	ServerEnv       []string `json:"server_env,omitempty"`
	ServerKind      string   `json:"server_kind,omitempty"`
}

// Env records the environment. root is the source tree (may be ""); serverArgs and
// serverEnv are the launcher's.
func Env(ctx context.Context, root string, serverKind string, serverArgs, serverEnv []string) Environment {
	e := Environment{
		SourceRevision: "unknown",
		GoVersion:      runtime.Version(),
		OS:             runtime.GOOS,
		Arch:           runtime.GOARCH,
		CPUModel:       cpuModel(),
		NumCPU:         runtime.NumCPU(),
		ServerArgs:     serverArgs,
		ServerEnv:      serverEnv,
		ServerKind:     serverKind,
	}
	e.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	if root == "" {
		return e
	}
	git := func(args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...).Output()
	}
	if out, err := git("rev-parse", "HEAD"); err == nil {
		e.SourceRevision = strings.TrimSpace(string(out))
	}
	diff, err1 := git("diff", "HEAD", "--binary")
	untracked, err2 := git("ls-files", "-z", "--others", "--exclude-standard")
	if err1 == nil && err2 == nil {
		h := sha256.New()
		h.Write(diff)
		names := bytes.Split(untracked, []byte{0})
		for _, n := range names {
			if len(n) == 0 {
				continue
			}
			h.Write(n)
			h.Write([]byte{0})
			if f, err := os.Open(filepath.Join(root, string(n))); err == nil {
				_, _ = io.Copy(h, f)
				f.Close()
			}
		}
		if len(diff) > 0 || len(bytes.TrimSpace(untracked)) > 0 {
			e.Dirty = true
			e.DirtyDiffSHA256 = hex.EncodeToString(h.Sum(nil))
		}
	}
	return e
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// Watcher re-takes the identity of fingerprinted files while a run goes on: a cheap stat of
// each file per pass, a hash only when the identity moved. It keeps every change it saw,
// even one undone before the run ended, so a file swapped for B while the run served it and
// swapped back is reported though the last fingerprints match the first.
type Watcher struct {
	mu      sync.Mutex
	last    map[string]File
	changes []Change
	stop    chan struct{}
	done    chan struct{}
}

// Watch starts a Watcher over base, checking every interval until Stop.
func Watch(base *Fingerprints, every time.Duration) *Watcher {
	w := &Watcher{last: map[string]File{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, f := range base.Files {
		if f.SHA256 != "deleted" {
			w.last[f.Path] = f
		}
	}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				w.Check()
			}
		}
	}()
	return w
}

// Check runs one pass now (the Watcher's goroutine runs it every interval).
func (w *Watcher) Check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for path, last := range w.last {
		cur, err := statPath(path, last.Role)
		if err != nil {
			if len(w.changes) < 1000 {
				w.changes = append(w.changes, Change{Path: path, Role: last.Role, Kind: "changed during the run", Before: last.SHA256, Detail: "unreadable: " + err.Error()})
			}
			continue
		}
		if last.sameIdentity(cur) {
			continue
		}
		full, err := fingerprintFile(path, last.Role)
		if err != nil {
			continue // changing under us; the next pass sees it
		}
		detail := last.identityChange(full)
		if full.SHA256 != last.SHA256 {
			detail = fmt.Sprintf("sha256 %.12s -> %.12s, %s", last.SHA256, full.SHA256, detail)
		}
		if len(w.changes) < 1000 {
			w.changes = append(w.changes, Change{Path: path, Role: last.Role, Kind: "changed during the run", Before: last.SHA256, After: full.SHA256, Detail: detail})
		}
		w.last[path] = full
	}
}

// Stop ends the Watcher after one last pass and returns a *ChangedError naming every change
// it saw, or nil.
func (w *Watcher) Stop() error {
	close(w.stop)
	<-w.done
	w.Check()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.changes) == 0 {
		return nil
	}
	return &ChangedError{Changes: append([]Change(nil), w.changes...)}
}
