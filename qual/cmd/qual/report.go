package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/modelqual/modelqual/reports"
)

func init() {
	register("report", "show, compare and merge run directories (AIPerf-compatible exports)", func(args []string) int {
		return reportMain(args, os.Stdout, os.Stderr)
	})
}

const reportUsage = `Usage:
  qual report show DIR                 print a run's summary.md
  qual report compare [flags] BASE CAND
                                       per-metric ratio CAND/BASE with its interval, sweep point by
                                       sweep point; BASE and CAND may each hold repeats (A1,A2,A3
                                       or a folder of runs), and a change is then called only
                                       beyond run-to-run variance; different configurations are
                                       never pooled
  qual report merge --out DIR [flags] RUN...
                                       join runs made on several machines into one run directory
  qual report sweep --out DIR RUN...   plot throughput and p99 latency against the swept parameter

Run directories are those written by 'qual profile' (profile_export.jsonl, summary.json, ...);
a directory written by AIPerf (profile_export.jsonl only) works for show and compare too. All
statistics are recomputed from profile_export.jsonl.

Run 'qual report <subcommand> --help' for flags.
`

func reportMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, reportUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "show":
		return reportShow(args[1:], stdout, stderr)
	case "compare":
		return reportCompare(args[1:], stdout, stderr)
	case "merge":
		return reportMerge(args[1:], stdout, stderr)
	case "sweep":
		return reportSweep(args[1:], stdout, stderr)
	case "verify": // every figure recomputed from the raw records (verify.go)
		return reportVerify(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "qual report: unknown subcommand %q; want show, compare, merge or sweep\n", args[0])
	return 2
}

// parseFlags parses fs; ok is false when the caller must return code (0 for --help).
func parseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err), false
	}
	return 0, true
}

