package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/envconfig"
)

func init() {
	register("qualify", "run the families' qualification specs and print one table per family", runQualify)
}

const qualifyUsage = `Usage: qual qualify [--family F[,F...]] [--launcher process|container|external --url U [--model M]]
                    [--label-filter EXPR] [--procs N] [--parallel N] [--out DIR] [--suite-bin DIR] [-v]

Runs each family's Ginkgo specs (families/<f>) with the Ginkgo CLI pinned by go.mod, writes
a JSON and a JUnit report per family, and prints one table: per family the gates passed and
failed, HTTP latency p50/p95, TTFT p50, output tokens/s and requests/s of the first load
point, the wall time, and where the reports are. Exit status 1 when any gate failed.

Launchers: process (default) starts bin/qual-server on a bundle built from the family's
manifest; container runs the same gates against the server image on the local Docker engine
(make image); external qualifies the OpenAI-compatible server at --url with the same gates
(gates that need the bundle, such as the planted-defect specs, are skipped). Against an
external server the suite first checks that it serves the family's checkpoint (/v1/models, then
greedy tokens and logprobs of golden prompts) and stops with one message when it does not; each
gate then passes, fails naming how the engine differs from the reference, or skips as not
checkable on this engine (an extension it lacks), and summary.md lists every gate so.

--parallel N qualifies N families side by side. On a GPU run (a label filter selecting gpu
specs, or MODELQUAL_GPU=1) the runner's GPUs (MODELQUAL_GPUS, default all; MIG instances in
place of MIG-enabled GPUs) are split into N disjoint sets of at least --procs each, and each
family's run gets one set as its MODELQUAL_GPUS, which its Ginkgo processes split again, one
GPU per server: no GPU is ever shared. With too few GPUs it runs fewer families at a time, saying
so (MODELQUAL_GPU_SHORTAGE=fail: it stops instead). The table then lists every card's share of
the campaign: who held it, for how long, its energy and memory high-water (docs/gpu.md).

Default label filter: "!gpu && !container" for process, "container" for container,
"!gpu && !container" for external. Run from inside the repository (it needs the Go toolchain, or
prebuilt suite binaries with --suite-bin).

Flags:
`

// familyResult is one family's outcome for the table.
type familyResult struct {
	Family       string             `json:"family"` // the runtime registry's name (qual families)
	Folder       string             `json:"folder"` // where its specs are: families/<folder>
	Checkpoint   string             `json:"checkpoint"`
	Precision    string             `json:"precision"`
	MaxContext   int                `json:"max_context"`
	Passed       int                `json:"passed"`
	Failed       int                `json:"failed"`
	Skipped      int                `json:"skipped"`
	FailedSpecs  []string           `json:"failed_specs,omitempty"`
	Verdicts     []gateVerdict      `json:"verdicts,omitempty"`
	GatesPassed  []string           `json:"gates_passed"`
	GatesFailed  []string           `json:"gates_failed"`
	Figures      []loadFigure       `json:"figures,omitempty"`
	Headline     map[string]float64 `json:"headline,omitempty"`
	HeadlineFrom string             `json:"headline_from,omitempty"`
	Wall         time.Duration      `json:"wall_ns"`
	JSONReport   string             `json:"json_report"`
	JUnitReport  string             `json:"junit_report"`
	Log          string             `json:"log"`
	Artifacts    string             `json:"artifacts"`
	Error        string             `json:"error,omitempty"`
	// GPUs is the GPU set the run was given (qual qualify --parallel on a GPU run), Cards what
	// its processes read of them (gpu.CardsEntry).
	GPUs  []string        `json:"gpus,omitempty"`
	Cards []gpu.CardUsage `json:"gpu_cards,omitempty"`
}

