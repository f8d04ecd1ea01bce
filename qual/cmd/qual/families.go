package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/modelqual/modelqual/native"
)

func init() {
	register("families", "list the native model families compiled into this binary", func(args []string) int {
		return familiesMain(args, os.Stdout, os.Stderr)
	})
}

// familiesMain prints the runtime's family registry: every native/models/<family>.cc that
// registered itself, with its task and the architectures it serves.
func familiesMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual families", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual families [--json]\n\nLists the native model families this binary serves (each native/models/<family>.cc registers\nitself): name, task, and the checkpoint architectures it accepts.\n\n")
		fs.PrintDefaults()
	}
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual families: unexpected arguments %q; it takes flags only (see --help)\n", fs.Args())
		return 2
	}
	fams := native.Families()
	if *asJSON {
		return bundlePrintJSON(stdout, stderr, fams)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAMILY\tTASK\tARCHITECTURES")
	for _, f := range fams {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, f.Task, strings.Join(f.Architectures, ", "))
	}
	tw.Flush()
	return 0
}
