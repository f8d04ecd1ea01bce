package spec

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// LoadInput is the input of LoadProfile and CheckLoad.
type LoadInput struct {
	// Endpoint is the suite's server (its records file is joined to the client records).
	Endpoint *launch.Endpoint
	// Profile is one of the manifest's profiles: the sweep, the request shape, the warmup
	// and the SLOs.
	Profile manifest.Profile
	// Tokenizer cuts synthetic prompts of the profile's input length and counts output tokens
	// on the client side (text endpoints).
	Tokenizer *tokenizer.Tokenizer
	// InputFile is the profile's input_file resolved (endpoint images: the requests and their
	// controls; fingerprinted with the rest).
	InputFile string
	// ImageDir is the profile's images.dir resolved (chat profiles with images from files).
	ImageDir string
	// OutDir receives one AIPerf-compatible run directory per sweep point.
	OutDir string
	// RequestTimeout bounds each request (the manifest's server.request_timeout).
	RequestTimeout time.Duration
	// Fingerprint names what must not change during the run (bundle, tokenizer, source).
	Fingerprint provenance.Spec
	// MixWarmupIntoMeasurement plants the "warmup mixed into measurement" defect in the load
	// generator; only the test proving that this gate bites sets it.
	MixWarmupIntoMeasurement bool
	// GPUIndices are the NVML indices of the server's GPUs, sampled during every point (nil:
	// all visible); RequireGPU makes missing telemetry a failure and adds the GPU figures
	// (memory high-water, utilization, power, energy, joules per output token).
	GPUIndices []int
	RequireGPU bool
}

// Figure is one number a load gate reports (and attaches to the JUnit report).
type Figure struct {
	Profile string  `json:"profile"`
	Point   string  `json:"point"` // sweep point, e.g. "concurrency=4"
	Name    string  `json:"name"`  // e.g. "mq_http_latency.p95"
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
}

// LoadResult is what CheckLoad measured.
type LoadResult struct {
	Profile *load.ProfileResult
	Figures []Figure
	// Dirs are the run directories, one per sweep point.
	Dirs []string
	// Verified says, per run directory, how many reported figures qual/recount recomputed
	// from the raw client records and whether they all agreed.
	Verified []string
}

// headline lists the figures every load gate reports: HTTP latency and TTFT percentiles,
// the native task time beside HTTP latency and their difference, and throughputs.
var headline = []struct{ tag, stat string }{
	{reports.TagHTTPLatency, "p50"}, {reports.TagHTTPLatency, "p95"}, {reports.TagHTTPLatency, "p99"},
	{reports.TagTTFT, "p50"}, {reports.TagTTFT, "p99"},
	{reports.TagTaskWallTime, "p50"}, {reports.TagHTTPMinusTask, "p50"}, {reports.TagHTTPMinusTask, "p95"},
	{reports.TagOutputTokenThroughput, "avg"}, {reports.TagRequestThroughput, "avg"},
}

