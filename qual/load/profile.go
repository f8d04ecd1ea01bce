package load

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/metrics"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
)

// ProfileInput describes a profile: one load configuration swept over concurrencies or
// request rates against a started server, each point written to its own run directory.
type ProfileInput struct {
	// Endpoint is the started server (from a launch.Launcher). Its RecordsPath, when set,
	// is read to join server records to client records by request ID; PID, when set, is
	// used for the serving-cost CPU figures.
	Endpoint *launch.Endpoint
	// Load is the per-point configuration; Concurrency / RequestRate are set per point
	// from the sweep lists below. BaseURL and Model default to the Endpoint's.
	Load Config
	// Concurrencies sweeps closed-loop concurrency; RequestRates sweeps open-loop rates
	// (with Load.MaxConcurrency as the cap). Exactly one must be non-empty.
	Concurrencies []int
	RequestRates  []float64
	// OutDir receives one run directory per point: <OutDir>/<Name>-c<N> or -r<R>.
	OutDir string
	// Name prefixes the run directories (default "profile").
	Name string
	// SLOs for goodput, e.g. "ttft:200ms,itl:20ms" (metrics.ParseSLOs syntax).
	SLOs string
	// Fingerprint names what must not change during each point (the bundle, inputs,
	// tokenizer and source tree). The run directories are always excluded.
	Fingerprint provenance.Spec
	// GPUIndices are sampled with NVML during each point (nil: all visible); RequireGPU
	// makes unavailable telemetry an error.
	GPUIndices []int
	RequireGPU bool
	// InputConfig is recorded verbatim as the exports' input_config (the CLI's flags).
	InputConfig any
	// RecordsWait bounds the wait for the server's records after the last response
	// (records are written when a request ends on the server; default 5 s).
	RecordsWait time.Duration
	// MaxErrorRate, when set, fails a point whose measured requests failed in a larger
	// fraction (0..1; cancellations the run asked for do not count). A point where no
	// measured request succeeded fails whatever it says.
	MaxErrorRate *float64
	// Repeat runs every sweep point this many times (default 1), each into its own run
	// directory with the suffix -rep<k> and its own seed, so that `qual report compare` can
	// tell a change from run-to-run variance.
	Repeat int
	// Overwrite lets a point replace a run directory that already holds a run; without it
	// Profile refuses before sending anything.
	Overwrite bool
	// FindMax, when set, searches for the highest rate or concurrency meeting its SLOs
	// (findmax.go) instead of sweeping the list given; SLOs is then left empty, the search's
	// thresholds being the points' goodput SLOs.
	FindMax *FindMax
}

// PointResult is one sweep point.
type PointResult struct {
	Dir     string
	Sweep   reports.SweepPoint
	Load    *Result
	Joined  *records.Joined
	Summary *reports.Summary
	// Err is why the point failed (join, fingerprints, artifacts); artifacts are written
	// whatever it says.
	Err error
	// exp are the point's export records (what profile_export.jsonl holds), which a find-max
	// search judges; noneSucceeded says, in a search, that no measured request succeeded.
	exp           []reports.ExportRecord
	noneSucceeded error
}

// ProfileResult is a whole sweep.
type ProfileResult struct {
	Points []PointResult
	// BundleDigest identifies the bundle served (empty when the server does not say and no
	// bundle file was given); every point's summary records it as target.bundle_digest.
	BundleDigest string
	// SweepPlots are the sweep's plots (throughput and p99 latency against the swept value,
	// throughput against latency), written into <OutDir>/<Name>-sweep when it has two points
	// or more.
	SweepPlots []string
	// Notes are what a reader must know to read the figures right (each point's summary
	// carries them too), e.g. NoServerRecordsNote.
	Notes       []string
	Environment provenance.Environment
	GPU         gpu.Inventory
	// FindMax is the search's outcome when ProfileInput.FindMax asked for one (also written
	// to <OutDir>/<Name>-sweep/summary.json and summary.md).
	FindMax *reports.FindMax
}

// Err joins the points' errors.
func (r *ProfileResult) Err() error {
	var errs []error
	for _, p := range r.Points {
		if p.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", filepath.Base(p.Dir), p.Err))
		}
	}
	return errors.Join(errs...)
}

