package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/modelqual/modelqual/fixtures"
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
		fmt.Fprint(stderr, "Usage: qual families [--json]\n\nLists the native model families this binary serves (each native/models/<family>.cc registers\nitself): name, task, and the checkpoint architectures it accepts; inside a checkout also the\nfamily's folder and the other names qual qualify --family accepts for it (folder, spec label,\nfixture). The name listed is the one qual prints everywhere.\n\n")
		fs.PrintDefaults()
	}
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual families: unexpected arguments %q; it takes flags only (see --help)\n", fs.Args())
		return 2
	}
	// Inside a checkout, each family's other names: its folder, spec label and fixture.
	var names []familyName
	if root, err := fixtures.RepoRoot(); err == nil {
		names, _ = familyNames(root) // a broken manifest is qualify's to report; list what the binary has
	}
	type row struct {
		native.FamilyInfo
		Folder  string   `json:"folder,omitempty"`
		Aliases []string `json:"aliases,omitempty"`
	}
	var rows []row
	for _, f := range native.Families() {
		r := row{FamilyInfo: f}
		for _, n := range names {
			if n.Canonical != f.Name {
				continue
			}
			r.Folder = "families/" + n.Folder
			for _, a := range n.Aliases {
				if a != f.Name && !slices.Contains(f.Architectures, a) {
					r.Aliases = append(r.Aliases, a)
				}
			}
		}
		rows = append(rows, r)
	}
	if *asJSON {
		return bundlePrintJSON(stdout, stderr, rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAMILY\tTASK\tARCHITECTURES\tFOLDER\tALSO ACCEPTED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Task, strings.Join(r.Architectures, ", "), dash(r.Folder), dash(strings.Join(r.Aliases, ", ")))
	}
	tw.Flush()
	return 0
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