// CheckLoad is LoadProfile's core. It synthesizes prompts of the profile's input length, runs
// the warmup and then every sweep point (closed-loop concurrencies or open-loop request
// rates) through qual/load, and requires for every point: zero failed requests; every client
// request ID matched by exactly one server record (the join); the warmup recorded apart and
// exactly the profile's request count measured; the AIPerf-compatible exports written; and
// every percentile SLO of the profile (e.g. ttft_p99: 1s) met.
func CheckLoad(ctx context.Context, in LoadInput) (*LoadResult, error) {
	const fn = "spec.CheckLoad"
	p := in.Profile
	switch {
	case in.Endpoint == nil:
		return nil, fmt.Errorf("%s: LoadInput.Endpoint is nil; pass the suite's endpoint", fn)
	case in.Tokenizer == nil && p.Endpoint != "images":
		return nil, fmt.Errorf("%s: LoadInput.Tokenizer is nil", fn)
	case in.OutDir == "":
		return nil, fmt.Errorf("%s: LoadInput.OutDir is empty", fn)
	case p.Name == "":
		return nil, fmt.Errorf("%s: LoadInput.Profile.Name is empty; pass a profile of the manifest", fn)
	case (len(p.Concurrency) == 0) == (len(p.RequestRate) == 0):
		return nil, fmt.Errorf("%s: LoadInput.Profile %q must set exactly one of concurrency and request_rate", fn, p.Name)
	}
	percentileSLOs, goodputSLOs, err := splitSLOs(p.SLO)
	if err != nil {
		return nil, fmt.Errorf("%s: profile %q: %w", fn, p.Name, err)
	}
	if p.Endpoint == "images" {
		return checkImageLoad(ctx, in, percentileSLOs)
	}
	prompts, err := load.Synthetic(in.Tokenizer, load.SyntheticOptions{Count: 64, Mean: p.InputTokensMean, Stddev: p.InputTokensStddev, Seed: 1})
	if err != nil {
		return nil, fmt.Errorf("%s: profile %q: synthetic prompts: %w", fn, p.Name, err)
	}
	if im := p.Images; im != nil {
		opt := load.ImageOptions{Dir: in.ImageDir, WidthMean: im.WidthMean, HeightMean: im.HeightMean, WidthStddev: im.WidthStddev,
			HeightStddev: im.HeightStddev, Format: im.Format, Seed: 1, Fraction: im.Fraction, PerRequest: im.PerRequest}
		if opt.Format == "" {
			opt.Format = "png"
		}
		if prompts, err = load.WithImages(prompts, opt); err != nil {
			return nil, fmt.Errorf("%s: profile %q: images: %w", fn, p.Name, err)
		}
	}
	if p.OutputTokensStddev > 0 {
		if prompts, err = load.DrawOutputLengths(prompts, p.OutputTokens, p.OutputTokensStddev, 1); err != nil {
			return nil, fmt.Errorf("%s: profile %q: output lengths: %w", fn, p.Name, err)
		}
	}
	endpoint := "completions"
	if p.Endpoint == "chat" {
		endpoint = "chat"
	}
	pr, perr := load.Profile(ctx, load.ProfileInput{
		Endpoint: in.Endpoint,
		Load: load.Config{
			Endpoint: endpoint, Stream: p.Stream, MaxConcurrency: p.MaxConcurrency,
			Requests: p.Requests, Duration: p.Duration.Duration, Warmup: p.Warmup,
			Prompts: prompts, OutputTokens: p.OutputTokens, Seed: 7,
			Extra:     map[string]any{"temperature": 0},
			Tokenizer: in.Tokenizer, RequestTimeout: in.RequestTimeout,
			MixWarmupIntoMeasurement: in.MixWarmupIntoMeasurement,
		},
		Concurrencies: p.Concurrency,
		RequestRates:  p.RequestRate,
		OutDir:        in.OutDir,
		Name:          p.Name,
		SLOs:          goodputSLOs,
		Fingerprint:   in.Fingerprint,
		GPUIndices:    in.GPUIndices,
		RequireGPU:    in.RequireGPU,
	})
	res := &LoadResult{Profile: pr}
	if pr == nil {
		return res, fmt.Errorf("load gate: profile %q: %w", p.Name, perr)
	}
	var problems []string
	if perr != nil {
		problems = append(problems, perr.Error())
	}
	for _, pt := range pr.Points {
		res.Dirs = append(res.Dirs, pt.Dir)
		label := fmt.Sprintf("%s=%s", pt.Sweep.Parameter, strconv.FormatFloat(pt.Sweep.Value, 'f', -1, 64))
		problems = append(problems, checkPoint(p, label, pt, in.Endpoint.RecordsPath != "")...)
		if in.RequireGPU {
			figs, problem := gpuFigures(p.Name, label, pt)
			res.Figures = append(res.Figures, figs...)
			if problem != "" {
				problems = append(problems, problem)
			}
		}
		if pt.Summary == nil {
			continue
		}
		for _, h := range headline {
			if v, ok := pt.Summary.Profiling.Stat(h.tag, h.stat); ok {
				unit := pt.Summary.Profiling.Metrics[h.tag].Unit
				res.Figures = append(res.Figures, Figure{Profile: p.Name, Point: label, Name: h.tag + "." + h.stat, Value: v, Unit: unit})
			}
		}
		for _, s := range percentileSLOs {
			v, ok := pt.Summary.Profiling.Stat(s.tag, s.stat)
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: SLO %s: the run has no %s.%s", label, s.spec, s.tag, s.stat))
			case v > s.limitMs:
				problems = append(problems, fmt.Sprintf("%s: SLO %s missed: %s.%s is %.3g ms", label, s.spec, s.tag, s.stat, v))
			}
		}
	}
	verified, bad := verifyRuns(res.Dirs) // every figure recomputed apart (verify.go)
	res.Verified, problems = verified, append(problems, bad...)
	if len(problems) > 0 {
		return res, fmt.Errorf("load gate: profile %q:\n  %s", p.Name, strings.Join(problems, "\n  "))
	}
	return res, nil
}

