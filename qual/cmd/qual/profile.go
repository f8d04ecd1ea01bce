package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/reports"
	"github.com/modelqual/modelqual/server/envconfig"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func init() {
	register("profile", "load-profile an OpenAI-compatible endpoint (AIPerf-compatible exports)", runProfile)
}

const profileUsage = `Usage: qual profile (--url URL | --bundle FILE [--launcher process|container] [--gpus all|0,1])
         --model NAME [--tokenizer DIR] --endpoint completions|chat|images|grpc [--stream]
         (--concurrency 1,8,32 | --request-rate R[,R...] [--max-concurrency C] [--arrival constant|poisson])
         (--requests N | --duration D) [--warmup N]
         [--input-tokens-mean M --input-tokens-stddev S | --input-file F]
         [--output-tokens N [--output-tokens-stddev S]] [--slo ttft:200ms,...] [--seed S] --out DIR
         [--image-dir D | --image-width-mean W --image-height-mean H [--image-format png|jpeg]]
         [--image-fraction F] [--images-per-request K] [--extra-body '{"temperature":0}'] [--temperature T] [--ramp-up D]
         [--find-max --slo ttft_p99:200ms,itl_p99:50ms [--find-max-resolution R] [--find-max-points N]]
   or: qual profile --family NAME ... (the family's tiny fixture bundle, model name and tokenizer)

Profiles a server the way AIPerf does and writes one run directory per sweep point under
--out: profile_export.jsonl, profile_export_aiperf.json/.csv, summary.json, summary.md,
plots, the raw client and server records joined by request ID, fingerprints taken before
and after, the environment and the server logs; against a qual-server, summary.json and
summary.md also hold its engine steps of the profiling phase (from its /metrics). A summary
table is printed at the end.

The run fails (exit 1) when a client request has no server record or the reverse, when
a fingerprinted file (bundle, inputs, tokenizer, source tree) changed during the run, when
no measured request of a point succeeded ("0 of N requests succeeded"), or when more failed
than --max-error-rate allows; the raw records are kept either way. A --url where nothing
accepts connections fails within 5 s, naming it. A run is written into a temporary folder
beside --out (OUT.partial-*) and renamed to --out when it ends; a failed run is kept as
OUT.failed-<UTC time> with a FAILED file saying why, so the next run into --out is not
blocked. An --out folder that already holds a run is refused unless --overwrite is given
(which replaces it once the new run has ended well), so a run is never replaced silently.
Against a server given by --url, whose records cannot be read, the figures are the client's
(as AIPerf's are), and a note says so. A sweep of two points or more also writes its plots
(throughput and p99 latency against the swept value on a log axis, throughput against
latency) into --out/NAME-sweep.

--find-max searches, instead of sweeping, for the highest request rate (open loop, from the one
--request-rate given) or concurrency (closed loop, from the one --concurrency given) whose
points meet every --slo: NAME_STAT:THRESHOLD items, NAME a metric tag or alias (ttft, itl,
tpot, e2e, e2el, latency, request_latency, tps, ...) and STAT p<N>, avg or max (a bare NAME
must hold for every request); a failed request misses every SLO. It doubles the value while
points pass (halves while they fail), then bisects between the highest passing and lowest
failing value until they are --find-max-resolution apart (default 1 client, or 5% of the rate),
in at most --find-max-points points. Every point is a run directory as a sweep's are (its
goodput counting the requests meeting every threshold); the search, each point's pass or
fail with the SLO it missed, and the answer are in --out/NAME-sweep/summary.md and
summary.json, and printed.

--ramp-up D raises the load linearly over D before each point's measured phase: an open
loop's rate from 0 to the point's, a closed loop's clients from 1 to its concurrency (one
more every D/C). As in AIPerf, where a ramp belongs to a phase and the measured figures are
kept clean by ramping the warmup, the ramp's requests are recorded as warmup (IDs ...-u<n>)
and reported apart from the steady state; the measured phase follows at once, at full load.

--extra-body '{"temperature":0,"top_p":1}' (AIPerf's --extra-inputs) merges a JSON object into
every request body (completions, chat, streaming, images, vision, grpc's sampling fields);
--temperature T is shorthand for its temperature. Both are part of the run's configuration
(summary.json input_config mq_config.extra_body), so qual report compare does not pool runs
made with different bodies. Fields the harness sets itself (model, prompt, messages,
max_tokens, ignore_eos, stream, stream_options) are refused: use their flags.

Progress (each point's bar with its name, e.g. "concurrency 4 (2/5)", the phase's ETA inside
the bar and the sweep's ETA after it) goes to stderr on a terminal, or anywhere with
--progress (a line every 5 s); --no-progress silences it.

With --endpoint images, the --input-file's requests are profiled in the same layout, with
AIPerf's image metrics (num_images, image_throughput, image_latency) and, from a qual-server's
records, task time and PNG encode time.

With --image-dir or --image-width-mean/--image-height-mean (chat only) every request carries
one image as a data: URL content part; a vision-language qual-server's records then hold each
image's token count and preprocessing time (record field vision); the summary reports them
(mq_image_tokens, mq_image_preprocess, and mq_image_vision_tower: the engine's vision tower, CPU
engines only) and TTFT split by image (mq_ttft_with_image,
mq_ttft_without_image). --image-fraction F gives an image to that fraction of the requests
only, spread evenly, so one run compares TTFT with and without an image. --images-per-request K
puts K images in each such request (AIPerf's --batch-size-image; a qual-server needs
--max-images-per-request K, e.g. --server-arg=--max-images-per-request=K).

Flags:
`

