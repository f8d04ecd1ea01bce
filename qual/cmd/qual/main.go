// Command qual is the modelqual harness CLI: it builds and inspects bundles, tokenizes,
// runs the engine directly, profiles OpenAI-compatible endpoints, compares reports and
// qualifies families. Each subcommand lives in its own file and registers itself here.
package main

import (
	"fmt"
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

func usage() {
	fmt.Fprintln(os.Stderr, "qual: the modelqual qualification harness\n\nUsage: qual <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'qual <command> --help' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "qual: unknown command %q; known: %s\n", os.Args[1], strings.Join(known(), ", "))
		os.Exit(2)
	}
	os.Exit(c.run(os.Args[2:]))
}

func known() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
