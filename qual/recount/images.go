package recount

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// imageDist is a distribution as the image layout writes it.
type imageDist struct {
	Avg, Min, Max, P50, P90, P95, P99 float64
	N                                 int
}

// imagePoint is one sweep point of the image layout's summary.json.
type imagePoint struct {
	Name           string    `json:"name"`
	Requests       int       `json:"requests"`
	Errors         int       `json:"errors"`
	WarmupRequests int       `json:"warmup_requests"`
	ImagesPerSec   float64   `json:"images_per_second"`
	WallSeconds    float64   `json:"wall_seconds"`
	HTTPLatencyMs  imageDist `json:"http_latency_ms"`
	NativeTaskMs   imageDist `json:"native_task_ms"`
	PNGEncodeMs    imageDist `json:"png_encode_ms"`
	PNGBytes       imageDist `json:"png_bytes"`
	UnmatchedIDs   int       `json:"unmatched_request_ids"`
	SHAMismatches  int       `json:"png_sha256_mismatches"`
}

// pointOf is the sweep point a request ID of the image layout belongs to: IDs are
// <point>-w-<i> (warmup) and <point>-m-<i> (measured).
func pointOf(id string) string {
	parts := strings.Split(id, "-")
	if len(parts) < 3 {
		return ""
	}
	return strings.Join(parts[:len(parts)-2], "-")
}

// imageCalc is one point recomputed.
type imageCalc struct {
	requests, errors, warmup, unmatched, shaMismatch int
	latency, bytes, native, encode                   []sample
	first, last                                      int64 // first measured send, last measured response (epoch ns)
	firstID, lastID                                  string
}

// span is the point's METRICS.md window in seconds: first measured send to last response.
func (pc *imageCalc) span() float64 {
	if pc.firstID == "" {
		return 0
	}
	return float64(pc.last-pc.first) / 1e9
}