// Artifact file names written next to the reports' exports in each run directory.
const (
	ClientRecordsFile = "client_records.jsonl"
	ServerRecordsFile = "server_records.jsonl"
	JoinedRecordsFile = "joined_records.jsonl"
	EnvironmentFile   = "environment.json"
	// ProvenanceFile holds the fingerprints taken before and after the point (written with
	// "before" alone when the point starts, so a run that dies keeps them); summary.json
	// refers to it rather than carrying a copy.
	ProvenanceFile = reports.ProvenanceFile
)

// Profile runs every sweep point of in and writes its run directory: the raw client and
// server records, the joined records, AIPerf-compatible exports and summaries (package
// reports), fingerprints before and after, the environment and a copy of the server logs.
// A point fails (PointResult.Err, and the returned error) when any request ID is unmatched
// between client and server records, or a fingerprinted file changed; its raw records are
// still written. Request-level errors do not fail a point: the caller's gate decides.
func Profile(ctx context.Context, in ProfileInput) (*ProfileResult, error) {
	if in.Endpoint == nil {
		return nil, errors.New("load.Profile: ProfileInput.Endpoint is nil; start a server with a launch.Launcher first")
	}
	if in.OutDir == "" {
		return nil, errors.New("load.Profile: ProfileInput.OutDir is empty")
	}
	if in.Load.Endpoint == EndpointImages {
		res, _, err := profileImages(ctx, in)
		return res, err
	}
	if in.FindMax != nil && (in.SLOs != "" || in.Load.FixedSchedule) {
		return nil, errors.New("load.Profile: ProfileInput.FindMax carries the SLOs and searches a rate or concurrency; leave ProfileInput.SLOs empty and Load.FixedSchedule off")
	}
	if in.Load.FixedSchedule {
		if len(in.Concurrencies) > 0 || len(in.RequestRates) > 0 {
			return nil, errors.New("load.Profile: a fixed schedule (Load.FixedSchedule) sends at the trace's timestamps; leave ProfileInput.Concurrencies and RequestRates empty")
		}
	} else if (len(in.Concurrencies) == 0) == (len(in.RequestRates) == 0) {
		return nil, errors.New("load.Profile: set exactly one of ProfileInput.Concurrencies and ProfileInput.RequestRates")
	}
	slos, err := metrics.ParseSLOs(in.SLOs)
	if err != nil {
		return nil, fmt.Errorf("load.Profile: SLOs: %w", err)
	}
	if in.Name == "" {
		in.Name = "profile"
	}
	if in.RecordsWait == 0 {
		in.RecordsWait = 5 * time.Second
	}
	if in.Load.BaseURL == "" {
		in.Load.BaseURL = in.Endpoint.BaseURL
	}
	if in.Load.Model == "" {
		in.Load.Model = in.Endpoint.Model
	}
	out, err := filepath.Abs(in.OutDir)
	if err != nil {
		return nil, fmt.Errorf("load.Profile: out dir: %w", err)
	}
	in.Fingerprint.Exclude = append(in.Fingerprint.Exclude, out)
	res := &ProfileResult{
		Environment: provenance.Env(ctx, in.Fingerprint.SourceRoot, in.Endpoint.Kind, in.Endpoint.Args, in.Endpoint.Env),
		GPU:         gpu.Inspect(),
	}
	if in.RequireGPU {
		if err := gpu.Require(res.GPU); err != nil {
			return res, err
		}
	}
	if in.MaxErrorRate != nil && (*in.MaxErrorRate < 0 || *in.MaxErrorRate > 1) {
		return res, fmt.Errorf("load.Profile: ProfileInput.MaxErrorRate %v must be within [0, 1]", *in.MaxErrorRate)
	}
	var points []sweepPoint
	if in.FindMax == nil {
		if points, err = sweepPlan(in, out); err != nil {
			return res, fmt.Errorf("load.Profile: %w", err)
		}
	}
	// Every point gets its own seed, base + its index in sweep order (repeats included), so
	// points differ yet the whole sweep repeats from the base alone; both are recorded.
	base := in.Load.Seed
	if base == 0 {
		base = newSeed()
	}
	res.BundleDigest = servedBundleDigest(ctx, in.Endpoint.BaseURL, in.Load.APIKey, in.Fingerprint.Bundle)
	if in.Endpoint.RecordsPath == "" {
		res.Notes = append(res.Notes, NoServerRecordsNote)
	}
	if in.FindMax != nil {
		if err := profileFindMax(ctx, in, out, base, res); err != nil {
			return res, errors.Join(res.Err(), err)
		}
		return res, res.Err()
	}
	clock := &sweepClock{total: len(points)}
	for i, p := range points {
		cfg := pointConfig(in.Load, p.sweep, base+uint64(i))
		cfg.ProgressLabel, cfg.ProgressSweep = clock.label(pointName(p), i), clock.eta
		clock.start()
		pr := profilePoint(ctx, in, cfg, p.sweep, p.dir, slos, base, res)
		clock.finish()
		res.Points = append(res.Points, pr)
		if ctx.Err() != nil {
			break
		}
	}
	if err := plotSweep(filepath.Join(out, in.Name+SweepDirSuffix), res); err != nil {
		return res, errors.Join(res.Err(), err)
	}
	return res, res.Err()
}

