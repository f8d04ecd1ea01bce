package modelqual_test

// The README is a user's first contact; a command it shows that no longer parses is a bug.
// This test reads every shell block of README.md and checks each command against what
// exists now: `make T` names a Makefile target, `./bin/qual SUB ...` names a subcommand whose
// --help lists every flag the README passes, `./bin/qual-server` likewise, and every
// repository path a ginkgo command names exists. The commands themselves are run by the
// packages' own tests and by `make test` (premerge and container specs, qualify).

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeCommands returns the commands of README.md's ```sh blocks, continuation lines joined
// and comments dropped.
func readmeCommands(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatalf("open README.md: %v", err)
	}
	defer f.Close()
	var cmds []string
	in, cur := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		cur += line
		if strings.TrimSpace(cur) != "" {
			cmds = append(cmds, strings.Join(strings.Fields(cur), " "))
		}
		cur = ""
	}
	return cmds
}

var flagRE = regexp.MustCompile(`(?:^|\s)--?([a-z][a-z0-9-]*)`)

func buildBinary(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func helpOf(bin string, args ...string) string {
	b, _ := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	return string(b)
}

func TestREADMECommands(t *testing.T) {
	cmds := readmeCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("README.md shows %d commands; expected the two set-up commands and the guides", len(cmds))
	}
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	qual := buildBinary(t, "./qual/cmd/qual")
	server := buildBinary(t, "./server/cmd/qual-server")
	sawTest, sawQualify := false, false
	for _, c := range cmds {
		words := strings.Fields(c)
		// Skip leading VAR=value environment assignments.
		for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
			words = words[1:]
		}
		if len(words) == 0 {
			continue
		}
		for _, part := range strings.Split(strings.Join(words, " "), "&&") {
			w := strings.Fields(part)
			if len(w) == 0 {
				continue
			}
			switch {
			case w[0] == "make":
				for _, target := range w[1:] {
					if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
						t.Errorf("README command %q: the Makefile has no target %q", c, target)
					}
					sawTest = sawTest || target == "test"
					sawQualify = sawQualify || target == "qualify"
				}
			case w[0] == "./bin/qual":
				checkFlags(t, c, w[1:], qual, true)
			case w[0] == "./bin/qual-server":
				checkFlags(t, c, w[1:], server, false)
			case w[0] == "go" && len(w) > 2 && strings.HasSuffix(w[2], "/ginkgo"):
				for _, a := range w[3:] {
					if strings.HasPrefix(a, "./") {
						p := strings.TrimSuffix(a, "/...")
						if _, err := os.Stat(p); err != nil {
							t.Errorf("README command %q names %s, which does not exist", c, a)
						}
					}
				}
			}
		}
	}
	if !sawTest || !sawQualify {
		t.Errorf("README must show the two set-up commands, make qualify and make test (saw test=%v qualify=%v)", sawTest, sawQualify)
	}
}

// checkFlags asserts that the subcommand exists and that every flag used is in its --help.
func checkFlags(t *testing.T, cmd string, args []string, bin string, sub bool) {
	t.Helper()
	var helpArgs []string
	if sub {
		if len(args) == 0 {
			t.Errorf("README command %q has no subcommand", cmd)
			return
		}
		helpArgs = append(helpArgs, args[0])
		// Two-level commands: qual bundle build, qual report compare, ...
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") && (args[0] == "bundle" || args[0] == "report") {
			helpArgs = append(helpArgs, args[1])
		}
	}
	help := helpOf(bin, helpArgs...)
	if strings.Contains(help, "unknown command") {
		t.Errorf("README command %q: %s", cmd, strings.TrimSpace(help))
		return
	}
	for _, m := range flagRE.FindAllStringSubmatch(strings.Join(args, " "), -1) {
		if !strings.Contains(help, "-"+m[1]) {
			t.Errorf("README command %q passes --%s, which `%s --help` does not list", cmd, m[1], strings.Join(append([]string{filepath.Base(bin)}, helpArgs...), " "))
		}
	}
}
