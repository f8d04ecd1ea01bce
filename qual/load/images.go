package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
)

// EndpointImages is `qual profile --endpoint images`: POST /v1/images/generations.
const EndpointImages = "images"

// ImageRequest is one line of an images input file: the prompt and the controls that define
// the workload, all required (a profile must say what it measures).
type ImageRequest struct {
	Name     string   `json:"name,omitempty"`
	Prompt   string   `json:"prompt"`
	Size     string   `json:"size"`
	Steps    *int     `json:"num_inference_steps"`
	Guidance *float64 `json:"guidance_scale"`
	Seed     *int64   `json:"seed"`
}

// ReadImageRequests reads a JSONL file of ImageRequest lines; a line missing a control is an
// error naming the line and the field.
func ReadImageRequests(path string) ([]ImageRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("images input: %w", err)
	}
	defer f.Close()
	var out []ImageRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var r ImageRequest
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("images input %s:%d: %v (want {\"prompt\", \"size\", \"num_inference_steps\", \"guidance_scale\", \"seed\"})", path, n, err)
		}
		for field, missing := range map[string]bool{"prompt": r.Prompt == "", "size": r.Size == "", "num_inference_steps": r.Steps == nil,
			"guidance_scale": r.Guidance == nil, "seed": r.Seed == nil} {
			if missing {
				return nil, fmt.Errorf("images input %s:%d: %q is required on every line (the controls define the workload)", path, n, field)
			}
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("images input %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("images input %s has no requests", path)
	}
	return out, nil
}

// imageClientRecord is the client's account of one image request, in the per-request format
// of a text record (client_records.jsonl): the phase, the send as epoch ns and the response's
// headers and end of body as ns after it, the HTTP status, the error as code and type, and
// what was received (PNG bytes and sha256, the number of images), so that qual/recount
// recomputes every figure of an image run from these lines alone.
type imageClientRecord struct {
	RequestID   string        `json:"request_id"`
	Phase       string        `json:"phase"` // records.PhaseWarmup or records.PhaseProfiling
	Input       int           `json:"input_index"`
	StartUnixNs int64         `json:"start_unix_ns"`    // the send
	AckNs       int64         `json:"ack_ns,omitempty"` // send to the response's headers
	EndNs       int64         `json:"end_ns"`           // send to the end of the body (or the failure)
	HTTPStatus  int           `json:"http_status"`      // 0 when no response came
	Error       *imageFailure `json:"error,omitempty"`  // nil when an image was received
	NumImages   int           `json:"num_images"`       // images received (the route returns one)
	PNGSHA256   string        `json:"png_sha256,omitempty"`
	PNGBytes    int           `json:"png_bytes,omitempty"`
	Size        string        `json:"size"`
	Steps       int           `json:"num_inference_steps"`
	Guidance    float64       `json:"guidance_scale"`
	Seed        int64         `json:"seed"`
}

