// Package recount recomputes every figure a run directory reports from the run's raw client
// records alone (each request's send time, the arrival of each content chunk, its status and
// phase) and compares the two: summary.json, profile_export.jsonl, profile_export_aiperf.json
// and profile_export_aiperf.csv. It also checks the server's records against what the client
// received (status, token counts, finish reason, PNG bytes and sha256) and that every request
// sent has exactly one server record.
//
// It is written apart from qual/metrics and reports on purpose, from METRICS.md's
// definitions alone, and imports nothing of the module: a figure computed over the wrong
// span, a throughput inflated for one route, or warmup and failed requests counted where the
// definitions do not put them, cannot be made twice the same way here and there. It reads
// the run's files by field name and ignores fields it does not know, so a layout that grows
// keeps being checked.
//
// Two layouts are read: the text layout of `qual profile` (completions, chat, streaming,
// vision chat, gRPC: client_records.jsonl, server_records.jsonl, summary.json with its
// profiling and warmup phases, the AIPerf exports), also written per sweep point by an image
// profile, whose client records take the text records' format (phase, send and receive
// times, status, error, PNG bytes, number of images) and whose figures (request and image
// latency, image throughput, PNG bytes, counts, window, request throughput, the server-side
// times) are recomputed the same way; and the earlier image layout of `qual profile
// --endpoint images` (summary.json with one entry per sweep point).
package recount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// File names of a run directory.
const (
	clientRecordsFile = "client_records.jsonl"
	serverRecordsFile = "server_records.jsonl"
	summaryFile       = "summary.json"
	exportJSONLFile   = "profile_export.jsonl"
	aiperfJSONFile    = "profile_export_aiperf.json"
	aiperfCSVFile     = "profile_export_aiperf.csv"
)

// Mismatch is one reported figure that the records do not give, or one server record that
// disagrees with what the client received.
type Mismatch struct {
	// Figure names the figure: the file, the phase or point, the metric and the statistic,
	// e.g. "summary.json profiling time_to_first_token.p99".
	Figure string
	// Reported is what the file says ("absent" when it lacks the figure); Recomputed is what
	// the records give ("absent" when they give none).
	Reported, Recomputed string
	// Records are the request IDs that differ or that the figure rests on (the two neighbours
	// a percentile interpolates between, the requests bounding the benchmark window).
	Records []string
	// Why says more when the values alone do not.
	Why string
	// group gathers the per-request mismatches of one figure ("profile_export.jsonl
	// time_to_first_token"), which Err reports once with their count and requests.
	group string
	// response marks a server record compared with the client's response (Reported is the
	// record's value, Recomputed what the client received).
	response bool
}

func (m Mismatch) String() string {
	s := fmt.Sprintf("%s: reported %s, the records give %s", m.Figure, m.Reported, m.Recomputed)
	if m.response {
		s = fmt.Sprintf("%s: the server's record says %s, the client received %s", m.Figure, m.Reported, m.Recomputed)
	}
	if m.Why != "" {
		s += " (" + m.Why + ")"
	}
	if len(m.Records) > 0 {
		ids := m.Records
		more := ""
		if len(ids) > maxNamed {
			ids, more = ids[:maxNamed], fmt.Sprintf(" and %d more", len(m.Records)-maxNamed)
		}
		s += "; records: " + strings.Join(ids, ", ") + more
	}
	return s
}

// maxNamed caps how many request IDs one mismatch lists.
const maxNamed = 12

// Report is what Verify found in one run directory.
type Report struct {
	Dir    string
	Layout string // "text" or "images"
	// Requests is how many client records were read; Checked how many reported values were
	// compared with their recomputation.
	Requests, Checked int
	Mismatches        []Mismatch
	// Notes say what was not checked and why (a file the run does not have, a tag this
	// package does not know).
	Notes []string
	noted map[string]bool
}