// checkPoint checks one sweep point's records and artifacts. joined says whether the server
// writes records the harness reads (not so for an external server).
func checkPoint(p manifest.Profile, label string, pt load.PointResult, joined bool) []string {
	var out []string
	if pt.Load == nil {
		return []string{fmt.Sprintf("%s: no requests were recorded", label)}
	}
	var warm, measured, failed int
	var firstFail string
	for i := range pt.Load.Records {
		r := &pt.Load.Records[i]
		switch r.Phase {
		case records.PhaseWarmup:
			warm++
		case records.PhaseProfiling:
			measured++
		}
		if r.Failed() {
			failed++
			if firstFail == "" {
				firstFail = fmt.Sprintf("%s (HTTP %d)", r.RequestID, r.HTTPStatus)
				if r.Error != nil {
					firstFail += ": " + r.Error.Message
				}
			}
		}
	}
	if failed > 0 {
		out = append(out, fmt.Sprintf("%s: %d of %d requests failed, first %s", label, failed, len(pt.Load.Records), firstFail))
	}
	if warm != p.Warmup {
		out = append(out, fmt.Sprintf("%s: %d requests recorded as warmup, the profile asks for %d: warmup is mixed into measurement", label, warm, p.Warmup))
	}
	if p.Requests > 0 && p.Duration.Duration == 0 && measured != p.Requests {
		out = append(out, fmt.Sprintf("%s: %d requests measured, the profile asks for %d (plus %d warmup)", label, measured, p.Requests, p.Warmup))
	}
	if pt.Summary != nil {
		if n := pt.Summary.Profiling.Requests; n != measured {
			out = append(out, fmt.Sprintf("%s: the profiling statistics cover %d requests, %d were measured", label, n, measured))
		}
		if n := pt.Summary.Warmup.Requests; n != warm {
			out = append(out, fmt.Sprintf("%s: the warmup statistics cover %d requests, %d were warmup", label, n, warm))
		}
	}
	artifacts := []string{reports.ProfileExportJSONL, reports.AIPerfJSONFile, reports.AIPerfCSVFile, load.ClientRecordsFile}
	if joined {
		artifacts = append(artifacts, load.ServerRecordsFile, load.JoinedRecordsFile)
	}
	missing := false
	for _, f := range artifacts {
		if st, err := os.Stat(filepath.Join(pt.Dir, f)); err != nil || st.Size() == 0 {
			out = append(out, fmt.Sprintf("%s: artifact %s missing or empty in %s", label, f, pt.Dir))
			missing = true
		}
	}
	if !missing {
		for _, p := range checkExportPercentiles(pt.Dir) {
			out = append(out, label+": "+p)
		}
	}
	return out
}

type percentileSLO struct {
	spec, tag, stat string
	limitMs         float64
}

