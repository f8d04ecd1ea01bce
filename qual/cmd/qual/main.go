// Command qual is the modelqual harness CLI: it builds and inspects bundles, tokenizes,
// runs the engine directly, profiles OpenAI-compatible endpoints, compares reports and
// qualifies families. Each subcommand lives in its own file and registers itself here.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one `qual` subcommand. run gets the arguments after the subcommand name and
// returns the process exit code; it prints its own errors.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

// register is called from init functions of the subcommand files.
func register(name, summary string, run func(args []string) int) {
	if _, dup := commands[name]; dup {
		panic("qual: subcommand registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "qual: the modelqual qualification harness\n\nUsage: qual <command> [flags]\n\nCommands:")
	for _, n := range known() {
		fmt.Fprintf(w, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'qual <command> --help' (or 'qual help <command>') for a command's flags; flags may\nfollow the arguments.")
}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	if isHelpFlag(args[0]) || args[0] == "help" && len(args) == 1 {
		usage(os.Stdout)
		return
	}
	if args[0] == "help" {
		args = []string{args[1], "--help"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "qual: unknown command %q; known: %s\n", args[0], strings.Join(known(), ", "))
		os.Exit(2)
	}
	if wantsHelp(args[1:]) {
		// Subcommands print their usage where their flag sets write, stderr, which is right
		// for a usage error; help that was asked for is the command's answer, so it goes to
		// stdout (qual profile --help | less).
		os.Stderr = os.Stdout
	}
	os.Exit(c.run(args[1:]))
}

func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// wantsHelp says whether the arguments ask for help: a help flag before any "--", or a
// two-level command's "help" (qual report help).
func wantsHelp(args []string) bool {
	if len(args) > 0 && args[0] == "help" {
		return true
	}
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelpFlag(a) {
			return true
		}
	}
	return false
}

// parseAll parses flags wherever they stand among the arguments ("compare A B --wide"; the
// flag package alone stops at the first positional), leaving the positionals in fs.Args().
func parseAll(fs *flag.FlagSet, args []string) error {
	pos, err := bundleParseArgs(fs, args)
	if err != nil {
		return err
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

// checkoutURL is where a modelqual checkout comes from.
const checkoutURL = "https://github.com/modelqual/modelqual"

// needCheckout is the error of a subcommand that works on a modelqual checkout (its families,
// fixtures data, Go sources) run outside one: what it needs, why, and what to do.
func needCheckout(cmd, why string, err error) string {
	return fmt.Sprintf("qual %s needs a modelqual checkout: %s (%v). cd into one, or git clone %s. "+
		"Without one, the binaries serve, profile, generate and report: qual-server, qual profile --bundle FILE, qual generate, qual report.",
		cmd, why, err, checkoutURL)
}

func known() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
