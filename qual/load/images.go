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
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelqual/modelqual/qual/provenance"
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

// imageClientRecord is the client's account of one image request.
type imageClientRecord struct {
	RequestID   string  `json:"request_id"`
	Warmup      bool    `json:"warmup"`
	Input       int     `json:"input_index"`
	StartUnixNs int64   `json:"start_unix_ns"`
	LatencyNs   int64   `json:"latency_ns"`
	Status      int     `json:"status"`
	Error       string  `json:"error,omitempty"`
	PNGSHA256   string  `json:"png_sha256,omitempty"`
	PNGBytes    int     `json:"png_bytes,omitempty"`
	Size        string  `json:"size"`
	Steps       int     `json:"num_inference_steps"`
	Guidance    float64 `json:"guidance_scale"`
	Seed        int64   `json:"seed"`
}

// imageServerRecord is what the join reads of qual-server's record of an image request.
type imageServerRecord struct {
	RequestID  string `json:"request_id"`
	Route      string `json:"route"`
	Status     int    `json:"status"`
	TaskWallNs int64  `json:"task_wall_ns"`
	Image      *struct {
		PNGSHA256   string `json:"png_sha256"`
		PNGBytes    int64  `json:"png_bytes"`
		PNGEncodeNs int64  `json:"png_encode_ns"`
	} `json:"image"`
}

// Dist is a distribution's summary in milliseconds (or plain units for bytes).
type Dist struct {
	Avg, Min, Max, P50, P90, P95, P99 float64
	N                                 int
}