// sweepPoint is one run of a sweep: its point and its run directory, and which repeat of
// the point it is (0: not repeated).
type sweepPoint struct {
	sweep reports.SweepPoint
	dir   string
	rep   int
}

// pointConfig is the load of one sweep point: base with the point's concurrency or rate and
// seed.
func pointConfig(base Config, sp reports.SweepPoint, seed uint64) Config {
	cfg := base
	switch sp.Parameter {
	case "concurrency":
		cfg.Concurrency, cfg.RequestRate = int(sp.Value), 0
	case "request_rate":
		cfg.RequestRate = sp.Value
	}
	cfg.Seed = seed
	return cfg
}

// pointName names a point in the progress bar: "concurrency 4", "request_rate 2.5",
// "trace", with ", repeat k" for repeats.
func pointName(p sweepPoint) string {
	name := "trace"
	if p.sweep.Parameter != "fixed_schedule" {
		name = p.sweep.Parameter + " " + strconv.FormatFloat(p.sweep.Value, 'f', -1, 64)
	}
	if p.rep > 0 {
		name += ", repeat " + strconv.Itoa(p.rep)
	}
	return name
}

// sweepPlan lists the runs of a profile in order (each concurrency, then each rate, or the
// trace; each repeated in.Repeat times) with their run directories under out, refusing
// directories that already hold a run unless in.Overwrite.
func sweepPlan(in ProfileInput, out string) ([]sweepPoint, error) {
	var points []sweepPoint
	for _, c := range in.Concurrencies {
		points = append(points, sweepPoint{sweep: reports.SweepPoint{Parameter: "concurrency", Value: float64(c)}, dir: fmt.Sprintf("%s-c%d", in.Name, c)})
	}
	for _, r := range in.RequestRates {
		points = append(points, sweepPoint{sweep: reports.SweepPoint{Parameter: "request_rate", Value: r}, dir: fmt.Sprintf("%s-r%s", in.Name, strconv.FormatFloat(r, 'f', -1, 64))})
	}
	if in.Load.FixedSchedule {
		points = append(points, sweepPoint{sweep: reports.SweepPoint{Parameter: "fixed_schedule", Value: 1}, dir: in.Name + "-trace"})
	}
	if in.Repeat < 0 {
		return nil, fmt.Errorf("ProfileInput.Repeat %d must not be negative", in.Repeat)
	}
	if in.Repeat > 1 {
		var reps []sweepPoint
		for _, p := range points {
			for k := 1; k <= in.Repeat; k++ {
				reps = append(reps, sweepPoint{p.sweep, fmt.Sprintf("%s-rep%d", p.dir, k), k})
			}
		}
		points = reps
	}
	for i := range points {
		points[i].dir = filepath.Join(out, points[i].dir)
	}
	if !in.Overwrite {
		dirs := []string{filepath.Join(out, in.Name+SweepDirSuffix)}
		for _, p := range points {
			dirs = append(dirs, p.dir)
		}
		for _, d := range dirs {
			if err := RefuseExistingRun(d); err != nil {
				return nil, err
			}
		}
	}
	return points, nil
}