// imageFailure is why a request returned no image, as the exports' error details: Code the
// HTTP status (0 when none came or the body was not an image), Type "http_error",
// "no_response" or "bad_response".
type imageFailure struct {
	Code    int    `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// warm tells a warmup request.
func (c *imageClientRecord) warm() bool { return c.Phase == records.PhaseWarmup }

// ok tells a request that returned an image.
func (c *imageClientRecord) ok() bool { return c.Error == nil }

// fail records why the request returned no image.
func (c *imageClientRecord) fail(code int, typ, msg string) {
	c.Error = &imageFailure{Code: code, Type: typ, Message: msg}
}

// Dist is a distribution's summary in milliseconds (or plain units for bytes).
type Dist struct {
	Avg, Min, Max, P50, P90, P95, P99 float64
	N                                 int
}

// dist summarizes v with the reports' statistics (METRICS.md: numpy's linear percentiles).
func dist(v []float64) Dist {
	d, ok := reports.Describe(v)
	if !ok {
		return Dist{}
	}
	return Dist{Avg: d.Avg, Min: d.Min, Max: d.Max, P50: d.P50, P90: d.P90, P95: d.P95, P99: d.P99, N: d.Count}
}

// ImagePoint is one sweep point's figures.
type ImagePoint struct {
	Name           string  `json:"name"`
	Concurrency    int     `json:"concurrency,omitempty"`
	RequestRate    float64 `json:"request_rate,omitempty"`
	Requests       int     `json:"requests"`
	Errors         int     `json:"errors"`
	WarmupRequests int     `json:"warmup_requests"`
	ImagesPerSec   float64 `json:"images_per_second"`
	WallSeconds    float64 `json:"wall_seconds"`
	HTTPLatencyMs  Dist    `json:"http_latency_ms"`
	NativeTaskMs   Dist    `json:"native_task_ms"`
	PNGEncodeMs    Dist    `json:"png_encode_ms"`
	PNGBytes       Dist    `json:"png_bytes"`
	UnmatchedIDs   int     `json:"unmatched_request_ids"`
	SHAMismatches  int     `json:"png_sha256_mismatches"`
}

// imagesRoute is the route image requests go to, and the route of their server records.
const imagesRoute = "/v1/images/generations"

// NoServerRecordsNote is printed and written into summary.md when the server's records cannot
// be read (a server given by URL): the run then reports what the client measured, as AIPerf
// does, without the server-side figures.
const NoServerRecordsNote = "no server records to join (the server was given by URL, so its records are not readable here): client-side metrics only, as AIPerf reports them; the server-side figures (task wall time, HTTP minus task, queue wait, PNG encode, image tokens) are absent"

// ProfileImages profiles /v1/images/generations as Profile profiles text (Profile calls it for
// Load.Endpoint "images"): per sweep point, warmup requests (marked X-Warmup: 1, reported
// apart) that run the image pipeline end to end, then a closed loop at each concurrency or an
// open loop at each request rate over the input file's requests in order, each point written
// to its own run directory in the text layout (profile_export.jsonl, AIPerf's
// profile_export_aiperf.json and .csv with its image metrics num_images, image_throughput and
// image_latency, summary.json and .md, plots, client and server records, provenance.json),
// and the sweep's plots beside them. Where the server's records can be read, client records
// are joined to them by request ID (every request exactly one record either way) and the
// served PNG's sha256 is checked against the server record's; against a server given by URL
// the run is client-side only, with NoServerRecordsNote. The fingerprints taken before each
// point must hold after it. Requests come from the fingerprinted input file
// (in.Fingerprint.Inputs[0]). The point figures are printed to out as a table.
func ProfileImages(ctx context.Context, in ProfileInput, out io.Writer) ([]ImagePoint, error) {
	res, points, err := profileImages(ctx, in)
	if out != nil {
		printImageSummary(out, points)
		if res != nil {
			for _, n := range res.Notes {
				fmt.Fprintf(out, "\nnote: %s\n", n)
			}
		}
	}
	return points, err
}

func profileImages(ctx context.Context, in ProfileInput) (*ProfileResult, []ImagePoint, error) {
	if len(in.Fingerprint.Inputs) == 0 {
		return nil, nil, errors.New("profile images: pass --input-file F: JSONL lines of {\"prompt\", \"size\", \"num_inference_steps\", \"guidance_scale\", \"seed\"}")
	}
	reqs, err := ReadImageRequests(in.Fingerprint.Inputs[0])
	if err != nil {
		return nil, nil, err
	}
	if in.Endpoint == nil {
		return nil, nil, errors.New("profile images: ProfileInput.Endpoint is nil; start a server with a launch.Launcher first")
	}
	if (len(in.Concurrencies) == 0) == (len(in.RequestRates) == 0) {
		return nil, nil, errors.New("profile images: pass exactly one of --concurrency and --request-rate")
	}
	if in.MaxErrorRate != nil && (*in.MaxErrorRate < 0 || *in.MaxErrorRate > 1) {
		return nil, nil, fmt.Errorf("profile images: ProfileInput.MaxErrorRate %v must be within [0, 1]", *in.MaxErrorRate)
	}
	if in.Name == "" {
		in.Name = "profile"
	}
	if in.RecordsWait <= 0 {
		in.RecordsWait = 5 * time.Second
	}
	if in.Load.Model == "" {
		in.Load.Model = in.Endpoint.Model
	}
	in.Load.Endpoint = EndpointImages
	out, err := filepath.Abs(in.OutDir)
	if err != nil {
		return nil, nil, fmt.Errorf("profile images: out dir: %w", err)
	}
	in.Fingerprint.Exclude = append(in.Fingerprint.Exclude, out)
	plan, err := sweepPlan(in, out)
	if err != nil {
		return nil, nil, fmt.Errorf("profile images: %w", err)
	}
	res := &ProfileResult{
		Environment: provenance.Env(ctx, in.Fingerprint.SourceRoot, in.Endpoint.Kind, in.Endpoint.Args, in.Endpoint.Env),
		GPU:         gpu.Inspect(),
	}
	if in.RequireGPU {
		if err := gpu.Require(res.GPU); err != nil {
			return res, nil, err
		}
	}
	res.BundleDigest = servedBundleDigest(ctx, in.Endpoint.BaseURL, in.Load.APIKey, in.Fingerprint.Bundle)
	if in.Endpoint.RecordsPath == "" {
		res.Notes = append(res.Notes, NoServerRecordsNote)
	}
	base := in.Load.Seed
	if base == 0 {
		base = newSeed()
	}
	client := &http.Client{Timeout: in.Load.RequestTimeout}
	var points []ImagePoint
	for i, sp := range plan {
		cfg := in.Load
		if sp.sweep.Parameter == "concurrency" {
			cfg.Concurrency = int(sp.sweep.Value)
		} else {
			cfg.RequestRate = sp.sweep.Value
		}
		cfg.Seed = base + uint64(i)
		pr, ip := imagePoint(ctx, in, cfg, sp, reqs, client, base, res)
		res.Points = append(res.Points, pr)
		points = append(points, ip)
		if in.Load.Progress != nil {
			fmt.Fprintf(in.Load.Progress, "profile images: %s: %d requests, %d errors, %.3f images/s\n", ip.Name, ip.Requests, ip.Errors, ip.ImagesPerSec)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err := plotSweep(filepath.Join(out, in.Name+SweepDirSuffix), res); err != nil {
		return res, points, errors.Join(res.Err(), err)
	}
	return res, points, res.Err()
}

// imagePoint runs and writes one sweep point of an image profile.
func imagePoint(ctx context.Context, in ProfileInput, cfg Config, sp sweepPoint, reqs []ImageRequest, hc *http.Client, baseSeed uint64, pres *ProfileResult) (PointResult, ImagePoint) {
	dir := sp.dir
	name := filepath.Base(dir)
	pr := PointResult{Dir: dir, Sweep: sp.sweep}
	ip := ImagePoint{Name: name, Concurrency: cfg.Concurrency, RequestRate: cfg.RequestRate}
	fail := func(err error) {
		if err != nil {
			pr.Err = errors.Join(pr.Err, err)
		}
	}
	before, watch, err := pointStart(ctx, in.Fingerprint, dir)
	if err != nil {
		pr.Err = err
		return pr, ip
	}
	watching := true
	defer func() {
		if watching {
			_ = watch.Stop()
		}
	}()
	env := struct {
		provenance.Environment
		GPU gpu.Inventory `json:"gpu"`
	}{pres.Environment, pres.GPU}
	fail(writeJSON(filepath.Join(dir, EnvironmentFile), env))
	// Only the records written from now on are this point's: a server that answered other
	// requests before (a qualification suite's gates, earlier points) has theirs in the file.
	recOffset := fileSize(in.Endpoint.RecordsPath)
	sampler, err := gpu.StartSampler(in.GPUIndices, 0, in.RequireGPU)
	if err != nil {
		pr.Err = err
		return pr, ip
	}
	base := strings.TrimRight(in.Endpoint.BaseURL, "/")
	send := func(i int, warm bool) imageClientRecord {
		r := reqs[i%len(reqs)]
		id := fmt.Sprintf("%s-%s-%d", name, map[bool]string{true: "w", false: "m"}[warm], i)
		return sendImage(ctx, hc, base, cfg.Model, cfg.APIKey, id, i%len(reqs), r, warm, cfg.Extra)
	}
	// Warmup: whole image requests through the server's pipeline (text encoder, denoising
	// steps, VAE decode, PNG encode), so the first measured request finds it warm.
	var all []imageClientRecord
	for i := 0; i < cfg.Warmup && ctx.Err() == nil; i++ {
		all = append(all, send(i, true))
		ip.WarmupRequests++
	}
	recs, t0, wall := runImageLoop(ctx, cfg, send)
	tel := sampler.Stop()
	all = append(all, recs...)
	ip.WallSeconds = wall.Seconds()
	var lat, pngBytes []float64
	for _, r := range recs {
		ip.Requests++
		if !r.ok() {
			ip.Errors++
			continue
		}
		lat = append(lat, float64(r.EndNs)/1e6)
		pngBytes = append(pngBytes, float64(r.PNGBytes))
	}
	if wall > 0 {
		ip.ImagesPerSec = float64(len(lat)) / wall.Seconds()
	}
	ip.HTTPLatencyMs, ip.PNGBytes = dist(lat), dist(pngBytes)
	fail(writeJSONL(filepath.Join(dir, ClientRecordsFile), all))

	// Join with the server's records of this point, where they can be read.
	var byID map[string]records.Server
	if in.Endpoint.RecordsPath != "" {
		server, err := waitImageRecords(ctx, in.Endpoint.RecordsPath, recOffset, all, in.RecordsWait)
		fail(err)
		fail(records.WriteJSONL(filepath.Join(dir, ServerRecordsFile), server))
		byID = map[string]records.Server{}
		for _, s := range server {
			byID[s.RequestID] = s
		}
		clientIDs := map[string]bool{}
		var native, enc []float64
		for _, c := range all {
			clientIDs[c.RequestID] = true
			s, ok := byID[c.RequestID]
			if !ok {
				ip.UnmatchedIDs++
				continue
			}
			if c.warm() || !c.ok() || s.Image == nil {
				continue
			}
			native = append(native, float64(s.TaskWallNs)/1e6)
			enc = append(enc, float64(s.Image.PNGEncodeNs)/1e6)
			if s.Image.PNGSHA256 != c.PNGSHA256 {
				ip.SHAMismatches++
			}
		}
		ip.NativeTaskMs, ip.PNGEncodeMs = dist(native), dist(enc)
		if ip.UnmatchedIDs > 0 || ip.SHAMismatches > 0 {
			fail(fmt.Errorf("%d client requests without a server record, %d PNGs whose sha256 differs from the server's record", ip.UnmatchedIDs, ip.SHAMismatches))
		}
		serverOnly := 0
		for _, s := range server {
			if !clientIDs[s.RequestID] {
				serverOnly++
			}
		}
		if serverOnly > 0 {
			fail(fmt.Errorf("%d server records of %s match no client request", serverOnly, imagesRoute))
		}
	}
	watching = false
	fail(watch.Stop())
	provRef, err := provenanceAfter(ctx, in.Fingerprint, dir, before)
	fail(err)
	copyLogs(in.Endpoint.LogPaths, dir)

	// The run directory, written as a text run's is.
	exp := imageExport(all, byID)
	seed := cfg.Seed
	lr := &Result{Seed: seed}
	inputCfg := in.InputConfig
	if inputCfg == nil {
		inputCfg = map[string]any{"endpoint": EndpointImages, "concurrency": cfg.Concurrency, "request_rate": cfg.RequestRate,
			"arrival": cfg.Arrival, "max_concurrency": cfg.MaxConcurrency, "requests": cfg.Requests, "duration": cfg.Duration.String(),
			"warmup": cfg.Warmup, "input_file": in.Fingerprint.Inputs[0], "model": cfg.Model, "url": in.Endpoint.BaseURL, "seed": seed}
	}
	ic := aiperfInputConfig(cfg, lr, sp.sweep, baseSeed, inputCfg)
	ic["endpoint"].(map[string]any)["type"] = "image_generation"
	ic["endpoint"].(map[string]any)["url"] = in.Endpoint.BaseURL
	ic["input"].(map[string]any)["file"] = in.Fingerprint.Inputs[0]
	tel.PerToken(0)
	run := &reports.Run{
		Name:         name,
		Records:      exp,
		Sweep:        &sp.sweep,
		InputConfig:  mustJSON(ic),
		Environment:  mustJSON(env),
		Provenance:   provRef,
		GPUTelemetry: mustJSON(tel),
		StartTime:    t0,
		EndTime:      t0.Add(wall),
		Seed:         &reports.SeedUse{Base: baseSeed, Used: seed},
		Notes:        pres.Notes,
		WasCancelled: ctx.Err() != nil,
	}
	run.Target = target(in, pres.Environment, pres.BundleDigest)
	sum, err := reports.WriteRun(dir, run)
	fail(err)
	pr.Summary = sum
	if ip.Requests > 0 && ip.Errors == ip.Requests {
		fail(fmt.Errorf("0 of %d requests succeeded against %s (first: %s)", ip.Requests, in.Endpoint.BaseURL, firstImageError(recs)))
	} else if in.MaxErrorRate != nil && ip.Requests > 0 && float64(ip.Errors)/float64(ip.Requests) > *in.MaxErrorRate {
		fail(fmt.Errorf("%d of %d requests failed (max error rate %v; first: %s)", ip.Errors, ip.Requests, *in.MaxErrorRate, firstImageError(recs)))
	}
	return pr, ip
}

// runImageLoop sends the measured requests of a point: a closed loop of cfg.Concurrency
// workers, or an open loop at cfg.RequestRate (Poisson or constant gaps from cfg.Seed, at most
// cfg.MaxConcurrency in flight), until cfg.Requests were sent or cfg.Duration passed. It
// returns the records, the loop's start and its wall time.
func runImageLoop(ctx context.Context, cfg Config, send func(int, bool) imageClientRecord) ([]imageClientRecord, time.Time, time.Duration) {
	var mu sync.Mutex
	var recs []imageClientRecord
	t0 := time.Now()
	deadline := time.Time{}
	if cfg.Duration > 0 {
		deadline = t0.Add(cfg.Duration)
	}
	more := func(i int) bool {
		if cfg.Requests > 0 && i >= cfg.Requests {
			return false
		}
		return deadline.IsZero() || time.Now().Before(deadline)
	}
	var wg sync.WaitGroup
	if cfg.Concurrency > 0 {
		next := 0
		for w := 0; w < cfg.Concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					mu.Lock()
					i := next
					ok := more(i)
					next++
					mu.Unlock()
					if !ok {
						return
					}
					rec := send(i, false)
					mu.Lock()
					recs = append(recs, rec)
					mu.Unlock()
				}
			}()
		}
	} else {
		rng := rand.New(rand.NewPCG(cfg.Seed, 0x696d616765))
		sem := make(chan struct{}, 1<<16)
		if cfg.MaxConcurrency > 0 {
			sem = make(chan struct{}, cfg.MaxConcurrency)
		}
		at := t0
		for i := 0; more(i) && ctx.Err() == nil; i++ {
			gap := 1 / cfg.RequestRate
			if cfg.Arrival != "constant" {
				gap = rng.ExpFloat64() / cfg.RequestRate
			}
			at = at.Add(time.Duration(gap * float64(time.Second)))
			time.Sleep(time.Until(at))
			sem <- struct{}{}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				rec := send(i, false)
				<-sem
				mu.Lock()
				recs = append(recs, rec)
				mu.Unlock()
			}(i)
		}
	}
	wg.Wait()
	sort.Slice(recs, func(i, j int) bool { return recs[i].StartUnixNs < recs[j].StartUnixNs })
	return recs, t0, time.Since(t0)
}

// imageExport turns image requests (warmup and measured) into profile_export.jsonl records:
// request latency (also as mq_http_latency: the end of the body), AIPerf's image metrics
// (num_images 1, image_throughput in images/sec, image_latency in ms/image), the PNG's bytes,
// and, joined by request ID where server records were read, the task wall time, HTTP − task,
// queue wait and PNG encode time.
func imageExport(recs []imageClientRecord, server map[string]records.Server) []reports.ExportRecord {
	out := make([]reports.ExportRecord, 0, len(recs))
	for i, c := range recs {
		phase := reports.PhaseProfiling
		if c.warm() {
			phase = reports.PhaseWarmup
		}
		end := c.StartUnixNs + c.EndNs
		ack := end
		if c.AckNs > 0 {
			ack = c.StartUnixNs + c.AckNs
		}
		e := reports.ExportRecord{
			Metadata: reports.RecordMetadata{SessionNum: i, XRequestID: c.RequestID, XCorrelationID: c.RequestID,
				RequestStartNs: c.StartUnixNs, RequestAckNs: ack, RequestEndNs: end, WorkerID: "images",
				RecordProcessorID: "qual/load", BenchmarkPhase: phase},
			Metrics: map[string]reports.MetricValue{},
		}
		if !c.ok() {
			e.Error = &reports.ErrorDetails{Code: c.Error.Code, Type: c.Error.Type, Message: c.Error.Message}
			out = append(out, e)
			continue
		}
		latMs := float64(c.EndNs) / 1e6
		n := float64(c.NumImages)
		e.Metrics[reports.TagRequestLatency] = reports.Scalar(latMs, "ms")
		e.Metrics[reports.TagHTTPLatency] = reports.Scalar(latMs, "ms")
		e.Metrics[reports.TagNumImages] = reports.Scalar(n, "images")
		if c.EndNs > 0 {
			e.Metrics[reports.TagImageThroughput] = reports.Scalar(n*1e9/float64(c.EndNs), "images/sec")
		}
		e.Metrics[reports.TagImageLatency] = reports.Scalar(latMs/n, "ms/image")
		e.Metrics[reports.TagPNGBytes] = reports.Scalar(float64(c.PNGBytes), "bytes")
		if s, ok := server[c.RequestID]; ok {
			e.Metrics[reports.TagTaskWallTime] = reports.Scalar(float64(s.TaskWallNs)/1e6, "ms")
			e.Metrics[reports.TagHTTPMinusTask] = reports.Scalar(float64(c.EndNs-s.TaskWallNs)/1e6, "ms")
			e.Metrics[reports.TagQueueWait] = reports.Scalar(float64(s.QueueWaitNs)/1e6, "ms")
			e.Metrics[reports.TagServerHTTPLatency] = reports.Scalar(float64(s.HTTPLatencyNs)/1e6, "ms")
			if s.Image != nil {
				e.Metrics[reports.TagPNGEncode] = reports.Scalar(float64(s.Image.PNGEncodeNs)/1e6, "ms")
			}
		}
		out = append(out, e)
	}
	return out
}

func firstImageError(recs []imageClientRecord) string {
	for _, r := range recs {
		if !r.ok() {
			return fmt.Sprintf("%d %s: %s", r.Error.Code, r.Error.Type, r.Error.Message)
		}
	}
	return "none"
}

func sendImage(ctx context.Context, c *http.Client, base, model, apiKey, id string, idx int, r ImageRequest, warm bool, extra map[string]any) imageClientRecord {
	phase := records.PhaseProfiling
	if warm {
		phase = records.PhaseWarmup
	}
	rec := imageClientRecord{RequestID: id, Phase: phase, Input: idx, Size: r.Size, Steps: *r.Steps, Guidance: *r.Guidance, Seed: *r.Seed}
	fields := map[string]any{"model": model, "prompt": r.Prompt, "size": r.Size, "num_inference_steps": *r.Steps,
		"guidance_scale": *r.Guidance, "seed": *r.Seed, "response_format": "b64_json"}
	for k, v := range extra { // --extra-body, merged into every request as into text ones
		if _, set := fields[k]; !set {
			fields[k] = v
		}
	}
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+imagesRoute, bytes.NewReader(body))
	if err != nil {
		rec.fail(0, "no_response", err.Error())
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if warm {
		req.Header.Set("X-Warmup", "1")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	t0 := time.Now()
	rec.StartUnixNs = t0.UnixNano()
	resp, err := c.Do(req)
	if err != nil {
		rec.EndNs = time.Since(t0).Nanoseconds()
		rec.fail(0, "no_response", err.Error())
		return rec
	}
	rec.AckNs = time.Since(t0).Nanoseconds()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	rec.EndNs, rec.HTTPStatus = time.Since(t0).Nanoseconds(), resp.StatusCode
	if err != nil {
		rec.fail(0, "no_response", err.Error())
		return rec
	}
	if resp.StatusCode != http.StatusOK {
		rec.fail(resp.StatusCode, "http_error", strings.TrimSpace(string(b)))
		return rec
	}
	var ans struct {
		Data []struct {
			B64 string `json:"b64_json"`
		} `json:"data"`
	}
	if json.Unmarshal(b, &ans) != nil || len(ans.Data) != 1 {
		rec.fail(0, "bad_response", "the response is not one b64_json image")
		return rec
	}
	png, err := base64.StdEncoding.DecodeString(ans.Data[0].B64)
	if err != nil {
		rec.fail(0, "bad_response", "b64_json: "+err.Error())
		return rec
	}
	s := sha256.Sum256(png)
	rec.PNGSHA256, rec.PNGBytes, rec.NumImages = hex.EncodeToString(s[:]), len(png), 1
	return rec
}

// waitImageRecords reads the server's image records written after offset until every client
// request has one or wait passes.
func waitImageRecords(ctx context.Context, path string, offset int64, client []imageClientRecord, wait time.Duration) ([]records.Server, error) {
	want := map[string]bool{}
	for _, c := range client {
		want[c.RequestID] = true
	}
	deadline := time.Now().Add(wait)
	for {
		sv, err := readRecordsFrom(path, offset, func(s *records.Server) bool { return s.Route == imagesRoute })
		if err != nil {
			return sv, fmt.Errorf("profile images: server records: %w", err)
		}
		found := 0
		for _, s := range sv {
			if want[s.RequestID] {
				found++
			}
		}
		if found >= len(want) || time.Now().After(deadline) || ctx.Err() != nil {
			return sv, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeJSONL writes one JSON line per element of v.
func writeJSONL[T any](path string, v []T) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range v {
		if err := enc.Encode(&v[i]); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func printImageSummary(w io.Writer, points []ImagePoint) {
	fmt.Fprintln(w, "| point | requests | errors | images/s | HTTP p50 ms | HTTP p95 ms | HTTP p99 ms | native task p50 ms | native task p99 ms | PNG encode avg ms | bytes/image | unmatched |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, p := range points {
		fmt.Fprintf(w, "| %s | %d | %d | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f | %d |\n", p.Name, p.Requests, p.Errors, p.ImagesPerSec,
			p.HTTPLatencyMs.P50, p.HTTPLatencyMs.P95, p.HTTPLatencyMs.P99, p.NativeTaskMs.P50, p.NativeTaskMs.P99, p.PNGEncodeMs.Avg, p.PNGBytes.Avg, p.UnmatchedIDs)
	}
}
