package modelqual_test

// The README is a user's first contact and docs/ the manual; a command they show that no longer
// parses, a link that leads nowhere or a file they name that is gone is a bug. These tests read
// README.md, docs/*.md and families/README.md and check them against what exists now:
//
//   - every command of a ```sh block: `make T` names a Makefile target, `./bin/qual SUB ...`
//     names a subcommand whose --help lists every flag passed, `./bin/qual-server` likewise, a
//     `curl` to the local server names a route qual-server's --help lists, and every repository
//     path a command names exists (or is a build output the Makefile names);
//   - every relative Markdown link and every repository path in `backticks` exists;
//   - README.md stays a front door: at most 200 lines, the two commands, the quickstart;
//   - docs/environment.md lists every variable server/envconfig declares.
//
// TestREADMEQuickstart runs the README's quickstart as a newcomer would paste it, in a scratch
// folder (other ports), and checks what it leaves behind. The other commands are run by the
// packages' own tests and by `make test` (premerge and container specs, qualify).

import (
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/server/envconfig"
)

// readmeMaxLines keeps README.md a front door; everything else belongs in docs/.
const readmeMaxLines = 200

// docPages are the pages whose commands, links and paths are checked.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docs/ holds no pages; the README links to them")
	}
	return append([]string{"README.md", "families/README.md"}, pages...)
}