// SweepDirSuffix names the folder beside a sweep's run directories (<Name>-sweep) that holds
// its sweep plots (reports.PlotSweep), written when the sweep has two points or more.
const SweepDirSuffix = "-sweep"

// plotSweep writes the sweep plots of res's points that have valid requests into dir and
// lists them in res.SweepPlots; a sweep of fewer than two such points has nothing to plot.
func plotSweep(dir string, res *ProfileResult) error {
	var sums []*reports.Summary
	for _, p := range res.Points {
		if p.Summary == nil || p.Summary.Sweep == nil || p.Summary.Sweep.Parameter == "fixed_schedule" {
			continue
		}
		if _, ok := p.Summary.Profiling.Metrics[reports.TagRequestLatency]; ok { // a point with no valid request has nothing to plot
			sums = append(sums, p.Summary)
		}
	}
	if len(sums) < 2 {
		return nil
	}
	// In order of the swept value: a find-max search profiles its points out of order.
	sort.SliceStable(sums, func(i, j int) bool { return sums[i].Sweep.Value < sums[j].Sweep.Value })
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sweep plots: %w", err)
	}
	names, err := reports.PlotSweep(dir, sums)
	for _, n := range names {
		res.SweepPlots = append(res.SweepPlots, filepath.Join(dir, n))
	}
	if err != nil {
		return fmt.Errorf("sweep plots in %s: %w", dir, err)
	}
	return nil
}