// loadFigure mirrors qual/spec.Figure as the load gates write it into the JSON report.
type loadFigure struct {
	Profile string  `json:"profile"`
	Point   string  `json:"point"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
}

// loadFiguresEntry is qual/spec.LoadFiguresEntry (the CLI does not link the Ginkgo DSL).
const loadFiguresEntry = "load figures"

var gateLabels = []string{"provenance", "parity", "contract", "load"}

func runQualify(args []string) int {
	fs := flag.NewFlagSet("qualify", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), qualifyUsage)
		fs.PrintDefaults()
	}
	var (
		families = fs.String("family", "", "comma-separated families to qualify, by any of their names: the registry's (qual families: qwen3), the folder (qwen), the fixture (qwen3-tiny) or an architecture (Qwen3ForCausalLM); default: every families/<f> with a manifest.yaml")
		launcher = fs.String("launcher", "process", "process, container or external")
		url      = fs.String("url", "", "base URL of the server to qualify (external launcher)")
		model    = fs.String("model", "", "model name to send to an external server (default: the family name)")
		filter   = fs.String("label-filter", "", "Ginkgo label filter (default depends on --launcher, see above)")
		procs    = fs.Int("procs", 1, "Ginkgo parallel processes per family (ginkgo -procs)")
		parallel = fs.Int("parallel", 1, "families qualified side by side; on a GPU run each gets its own GPUs (see above)")
		out      = fs.String("out", "artifacts/qualify", "output folder: reports/, logs/ and one artifact folder per family")
		timeout  = fs.Duration("timeout", 60*time.Minute, "timeout of each family's run")
		verbose  = fs.Bool("v", false, "stream Ginkgo's output instead of writing it to logs/<family>.log only")
		suiteBin = fs.String("suite-bin", "", "folder of prebuilt suite binaries <folder>.test (go test -c -o DIR/qwen.test ./families/qwen), run in place of the Ginkgo CLI: for a machine without the Go toolchain (a GPU host); one process per family")
	)
	if err := parseAll(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "qual qualify: unexpected arguments %q; see --help\n", fs.Args())
		return 2
	}
	switch *launcher {
	case "process", "container":
		if *url != "" {
			fmt.Fprintln(os.Stderr, "qual qualify: --url needs --launcher external")
			return 2
		}
	case "external":
		if *url == "" {
			fmt.Fprintln(os.Stderr, "qual qualify: --launcher external needs --url http://host:port")
			return 2
		}
	default:
		fmt.Fprintf(os.Stderr, "qual qualify: --launcher %q: use process, container or external\n", *launcher)
		return 2
	}
	if *filter == "" {
		*filter = "!gpu && !container"
		if *launcher == "container" {
			*filter = "container"
		}
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, needCheckout("qualify", "it runs the Ginkgo specs of its families/ with the Go toolchain", err))
		return 1
	}
	known, err := familyNames(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual qualify: %v\n", err)
		return 1
	}
	selected := known
	if *families != "" {
		selected = nil
		for _, f := range strings.Split(*families, ",") {
			n, ok := resolveFamily(known, strings.TrimSpace(f))
			if !ok {
				fmt.Fprintf(os.Stderr, "qual qualify: --family %q: unknown family; known: %s\n", strings.TrimSpace(f), describeFamilies(known))
				return 2
			}
			selected = append(selected, n)
		}
	}
	outDir, err := filepath.Abs(*out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual qualify: --out: %v\n", err)
		return 2
	}
	for _, d := range []string{"reports", "logs"} {
		if err := os.MkdirAll(filepath.Join(outDir, d), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "qual qualify: %v\n", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	isGPU := gpuCampaign(*filter, selected) && *launcher != "external"
	var inv gpu.Inventory
	if isGPU {
		inv = gpu.Inspect()
	}
	planProcs := *procs
	if *suiteBin != "" {
		planProcs = 1 // a suite binary runs as one process
	}
	plan, err := planCampaign(inv, envconfig.GPUs.Get(), isGPU, *parallel, planProcs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual qualify: %v\n", err)
		return 2
	}
	for _, n := range plan.Notes {
		fmt.Fprintf(os.Stderr, "qual qualify: %s\n", n)
	}
	start := time.Now()
	results := runCampaign(selected, plan.Slots, func(f familyName, slot []gpu.Device) familyResult {
		where := ""
		if len(slot) > 0 {
			where = " on GPUs " + strings.Join(gpu.UUIDs(slot), ",")
		}
		fmt.Fprintf(os.Stderr, "qual qualify: %s: running specs of families/%s (label filter %q, launcher %s)%s...\n", f.Canonical, f.Folder, *filter, *launcher, where)
		return qualifyFamily(ctx, root, outDir, f, qualifyOptions{launcher: *launcher, url: *url, model: *model,
			filter: *filter, procs: *procs, timeout: *timeout, verbose: *verbose, suiteBin: *suiteBin, gpus: slot})
	}, func() bool { return ctx.Err() != nil })
	total := time.Since(start)
	var shares []gpu.CardShare
	if plan.GPURun {
		var usage []gpu.CardUsage
		for _, r := range results {
			usage = append(usage, r.Cards...)
		}
		if len(plan.Units) > 0 || len(usage) > 0 {
			shares = gpu.MergeCards(plan.Units, usage, total.Seconds())
		}
	}
	printQualifyTable(os.Stdout, results, total)
	printCampaignCards(os.Stdout, plan, results, shares)
	if b, err := json.MarshalIndent(map[string]any{"families": results, "wall_ns": total, "label_filter": *filter, "launcher": *launcher,
		"parallel": len(plan.Slots), "gpu_cards": shares}, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(outDir, "qualify.json"), append(b, '\n'), 0o644)
	}
	var md strings.Builder
	printQualifyTable(&md, results, total)
	printCampaignCards(&md, plan, results, shares)
	_ = os.WriteFile(filepath.Join(outDir, "qualify.txt"), []byte(md.String()), 0o644)
	if err := writeSummary(summaryPath(outDir), results, qualifyOptions{launcher: *launcher, url: *url, filter: *filter}); err == nil {
		fmt.Fprintf(os.Stdout, "\nPer-gate summary: %s\n", summaryPath(outDir))
	}
	for _, r := range results {
		if r.Failed > 0 || r.Error != "" {
			return 1
		}
	}
	return 0
}

type qualifyOptions struct {
	launcher, url, model, filter string
	suiteBin                     string
	procs                        int
	timeout                      time.Duration
	verbose                      bool
	// gpus is the run's own GPU set (qual qualify --parallel), passed as MODELQUAL_GPUS; nil:
	// the environment's.
	gpus []gpu.Device
}

func qualifyFamily(ctx context.Context, root, outDir string, name familyName, o qualifyOptions) familyResult {
	family := name.Folder
	r := familyResult{
		Family:      name.Canonical,
		Folder:      "families/" + name.Folder,
		JSONReport:  filepath.Join(outDir, "reports", family+".json"),
		JUnitReport: filepath.Join(outDir, "reports", family+".xml"),
		Log:         filepath.Join(outDir, "logs", family+".log"),
		Artifacts:   filepath.Join(outDir, family),
	}
	m, err := manifest.Load(filepath.Join(root, "families", family, "manifest.yaml"))
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Checkpoint, r.Precision, r.MaxContext = m.Checkpoint.ID, m.Build.Precision, m.Build.MaxContext
	_ = os.Remove(r.JSONReport)
	args := []string{"run", "github.com/onsi/ginkgo/v2/ginkgo",
		"--label-filter=" + o.filter, "--timeout=" + o.timeout.String(),
		"--output-dir=" + filepath.Join(outDir, "reports"),
		"--json-report=" + family + ".json", "--junit-report=" + family + ".xml"}
	if o.procs > 1 {
		args = append(args, fmt.Sprintf("--procs=%d", o.procs))
	}
	args = append(args, "./families/"+family)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if o.suiteBin != "" {
		// A prebuilt suite binary, run as go test runs it: in the family folder.
		bin, err := filepath.Abs(filepath.Join(o.suiteBin, family+".test"))
		if err == nil {
			_, err = os.Stat(bin)
		}
		if err != nil {
			r.Error = fmt.Sprintf("--suite-bin: %v; build it with go test -c -o %s ./families/%s", err, filepath.Join(o.suiteBin, family+".test"), family)
			return r
		}
		cmd = exec.CommandContext(ctx, bin, "-ginkgo.label-filter="+o.filter, "-ginkgo.timeout="+o.timeout.String(),
			"-ginkgo.json-report="+r.JSONReport, "-ginkgo.junit-report="+r.JUnitReport)
		cmd.Dir = filepath.Join(root, "families", family)
	}
	cmd.Env = append(os.Environ(), "MODELQUAL_ARTIFACTS="+outDir, "MODELQUAL_LAUNCHER="+o.launcher)
	if len(o.gpus) > 0 {
		r.GPUs = gpu.UUIDs(o.gpus)
		cmd.Env = append(cmd.Env, envconfig.GPUs.Name+"="+strings.Join(r.GPUs, ","))
	}
	if o.launcher == "external" {
		cmd.Env = append(cmd.Env, "MODELQUAL_EXTERNAL_URL="+o.url)
		if o.model != "" {
			cmd.Env = append(cmd.Env, "MODELQUAL_EXTERNAL_MODEL="+o.model)
		}
	}
	logf, err := os.Create(r.Log)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer logf.Close()
	var w io.Writer = logf
	if o.verbose {
		w = io.MultiWriter(logf, os.Stdout)
	}
	cmd.Stdout, cmd.Stderr = w, w
	t0 := time.Now()
	runErr := cmd.Run()
	r.Wall = time.Since(t0)
	var profiles []string
	for _, p := range m.Profiles {
		profiles = append(profiles, p.Name)
	}
	if err := readGinkgoReport(&r, profiles); err != nil {
		msg := fmt.Sprintf("no Ginkgo report (%v)", err)
		if runErr != nil {
			msg += fmt.Sprintf("; ginkgo: %v; see %s", runErr, r.Log)
		}
		r.Error = msg
	} else if runErr != nil && r.Failed == 0 {
		// The suite failed outside any spec (setup, a panic in tree construction, a timeout).
		r.Error = fmt.Sprintf("ginkgo: %v; see %s", runErr, r.Log)
	}
	return r
}

// readGinkgoReport fills r from the family's Ginkgo JSON report: spec counts, the gates that
// passed and failed (by gate label), and the load figures.
func readGinkgoReport(r *familyResult, profiles []string) error {
	b, err := os.ReadFile(r.JSONReport)
	if err != nil {
		return err
	}
	var reps []types.Report
	if err := json.Unmarshal(b, &reps); err != nil {
		return fmt.Errorf("decode %s: %w", r.JSONReport, err)
	}
	r.Cards = readCards(reps)
	passedGates, failedGates := map[string]bool{}, map[string]bool{}
	for _, rep := range reps {
		for _, sr := range rep.SpecReports {
			var labelled []string
			for _, l := range sr.Labels() {
				if slices.Contains(gateLabels, l) {
					labelled = append(labelled, l)
				}
			}
			if v, ok := verdictOf(sr, labelled); ok {
				r.Verdicts = append(r.Verdicts, v)
			}
			if sr.LeafNodeType != types.NodeTypeIt {
				if sr.State.Is(types.SpecStateFailureStates) {
					r.Failed++
					r.FailedSpecs = append(r.FailedSpecs, fmt.Sprintf("[%s] %s", sr.LeafNodeType, firstLine(sr.Failure.Message)))
				}
				continue
			}
			var gates []string
			for _, l := range sr.Labels() {
				if slices.Contains(gateLabels, l) {
					gates = append(gates, l)
				}
			}
			switch {
			case sr.State == types.SpecStatePassed:
				r.Passed++
				for _, g := range gates {
					passedGates[g] = true
				}
			case sr.State.Is(types.SpecStateFailureStates):
				r.Failed++
				r.FailedSpecs = append(r.FailedSpecs, sr.FullText()+": "+firstLine(sr.Failure.Message))
				for _, g := range gates {
					failedGates[g] = true
				}
			default:
				r.Skipped++
			}
			for _, e := range sr.ReportEntries {
				if e.Name != loadFiguresEntry {
					continue
				}
				var figs []loadFigure
				if json.Unmarshal([]byte(e.Value.AsJSON), &figs) == nil {
					r.Figures = append(r.Figures, figs...)
				}
			}
		}
	}
	for _, g := range gateLabels {
		if failedGates[g] {
			r.GatesFailed = append(r.GatesFailed, g)
		} else if passedGates[g] {
			r.GatesPassed = append(r.GatesPassed, g)
		}
	}
	// Specs run in random order; list the verdicts by gate, then spec, and the figures in the
	// manifest's profile order.
	sort.SliceStable(r.Verdicts, func(i, j int) bool {
		gi, gj := gateRank(r.Verdicts[i].Gate), gateRank(r.Verdicts[j].Gate)
		if gi != gj {
			return gi < gj
		}
		return r.Verdicts[i].Spec < r.Verdicts[j].Spec
	})
	sort.SliceStable(r.Figures, func(i, j int) bool {
		return slices.Index(profiles, r.Figures[i].Profile) < slices.Index(profiles, r.Figures[j].Profile)
	})
	r.Headline, r.HeadlineFrom = headline(r.Figures)
	return nil
}

// gateRank orders verdicts: a failed setup first, then the gates in gateLabels' order.
func gateRank(gate string) int {
	if gate == "setup" {
		return -1
	}
	first, _, _ := strings.Cut(gate, ",")
	if i := slices.Index(gateLabels, first); i >= 0 {
		return i
	}
	return len(gateLabels)
}

// headline picks the figures of the first load point (the manifest's first profile's first
// sweep point, usually concurrency 1, non-streaming), the setting of the ten-model table
// modelqual's reports follow.
func headline(figs []loadFigure) (map[string]float64, string) {
	if len(figs) == 0 {
		return nil, ""
	}
	first := figs[0]
	out := map[string]float64{}
	for _, f := range figs {
		if f.Profile == first.Profile && f.Point == first.Point {
			out[f.Name] = f.Value
		}
	}
	return out, first.Profile + " " + first.Point
}

func printQualifyTable(w io.Writer, results []familyResult, total time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Family\tCheckpoint\tPrecision\tContext\tSpecs passed\tFailed\tGates passed\tGates failed\tHTTP p50 (ms)\tHTTP p95 (ms)\tTTFT p50 (ms)\tOutput tokens/s\tRequests/s\tWall")
	num := func(r familyResult, k string) string {
		if v, ok := r.Headline[k]; ok {
			return fmt.Sprintf("%.2f", v)
		}
		return "-"
	}
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Family, r.Checkpoint, r.Precision, r.MaxContext,
			r.Passed, r.Failed, list(r.GatesPassed), list(r.GatesFailed),
			num(r, "mq_http_latency.p50"), num(r, "mq_http_latency.p95"), num(r, "time_to_first_token.p50"),
			num(r, "output_token_throughput.avg"), num(r, "request_throughput.avg"), r.Wall.Round(100*time.Millisecond))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nTotal wall time %s.", total.Round(100*time.Millisecond))
	if len(results) > 0 && results[0].HeadlineFrom != "" {
		fmt.Fprintf(w, " Latency and throughput columns: the first load point of each family (e.g. %s).", results[0].HeadlineFrom)
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "\n%s: JSON %s, JUnit %s, log %s, artifacts %s\n", r.Family, r.JSONReport, r.JUnitReport, r.Log, r.Artifacts)
		if r.Error != "" {
			fmt.Fprintf(w, "  ERROR %s\n", r.Error)
		}
		printVerdicts(w, r)
		points := map[string]bool{}
		var order []string
		for _, f := range r.Figures {
			k := f.Profile + " " + f.Point
			if !points[k] {
				points[k] = true
				order = append(order, k)
			}
		}
		if len(order) > 1 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  Load point\tHTTP p50 (ms)\tHTTP p95 (ms)\tTTFT p50 (ms)\tHTTP−task p50 (ms)\tOutput tokens/s\tRequests/s")
			for _, k := range order {
				v := map[string]float64{}
				for _, f := range r.Figures {
					if f.Profile+" "+f.Point == k {
						v[f.Name] = f.Value
					}
				}
				cell := func(name, format string) string {
					if x, ok := v[name]; ok {
						return fmt.Sprintf(format, x)
					}
					return "-"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", k, cell("mq_http_latency.p50", "%.2f"), cell("mq_http_latency.p95", "%.2f"),
					cell("time_to_first_token.p50", "%.2f"), cell("mq_http_minus_task.p50", "%.2f"), cell("output_token_throughput.avg", "%.1f"), cell("request_throughput.avg", "%.2f"))
			}
			tw.Flush()
		}
	}
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ",")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