func readPage(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// shellBlocks returns the bodies of a page's ```sh blocks; with section set, only those under the
// "## " heading that starts with it.
func shellBlocks(text, section string) []string {
	var blocks []string
	var cur []string
	in, inSection := false, section == ""
	for _, line := range strings.Split(text, "\n") {
		switch {
		case !in && strings.HasPrefix(line, "## ") && section != "":
			inSection = strings.HasPrefix(strings.TrimPrefix(line, "## "), section)
		case !in && strings.HasPrefix(line, "```sh"):
			in, cur = true, nil
		case in && strings.HasPrefix(line, "```"):
			in = false
			if inSection {
				blocks = append(blocks, strings.Join(cur, "\n"))
			}
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// shellWords splits a block into simple commands, each a list of words with quotes removed:
// comments dropped, `\` continuations and quotes that span lines joined, and a command
// substitution's inner command returned as a command of its own. Commands are separated by
// newlines, `;`, `&&`, `||`, `|` and `&`.
func shellWords(block string) [][]string {
	var cmds [][]string
	var stack [][]string // the enclosing commands of open $( ... )
	var words []string
	var word strings.Builder
	inWord := false
	flushWord := func() {
		if inWord {
			words = append(words, word.String())
		}
		word.Reset()
		inWord = false
	}
	endCmd := func() {
		flushWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	rs := []rune(block)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case c == '\\' && i+1 < len(rs) && rs[i+1] == '\n':
			i++ // continuation
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(rs) && rs[j] != c {
				j++
			}
			word.WriteString(string(rs[i+1 : min(j, len(rs))]))
			inWord, i = true, j
		case c == '#' && !inWord:
			for i < len(rs) && rs[i] != '\n' {
				i++
			}
			i--
		case c == '$' && i+1 < len(rs) && rs[i+1] == '(':
			flushWord()
			stack = append(stack, words)
			words = nil
			i++
		case c == ')' && len(stack) > 0:
			endCmd()
			words = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			word.WriteString("$(...)")
			inWord = true
		case c == '\n' || c == ';' || c == '|' || c == '&':
			endCmd()
		case c == ' ' || c == '\t':
			flushWord()
		default:
			word.WriteRune(c)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// repoPathRE matches a path inside one of the repository's top-level folders.
var repoPathRE = regexp.MustCompile(`^(?:\./)?(?:native|server|qual|families|fixtures|reports|lab|docs)/[A-Za-z0-9_.*/-]*$`)

// checkRepoPath reports whether p, a path a page names, exists in the repository (relative to
// the root), is a build output the Makefile names (native/cuda/build/...), or is a placeholder
// (NAME, <f>).
func checkRepoPath(p string, makefile []byte) error {
	if strings.Contains(p, "<") || strings.Contains(p, "NAME") || strings.Contains(p, "*") {
		return nil
	}
	q := strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
	if _, err := os.Stat(q); err == nil {
		return nil
	}
	for d := filepath.Dir(q); d != "." && d != "/"; d = filepath.Dir(d) {
		if filepath.Base(d) == "build" && strings.Contains(string(makefile), d) {
			return nil
		}
	}
	return errors.New(p + " does not exist")
}

func buildBinary(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func helpOf(bin string, args ...string) string {
	b, _ := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	return string(b)
}

// TestREADMECommands checks every shell command of README.md, families/README.md and docs/*.md.
func TestREADMECommands(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	qual := buildBinary(t, bin, "./qual/cmd/qual")
	server := buildBinary(t, bin, "./server/cmd/qual-server")
	serverHelp := helpOf(server)
	for _, page := range docPages(t) {
		var cmds [][]string
		for _, b := range shellBlocks(readPage(t, page), "") {
			cmds = append(cmds, shellWords(b)...)
		}
		if len(cmds) == 0 && page == "README.md" {
			t.Errorf("%s shows no commands in ```sh blocks", page)
		}
		for _, w := range cmds {
			cmd := strings.Join(w, " ")
			for len(w) > 0 && strings.Contains(w[0], "=") && !strings.HasPrefix(w[0], "-") {
				w = w[1:] // VAR=value prefixes
			}
			if len(w) == 0 {
				continue
			}
			for _, a := range w[1:] {
				if repoPathRE.MatchString(a) {
					if err := checkRepoPath(a, makefile); err != nil {
						t.Errorf("%s: command %q names %v", page, cmd, err)
					}
				}
			}
			switch {
			case w[0] == "make":
				for _, target := range w[1:] {
					if strings.Contains(target, "=") {
						continue // a variable: make mutants MUTANTS=...
					}
					if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
						t.Errorf("%s: command %q: the Makefile has no target %q", page, cmd, target)
					}
				}
			case w[0] == "./bin/qual":
				checkFlags(t, page, cmd, w[1:], qual, true)
			case w[0] == "./bin/qual-server":
				checkFlags(t, page, cmd, w[1:], server, false)
			case w[0] == "curl":
				for _, a := range w[1:] {
					u := strings.TrimPrefix(strings.TrimPrefix(a, "http://"), "https://")
					if !strings.HasPrefix(u, "localhost:") && !strings.HasPrefix(u, "127.0.0.1:") {
						continue
					}
					route := "/"
					if i := strings.Index(u, "/"); i >= 0 {
						route = u[i:]
					}
					if !strings.Contains(serverHelp, " "+route) {
						t.Errorf("%s: command %q asks for %s, which `qual-server --help` does not list among its routes", page, cmd, route)
					}
				}
			}
		}
	}
}

// checkFlags asserts that the subcommand exists and that every flag used is in its --help.
func checkFlags(t *testing.T, page, cmd string, args []string, bin string, sub bool) {
	t.Helper()
	var helpArgs []string
	if sub {
		if len(args) == 0 {
			t.Errorf("%s: command %q has no subcommand", page, cmd)
			return
		}
		helpArgs = append(helpArgs, args[0])
		// Two-level commands: qual bundle build, qual report compare, ...
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") && (args[0] == "bundle" || args[0] == "report") {
			helpArgs = append(helpArgs, args[1])
		}
	}
	help := helpOf(bin, helpArgs...)
	if strings.Contains(help, "unknown command") || strings.Contains(help, "unknown subcommand") {
		t.Errorf("%s: command %q: %s", page, cmd, strings.TrimSpace(help))
		return
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || len(a) < 2 || !(a[1] == '-' || a[1] >= 'a' && a[1] <= 'z') {
			continue
		}
		name := strings.SplitN(strings.TrimLeft(a, "-"), "=", 2)[0]
		if !strings.Contains(help, "-"+name) {
			t.Errorf("%s: command %q passes --%s, which `%s --help` does not list", page, cmd, name,
				strings.Join(append([]string{filepath.Base(bin)}, helpArgs...), " "))
		}
	}
}

var (
	mdLinkRE   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	backtickRE = regexp.MustCompile("`([^`\\s]+)`")
)

// TestREADMELinksAndPaths checks that every relative link of the pages leads to a file or folder
// that exists, and that every repository path they name in backticks exists.
func TestREADMELinksAndPaths(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range docPages(t) {
		text := readPage(t, page)
		links := 0
		for _, m := range mdLinkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			target = strings.SplitN(target, "#", 2)[0]
			if _, err := os.Stat(filepath.Join(filepath.Dir(page), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, m[1])
			}
		}
		if page == "README.md" && links < 5 {
			t.Errorf("README.md links to %d pages; it should lead to docs/", links)
		}
		for _, m := range backtickRE.FindAllStringSubmatch(text, -1) {
			if repoPathRE.MatchString(m[1]) {
				if err := checkRepoPath(m[1], makefile); err != nil {
					t.Errorf("%s names `%v`", page, err)
				}
			}
		}
	}
}

// TestREADMEIsAFrontDoor keeps README.md short, with the two commands and the quickstart.
func TestREADMEIsAFrontDoor(t *testing.T) {
	text := readPage(t, "README.md")
	if n := strings.Count(strings.TrimRight(text, "\n"), "\n") + 1; n > readmeMaxLines {
		t.Errorf("README.md has %d lines; keep it at most %d and move the rest to docs/", n, readmeMaxLines)
	}
	var all []string
	for _, b := range shellBlocks(text, "") {
		for _, w := range shellWords(b) {
			all = append(all, strings.Join(w, " "))
		}
	}
	joined := "\n" + strings.Join(all, "\n") + "\n"
	for _, want := range []string{"\nmake test\n", "\nmake qualify\n"} {
		if !strings.Contains(joined, want) {
			t.Errorf("README.md must show %q, one of the two commands", strings.TrimSpace(want))
		}
	}
	var quick []string
	for _, b := range shellBlocks(text, "Quickstart") {
		for _, w := range shellWords(b) {
			quick = append(quick, strings.Join(w, " "))
		}
	}
	q := strings.Join(quick, "\n")
	for _, want := range []string{"./bin/qual fixtures", "./bin/qual-server", "/v1/chat/completions",
		"/v1/images/generations", "./bin/qual profile", "./bin/qual report show"} {
		if !strings.Contains(q, want) {
			t.Errorf("README.md's Quickstart section must show %q", want)
		}
	}
}

// TestREADMEEnvironmentComplete checks that docs/environment.md lists every variable declared
// in server/envconfig.
func TestREADMEEnvironmentComplete(t *testing.T) {
	text := readPage(t, "docs/environment.md")
	for _, v := range envconfig.All() {
		if !strings.Contains(text, "`"+v.Name+"`") {
			t.Errorf("docs/environment.md does not list %s (%s)", v.Name, v.Description)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// TestREADMEQuickstart runs the Quickstart section's blocks, in order, as one bash script in a
// scratch git work tree holding bin/ (freshly built binaries) and the repository's go.mod,
// fixtures/ and .gitignore, with the ports 8000 and 8001 replaced by free ones, and checks what
// the newcomer would see.
func TestREADMEQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers and profiles one; skipped with -short")
	}
	for _, tool := range []string{"bash", "curl", "jq", "base64", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			// A CI image without the quickstart's tools still runs the other checks.
			t.Skipf("the quickstart needs %s (README's Install section says so), which this machine lacks: %v", tool, err)
		}
	}
	blocks := shellBlocks(readPage(t, "README.md"), "Quickstart")
	if len(blocks) < 3 {
		t.Fatalf("README.md's Quickstart section has %d shell blocks", len(blocks))
	}
	script := strings.Join(blocks, "\n")
	p1, p2 := freePort(t), freePort(t)
	script = strings.NewReplacer(":8000", ":"+p1, "--port 8000", "--port "+p1,
		":8001", ":"+p2, "--port 8001", "--port "+p2).Replace(script)

	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	buildBinary(t, filepath.Join(dir, "bin"), "./qual/cmd/qual")
	buildBinary(t, filepath.Join(dir, "bin"), "./server/cmd/qual-server")
	// A stand-in for the checkout's root: qual fixtures finds its tokenizers through go.mod, and
	// qual profile fingerprints the git work tree less what .gitignore leaves out, as in the
	// checkout; nothing the quickstart writes lands in the checkout itself.
	for _, name := range []string{"go.mod", "fixtures"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ignore, err := os.ReadFile(".gitignore") // copied: git does not follow a symlinked .gitignore
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".gitignore"), ignore, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("git", "-C", dir, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, b)
	}
	cache := envconfig.Cache.Get()
	if cache == "" {
		cache = filepath.Join(root, ".cache", "modelqual")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Servers left running by a failed step are stopped when the script exits.
	cmd := exec.CommandContext(ctx, "bash", "-c",
		"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), envconfig.Cache.Name+"="+cache)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the quickstart failed: %v\n--- script ---\n%s\n--- output ---\n%s", err, script, out)
	}

	for _, want := range []string{`"status":"ready"`, `"object":"chat.completion"`, `"route":"/v1/chat/completions"`, "### modelqual profile: profile-c4"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the quickstart's output lacks %q:\n%s", want, out)
		}
	}
	records, err := os.ReadFile(filepath.Join(dir, "artifacts", "records.jsonl"))
	if err != nil {
		t.Fatalf("the quickstart's server left no records: %v", err)
	}
	// The chat request, then the profile's warmup and measured requests of both points, and the
	// profile's one GET /mq/v1/bundle (the served bundle's digest, recorded with the run).
	routes := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(records)), "\n") {
		var r struct {
			Route string `json:"route"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("records.jsonl line %q: %v", line, err)
		}
		routes[r.Route]++
	}
	want := map[string]int{"/v1/chat/completions": 1 + 2*(2+16), "/mq/v1/bundle": 1}
	if !maps.Equal(routes, want) {
		t.Errorf("records.jsonl has %v records by route, want %v (one chat request, then 2 points of 2 warmup and 16 requests, and the profile's bundle query)", routes, want)
	}
	f, err := os.Open(filepath.Join(dir, "artifacts", "fox.png"))
	if err != nil {
		t.Fatalf("the quickstart wrote no fox.png: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("fox.png is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 64 || b.Dy() != 64 {
		t.Errorf("fox.png is %dx%d, the request asked for 64x64", b.Dx(), b.Dy())
	}
}