func profilePoint(ctx context.Context, in ProfileInput, cfg Config, sweep reports.SweepPoint, dir string, slos []reports.SLO, baseSeed uint64, pres *ProfileResult) PointResult {
	pr := PointResult{Dir: dir, Sweep: sweep}
	fail := func(err error) {
		if err != nil {
			pr.Err = errors.Join(pr.Err, err)
		}
	}
	before, watch, err := pointStart(ctx, in.Fingerprint, dir)
	if err != nil {
		pr.Err = err
		return pr
	}
	watching := true
	defer func() {
		if watching {
			_ = watch.Stop()
		}
	}()
	fail(writeJSON(filepath.Join(dir, EnvironmentFile), struct {
		provenance.Environment
		GPU gpu.Inventory `json:"gpu"`
	}{pres.Environment, pres.GPU}))

	recOffset := fileSize(in.Endpoint.RecordsPath)
	var cpuStart, cpuEnd procCPU
	// The server's engine steps over the profiling phase, where it exports them.
	var stepsStart, stepsEnd reports.EngineSteps
	var stepsOK bool
	userHook := cfg.OnPhase
	cfg.OnPhase = func(phase string, start bool) {
		if phase == records.PhaseProfiling && in.Endpoint.PID > 0 {
			if start {
				cpuStart = readProcCPU(in.Endpoint.PID)
			} else {
				cpuEnd = readProcCPU(in.Endpoint.PID)
			}
		}
		if phase == records.PhaseProfiling {
			es, ok := readEngineSteps(ctx, in.Endpoint.BaseURL)
			if start {
				stepsStart, stepsOK = es, ok
			} else {
				stepsEnd, stepsOK = es, stepsOK && ok
			}
		}
		if userHook != nil {
			userHook(phase, start)
		}
	}
	sampler, err := gpu.StartSampler(in.GPUIndices, 0, in.RequireGPU)
	if err != nil {
		pr.Err = err
		return pr
	}
	lr, runErr := Run(ctx, cfg)
	tel := sampler.Stop()
	pr.Load = lr
	fail(runErr)
	if lr == nil {
		return pr
	}
	fail(records.WriteJSONL(filepath.Join(dir, ClientRecordsFile), lr.Records))

	// Join with the server's records of this point.
	var joined *records.Joined
	if in.Endpoint.RecordsPath != "" {
		sv, err := waitServerRecords(ctx, in.Endpoint.RecordsPath, recOffset, lr.Records, in.RecordsWait)
		fail(records.WriteJSONL(filepath.Join(dir, ServerRecordsFile), sv))
		if err != nil {
			fail(err)
		} else {
			j, jerr := records.Join(lr.Records, sv)
			joined = j
			fail(jerr)
			if j != nil {
				fail(records.WriteJSONL(filepath.Join(dir, JoinedRecordsFile), j.Requests))
			}
		}
	}
	pr.Joined = joined

	watching = false
	fail(watch.Stop())
	provRef, err := provenanceAfter(ctx, in.Fingerprint, dir, before)
	fail(err)
	copyLogs(in.Endpoint.LogPaths, dir)

	// Exports through package reports.
	open := cfg.RequestRate > 0 || cfg.FixedSchedule || metrics.HasSchedule(lr.Records)
	exp := metrics.Export(lr.Records, joined, metrics.Options{ScheduleLateness: open})
	outTok := 0
	for i := range lr.Records {
		if lr.Records[i].Phase == records.PhaseProfiling && !lr.Records[i].Failed() {
			outTok += lr.Records[i].OutputTokens()
		}
	}
	tel.PerToken(outTok)
	cost := &reports.ServingCost{ClientCPUNs: int64(lr.ClientCPU)}
	if cpuEnd.ok && cpuStart.ok {
		cost.FrontendCPUNs = cpuEnd.frontend - cpuStart.frontend
		cost.WorkerCPUNs = cpuEnd.workers - cpuStart.workers
	}
	inputCfg := in.InputConfig
	if inputCfg == nil {
		inputCfg = describeConfig(cfg, lr)
	}
	run := &reports.Run{
		Name:      filepath.Base(dir),
		Records:   exp,
		SLOs:      slos,
		Cost:      cost,
		Sweep:     &sweep,
		StartTime: time.Unix(0, lr.StartUnixNs),
		EndTime:   time.Unix(0, lr.StartUnixNs+lr.ProfilingEndNs),
	}
	run.InputConfig = mustJSON(aiperfInputConfig(cfg, lr, sweep, baseSeed, inputCfg))
	run.Target = target(in, pres.Environment, pres.BundleDigest)
	run.Target.Pacer = lr.Pacer
	run.WasCancelled = ctx.Err() != nil
	run.Environment = mustJSON(struct {
		provenance.Environment
		GPU gpu.Inventory `json:"gpu"`
	}{pres.Environment, pres.GPU})
	run.Provenance = provRef
	run.Seed = &reports.SeedUse{Base: baseSeed, Used: lr.Seed}
	run.Notes = pres.Notes
	run.GPUTelemetry = mustJSON(tel)
	if stepsOK {
		run.EngineSteps, err = stepsEnd.Since(stepsStart)
		fail(err)
	}
	sum, err := reports.WriteRun(dir, run)
	fail(err)
	pr.Summary = sum
	pr.exp = exp
	if in.FindMax == nil {
		fail(checkSuccess(lr.Records, cfg.BaseURL, in.MaxErrorRate))
	} else {
		// A search's points fail by their SLOs (failed requests count as missing them), so
		// that a load past the server's limit is an answer, not an error; the search decides
		// what a point none of whose requests succeeded means (findmax.go).
		pr.noneSucceeded = checkSuccess(lr.Records, cfg.BaseURL, nil)
	}
	return pr
}

// checkSuccess fails a point none of whose measured requests succeeded, or (with max set)
// more of whose measured requests failed than max allows; planned cancellations are the
// run's own doing and count neither way. The message names the commonest error so the
// user sees why at once.
func checkSuccess(recs []records.Request, url string, max *float64) error {
	var n, ok int
	errs := map[string]int{}
	for i := range recs {
		r := &recs[i]
		if r.Phase != records.PhaseProfiling || r.Cancelled {
			continue
		}
		n++
		if !r.Failed() {
			ok++
			continue
		}
		errs[fmt.Sprintf("%d %s: %s", r.Error.Code, r.Error.Type, r.Error.Message)]++
	}
	if n == 0 {
		return nil
	}
	top, topN := "", 0
	for e, c := range errs {
		if c > topN || c == topN && e < top {
			top, topN = e, c
		}
	}
	if ok == 0 {
		return fmt.Errorf("0 of %d requests succeeded against %s (%d× %q); fix the request or the server, the records are kept", n, url, topN, top)
	}
	if max != nil {
		rate := float64(n-ok) / float64(n)
		if rate > *max {
			return fmt.Errorf("%d of %d requests failed (error rate %.3g > --max-error-rate %.3g; commonest: %d× %q)", n-ok, n, rate, *max, topN, top)
		}
	}
	return nil
}