// sloMetric maps the short metric names of manifest SLO keys to report tags.
var sloMetric = map[string]string{
	"ttft": reports.TagTTFT, "ttst": reports.TagTTST, "itl": reports.TagITL,
	"e2el": reports.TagRequestLatency, "latency": reports.TagRequestLatency,
	"http": reports.TagHTTPLatency, "queue_wait": reports.TagQueueWait,
}

var statSuffix = regexp.MustCompile(`^(.+)_(p[0-9]{1,2}|avg)$`)

// splitSLOs separates a profile's SLO map into percentile gates ("ttft_p99: 1s": the p99 of
// time to first token must not exceed 1 s) and per-request goodput SLOs ("ttft: 200ms", in
// qual/metrics.ParseSLOs syntax), which only feed the goodput figure.
func splitSLOs(m map[string]string) ([]percentileSLO, string, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var gates []percentileSLO
	var goodput []string
	for _, k := range keys {
		v := m[k]
		sm := statSuffix.FindStringSubmatch(k)
		if sm == nil {
			goodput = append(goodput, k+":"+v)
			continue
		}
		tag, ok := sloMetric[sm[1]]
		if !ok {
			if _, known := reports.LookupMetric(sm[1]); !known {
				return nil, "", fmt.Errorf("slo %q: unknown metric %q; use ttft, ttst, itl, e2el, http, queue_wait or a report tag", k, sm[1])
			}
			tag = sm[1]
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, "", fmt.Errorf("slo %q: limit %q is not a duration like 500ms", k, v)
		}
		gates = append(gates, percentileSLO{spec: k + ": " + v, tag: tag, stat: sm[2], limitMs: float64(d) / 1e6})
	}
	return gates, strings.Join(goodput, ","), nil
}

