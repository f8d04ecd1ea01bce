package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/mutants"
)

func init() {
	register("mutants", "plant each catalogued defect in a scratch copy and run the premerge gate there (caught or missed, by which spec)", runMutants)
}

const mutantsUsage = `Usage: qual mutants [--match REGEXP] [--family F] [--full] [--first-catch] [--work DIR] [--keep] [--list] [--out FILE]

The planted-defect campaign (qual/mutants/catalog.go). For each defect: copy the files git
tracks (with their working-tree content) to a scratch folder, plant the defect there as a
source edit, and run the premerge gate of its family in that copy (go test ./families/<f>
with --label-filter "premerge && !container", narrowed to the gates the entry names unless
--full; the "gates bite" proofs are skipped since they plant faults of their own), after
the unit tests of the packages of make test the entry names (a defect in the harness's own
numbers, records or exports; --first-catch skips the family gate when they caught it).
Binaries, fixtures and bundles are built from the copy.

Prints one line per defect while it runs, then a Markdown table: defect, file, caught or
missed, and the specs that failed. Exit status 1 when any defect was missed or not tried.
It is slow (one premerge gate per defect; run it under nice on a shared machine) and not
part of make test. Run from inside the repository.

Flags:
`

func runMutants(args []string) int {
	fs := flag.NewFlagSet("mutants", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, mutantsUsage); fs.PrintDefaults() }
	match := fs.String("match", "", "run only the defects whose name matches this regular expression")
	family := fs.String("family", "", "run only the defects of this family")
	work := fs.String("work", "", "folder for the scratch copies and the campaign's cache (default: a new temporary folder)")
	keep := fs.Bool("keep", false, "keep the scratch copies (to rerun a gate by hand)")
	full := fs.Bool("full", false, "run the whole premerge gate for every defect, not only the gates its catalog entry names")
	firstCatch := fs.Bool("first-catch", false, "skip the family gate of a defect its packages' unit tests already caught")
	list := fs.Bool("list", false, "list the catalog and exit")
	out := fs.String("out", "", "also write the table to this file")
	timeout := fs.Duration("timeout", 20*time.Minute, "limit of one defect's gate run")
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "qual mutants: unexpected arguments %q; it takes flags only (see --help)\n", fs.Args())
		return 2
	}
	if *list {
		for i, m := range mutants.Catalog {
			fmt.Printf("%2d  %-7s %-9s %-34s %s\n", i+1, m.Family, m.Gates, m.File, m.Name)
		}
		return 0
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, needCheckout("mutants", "it plants defects in a copy of its sources and runs their gates", err))
		return 2
	}
	dir := *work
	if dir == "" {
		if dir, err = os.MkdirTemp("", "modelqual-mutants-"); err != nil {
			fmt.Fprintln(os.Stderr, "qual mutants:", err)
			return 2
		}
		if !*keep {
			defer os.RemoveAll(dir)
		}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		fmt.Fprintln(os.Stderr, "qual mutants:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rs, err := mutants.Run(ctx, mutants.Catalog, mutants.Options{Root: root, Work: dir, Match: *match, Family: *family, Keep: *keep, Full: *full, FirstCatch: *firstCatch, Timeout: *timeout, Log: os.Stderr})
	table := mutants.Table(rs)
	fmt.Print(table)
	if *out != "" {
		if werr := os.WriteFile(*out, []byte(table), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "qual mutants:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "qual mutants:", err)
		return 2
	}
	for _, r := range rs {
		if !r.Caught {
			return 1
		}
	}
	return 0
}