// Err is nil when every figure agreed, else an error listing the mismatches: the run-level
// figures first, then each per-request figure once, with how many requests differ, the first
// of them and their IDs.
func (r *Report) Err() error {
	if len(r.Mismatches) == 0 {
		return nil
	}
	var lines []string
	groups := map[string][]Mismatch{}
	var order []string
	for _, m := range r.Mismatches {
		if m.group == "" {
			lines = append(lines, m.String())
			continue
		}
		if _, ok := groups[m.group]; !ok {
			order = append(order, m.group)
		}
		groups[m.group] = append(groups[m.group], m)
	}
	for _, g := range order {
		ms := groups[g]
		if len(ms) == 1 {
			lines = append(lines, ms[0].String())
			continue
		}
		first := ms[0]
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.Records...)
		}
		first.Records = ids
		lines = append(lines, fmt.Sprintf("%s: %d requests differ, the first: %s", g, len(ms), first.String()))
	}
	const shown = 40
	if len(lines) > shown {
		lines = append(lines[:shown], fmt.Sprintf("... and %d more", len(lines)-shown))
	}
	return fmt.Errorf("%s: %d of %d reported figures differ from their recomputation from %s (or records disagree with responses):\n  %s",
		r.Dir, len(r.Mismatches), r.Checked, clientRecordsFile, strings.Join(lines, "\n  "))
}

// Summary is one line for people: what was checked and the outcome.
func (r *Report) Summary() string {
	state := "all agree"
	if n := len(r.Mismatches); n > 0 {
		state = fmt.Sprintf("%d MISMATCHES", n)
	}
	return fmt.Sprintf("%s: %s layout, %d requests, %d figures compared: %s", r.Dir, r.Layout, r.Requests, r.Checked, state)
}

// Verify recomputes the run directory dir's figures from its client records and compares
// them with every report it holds. The error is for a directory that cannot be verified at
// all (no client records, unreadable files); figures that differ are in the Report
// (Report.Err).
func Verify(dir string) (*Report, error) {
	r := &Report{Dir: dir}
	if _, err := os.Stat(filepath.Join(dir, clientRecordsFile)); err != nil {
		return r, fmt.Errorf("verify %s: %w; verify needs the raw client records a run of qual profile writes (a merged run or an AIPerf directory has none)", dir, err)
	}
	sum, err := readSummary(filepath.Join(dir, summaryFile))
	if err != nil {
		return r, err
	}
	if sum.Endpoint == "images" && len(sum.Points) > 0 {
		r.Layout = "images"
		return r, verifyImages(dir, sum, r)
	}
	if sum.InputConfig.Endpoint.Type == "image_generation" {
		r.Layout = "text (images)"
		return r, verifyImagePoint(dir, sum, r)
	}
	r.Layout = "text"
	return r, verifyText(dir, sum, r)
}

// verifyImagePoint checks one sweep point of an image run written in the text layout: one
// server record per request, each equal to the image the client received (status, warmup flag,
// PNG bytes and sha256, controls); and every figure the point reports, recomputed from the
// client records (and the server records for the server-side figures) as METRICS.md defines
// them, against profile_export.jsonl line by line, summary.json's phases, the AIPerf JSON and
// CSV: request latency, image latency and image throughput per request, PNG bytes, the
// number of images, the request and error counts, the benchmark window and request
// throughput; the task wall time, HTTP − task, queue wait, server HTTP latency and PNG encode
// time from the server's records.
func verifyImagePoint(dir string, sum *summaryJSON, rep *Report) error {
	client, err := readJSONL[imageClientRecord](filepath.Join(dir, clientRecordsFile))
	if err != nil {
		return err
	}
	rep.Requests = len(client)
	var joined map[string]*serverRecord
	svPath := filepath.Join(dir, serverRecordsFile)
	if _, err := os.Stat(svPath); err == nil {
		server, err := readJSONL[serverRecord](svPath)
		if err != nil {
			return err
		}
		checkImageRecords(client, server, rep)
		count := map[string]int{}
		for i := range server {
			count[server[i].RequestID]++
		}
		joined = map[string]*serverRecord{}
		for i := range server {
			if count[server[i].RequestID] == 1 {
				joined[server[i].RequestID] = &server[i]
			}
		}
	} else {
		rep.note("%s: none (an external server): the server figures and the record checks are left out", serverRecordsFile)
	}
	reqs := make([]request, len(client))
	for i := range client {
		reqs[i] = recomputeImage(&client[i], joined[client[i].RequestID])
	}
	prof := aggregateImages(reqs, phaseProfiling)
	warm := aggregateImages(reqs, phaseWarmup)
	diff := checkExportJSONL(filepath.Join(dir, exportJSONLFile), reqs, rep)
	comparePhase(rep, summaryFile+" profiling", sum.Profiling, prof, diff[phaseProfiling])
	if sum.Warmup != nil || warm.requests > 0 {
		comparePhase(rep, summaryFile+" warmup", sum.Warmup, warm, diff[phaseWarmup])
	}
	am, aerrs, err := readAIPerfJSON(filepath.Join(dir, aiperfJSONFile))
	if err != nil {
		return err
	}
	comparePhase(rep, aiperfJSONFile, &phaseJSON{Metrics: am, Errors: aerrs}, prof, diff[phaseProfiling])
	return checkCSV(filepath.Join(dir, aiperfCSVFile), prof, diff[phaseProfiling], rep)
}