// checkImageLoad is CheckLoad for endpoint images (/v1/images/generations): the input file's
// requests with their controls through qual/load.ProfileImages (warmup apart, records joined by
// request ID, served PNG sha256 equal to the server record's, fingerprints before and after),
// and for every point zero errors, zero unmatched IDs, the profile's warmup and request
// counts, and the percentile SLOs on HTTP latency (http_pNN / latency_pNN).
func checkImageLoad(ctx context.Context, in LoadInput, slos []percentileSLO) (*LoadResult, error) {
	p := in.Profile
	if in.InputFile == "" {
		return nil, fmt.Errorf("spec.CheckLoad: profile %q: endpoint images needs LoadInput.InputFile (the manifest's input_file)", p.Name)
	}
	fp := in.Fingerprint
	fp.Inputs = append([]string{in.InputFile}, fp.Inputs...) // ProfileImages reads Inputs[0]
	dir := filepath.Join(in.OutDir, p.Name)
	// GPU telemetry over the whole profile (ProfileImages has no per-point sampler): on a GPU
	// run it is required, as for the text profiles.
	sampler, err := gpu.StartSampler(in.GPUIndices, 0, in.RequireGPU)
	if err != nil {
		return nil, fmt.Errorf("load gate: profile %q: %w", p.Name, err)
	}
	points, perr := load.ProfileImages(ctx, load.ProfileInput{
		Endpoint: in.Endpoint,
		Load: load.Config{Requests: p.Requests, Duration: p.Duration.Duration, Warmup: p.Warmup,
			RequestTimeout: in.RequestTimeout},
		Concurrencies: p.Concurrency,
		RequestRates:  p.RequestRate,
		OutDir:        dir,
		Name:          p.Name,
		Fingerprint:   fp,
	}, io.Discard)
	tel := sampler.Stop()
	res := &LoadResult{Dirs: []string{dir}}
	var problems []string
	if perr != nil {
		problems = append(problems, perr.Error())
	}
	if in.RequireGPU {
		figs, problem := imageGPUFigures(p.Name, tel, points)
		res.Figures = append(res.Figures, figs...)
		if problem != "" {
			problems = append(problems, problem)
		}
	}
	if len(points) == 0 && perr == nil {
		problems = append(problems, "the profile ran no sweep point")
	}
	for _, pt := range points {
		label := fmt.Sprintf("concurrency=%d", pt.Concurrency)
		if pt.Concurrency == 0 {
			label = "request_rate=" + strconv.FormatFloat(pt.RequestRate, 'f', -1, 64)
		}
		if pt.Errors > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d of %d requests failed", label, pt.Errors, pt.Requests))
		}
		if pt.UnmatchedIDs > 0 || pt.SHAMismatches > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d requests without a server record, %d PNG sha256 mismatches", label, pt.UnmatchedIDs, pt.SHAMismatches))
		}
		if pt.WarmupRequests != p.Warmup {
			problems = append(problems, fmt.Sprintf("%s: %d warmup requests, the profile asks for %d", label, pt.WarmupRequests, p.Warmup))
		}
		if p.Requests > 0 && p.Duration.Duration == 0 && pt.Requests != p.Requests {
			problems = append(problems, fmt.Sprintf("%s: %d requests measured, the profile asks for %d", label, pt.Requests, p.Requests))
		}
		add := func(name string, v float64, unit string) {
			res.Figures = append(res.Figures, Figure{Profile: p.Name, Point: label, Name: name, Value: v, Unit: unit})
		}
		add(reports.TagRequestThroughput+".avg", pt.ImagesPerSec, "requests/sec") // one image a request: images/s, qual qualify's Requests/s column
		add(reports.TagHTTPLatency+".p50", pt.HTTPLatencyMs.P50, "ms")
		add(reports.TagHTTPLatency+".p95", pt.HTTPLatencyMs.P95, "ms")
		add(reports.TagHTTPLatency+".p99", pt.HTTPLatencyMs.P99, "ms")
		add(reports.TagTaskWallTime+".p50", pt.NativeTaskMs.P50, "ms")
		add("mq_png_encode.p50", pt.PNGEncodeMs.P50, "ms")
		add("mq_png_bytes.avg", pt.PNGBytes.Avg, "bytes")
		for _, s := range slos {
			if s.tag != reports.TagHTTPLatency && s.tag != reports.TagRequestLatency {
				problems = append(problems, fmt.Sprintf("%s: SLO %s: an image profile measures request latency only (http_pNN, latency_pNN)", label, s.spec))
				continue
			}
			d := pt.HTTPLatencyMs
			v, ok := map[string]float64{"p50": d.P50, "p90": d.P90, "p95": d.P95, "p99": d.P99, "avg": d.Avg}[s.stat]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: SLO %s: an image profile reports avg, p50, p90, p95 and p99 only", label, s.spec))
			case v > s.limitMs:
				problems = append(problems, fmt.Sprintf("%s: SLO %s missed: %s.%s is %.3g ms", label, s.spec, s.tag, s.stat, v))
			}
		}
	}
	verified, bad := verifyRuns(res.Dirs) // every figure recomputed apart (verify.go)
	res.Verified, problems = verified, append(problems, bad...)
	if len(problems) > 0 {
		return res, fmt.Errorf("load gate: profile %q:\n  %s", p.Name, strings.Join(problems, "\n  "))
	}
	return res, nil
}

// imageGPUFigures turns an image profile's go-nvml telemetry (all its points, warmup included)
// into figures: memory high-water, utilization, power, energy and joules per image.
func imageGPUFigures(profile string, tel gpu.Telemetry, points []load.ImagePoint) ([]Figure, string) {
	if !tel.Available || len(tel.Devices) == 0 {
		return nil, "GPU telemetry unavailable on a GPU run: " + tel.Reason
	}
	images := 0
	for _, pt := range points {
		images += pt.Requests - pt.Errors + pt.WarmupRequests
	}
	figs := telemetryFigures(profile, "all points", tel)
	if images > 0 {
		figs = append(figs, Figure{Profile: profile, Point: "all points", Name: "gpu.joules_per_image", Value: tel.EnergyJ / float64(images), Unit: "J/image"})
	}
	return figs, ""
}