// RefuseExistingRun returns an error when dir already holds a run (any file in it), so a
// new run never silently replaces one; nil when dir is absent or empty.
func RefuseExistingRun(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("check run directory %s: %w", dir, err)
	}
	if len(ents) == 0 {
		return nil
	}
	return fmt.Errorf("%s already holds a run (%s, ...); pass a new --out or --name, or --overwrite to replace it", dir, ents[0].Name())
}

// target names the server, URL, model, bundle (with its digest) and source commit for
// summary.md.
func target(in ProfileInput, env provenance.Environment, digest string) *reports.Target {
	t := &reports.Target{URL: in.Endpoint.BaseURL, Model: in.Load.Model, Bundle: in.Fingerprint.Bundle,
		BundleDigest: digest, Commit: env.SourceRevision, Dirty: env.Dirty}
	switch in.Endpoint.Kind {
	case "external":
		t.Server = "external"
	case "":
		t.Server = "unknown"
	default:
		t.Server = "qual-server (" + in.Endpoint.Kind + ")"
	}
	return t
}

// servedBundleDigest is the digest of the bundle a server serves: what a qual-server answers
// at /mq/v1/bundle (the bundle it verified and logged), else, given the bundle's path, the
// file's own digest (bundle.Open verifies it); "" when neither says.
func servedBundleDigest(ctx context.Context, baseURL, apiKey, path string) string {
	if baseURL != "" && !strings.HasPrefix(baseURL, "grpc://") {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/mq/v1/bundle", nil)
		if err == nil {
			if apiKey != "" {
				req.Header.Set("Authorization", "Bearer "+apiKey)
			}
			if resp, err := http.DefaultClient.Do(req); err == nil {
				var b struct {
					Digest string `json:"bundle_digest"`
				}
				ok := resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&b) == nil && b.Digest != ""
				resp.Body.Close()
				if ok {
					return b.Digest
				}
			}
		}
	}
	if path == "" {
		return ""
	}
	b, err := bundle.Open(path)
	if err != nil {
		return ""
	}
	defer b.Close()
	return b.Digest()
}

// pointStart prepares a point's run directory: it creates it, takes the fingerprints before
// (written to provenance.json at once, so a run that dies keeps them) and starts the watcher,
// which re-stats the fingerprinted files every second while the point runs, so that a file
// changed and changed back (A to B to A), which before/after alone cannot see, is caught.
func pointStart(ctx context.Context, spec provenance.Spec, dir string) (*provenance.Fingerprints, *provenance.Watcher, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create run directory: %w", err)
	}
	before, err := provenance.Take(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	if err := writeJSON(filepath.Join(dir, ProvenanceFile), provenanceDoc{Before: before}); err != nil {
		return nil, nil, err
	}
	return before, provenance.Watch(before, time.Second), nil
}

// provenanceAfter takes the fingerprints after a point, writes provenance.json with those
// before, and returns summary.json's reference to it; the error says what changed (or could
// not be fingerprinted or written), the reference is returned whatever it says.
func provenanceAfter(ctx context.Context, spec provenance.Spec, dir string, before *provenance.Fingerprints) (json.RawMessage, error) {
	after, err := provenance.Take(ctx, spec)
	var changed error
	if err == nil {
		changed = provenance.Compare(before, after)
	}
	ref, werr := writeProvenance(dir, before, after, changed)
	return ref, errors.Join(err, changed, werr)
}

// provenanceDoc is provenance.json: the fingerprints before and after a point and, when a
// fingerprinted file changed, what changed.
type provenanceDoc struct {
	Before  *provenance.Fingerprints `json:"before"`
	After   *provenance.Fingerprints `json:"after,omitempty"`
	Changed string                   `json:"changed,omitempty"`
}