// recomputeImage derives an image request's figures from its client record (and its server
// record, when joined): a request that returned no image has none but its error's code and
// type; one that did has request latency = end of the body − send (also as mq_http_latency),
// num_images, image latency = latency / images, image throughput = images / latency in
// seconds, and the PNG's bytes; the server's record gives the task wall time, HTTP − task
// (the client's latency minus the task), the queue wait, the server's HTTP latency and the
// PNG encode time.
func recomputeImage(c *imageClientRecord, sv *serverRecord) request {
	r := request{id: c.RequestID, phase: c.Phase, vals: map[string]float64{}, startNs: c.StartUnixNs,
		ackNs: c.StartUnixNs + c.EndNs, httpEndNs: c.StartUnixNs + c.EndNs, windowEnd: c.StartUnixNs + c.EndNs}
	if c.AckNs > 0 {
		r.ackNs = c.StartUnixNs + c.AckNs
	}
	if !c.ok() {
		r.failed, r.errCode, r.errType = true, c.Failure.Code, c.Failure.Type
		return r
	}
	n := float64(c.NumImages)
	r.vals[tagLatency] = ms(c.EndNs)
	r.vals[tagHTTPLatency] = ms(c.EndNs)
	r.vals[tagNumImages] = n
	r.vals[tagImageLatency] = ms(c.EndNs) / n
	if c.EndNs > 0 {
		r.vals[tagImageTput] = n / (float64(c.EndNs) / 1e9)
	}
	r.vals[tagPNGBytes] = float64(c.PNGBytes)
	if sv != nil {
		r.vals[tagTaskWall] = ms(sv.TaskWallNs)
		r.vals[tagHTTPMinusTask] = ms(c.EndNs - sv.TaskWallNs)
		r.vals[tagQueueWait] = ms(sv.QueueWaitNs)
		r.vals[tagServerHTTP] = ms(sv.HTTPLatencyNs)
		if sv.Image != nil {
			r.vals[tagPNGEncode] = ms(sv.Image.PNGEncodeNs)
		}
	}
	return r
}

// aggregateImages is a phase of an image run recomputed: the text layout's aggregation
// (distributions over the requests that returned an image, the benchmark window over them,
// request throughput = those requests / window, errors by code and type) without the token
// figures an image run does not define (token sums and throughput, the error input length).
func aggregateImages(reqs []request, phase string) phaseCalc {
	pc := aggregate(reqs, phase, nil, nil)
	delete(pc.dists, tagErrISL)
	for _, tag := range []string{tagTotalOut, tagTotalOSL, tagTotalISL, tagTotalErrISL, tagOutTput} {
		delete(pc.scalars, tag)
		delete(pc.wholes, tag)
	}
	return pc
}

// add records a mismatch.
func (r *Report) add(m Mismatch) { r.Mismatches = append(r.Mismatches, m) }

// note records what was not checked.
func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// noteOnce records a note the first time it is made.
func (r *Report) noteOnce(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if r.noted == nil {
		r.noted = map[string]bool{}
	}
	if !r.noted[n] {
		r.noted[n] = true
		r.Notes = append(r.Notes, n)
	}
}

// num writes a figure as the files do: the shortest form that reads back the same.
func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// fileErr wraps a read error with the file and what to do.
func fileErr(path string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("verify: %s is missing; the run directory is incomplete (was the run interrupted?)", path)
	}
	return fmt.Errorf("verify: read %s: %w", path, err)
}

// RunDirs lists the run directories at or under root (folders holding client_records.jsonl),
// so that a profile's output folder (one run per sweep point) or a qualification's artifact
// folder is verified whole. A root that is itself a run gives just root.
func RunDirs(root string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(root, clientRecordsFile)); err == nil {
		return []string{root}, nil
	}
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == clientRecordsFile {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("verify: %s holds no run directory (no %s at or under it); pass a folder written by qual profile", root, clientRecordsFile)
	}
	return dirs, nil
}