// verifyImages checks a run of the image layout: for every sweep point, the request, error
// and warmup counts, the HTTP latency and PNG size distributions over the measured requests
// that returned an image (warmup apart, failures out), the native task and PNG encode
// distributions from the server records, the unmatched and sha256 counts, and images/s; and
// the server records against the images received.
func verifyImages(dir string, sum *summaryJSON, rep *Report) error {
	var points []imagePoint
	if err := json.Unmarshal(sum.Points, &points); err != nil {
		return fmt.Errorf("verify: %s points: %w", filepath.Join(dir, summaryFile), err)
	}
	client, err := readJSONL[imageClientRecord](filepath.Join(dir, clientRecordsFile))
	if err != nil {
		return err
	}
	rep.Requests = len(client)
	server, err := readJSONL[serverRecord](filepath.Join(dir, serverRecordsFile))
	if err != nil {
		return err
	}
	checkImageRecords(client, server, rep)
	anyRecord := map[string]*serverRecord{}
	for i := range server {
		anyRecord[server[i].RequestID] = &server[i]
	}
	calc := map[string]*imageCalc{}
	for _, p := range points {
		calc[p.Name] = &imageCalc{}
	}
	for i := range client {
		c := &client[i]
		pc := calc[pointOf(c.RequestID)]
		if pc == nil {
			rep.Checked++
			rep.add(Mismatch{Figure: summaryFile + " points", Reported: "no point for request " + c.RequestID, Recomputed: "a point named " + pointOf(c.RequestID), Records: []string{c.RequestID}})
			continue
		}
		s := anyRecord[c.RequestID]
		if s == nil {
			pc.unmatched++
		}
		if c.warm() {
			pc.warmup++
			continue
		}
		pc.requests++
		if !c.ok() {
			pc.errors++
			continue
		}
		if end := c.StartUnixNs + c.EndNs; pc.firstID == "" {
			pc.first, pc.firstID, pc.last, pc.lastID = c.StartUnixNs, c.RequestID, end, c.RequestID
		} else {
			if c.StartUnixNs < pc.first {
				pc.first, pc.firstID = c.StartUnixNs, c.RequestID
			}
			if end > pc.last {
				pc.last, pc.lastID = end, c.RequestID
			}
		}
		pc.latency = append(pc.latency, sample{ms(c.EndNs), c.RequestID})
		pc.bytes = append(pc.bytes, sample{float64(c.PNGBytes), c.RequestID})
		if s != nil && s.Image != nil {
			pc.native = append(pc.native, sample{ms(s.TaskWallNs), c.RequestID})
			pc.encode = append(pc.encode, sample{ms(s.Image.PNGEncodeNs), c.RequestID})
			if s.Image.PNGSHA256 != c.PNGSHA256 {
				pc.shaMismatch++
			}
		}
	}
	exports := map[string]map[string]map[string]json.RawMessage{}
	if b, err := os.ReadFile(filepath.Join(dir, aiperfJSONFile)); err == nil {
		var list []map[string]json.RawMessage
		if err := json.Unmarshal(b, &list); err != nil {
			return fmt.Errorf("verify: %s: %w", filepath.Join(dir, aiperfJSONFile), err)
		}
		for _, e := range list {
			var name string
			_ = json.Unmarshal(e["name"], &name)
			m := map[string]map[string]json.RawMessage{}
			for k, raw := range e {
				var obj map[string]json.RawMessage
				if json.Unmarshal(raw, &obj) == nil {
					m[k] = obj
				}
			}
			exports[name] = m
		}
	} else {
		rep.note("%s: %v; not verified", aiperfJSONFile, err)
	}
	for _, p := range points {
		pc := calc[p.Name]
		where := summaryFile + " " + p.Name
		count := func(name string, got, want int) {
			rep.Checked++
			if got != want {
				rep.add(Mismatch{Figure: where + " " + name, Reported: strconv.Itoa(got), Recomputed: strconv.Itoa(want)})
			}
		}
		count("requests", p.Requests, pc.requests)
		count("errors", p.Errors, pc.errors)
		count("warmup_requests", p.WarmupRequests, pc.warmup)
		count("unmatched_request_ids", p.UnmatchedIDs, pc.unmatched)
		count("png_sha256_mismatches", p.SHAMismatches, pc.shaMismatch)
		ok := pc.requests - pc.errors
		compareImageDist(rep, where+" http_latency_ms", p.HTTPLatencyMs, pc.latency)
		compareImageDist(rep, where+" png_bytes", p.PNGBytes, pc.bytes)
		compareImageDist(rep, where+" native_task_ms", p.NativeTaskMs, pc.native)
		compareImageDist(rep, where+" png_encode_ms", p.PNGEncodeMs, pc.encode)
		// images/s: images over the sweep point's wall clock, which must enclose every
		// measured request; METRICS.md's window (first send to last response) is noted.
		rep.Checked += 2
		if p.WallSeconds > 0 && !agree(p.ImagesPerSec, float64(ok)/p.WallSeconds, 0) {
			rep.add(Mismatch{Figure: where + " images_per_second", Reported: num(p.ImagesPerSec), Recomputed: num(float64(ok) / p.WallSeconds),
				Why: fmt.Sprintf("%d images over the point's %s s", ok, num(p.WallSeconds)), Records: nonEmpty(pc.firstID, pc.lastID)})
		}
		if p.WallSeconds < pc.span()*(1-precision) {
			rep.add(Mismatch{Figure: where + " wall_seconds", Reported: num(p.WallSeconds), Recomputed: fmt.Sprintf("at least %s", num(pc.span())),
				Why: "the point's wall clock is shorter than the requests it measured", Records: nonEmpty(pc.firstID, pc.lastID)})
		}
		if pc.span() > 0 {
			rep.note("%s: images/s over METRICS.md's window (first send to last response, %s s) is %s; the point reports %s over its wall clock",
				p.Name, num(pc.span()), num(float64(ok)/pc.span()), num(p.ImagesPerSec))
		}
		e, has := exports[p.Name]
		if !has {
			if len(exports) > 0 {
				rep.Checked++
				rep.add(Mismatch{Figure: aiperfJSONFile + " " + p.Name, Reported: "absent", Recomputed: "the point"})
			}
			continue
		}
		ew := aiperfJSONFile + " " + p.Name
		scalar := func(tag string, want float64) {
			rep.Checked++
			_, vals := metricNumbers(e[tag])
			if g, ok := vals["avg"]; !ok || !agree(g, want, 0) {
				rep.add(Mismatch{Figure: ew + " " + tag, Reported: fmt.Sprint(vals["avg"]), Recomputed: num(want), Records: nonEmpty(pc.firstID, pc.lastID)})
			}
		}
		scalar(tagReqCount, float64(ok))
		scalar(tagErrCount, float64(pc.errors))
		if p.WallSeconds > 0 {
			scalar(tagReqTput, float64(ok)/p.WallSeconds)
		}
		if d, has := describe(pc.latency); has {
			_, vals := metricNumbers(e[tagLatency])
			for _, st := range []string{"avg", "min", "max", "p50", "p90", "p95", "p99"} {
				w, _ := d.stat(st)
				rep.Checked++
				if g, ok := vals[st]; !ok || !agree(g, w, d.magnitude) {
					rep.add(Mismatch{Figure: fmt.Sprintf("%s %s.%s", ew, tagLatency, st), Reported: fmt.Sprint(vals[st]), Recomputed: num(w), Records: d.statRecords(st)})
				}
			}
		}
	}
	return nil
}

// compareImageDist compares one of the image layout's distributions with its recomputation
// (all zero for an empty sample).
func compareImageDist(rep *Report, where string, got imageDist, s []sample) {
	d, _ := describe(s)
	rep.Checked++
	if got.N != d.n {
		rep.add(Mismatch{Figure: where + ".N", Reported: strconv.Itoa(got.N), Recomputed: strconv.Itoa(d.n)})
	}
	if d.n == 0 {
		return
	}
	for _, f := range []struct {
		st  string
		got float64
	}{{"avg", got.Avg}, {"min", got.Min}, {"max", got.Max}, {"p50", got.P50}, {"p90", got.P90}, {"p95", got.P95}, {"p99", got.P99}} {
		w, _ := d.stat(f.st)
		rep.Checked++
		if !agree(f.got, w, d.magnitude) {
			m := Mismatch{Figure: where + "." + f.st, Reported: num(f.got), Recomputed: num(w), Records: d.statRecords(f.st)}
			if m.Records == nil {
				m.Why = fmt.Sprintf("over all %d values", d.n)
			}
			rep.add(m)
		}
	}
}