func reportShow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual report show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	recompute := fs.Bool("recompute", false, "recompute the summary from profile_export.jsonl instead of printing summary.md")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual report show [--recompute] DIR\n\nPrints the run's summary.md (a Markdown table that fits a CI step summary:\n"+
			"qual report show DIR >> $GITHUB_STEP_SUMMARY).\n\n")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	dir := fs.Arg(0)
	if !*recompute {
		if b, err := os.ReadFile(filepath.Join(dir, reports.SummaryMDFile)); err == nil {
			stdout.Write(b)
			return 0
		}
	}
	run, err := reports.ReadRun(dir)
	if err != nil {
		fmt.Fprintf(stderr, "qual report show: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, reports.Markdown(reports.Summarize(run)))
	return 0
}

func reportCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual report compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	iters := fs.Int("iterations", 1000, "bootstrap resamples (one run a side)")
	seed := fs.Uint64("seed", 1, "bootstrap seed; the same seed and runs always give the same intervals")
	stats := fs.String("stats", "avg,p50,p99", "comma-separated statistics compared per metric (avg, min, max, std, p1..p99)")
	level := fs.Float64("level", 0.95, "repeats: family-wise confidence over all statistics of a point")
	asJSON := fs.Bool("json", false, "print the comparisons as JSON instead of tables")
	wide := fs.Bool("wide", false, "print full metric and run names, the configuration key and every run's value (lines longer than 120 columns)")
	ignore := fs.String("ignore", "", "comma-separated configuration fields allowed to differ (e.g. concurrency to compare concurrency 1 with 4; bundle to pool runs of two bundles as repeats); fields: "+strings.Join(reports.KeyFieldNames(), ", "))
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: qual report compare [flags] BASE CAND

BASE and CAND are each a run directory, a comma-separated list of them (a1,a2,a3), or a folder
whose subfolders are runs (the --out of qual profile: a sweep, repeats, or both).

Every run carries a configuration key computed from what it recorded: the load (endpoint,
stream, concurrency or request rate, input and output lengths, ...) and the server (model,
bundle digest, server flags). Runs of one side with the same key are repeats; runs of other
loads are other sweep points, compared point by point with the other side's run of the same
load. Runs of one load but different servers are not pooled: the error names the field.
Base and candidate may differ in the server (that is what they compare, shown as "differs");
they must match in the load unless --ignore names the field.

With at least 2 runs a side, every statistic is computed per run and the runs are the
observations: the ratio of the means with Welch's t interval on the log values, at a
family-wise --level over the statistics of the point (Bonferroni), and a verdict (better,
worse, no change) where the interval says so. Where too few runs make the interval wider
than any ratio of a candidate run to a base run, no interval is printed and the verdict says
how many runs a side would resolve the change seen (or a 5 % change).

With one run a side, the interval is a bootstrap over requests, which cannot see run-to-run
variance; its verdicts are marked (within run).

Ratios and intervals have three significant digits; lines fit 120 columns (--wide for all).

`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 2 {
		fmt.Fprintf(stderr, "qual report compare: want BASE and CAND, got %d arguments; see --help\n", fs.NArg())
		return 2
	}
	var st []string
	for _, s := range strings.Split(*stats, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if _, ok := (reports.Distribution{}).Stat(s); !ok {
			fmt.Fprintf(stderr, "qual report compare: --stats: unknown statistic %q; use avg, min, max, std or p1, p5, p10, p25, p50, p75, p90, p95, p99\n", s)
			return 2
		}
		st = append(st, s)
	}
	var ign []string
	for _, f := range strings.Split(*ignore, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(reports.KeyFieldNames(), f) {
			fmt.Fprintf(stderr, "qual report compare: --ignore: unknown field %q; fields: %s\n", f, strings.Join(reports.KeyFieldNames(), ", "))
			return 2
		}
		ign = append(ign, f)
	}
	bases, bnames, err := readRunGroup(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "qual report compare: base: %v\n", err)
		return 1
	}
	cands, cnames, err := readRunGroup(fs.Arg(1))
	if err != nil {
		fmt.Fprintf(stderr, "qual report compare: candidate: %v\n", err)
		return 1
	}
	sc, err := reports.CompareSweep(reports.CompareSide{Runs: bases, Names: bnames}, reports.CompareSide{Runs: cands, Names: cnames},
		reports.CompareSweepOptions{Stats: st, Level: *level, Iterations: *iters, Seed: *seed, Ignore: ign})
	if err != nil {
		fmt.Fprintf(stderr, "qual report compare: %v\n", err)
		return 1
	}
	if *asJSON {
		return writeJSONOut(stdout, stderr, sc)
	}
	if err := reports.WriteSweepComparison(stdout, sc, *wide); err != nil {
		fmt.Fprintf(stderr, "qual report compare: %v\n", err)
		return 1
	}
	for _, p := range sc.Points {
		if len(p.Rows) > 0 {
			return 0
		}
	}
	fmt.Fprintf(stderr, "qual report compare: no point of %s and %s could be compared (see above)\n", fs.Arg(0), fs.Arg(1))
	return 1
}

func writeJSONOut(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "qual report compare: %v\n", err)
		return 1
	}
	return 0
}

// readRunGroup reads one side of a compare: a comma-separated list of run directories, or
// one directory that is a run, or a folder whose subfolders holding profile_export.jsonl are
// runs (repeats). Each run is labelled with the path as given, so two runs of the same name
// from different folders stay apart.
func readRunGroup(arg string) ([]*reports.Run, []string, error) {
	var dirs []string
	for _, d := range strings.Split(arg, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, reports.ProfileExportJSONL)); err == nil {
			dirs = append(dirs, d)
			continue
		}
		ents, err := os.ReadDir(d)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", d, err)
		}
		n := len(dirs)
		for _, e := range ents {
			sub := filepath.Join(d, e.Name())
			if _, err := os.Stat(filepath.Join(sub, reports.ProfileExportJSONL)); e.IsDir() && err == nil {
				dirs = append(dirs, sub)
			}
		}
		if len(dirs) == n {
			// Let ReadRun say what is missing.
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		return nil, nil, fmt.Errorf("%q names no run directory", arg)
	}
	runs := make([]*reports.Run, len(dirs))
	for i, d := range dirs {
		r, err := reports.ReadRun(d)
		if err != nil {
			return nil, nil, err
		}
		runs[i] = r
	}
	return runs, dirs, nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func reportMerge(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual report merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output run `DIR` (required)")
	var shards, junits stringList
	fs.Var(&shards, "shard-id", "shard ID of the next RUN, in order (repeatable; default: each RUN's directory name)")
	fs.Var(&junits, "junit", "JUnit XML `FILE` to merge besides those found in the RUN directories (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual report merge --out DIR [--shard-id ID]... [--junit FILE]... RUN...\n\n"+
			"Joins runs made on several machines: per-request records are concatenated, each tagged with\n"+
			"its shard ID (metadata.mq_shard_id), and every statistic is recomputed over all of them; the\n"+
			"benchmark duration spans the earliest start to the latest end, so throughputs are the\n"+
			"shards' together. JUnit files (RUN/*.xml, plus --junit) are merged into DIR/junit.xml.\n\n")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *out == "" || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	dirs := fs.Args()
	if len(shards) == 0 {
		for _, d := range dirs {
			shards = append(shards, filepath.Base(filepath.Clean(d)))
		}
	} else if len(shards) != len(dirs) {
		fmt.Fprintf(stderr, "qual report merge: %d --shard-id for %d runs; give one per run or none\n", len(shards), len(dirs))
		return 2
	}
	var runs []*reports.Run
	for _, d := range dirs {
		r, err := reports.ReadRun(d)
		if err != nil {
			fmt.Fprintf(stderr, "qual report merge: %v\n", err)
			return 1
		}
		runs = append(runs, r)
		found, _ := filepath.Glob(filepath.Join(d, "*.xml"))
		sort.Strings(found)
		junits = append(junits, found...)
	}
	merged, err := reports.Merge(runs, shards)
	if err != nil {
		fmt.Fprintf(stderr, "qual report merge: %v\n", err)
		return 1
	}
	merged.Name = filepath.Base(filepath.Clean(*out))
	s, err := reports.WriteRun(*out, merged)
	if err != nil {
		fmt.Fprintf(stderr, "qual report merge: %v\n", err)
		return 1
	}
	if len(junits) > 0 {
		if err := reports.MergeJUnit(filepath.Join(*out, "junit.xml"), junits); err != nil {
			fmt.Fprintf(stderr, "qual report merge: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(stdout, "merged %d runs (%d profiling requests, %d JUnit files) into %s\n",
		len(runs), s.Profiling.Requests, len(junits), *out)
	return 0
}

func reportSweep(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual report sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "`DIR` for the sweep plots (required)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual report sweep --out DIR RUN...\n\n"+
			"Plots output token throughput and p99 latency against the swept parameter (concurrency or\n"+
			"request rate) of runs written by one 'qual profile' sweep.\n\n")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *out == "" || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	var sums []*reports.Summary
	for _, d := range fs.Args() {
		s, err := reports.ReadSummary(d)
		if err != nil {
			fmt.Fprintf(stderr, "qual report sweep: %v\n", err)
			return 1
		}
		sums = append(sums, s)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "qual report sweep: %v\n", err)
		return 1
	}
	names, err := reports.PlotSweep(*out, sums)
	if err != nil {
		fmt.Fprintf(stderr, "qual report sweep: %v\n", err)
		return 1
	}
	for _, n := range names {
		fmt.Fprintln(stdout, filepath.Join(*out, n))
	}
	return 0
}