func runProfile(args []string) (code int) {
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), profileUsage)
		fs.PrintDefaults()
	}
	var (
		url            = fs.String("url", "", "profile the OpenAI-compatible server at this base URL (external launcher)")
		bundlePath     = fs.String("bundle", "", "start qual-server on this bundle (.mqb)")
		launcher       = fs.String("launcher", "process", "how to start the server for --bundle: process or container")
		gpus           = fs.String("gpus", "", "serve on these GPUs: all or device IDs (0,1); a machine or Docker engine without NVIDIA support is an error, never a CPU run")
		image          = fs.String("image", launch.DefaultImage, "container launcher: the locally built image (make image)")
		ctrMemory      = fs.Int64("container-memory", 0, "container launcher: memory cap in bytes (0: none)")
		ctrPids        = fs.Int64("container-pids", launch.DefaultPidsLimit, "container launcher: process-and-thread cap (-1: none)")
		model          = fs.String("model", "", "model name sent in requests (and served, with --bundle)")
		tokDir         = fs.String("tokenizer", "", "tokenizer folder (tokenizer.json, tokenizer_config.json) for client token counts and synthetic prompts; default: the bundle's own")
		endpoint       = fs.String("endpoint", "completions", "completions, chat, images (/v1/images/generations; --input-file lines carry prompt, size, num_inference_steps, guidance_scale, seed), or grpc (OpenEngine v1 Generate streams: with --bundle, qual-server is started with --grpc-port; with --url, give grpc://host:port of any OpenEngine server)")
		stream         = fs.Bool("stream", false, "stream responses (SSE)")
		concurrency    = fs.String("concurrency", "", "closed loop: comma-separated concurrencies to sweep, e.g. 1,8,32")
		rate           = fs.String("request-rate", "", "open loop: comma-separated request rates (req/s) to sweep; each send's lateness against its schedule is reported, and the pacer thread asks for SCHED_FIFO (else nice -20), so grant CAP_SYS_NICE for the tightest schedule")
		maxConc        = fs.Int("max-concurrency", 0, "open loop: cap on in-flight requests (0: none)")
		arrival        = fs.String("arrival", "poisson", "open loop arrivals: poisson (AIPerf's default) or constant")
		requests       = fs.Int("requests", 0, "measured requests per sweep point")
		duration       = fs.Duration("duration", 0, "measured duration per sweep point (e.g. 30s)")
		warmup         = fs.Int("warmup", 0, "warmup requests per sweep point, reported apart")
		inMean         = fs.Int("input-tokens-mean", 128, "synthetic prompts: mean input length in tokens")
		inStd          = fs.Int("input-tokens-stddev", 0, "synthetic prompts: input length standard deviation")
		numPrompts     = fs.Int("num-prompts", 100, "synthetic prompts: how many distinct prompts to cycle through")
		inputFile      = fs.String("input-file", "", "JSONL prompts: families' corpus format or {\"text\": ...} lines; with --custom-dataset-type, an AIPerf dataset file")
		datasetType    = fs.String("custom-dataset-type", "", "read --input-file as AIPerf's single_turn, multi_turn (sessions whose history grows turn by turn, with per-turn delays), random_pool (sampled with replacement) or mooncake_trace (timestamp, input_length, output_length, hash_ids)")
		fixedSchedule  = fs.Bool("fixed-schedule", false, "send each request at its --input-file timestamp (ms from the first), as AIPerf's --fixed-schedule; lateness against the trace is reported")
		img            load.ImageOptions
		outTokens      = fs.Int("output-tokens", 0, "output length: max_tokens with ignore_eos (0: server default); the mean with --output-tokens-stddev; an input file's per-line output_length takes precedence")
		outStd         = fs.Int("output-tokens-stddev", 0, "output length standard deviation: each prompt gets its own length, drawn from a normal distribution around --output-tokens (so requests do not all finish together)")
		slo            = fs.String("slo", "", "goodput SLOs, e.g. ttft:200ms,itl:20ms,request_latency:1s")
		seed           = fs.Uint64("seed", 0, "random seed of prompts, arrivals and cancellations (0: pick one); summary.json records it as seed.base and each point's own, base + the point's index in sweep order, as seed.used")
		out            = fs.String("out", "", "output folder (one run directory per sweep point)")
		name           = fs.String("name", "profile", "run directory name prefix")
		cancelRate     = fs.Float64("cancel-rate", 0, "fraction of measured requests to cancel (0..1)")
		cancelDelay    = fs.Duration("cancel-delay", 0, "cancel those requests this long after they start")
		startupTimeout = fs.Duration("startup-timeout", 60*time.Second, "how long to wait for the server to be ready")
		requestTimeout = fs.Duration("request-timeout", 0, "per-request timeout (0: none)")
		apiKey         = fs.String("api-key", envconfig.OpenAIAPIKey.Get(), "bearer token for the server")
		faults         = fs.String("faults", envconfig.Faults.Get(), "MODELQUAL_FAULTS passed to a launched server")
		sourceRoot     = fs.String("source-root", "", "source tree to fingerprint (default: the repository around the working directory; \"none\" to skip)")
		noProgress     = fs.Bool("no-progress", false, "do not print progress on stderr")
		progressFlag   = fs.Bool("progress", false, "print progress on stderr even when it is not a terminal (a line every 5 s)")
		family         = fs.String("family", "", "profile a family by any of its names (qual families: qwen3; its folder qwen; its fixture qwen3-tiny; an architecture): without --url or --bundle its tiny fixture bundle is served; --model defaults to the registry's name and, with --url, --tokenizer to the fixture's")
		extraBody      = fs.String("extra-body", "", "JSON object merged into every request body, e.g. '{\"temperature\":0}' (AIPerf's --extra-inputs)")
		temperature    = fs.String("temperature", "", "sampling temperature sent in every request (shorthand for --extra-body '{\"temperature\":T}')")
		rampUp         = fs.Duration("ramp-up", 0, "raise the load linearly over this long before each point's measured phase (rate from 0, clients from 1); its requests are recorded as warmup")
		findMax        = fs.Bool("find-max", false, "search the highest --request-rate or --concurrency (one starting value) whose points meet every --slo (NAME_pN:THRESHOLD, e.g. ttft_p99:200ms,itl_p99:50ms)")
		fmResolution   = fs.String("find-max-resolution", "", "--find-max: stop bisecting when the answer and the first failing value above it are this close: a number (req/s or clients) or a percentage of the answer (5%); default 1 client or 5%")
		fmPoints       = fs.Int("find-max-points", 10, "--find-max: profile at most this many points")
		fmLimit        = fs.Float64("find-max-limit", 0, "--find-max: the highest rate or concurrency to try (0: none)")
		maxErrorRate   = fs.Float64("max-error-rate", -1, "fail a point whose measured requests failed in a larger fraction (0..1; default: fail only when none succeeded)")
		overwrite      = fs.Bool("overwrite", false, "replace the runs already in --out")
		repeat         = fs.Int("repeat", 1, "run every sweep point N times (run directories ...-rep1..N) so qual report compare can separate a change from run-to-run variance")
	)
	var serverArgs profileMultiFlag
	fs.StringVar(&img.Dir, "image-dir", "", "chat: one image per request from this folder's .png/.jpg files (round robin)")
	fs.IntVar(&img.WidthMean, "image-width-mean", 0, "chat: one synthetic image per request, width around this (AIPerf's name)")
	fs.IntVar(&img.HeightMean, "image-height-mean", 0, "chat: synthetic image height around this")
	fs.IntVar(&img.WidthStddev, "image-width-stddev", 0, "chat: synthetic image width standard deviation")
	fs.IntVar(&img.HeightStddev, "image-height-stddev", 0, "chat: synthetic image height standard deviation")
	fs.StringVar(&img.Format, "image-format", "png", "chat: synthetic image format, png or jpeg")
	fs.IntVar(&img.PerRequest, "images-per-request", 1, "chat, with the image flags: images in each request that carries any (AIPerf's --batch-size-image); qual-server takes more than one with --max-images-per-request (pass it with --server-arg)")
	fs.Float64Var(&img.Fraction, "image-fraction", 1, "chat, with the image flags: the fraction (0 < F <= 1) of requests that carry an image; the rest are text-only, for TTFT with and without image in one run")
	fs.Var(&serverArgs, "server-arg", "extra qual-server flag (repeatable), e.g. --server-arg=--max-batch=64")
	if err := parseAll(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "qual profile: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments %q: qual profile takes flags only (the output folder is --out DIR); see --help", fs.Args())
	}
	if *family != "" {
		fam, code := profileFamily(*family, *url == "" && *bundlePath == "", *url != "" && *tokDir == "")
		if code != 0 {
			return code
		}
		if *bundlePath == "" && *url == "" {
			*bundlePath = fam.bundle
		}
		if *model == "" {
			*model = fam.name.Canonical
		}
		if *tokDir == "" && *url != "" {
			*tokDir = fam.tokenizer
		}
	}
	if (*url == "") == (*bundlePath == "") {
		return bad("pass exactly one of --url (an external server) and --bundle (start qual-server), or --family F alone (its fixture bundle)")
	}
	if *model == "" {
		return bad("--model is required (the model name requests carry)")
	}
	extra, err := profileExtraBody(*extraBody, *temperature)
	if err != nil {
		return bad("%v", err)
	}
	if *out == "" {
		return bad("--out is required (where run directories go)")
	}
	if *endpoint != client.Completions && *endpoint != client.Chat && *endpoint != load.EndpointImages && *endpoint != load.EndpointGRPC {
		return bad("--endpoint %q must be completions, chat, images or grpc", *endpoint)
	}
	grpcURL := ""
	if *endpoint == load.EndpointGRPC {
		*stream = true // every Generate is a stream
		if *url != "" {
			if !strings.HasPrefix(*url, "grpc://") {
				return bad("--endpoint grpc: --url %q must be grpc://host:port", *url)
			}
			grpcURL = *url
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return bad("--endpoint grpc: find a free port: %v", err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			ln.Close()
			serverArgs = append(serverArgs, "--grpc-port", strconv.Itoa(port))
			grpcURL = fmt.Sprintf("grpc://127.0.0.1:%d", port)
		}
	}
	if *fixedSchedule {
		if *datasetType == "" || *inputFile == "" {
			return bad("--fixed-schedule needs --input-file F --custom-dataset-type single_turn|multi_turn|mooncake_trace with timestamps")
		}
		if *concurrency != "" || *rate != "" {
			return bad("--fixed-schedule sends at the trace's timestamps; leave out --concurrency and --request-rate")
		}
	} else if (*concurrency == "") == (*rate == "") {
		return bad("pass exactly one of --concurrency and --request-rate")
	}
	if *datasetType != "" && *inputFile == "" {
		return bad("--custom-dataset-type %s needs --input-file F", *datasetType)
	}
	if *rampUp < 0 {
		return bad("--ramp-up %v must not be negative", *rampUp)
	}
	if *rampUp > 0 && (*fixedSchedule || *datasetType != "" || *endpoint == load.EndpointImages) {
		return bad("--ramp-up ramps a --request-rate or --concurrency of prompts; a trace (--fixed-schedule), an AIPerf dataset (--custom-dataset-type) and --endpoint images keep their own timing")
	}
	var fm *load.FindMax
	if *findMax {
		switch {
		case *slo == "":
			return bad("--find-max needs --slo, e.g. --slo 'ttft_p99:200ms,itl_p99:50ms'")
		case *fixedSchedule || *endpoint == load.EndpointImages:
			return bad("--find-max searches a --request-rate or --concurrency of prompts; not a trace (--fixed-schedule) or --endpoint images")
		case strings.Contains(*concurrency+*rate, ","):
			return bad("--find-max starts from one value: give one --concurrency C or one --request-rate R (the search picks the others)")
		case *repeat > 1:
			return bad("--find-max profiles one point at a time; leave out --repeat")
		case *fmPoints < 1:
			return bad("--find-max-points %d must be at least 1", *fmPoints)
		}
		if _, err := load.ParseFindMaxSLOs(*slo); err != nil {
			return bad("--slo: %v", err)
		}
		fm = &load.FindMax{SLOs: *slo, MaxPoints: *fmPoints, Limit: *fmLimit}
		if r := strings.TrimSpace(*fmResolution); r != "" {
			pct := strings.HasSuffix(r, "%")
			v, err := strconv.ParseFloat(strings.TrimSuffix(r, "%"), 64)
			if err != nil || v <= 0 {
				return bad("--find-max-resolution %q: want a positive number (req/s or clients) or a percentage such as 5%%", r)
			}
			if pct {
				v /= 100
			}
			fm.Resolution, fm.Relative = v, pct
		}
	} else if *fmResolution != "" || *fmLimit != 0 {
		return bad("--find-max-resolution and --find-max-limit go with --find-max")
	}
	if *requests <= 0 && *duration <= 0 && *datasetType == "" {
		return bad("pass --requests N or --duration D to say when each point stops")
	}
	concs, err := profileParseInts(*concurrency)
	if err != nil {
		return bad("--concurrency: %v", err)
	}
	rates, err := profileParseFloats(*rate)
	if err != nil {
		return bad("--request-rate: %v", err)
	}
	if *gpus != "" && *url != "" {
		return bad("--gpus needs --bundle (the harness starts the server on those GPUs)")
	}
	if *outStd < 0 || *outStd > 0 && *outTokens <= 0 {
		return bad("--output-tokens-stddev %d needs --output-tokens M > 0 (the mean) and must not be negative", *outStd)
	}
	gpuIndices, err := profileGPUIndices(*gpus)
	if err != nil {
		return bad("--gpus: %v", err)
	}
	if *repeat < 1 {
		return bad("--repeat %d must be at least 1", *repeat)
	}
	if *maxErrorRate > 1 {
		return bad("--max-error-rate %v must be within [0, 1]", *maxErrorRate)
	}
	if *url != "" {
		if err := profileReachable(*url, 5*time.Second); err != nil {
			return profileFail("%v", err)
		}
	}
	stage, err := load.StageRun(*out, *overwrite)
	if err != nil {
		return bad("--out: %v", err)
	}
	var res *load.ProfileResult
	var runErr error
	defer func() { code = profileFinish(stage, res, runErr, code) }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Tokenizer: --tokenizer, else the bundle's own sections.
	var tok *tokenizer.Tokenizer
	switch {
	case *tokDir != "":
		tok, err = tokenizer.Load(*tokDir)
		if err != nil {
			return profileFail("load tokenizer: %v", err)
		}
	case *bundlePath != "":
		tok, err = profileBundleTokenizer(*bundlePath)
		if err != nil {
			return profileFail("tokenizer from bundle: %v; pass --tokenizer DIR", err)
		}
	}
	var ltok load.Tokenizer
	if tok != nil {
		ltok = tok
	}
	var prompts []load.Prompt
	promptSeed := *seed
	if promptSeed == 0 {
		promptSeed = uint64(time.Now().UnixNano())
	}
	var sessions []load.Session
	if *endpoint == load.EndpointImages {
		// Requests and their controls come from --input-file (load.Profile reads it).
	} else if *datasetType != "" {
		var ds *load.Dataset
		ds, err = load.ReadDataset(*inputFile, *datasetType, ltok)
		if err == nil {
			if *fixedSchedule && !ds.Timed {
				return bad("--fixed-schedule: %s has turns without a \"timestamp\"; give every line one, or drop --fixed-schedule", *inputFile)
			}
			sessions = ds.SampleSessions(*requests, promptSeed)
		}
	} else if *inputFile != "" {
		prompts, err = load.ReadCorpus(*inputFile, ltok)
	} else {
		if tok == nil {
			return bad("synthetic prompts need a tokenizer: pass --tokenizer DIR (or --input-file F)")
		}
		prompts, err = load.Synthetic(tok, load.SyntheticOptions{Count: *numPrompts, Mean: *inMean, Stddev: *inStd, Seed: promptSeed})
	}
	if err == nil && img.Enabled() { // one image per chat request (qual/load/vision.go)
		if *endpoint != client.Chat {
			return bad("image flags need --endpoint chat")
		}
		if !(img.Fraction > 0 && img.Fraction <= 1) {
			return bad("--image-fraction %v must be in (0, 1]", img.Fraction)
		}
		if img.PerRequest < 1 {
			return bad("--images-per-request %d must be at least 1", img.PerRequest)
		}
		img.Seed = promptSeed
		prompts, err = load.WithImages(prompts, img)
	}
	if err == nil && *outStd > 0 {
		prompts, err = load.DrawOutputLengths(prompts, *outTokens, *outStd, promptSeed)
	}
	if err != nil {
		return profileFail("%v", err)
	}

	runDir := stage.Dir
	opts := []launch.Option{launch.WithModel(*model), launch.WithRunDir(filepath.Join(runDir, "server")),
		launch.WithStartupTimeout(*startupTimeout), launch.WithArgs(serverArgs...), launch.WithFaults(*faults),
		launch.WithAPIKey(*apiKey), launch.WithImage(*image), launch.WithMemoryLimit(*ctrMemory), launch.WithPidsLimit(*ctrPids)}
	var l launch.Launcher
	if grpcURL != "" && *url != "" {
		l = grpcEndpoint{&launch.Endpoint{BaseURL: grpcURL, Model: *model, Kind: "external"}}
	} else if *url != "" {
		l = launch.External(append(opts, launch.WithURL(*url))...)
	} else {
		opts = append(opts, launch.WithBundle(*bundlePath))
		if *gpus != "" {
			opts = append(opts, launch.WithGPUs(*gpus))
		}
		l, err = launch.New(*launcher, opts...)
		if err != nil {
			return bad("%v", err)
		}
	}
	ep, err := l.Start(ctx)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ep.Stop(sctx); err != nil {
			fmt.Fprintf(os.Stderr, "qual profile: stop server: %v\n", err)
		}
	}()
	if err != nil {
		return profileFail("%v", err)
	}

	src := *sourceRoot
	switch src {
	case "none":
		src = ""
	case "":
		if root, err := fixtures.RepoRoot(); err == nil {
			src = root
		}
	}
	fp := provenance.Spec{Bundle: *bundlePath, TokenizerDir: *tokDir, SourceRoot: src}
	if *inputFile != "" {
		fp.Inputs = []string{*inputFile}
	}
	// Progress on a terminal, or wherever --progress asks for it (CI logs).
	var progress io.Writer
	if !*noProgress && (*progressFlag || load.IsTerminal(os.Stderr)) {
		progress = os.Stderr
	}
	in := load.ProfileInput{
		Endpoint: ep,
		Load: load.Config{
			BaseURL: grpcURL, APIKey: *apiKey, Endpoint: *endpoint, Stream: *stream, MaxConcurrency: *maxConc, Arrival: *arrival,
			Requests: *requests, Duration: *duration, Warmup: *warmup, RampUp: *rampUp, Prompts: prompts, OutputTokens: *outTokens,
			Extra:    extra,
			Sessions: sessions, FixedSchedule: *fixedSchedule,
			CancelRate: *cancelRate, CancelDelay: *cancelDelay, Seed: promptSeed, Tokenizer: ltok,
			RequestTimeout: *requestTimeout, Progress: progress,
		},
		Concurrencies: concs,
		RequestRates:  rates,
		OutDir:        runDir,
		Name:          *name,
		SLOs:          *slo,
		FindMax:       fm,
		Fingerprint:   fp,
		InputConfig:   profileInputConfig(fs, extra),
		GPUIndices:    gpuIndices,
		RequireGPU:    *gpus != "",
		Overwrite:     *overwrite,
		Repeat:        *repeat,
	}
	if *maxErrorRate >= 0 {
		in.MaxErrorRate = maxErrorRate
	}
	if fm != nil {
		in.SLOs = "" // the search's objectives are the points' goodput SLOs
	}
	res, runErr = load.Profile(ctx, in)
	if runErr != nil {
		return profileFail("%v", runErr)
	}
	return 0
}