// writeProvenance writes provenance.json into dir and returns summary.json's provenance
// field: a reference to the file (its name and sha256), how many files were fingerprinted
// and whether they all held, so summary.json stays small while the fingerprints are kept.
func writeProvenance(dir string, before, after *provenance.Fingerprints, changed error) (json.RawMessage, error) {
	doc := provenanceDoc{Before: before, After: after}
	if changed != nil {
		doc.Changed = changed.Error()
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", ProvenanceFile, err)
	}
	b = append(b, '\n')
	if err := os.WriteFile(filepath.Join(dir, ProvenanceFile), b, 0o644); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	files := 0
	if before != nil {
		files = len(before.Files)
	}
	return mustJSON(map[string]any{"file": ProvenanceFile, "sha256": hex.EncodeToString(sum[:]), "files": files,
		"unchanged": after != nil && changed == nil}), nil
}

// aiperfInputConfig is the exports' input_config in AIPerf's UserConfig layout (endpoint,
// loadgen, input sections with AIPerf's field names), so scripts reading AIPerf's
// input_config.endpoint.model_names or input_config.loadgen.concurrency read ours; the full
// settings this run was made with follow under mq_config, the sweep point under mq_point.
// input.random_seed is the seed this point used; input.mq_base_seed the sweep's, from which
// it was derived (so mq_config's seed, the flag as given, is the base).
func aiperfInputConfig(cfg Config, lr *Result, sweep reports.SweepPoint, baseSeed uint64, full any) map[string]any {
	endpointType := cfg.Endpoint
	loadgen := map[string]any{
		"request_count":        cfg.Requests,
		"warmup_request_count": cfg.Warmup,
	}
	if cfg.Duration > 0 {
		loadgen["benchmark_duration"] = cfg.Duration.Seconds()
	}
	if cfg.RampUp > 0 { // AIPerf's names for the ramp (seconds)
		if cfg.RequestRate > 0 {
			loadgen["request_rate_ramp_duration"] = cfg.RampUp.Seconds()
		} else {
			loadgen["concurrency_ramp_duration"] = cfg.RampUp.Seconds()
		}
	}
	if cfg.RequestRate > 0 {
		loadgen["request_rate"] = cfg.RequestRate
		loadgen["request_rate_mode"] = cfg.Arrival
		if cfg.MaxConcurrency > 0 {
			loadgen["concurrency"] = cfg.MaxConcurrency
		}
	} else {
		loadgen["concurrency"] = cfg.Concurrency
	}
	if cfg.CancelRate > 0 {
		loadgen["request_cancellation_rate"] = cfg.CancelRate * 100 // AIPerf: percent
		loadgen["request_cancellation_delay"] = cfg.CancelDelay.Seconds()
	}
	input := map[string]any{"random_seed": lr.Seed, "mq_base_seed": baseSeed, "fixed_schedule": cfg.FixedSchedule}
	if len(cfg.Sessions) > 0 {
		input["conversation_num"] = len(cfg.Sessions)
	}
	if len(cfg.Extra) > 0 {
		input["extra"] = cfg.Extra // AIPerf's input.extra: its --extra-inputs
	}
	return map[string]any{
		"endpoint": map[string]any{
			"model_names": []string{cfg.Model},
			"type":        endpointType,
			"streaming":   cfg.Stream,
			"url":         cfg.BaseURL,
		},
		"loadgen":   loadgen,
		"input":     input,
		"mq_config": full,
		"mq_point":  sweep,
	}
}

// describeConfig is the input_config recorded when the caller gave none. Prompts with output
// lengths of their own (a manifest's output_tokens_stddev, an input file's output_length) add
// them in prompt order, since output_tokens alone would not say what was asked for.
func describeConfig(cfg Config, lr *Result) map[string]any {
	d := map[string]any{
		"endpoint": cfg.Endpoint, "stream": cfg.Stream, "concurrency": cfg.Concurrency,
		"request_rate": cfg.RequestRate, "arrival": cfg.Arrival, "max_concurrency": cfg.MaxConcurrency,
		"requests": cfg.Requests, "duration": cfg.Duration.String(), "warmup": cfg.Warmup,
		"prompts": len(cfg.Prompts), "output_tokens": cfg.OutputTokens, "cancel_rate": cfg.CancelRate,
		"cancel_delay": cfg.CancelDelay.String(), "seed": lr.Seed, "model": cfg.Model, "url": cfg.BaseURL,
		"extra_body": reports.CanonicalExtraBody(cfg.Extra), "ramp_up": cfg.RampUp.String(),
	}
	own, some := make([]int, len(cfg.Prompts)), false
	for i, p := range cfg.Prompts {
		own[i], some = p.OutputTokens, some || p.OutputTokens > 0
	}
	if some {
		d["prompt_output_tokens"] = own
	}
	return d
}