func dist(v []float64) Dist {
	if len(v) == 0 {
		return Dist{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	q := func(p float64) float64 { // linear interpolation between closest ranks (numpy's default)
		x := p * float64(len(s)-1)
		i := int(math.Floor(x))
		if i+1 >= len(s) {
			return s[len(s)-1]
		}
		return s[i] + (x-float64(i))*(s[i+1]-s[i])
	}
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Dist{Avg: sum / float64(len(s)), Min: s[0], Max: s[len(s)-1], P50: q(0.5), P90: q(0.9), P95: q(0.95), P99: q(0.99), N: len(s)}
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

// ProfileImages profiles /v1/images/generations: per sweep point, warmup requests (marked
// X-Warmup: 1, reported apart), then a closed loop at each concurrency or an open loop at each
// request rate over the input file's requests in order; client records are joined to the
// server's by request ID (every request exactly one record either way), the served PNG's
// sha256 is checked against the server record's, and the fingerprints taken before the run
// must hold after it. Requests come from the fingerprinted input file (in.Fingerprint.Inputs[0]).
func ProfileImages(ctx context.Context, in ProfileInput, out io.Writer) ([]ImagePoint, error) {
	if len(in.Fingerprint.Inputs) == 0 {
		return nil, errors.New("profile images: pass --input-file F: JSONL lines of {\"prompt\", \"size\", \"num_inference_steps\", \"guidance_scale\", \"seed\"}")
	}
	reqs, err := ReadImageRequests(in.Fingerprint.Inputs[0])
	if err != nil {
		return nil, err
	}
	if in.Endpoint == nil || in.Endpoint.RecordsPath == "" {
		return nil, errors.New("profile images: the server's records are needed to join by request ID; profile a server started with --bundle (or one whose records this launcher knows)")
	}
	if (len(in.Concurrencies) == 0) == (len(in.RequestRates) == 0) {
		return nil, errors.New("profile images: pass exactly one of --concurrency and --request-rate")
	}
	name := in.Name
	if name == "" {
		name = "profile"
	}
	// Only the records written from now on are this run's: a server that answered other
	// requests before (a qualification suite's gates) has their records in the file already.
	recOffset := fileSize(in.Endpoint.RecordsPath)
	fp := in.Fingerprint
	fp.Exclude = append(fp.Exclude, in.OutDir)
	before, err := provenance.Take(ctx, fp)
	if err != nil {
		return nil, fmt.Errorf("profile images: fingerprints before: %w", err)
	}
	client := &http.Client{Timeout: in.Load.RequestTimeout}
	base := strings.TrimRight(in.Endpoint.BaseURL, "/")
	var points []ImagePoint
	var all []imageClientRecord
	type sweep struct {
		conc int
		rate float64
	}
	var sweeps []sweep
	for _, c := range in.Concurrencies {
		sweeps = append(sweeps, sweep{conc: c})
	}
	for _, r := range in.RequestRates {
		sweeps = append(sweeps, sweep{rate: r})
	}
	for si, sw := range sweeps {
		p := ImagePoint{Concurrency: sw.conc, RequestRate: sw.rate}
		if sw.conc > 0 {
			p.Name = fmt.Sprintf("%s-c%d", name, sw.conc)
		} else {
			p.Name = fmt.Sprintf("%s-r%g", name, sw.rate)
		}
		send := func(i int, warm bool) imageClientRecord {
			r := reqs[i%len(reqs)]
			id := fmt.Sprintf("%s-%s-%d", p.Name, map[bool]string{true: "w", false: "m"}[warm], i)
			return sendImage(ctx, client, base, in.Endpoint.Model, in.Load.APIKey, id, i%len(reqs), r, warm)
		}
		for i := 0; i < in.Load.Warmup; i++ {
			rec := send(i, true)
			all = append(all, rec)
			p.WarmupRequests++
		}
		var mu sync.Mutex
		var recs []imageClientRecord
		t0 := time.Now()
		deadline := time.Time{}
		if in.Load.Duration > 0 {
			deadline = t0.Add(in.Load.Duration)
		}
		more := func(i int) bool {
			if in.Load.Requests > 0 && i >= in.Load.Requests {
				return false
			}
			return deadline.IsZero() || time.Now().Before(deadline)
		}
		if sw.conc > 0 {
			next := 0
			var wg sync.WaitGroup
			for w := 0; w < sw.conc; w++ {
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
			wg.Wait()
		} else {
			rng := rand.New(rand.NewPCG(in.Load.Seed+uint64(si), 0x696d616765))
			sem := make(chan struct{}, max(1, in.Load.MaxConcurrency))
			if in.Load.MaxConcurrency <= 0 {
				sem = make(chan struct{}, 1<<16)
			}
			var wg sync.WaitGroup
			at := t0
			for i := 0; more(i) && ctx.Err() == nil; i++ {
				gap := 1 / sw.rate
				if in.Load.Arrival != "constant" {
					gap = rng.ExpFloat64() / sw.rate
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
			wg.Wait()
		}
		wall := time.Since(t0)
		p.WallSeconds = wall.Seconds()
		var lat, bytesV []float64
		for _, r := range recs {
			p.Requests++
			if r.Status != http.StatusOK {
				p.Errors++
				continue
			}
			lat = append(lat, float64(r.LatencyNs)/1e6)
			bytesV = append(bytesV, float64(r.PNGBytes))
		}
		p.ImagesPerSec = float64(len(lat)) / wall.Seconds()
		p.HTTPLatencyMs, p.PNGBytes = dist(lat), dist(bytesV)
		all = append(all, recs...)
		points = append(points, p)
		if in.Load.Progress != nil {
			fmt.Fprintf(in.Load.Progress, "profile images: %s: %d requests, %d errors, %.3f images/s\n", p.Name, p.Requests, p.Errors, p.ImagesPerSec)
		}
	}
	// Join with the server's records (written as each request ends; wait for the last).
	server, err := waitImageRecords(in.Endpoint.RecordsPath, recOffset, all, in.RecordsWait)
	if err != nil {
		return points, err
	}
	byID := map[string]imageServerRecord{}
	for _, s := range server {
		byID[s.RequestID] = s
	}
	clientIDs := map[string]bool{}
	var problems []string
	for pi := range points {
		p := &points[pi]
		var native, enc []float64
		for _, c := range all {
			if !strings.HasPrefix(c.RequestID, p.Name+"-") {
				continue
			}
			clientIDs[c.RequestID] = true
			s, ok := byID[c.RequestID]
			if !ok {
				p.UnmatchedIDs++
				continue
			}
			if c.Warmup || c.Status != http.StatusOK || s.Image == nil {
				continue
			}
			native = append(native, float64(s.TaskWallNs)/1e6)
			enc = append(enc, float64(s.Image.PNGEncodeNs)/1e6)
			if s.Image.PNGSHA256 != c.PNGSHA256 {
				p.SHAMismatches++
			}
		}
		p.NativeTaskMs, p.PNGEncodeMs = dist(native), dist(enc)
		if p.UnmatchedIDs > 0 || p.SHAMismatches > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d client requests without a server record, %d PNGs whose sha256 differs from the server's record", p.Name, p.UnmatchedIDs, p.SHAMismatches))
		}
		if p.Requests > 0 && p.Errors == p.Requests {
			problems = append(problems, fmt.Sprintf("%s: 0 of %d requests succeeded", p.Name, p.Requests))
		} else if in.MaxErrorRate != nil && p.Requests > 0 && float64(p.Errors)/float64(p.Requests) > *in.MaxErrorRate {
			problems = append(problems, fmt.Sprintf("%s: %d of %d requests failed (max error rate %v)", p.Name, p.Errors, p.Requests, *in.MaxErrorRate))
		}
	}
	serverOnly := 0
	for _, s := range server {
		if !clientIDs[s.RequestID] {
			serverOnly++
		}
	}
	if serverOnly > 0 {
		problems = append(problems, fmt.Sprintf("%d server records of %s match no client request", serverOnly, "/v1/images/generations"))
	}
	after, err := provenance.Take(ctx, fp)
	if err != nil {
		return points, fmt.Errorf("profile images: fingerprints after: %w", err)
	}
	if err := provenance.Compare(before, after); err != nil {
		problems = append(problems, err.Error())
	}
	if err := writeImageRun(in.OutDir, points, all, server, before, after); err != nil {
		return points, err
	}
	printImageSummary(out, points)
	if len(problems) > 0 {
		return points, fmt.Errorf("profile images: %s", strings.Join(problems, "; "))
	}
	return points, nil
}

func sendImage(ctx context.Context, c *http.Client, base, model, apiKey, id string, idx int, r ImageRequest, warm bool) imageClientRecord {
	rec := imageClientRecord{RequestID: id, Warmup: warm, Input: idx, Size: r.Size, Steps: *r.Steps, Guidance: *r.Guidance, Seed: *r.Seed}
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": r.Prompt, "size": r.Size, "num_inference_steps": *r.Steps,
		"guidance_scale": *r.Guidance, "seed": *r.Seed})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/images/generations", bytes.NewReader(body))
	if err != nil {
		rec.Error = err.Error()
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
		rec.LatencyNs, rec.Error = time.Since(t0).Nanoseconds(), err.Error()
		return rec
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	rec.LatencyNs, rec.Status = time.Since(t0).Nanoseconds(), resp.StatusCode
	if err != nil {
		rec.Error = err.Error()
		return rec
	}
	if resp.StatusCode != http.StatusOK {
		rec.Error = strings.TrimSpace(string(b))
		return rec
	}
	var ans struct {
		Data []struct {
			B64 string `json:"b64_json"`
		} `json:"data"`
	}
	if json.Unmarshal(b, &ans) != nil || len(ans.Data) != 1 {
		rec.Status, rec.Error = 0, "the response is not one b64_json image"
		return rec
	}
	png, err := base64.StdEncoding.DecodeString(ans.Data[0].B64)
	if err != nil {
		rec.Status, rec.Error = 0, "b64_json: "+err.Error()
		return rec
	}
	s := sha256.Sum256(png)
	rec.PNGSHA256, rec.PNGBytes = hex.EncodeToString(s[:]), len(png)
	return rec
}

// waitImageRecords reads the server's image records until every client request has one or
// wait (default 5 s) passes.
func waitImageRecords(path string, offset int64, client []imageClientRecord, wait time.Duration) ([]imageServerRecord, error) {
	if wait <= 0 {
		wait = 5 * time.Second
	}
	want := map[string]bool{}
	for _, c := range client {
		want[c.RequestID] = true
	}
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("profile images: server records: %w", err)
		}
		if offset > 0 && offset <= int64(len(b)) {
			b = b[offset:]
		}
		var out []imageServerRecord
		found := 0
		for _, line := range bytes.Split(b, []byte("\n")) {
			var r imageServerRecord
			if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &r) != nil || r.Route != "/v1/images/generations" {
				continue
			}
			out = append(out, r)
			if want[r.RequestID] {
				found++
			}
		}
		if found >= len(want) || time.Now().After(deadline) {
			return out, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeImageRun writes summary.json, summary.md, the client records and the server records
// under dir, and profile_export_aiperf.json with the fields AIPerf has for this workload
// (request_latency in ms, request_throughput in requests/s, request_count, error_request_count).
func writeImageRun(dir string, points []ImagePoint, client []imageClientRecord, server []imageServerRecord, before, after *provenance.Fingerprints) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("profile images: %w", err)
	}
	write := func(name string, v any) error {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644)
	}
	if err := write("summary.json", map[string]any{"endpoint": EndpointImages, "points": points, "fingerprints_before": before, "fingerprints_after": after}); err != nil {
		return fmt.Errorf("profile images: %w", err)
	}
	var exports []map[string]any
	for _, p := range points {
		m := func(d Dist, unit string) map[string]any {
			return map[string]any{"unit": unit, "avg": d.Avg, "min": d.Min, "max": d.Max, "p50": d.P50, "p90": d.P90, "p95": d.P95, "p99": d.P99}
		}
		exports = append(exports, map[string]any{"name": p.Name, "request_latency": m(p.HTTPLatencyMs, "ms"),
			"request_throughput":  map[string]any{"unit": "requests/sec", "avg": p.ImagesPerSec},
			"request_count":       map[string]any{"unit": "requests", "avg": p.Requests - p.Errors},
			"error_request_count": map[string]any{"unit": "requests", "avg": p.Errors}})
	}
	if err := write("profile_export_aiperf.json", exports); err != nil {
		return fmt.Errorf("profile images: %w", err)
	}
	var cl, sv bytes.Buffer
	for _, c := range client {
		b, _ := json.Marshal(c)
		cl.Write(append(b, '\n'))
	}
	for _, s := range server {
		b, _ := json.Marshal(s)
		sv.Write(append(b, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "client_records.jsonl"), cl.Bytes(), 0o644); err != nil {
		return fmt.Errorf("profile images: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "server_records.jsonl"), sv.Bytes(), 0o644); err != nil {
		return fmt.Errorf("profile images: %w", err)
	}
	var md bytes.Buffer
	printImageSummary(&md, points)
	return os.WriteFile(filepath.Join(dir, "summary.md"), md.Bytes(), 0o644)
}

func printImageSummary(w io.Writer, points []ImagePoint) {
	fmt.Fprintln(w, "| point | requests | errors | images/s | HTTP p50 ms | HTTP p95 ms | HTTP p99 ms | native task p50 ms | native task p99 ms | PNG encode avg ms | bytes/image | unmatched |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, p := range points {
		fmt.Fprintf(w, "| %s | %d | %d | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f | %d |\n", p.Name, p.Requests, p.Errors, p.ImagesPerSec,
			p.HTTPLatencyMs.P50, p.HTTPLatencyMs.P95, p.HTTPLatencyMs.P99, p.NativeTaskMs.P50, p.NativeTaskMs.P99, p.PNGEncodeMs.Avg, p.PNGBytes.Avg, p.UnmatchedIDs)
	}
}