// profileReachable dials the host of url within timeout, so a dead --url fails at once with
// its name instead of after the launcher's startup timeout.
func profileReachable(raw string, timeout time.Duration) error {
	u, err := neturl.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "grpc") {
		return fmt.Errorf("--url %q is not an http://, https:// or (with --endpoint grpc) grpc:// URL", raw)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return fmt.Errorf("--url %s: nothing accepts connections at %s within %s (%v); is the server running and the port right?", raw, host, timeout, err)
	}
	return c.Close()
}

func profileFail(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "qual profile: "+format+"\n", a...)
	return 1
}

// profileBundleTokenizer reads the tokenizer sections carried in a bundle.
func profileBundleTokenizer(path string) (*tokenizer.Tokenizer, error) {
	b, err := bundle.Open(path)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	tj, err := b.Section("tokenizer.json")
	if err != nil {
		return nil, err
	}
	tc, err := b.Section("tokenizer_config.json")
	if err != nil {
		return nil, err
	}
	// Copy out of the mapping before it is closed.
	return tokenizer.FromBytes(append([]byte(nil), tj...), append([]byte(nil), tc...))
}

// printProfileSummary prints one row per sweep point.
func printProfileSummary(w io.Writer, res *load.ProfileResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "point\trequests\terrors\treq/s\tout tok/s\tTTFT p50 ms\tTTFT p99 ms\tlatency p50 ms\tlatency p99 ms\tITL p50 ms\tHTTP-task p50 ms\tstatus\trun dir\t")
	for _, p := range res.Points {
		status := "ok"
		if p.Err != nil {
			status = "FAILED"
		}
		label := fmt.Sprintf("%s=%s", p.Sweep.Parameter, strconv.FormatFloat(p.Sweep.Value, 'f', -1, 64))
		if p.Summary == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\t\n", label, status, p.Dir)
			continue
		}
		ps := &p.Summary.Profiling
		g := func(tag, stat string) string {
			v, ok := ps.Stat(tag, stat)
			if !ok {
				return "-"
			}
			return strconv.FormatFloat(v, 'f', 2, 64)
		}
		errs := 0
		for _, e := range ps.Errors {
			errs += e.Count
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", label, ps.Requests, errs,
			g(reports.TagRequestThroughput, "avg"), g(reports.TagOutputTokenThroughput, "avg"),
			g(reports.TagTTFT, "p50"), g(reports.TagTTFT, "p99"),
			g(reports.TagRequestLatency, "p50"), g(reports.TagRequestLatency, "p99"),
			g(reports.TagITL, "p50"), g(reports.TagHTTPMinusTask, "p50"), status, p.Dir)
	}
	tw.Flush()
	// Scheduled runs: how late the sends were against their schedule, and how it was kept.
	for _, p := range res.Points {
		if p.Summary == nil || p.Load == nil || p.Load.Pacer == "" {
			continue
		}
		p50, ok50 := p.Summary.Profiling.Stat(reports.TagScheduleLateness, "p50")
		p99, ok99 := p.Summary.Profiling.Stat(reports.TagScheduleLateness, "p99")
		if ok50 && ok99 {
			fmt.Fprintf(w, "%s=%s: schedule lateness p50 %.3f ms, p99 %.3f ms (pacer: %s)\n", p.Sweep.Parameter,
				strconv.FormatFloat(p.Sweep.Value, 'f', -1, 64), p50, p99, p.Load.Pacer)
		}
	}
	for _, p := range res.Points {
		if p.Err != nil {
			fmt.Fprintf(w, "\n%s: %v\n", filepath.Base(p.Dir), p.Err)
		}
	}
}