// waitServerRecords reads the server records appended since offset, waiting (up to wait)
// until every client request has one: servers write a record when a request ends on their
// side, which for a cancelled request can be a little after the client gave up. Only the
// load routes are kept (/v1/completions, /v1/chat/completions).
func waitServerRecords(ctx context.Context, path string, offset int64, cl []records.Request, wait time.Duration) ([]records.Server, error) {
	want := make(map[string]bool, len(cl))
	for _, r := range cl {
		want[r.RequestID] = true
	}
	deadline := time.Now().Add(wait)
	delay := 5 * time.Millisecond
	for {
		sv, err := readServerFrom(path, offset)
		if err != nil {
			return sv, err
		}
		have := 0
		for _, s := range sv {
			if want[s.RequestID] {
				have++
			}
		}
		if have >= len(want) || time.Now().After(deadline) || ctx.Err() != nil {
			return sv, nil
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// readServerFrom decodes the load routes' records (completions, chat, gRPC Generate) in
// complete JSONL lines after offset.
func readServerFrom(path string, offset int64) ([]records.Server, error) {
	return readRecordsFrom(path, offset, func(s *records.Server) bool {
		return s.Route == "/v1/completions" || s.Route == "/v1/chat/completions" || s.Route == grpcGenerateRoute
	})
}

// readRecordsFrom decodes complete JSONL lines after offset (a last line still being written
// is left for the next read) and keeps the records keep accepts.
func readRecordsFrom(path string, offset int64, keep func(*records.Server) bool) ([]records.Server, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read server records: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read server records %s: %w", path, err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read server records %s: %w", path, err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	sv, err := records.DecodeJSONL[records.Server](bytes.NewReader(b))
	if err != nil {
		return sv, fmt.Errorf("read server records %s (from byte %d): %w", path, offset, err)
	}
	var out []records.Server
	for i := range sv {
		if keep(&sv[i]) {
			out = append(out, sv[i])
		}
	}
	return out, nil
}

func fileSize(path string) int64 {
	if path == "" {
		return 0
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

func copyLogs(paths []string, dir string) {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		_ = os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o644)
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage(strconv.Quote(err.Error()))
	}
	return b
}

// procCPU is CPU time of a server process (frontend) and its descendants (workers).
type procCPU struct {
	frontend, workers int64
	ok                bool
}

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 100

// readProcCPU reads utime+stime of pid and of every process whose parent chain reaches pid.
func readProcCPU(pid int) procCPU {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return procCPU{}
	}
	type st struct {
		ppid int
		cpu  int64
	}
	all := map[int]st{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, cpu, ok := statCPU(p)
		if ok {
			all[p] = st{ppid, cpu}
		}
	}
	root, ok := all[pid]
	if !ok {
		return procCPU{}
	}
	res := procCPU{frontend: cpuNs(pid, root.cpu), ok: true}
	for p, s := range all {
		if p == pid {
			continue
		}
		for q, hops := s.ppid, 0; q > 1 && hops < 16; hops++ {
			if q == pid {
				res.workers += cpuNs(p, s.cpu)
				break
			}
			q = all[q].ppid
		}
	}
	return res
}

// cpuNs is a process's CPU time in ns from its threads' schedstat (nanosecond resolution),
// or the clock-tick figure from stat when schedstat is unavailable: at 10 ms a tick, short
// profiling windows would otherwise read as zero.
func cpuNs(pid int, fromStat int64) int64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fromStat
	}
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			return fromStat
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return fromStat
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return fromStat
		}
		total += v
	}
	if total == 0 {
		return fromStat // schedstat present but not collected
	}
	return total
}

// statCPU parses /proc/<pid>/stat: ppid (field 4) and utime+stime (fields 14, 15) in ns.
func statCPU(pid int) (ppid int, cpuNs int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name (field 2) may hold spaces; fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, (ut + stt) * int64(time.Second/clockTick), true
}
