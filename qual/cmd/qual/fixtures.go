package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/modelqual/modelqual/fixtures"
)

func init() {
	register("fixtures", "generate the deterministic tiny checkpoints (hub-cache layout)", func(args []string) int {
		return fixturesMain(args, os.Stdout, os.Stderr)
	})
}

// fixtureNames is a repeatable --name flag.
type fixtureNames []string

func (n *fixtureNames) String() string     { return strings.Join(*n, ",") }
func (n *fixtureNames) Set(v string) error { *n = append(*n, v); return nil }

func fixturesMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual fixtures", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cache := fs.String("cache", "", "modelqual cache `DIR` (default $MODELQUAL_CACHE, else <repo>/.cache/modelqual inside a checkout, else the user cache directory); snapshots go to DIR/hub")
	withBundle := fs.Bool("bundle", false, "also build (or reuse) a bundle of each fixture at its precision (cpu backend)")
	var names fixtureNames
	fs.Var(&names, "name", fmt.Sprintf("fixture to generate (repeatable; default %s and %s; known: %s)",
		fixtures.GPT2Tiny, fixtures.Qwen3Tiny, strings.Join(fixtures.Names(), ", ")))
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual fixtures [--cache DIR] [--name N]... [--bundle]\n\n"+
			"Generates (or verifies and reuses) the fixtures in Hugging Face hub-cache layout and prints\n"+
			"a JSON array of {name, model, hub_cache, snapshot_dir, revision[, bundle_path]}.\n\n")
		fs.PrintDefaults()
	}
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual fixtures: unexpected argument %q; use --name\n", fs.Arg(0))
		return 2
	}
	if len(names) == 0 {
		names = fixtureNames{fixtures.GPT2Tiny, fixtures.Qwen3Tiny}
	}
	dir := *cache
	if dir == "" {
		dir = fixtures.DefaultCacheDir()
	}
	var out []map[string]any
	for _, n := range names {
		snap, rev, err := fixtures.Ensure(dir, n)
		if err != nil {
			fmt.Fprintf(stderr, "qual fixtures: %v\n", err)
			return 1
		}
		row := map[string]any{"name": n, "model": fixtures.ModelID(n), "hub_cache": fixtures.HubCacheDir(dir), "snapshot_dir": snap, "revision": rev}
		if *withBundle {
			p, err := fixtures.Bundle(dir, n)
			if err != nil {
				fmt.Fprintf(stderr, "qual fixtures: %v\n", err)
				return 1
			}
			row["bundle_path"] = p
		}
		out = append(out, row)
	}
	return bundlePrintJSON(stdout, stderr, out)
}