func profileFlagValues(fs *flag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "api-key" {
			return // never record secrets
		}
		m[f.Name] = f.Value.String()
	})
	return m
}

// profileInputConfig is the run's recorded configuration (input_config's mq_config): every
// flag as given, and extra_body, the JSON object merged into every request (--extra-body with
// --temperature folded in, keys sorted), which the configuration key compares.
func profileInputConfig(fs *flag.FlagSet, extra map[string]any) map[string]string {
	m := profileFlagValues(fs)
	m["extra_body"] = reports.CanonicalExtraBody(extra)
	return m
}

// profileReserved are the body fields the harness sets from its own flags.
var profileReserved = map[string]string{"model": "--model", "prompt": "the inputs", "messages": "the inputs",
	"max_tokens": "--output-tokens", "ignore_eos": "--output-tokens", "stream": "--stream", "stream_options": "--stream"}

// profileExtraBody parses --extra-body (a JSON object) and --temperature into the fields
// merged into every request body.
func profileExtraBody(raw, temperature string) (map[string]any, error) {
	extra := map[string]any{}
	if strings.TrimSpace(raw) != "" {
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.UseNumber() // keep numbers as written (1e-3 stays 1e-3, big seeds stay exact)
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("--extra-body %q is not valid JSON (%v); give one object, e.g. '{\"temperature\":0}'", raw, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("--extra-body %q holds more than one JSON value; give one object, e.g. '{\"temperature\":0}'", raw)
		}
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("--extra-body %q is JSON but not an object; give one, e.g. '{\"temperature\":0}'", raw)
		}
		extra = obj
	}
	for k := range extra {
		if flag, ok := profileReserved[k]; ok {
			return nil, fmt.Errorf("--extra-body sets %q, which qual profile sets itself from %s; use that instead", k, flag)
		}
	}
	if temperature != "" {
		t, err := strconv.ParseFloat(temperature, 64)
		if err != nil || t < 0 {
			return nil, fmt.Errorf("--temperature %q must be a number >= 0", temperature)
		}
		if _, both := extra["temperature"]; both {
			return nil, errors.New("--temperature and --extra-body's \"temperature\" both set it; give it once")
		}
		extra["temperature"] = json.Number(temperature)
	}
	if len(extra) == 0 {
		return nil, nil
	}
	return extra, nil
}

// profileFamilyFixture is what --family gives a profile: the family's names, its fixture's
// bundle (built into the cache on first use, only when no server is given) and tokenizer.
type profileFamilyFixture struct {
	name      familyName
	bundle    string
	tokenizer string
}

// profileFamily resolves --family as qual qualify does (qual/cmd/qual/familynames.go); its
// exit code is 2 for a name no family has.
func profileFamily(s string, needBundle, needTokenizer bool) (profileFamilyFixture, int) {
	var f profileFamilyFixture
	root, err := fixtures.RepoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual profile: --family reads the families' manifests from a checkout: %v; give --bundle and --model instead\n", err)
		return f, 2
	}
	known, err := familyNames(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual profile: --family: %v\n", err)
		return f, 2
	}
	n, ok := resolveFamily(known, s)
	if !ok {
		fmt.Fprintf(os.Stderr, "qual profile: --family %q: unknown family; known: %s\n", s, describeFamilies(known))
		return f, 2
	}
	f.name = n
	m, err := manifest.Load(filepath.Join(root, "families", n.Folder, "manifest.yaml"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual profile: --family %s: %v\n", s, err)
		return f, 2
	}
	fx := m.Checkpoint.Fixture
	if !needBundle && !needTokenizer {
		return f, 0
	}
	if fx == "" {
		if needBundle {
			fmt.Fprintf(os.Stderr, "qual profile: --family %s names no fixture (manifest checkpoint.fixture); give --bundle or --url\n", s)
			return f, 2
		}
		return f, 0
	}
	dir, _, err := fixtures.Ensure(fixtures.DefaultCacheDir(), fx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual profile: --family %s: fixture %s: %v\n", s, fx, err)
		return f, 1
	}
	f.tokenizer = dir
	if needBundle {
		if f.bundle, err = fixtures.Bundle(fixtures.DefaultCacheDir(), fx); err != nil {
			fmt.Fprintf(os.Stderr, "qual profile: --family %s: %v\n", s, err)
			return f, 1
		}
	}
	return f, 0
}

func profileParseInts(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, v)
	}
	return out, nil
}

func profileParseFloats(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// profileGPUIndices turns --gpus into NVML indices to sample: nil for "all" or none;
// UUIDs are not mapped (all GPUs are sampled then).
func profileGPUIndices(s string) ([]int, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if strings.HasPrefix(p, "GPU-") {
			return nil, nil
		}
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q is neither all, a GPU index nor a GPU UUID", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// profileMultiFlag collects a repeatable string flag.
type profileMultiFlag []string

func (m *profileMultiFlag) String() string     { return strings.Join(*m, " ") }
func (m *profileMultiFlag) Set(v string) error { *m = append(*m, v); return nil }

// grpcEndpoint is an OpenEngine server given by --url grpc://host:port: nothing to start,
// and no HTTP /health to wait on (the first Generate says whether it serves).
type grpcEndpoint struct{ ep *launch.Endpoint }

func (g grpcEndpoint) Start(context.Context) (*launch.Endpoint, error) { return g.ep, nil }
