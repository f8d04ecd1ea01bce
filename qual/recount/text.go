package recount

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Phases of a run (metadata.benchmark_phase).
const (
	phaseWarmup    = "warmup"
	phaseProfiling = "profiling"
)

// cancelledCode is the error code of a request the client cancelled (AIPerf's convention).
const cancelledCode = 499

// request is one client record with the per-request figures METRICS.md defines for it.
type request struct {
	id        string
	phase     string
	failed    bool
	cancelled bool // counted as cancelled: the client cancelled it or its error is code 499
	clientCx  bool // the client record says it cancelled the request (metadata.was_cancelled)
	errCode   int
	errType   string
	vals      map[string]float64
	icl       []float64 // inter-chunk latency in ms; nil when the request has none
	startNs   int64     // epoch ns of the send
	ackNs     int64     // epoch ns of the response headers (= start when none came)
	httpEndNs int64     // epoch ns of the end of the HTTP body
	windowEnd int64     // epoch ns the request ends at in the benchmark window
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// recompute derives a request's figures from its client record (and its server record, when
// the run has one):
//   - a failed or cancelled request has no latency figure: only its input length (error_isl),
//     the server's prompt count and, on an open loop, its schedule lateness;
//   - TTFT = first content chunk − send, TTST = second − first, request latency = last content
//     chunk − send (the end of the body when no content came), ITL = (latency − TTFT) /
//     (output tokens − 1) with at least two output tokens, output tokens per second per user
//     = 1/ITL, inter-chunk latency = the gaps between content chunks; the first four and the
//     last are streaming figures;
//   - output tokens: the server's usage when given, else the client tokenizer's count.
func recompute(c *clientRecord, sv *serverRecord, open, splitTTFT bool) request {
	r := request{id: c.RequestID, phase: c.Phase, vals: map[string]float64{}, startNs: c.StartUnixNs,
		ackNs: c.StartUnixNs + c.AckNs, httpEndNs: c.StartUnixNs + c.EndNs}
	r.failed = c.Error != nil || c.Cancelled
	r.clientCx = c.Cancelled
	if c.InputTokensServer > 0 {
		r.vals[tagISLServer] = float64(c.InputTokensServer)
	}
	if open {
		r.vals[tagLateness] = ms(c.LatenessNs)
	}
	if r.failed {
		r.cancelled = c.Cancelled
		r.errCode, r.errType = c.HTTPStatus, "error"
		if c.Error != nil {
			r.errCode, r.errType = c.Error.Code, c.Error.Type
			r.cancelled = r.cancelled || c.Error.Code == cancelledCode
		}
		if c.Cancelled {
			r.errCode = cancelledCode
			if c.Error == nil {
				r.errType = "cancelled"
			}
		}
		r.vals[tagErrISL] = float64(c.InputTokens)
		r.windowEnd = r.httpEndNs
		return r
	}
	out := c.OutputTokensServer
	if out <= 0 {
		out = c.OutputTokensClient
	}
	r.vals[tagISL] = float64(c.InputTokens)
	latency := c.EndNs
	n := len(c.ChunkNs)
	if n > 0 {
		latency = c.ChunkNs[n-1]
	}
	if c.Stream && n > 0 {
		ttft := c.ChunkNs[0]
		r.vals[tagTTFT] = ms(ttft)
		if n >= 2 {
			r.vals[tagTTST] = ms(c.ChunkNs[1] - c.ChunkNs[0])
			r.icl = make([]float64, 0, n-1)
			for i := 1; i < n; i++ {
				r.icl = append(r.icl, ms(c.ChunkNs[i]-c.ChunkNs[i-1]))
			}
		}
		if out >= 2 {
			itlNs := float64(latency-ttft) / float64(out-1)
			r.vals[tagITL] = itlNs / 1e6
			if itlNs > 0 {
				r.vals[tagTPSUser] = 1e9 / itlNs
			}
		}
	}
	r.vals[tagLatency] = ms(latency)
	r.vals[tagOSL] = float64(out)
	r.vals[tagOutCount] = float64(out)
	if c.OutputTokensClient > 0 {
		r.vals[tagOSLClient] = float64(c.OutputTokensClient)
	}
	r.vals[tagHTTPLatency] = ms(c.EndNs)
	if c.ResponseBytes > 0 {
		r.vals[tagRespBytes] = float64(c.ResponseBytes)
	}
	r.windowEnd = c.StartUnixNs + latency
	if sv != nil {
		r.vals[tagServerHTTP] = ms(sv.HTTPLatencyNs)
		if sv.TTFTNs > 0 {
			r.vals[tagServerTTFT] = ms(sv.TTFTNs)
		}
		r.vals[tagQueueWait] = ms(sv.QueueWaitNs)
		if sv.TaskWallNs > 0 {
			r.vals[tagTaskWall] = ms(sv.TaskWallNs)
			r.vals[tagHTTPMinusTask] = ms(c.EndNs - sv.TaskWallNs)
		}
		if sv.TaskTTFTNs > 0 {
			r.vals[tagTaskTTFT] = ms(sv.TaskTTFTNs)
		}
		// Every image of the request: vision_images when the record lists several.
		if imgs := sv.VisionImages; len(imgs) > 0 || sv.Vision != nil {
			if len(imgs) == 0 {
				imgs = []visionCost{*sv.Vision}
			}
			tokens, prep := 0, int64(0)
			for _, v := range imgs {
				tokens += v.ImageTokens
				prep += v.PreprocessNs
			}
			r.vals[tagImageTokens] = float64(tokens)
			r.vals[tagImagePreprocess] = ms(prep)
			if sv.VisionNs > 0 {
				r.vals[tagImageVision] = ms(sv.VisionNs)
			}
		}
		if splitTTFT && c.Stream && n > 0 {
			if sv.Vision != nil {
				r.vals[tagTTFTWithImage] = ms(c.ChunkNs[0])
			} else {
				r.vals[tagTTFTWithoutImage] = ms(c.ChunkNs[0])
			}
		}
	}
	return r
}

// slo is one goodput objective of the run (its settings, from summary.json).
type slo struct {
	tag       string
	threshold float64
	larger    bool
}

// phaseCalc is one phase recomputed.
type phaseCalc struct {
	requests       int
	startNs, endNs int64
	dists          map[string]dist
	scalars        map[string]float64
	// wholes are the whole-number figures (counts, token sums, epoch-ns timestamps) held
	// exactly, for reports that write them exactly.
	wholes map[string]int64
	errors map[string]int // "code type" → count
	// window names the requests bounding the benchmark window (first send, last response).
	window []string
}

// aggregate computes a phase's run-level figures as METRICS.md defines them: distributions
// over the phase's valid requests only (error_isl over its failed ones), the benchmark
// duration max(send + latency) − min(send) over valid requests, output token throughput =
// Σ output tokens / duration, request throughput = valid requests / duration, goodput =
// requests meeting every SLO / duration, errors counted by code and type.
func aggregate(reqs []request, phase string, slos []slo, cost *costInput) phaseCalc {
	pc := phaseCalc{dists: map[string]dist{}, scalars: map[string]float64{}, wholes: map[string]int64{}, errors: map[string]int{}}
	whole := func(tag string, v int64) {
		pc.wholes[tag], pc.scalars[tag] = v, float64(v)
	}
	samples := map[string][]sample{}
	var valid, good, cancelled, failed int
	var outTok, outCount, inTok, errISL, respBytes float64
	haveBytes := false
	pc.startNs, pc.endNs = math.MaxInt64, math.MinInt64
	vStart, vEnd := int64(math.MaxInt64), int64(math.MinInt64)
	var firstID, lastID string
	for i := range reqs {
		r := &reqs[i]
		if r.phase != phase {
			continue
		}
		pc.requests++
		pc.startNs = min(pc.startNs, r.startNs)
		pc.endNs = max(pc.endNs, r.windowEnd)
		if r.failed {
			failed++
			if r.cancelled {
				cancelled++
			}
			pc.errors[strconv.Itoa(r.errCode)+" "+r.errType]++
			samples[tagErrISL] = append(samples[tagErrISL], sample{r.vals[tagErrISL], r.id})
			errISL += r.vals[tagErrISL]
			continue
		}
		valid++
		if r.startNs < vStart {
			vStart, firstID = r.startNs, r.id
		}
		if r.windowEnd > vEnd {
			vEnd, lastID = r.windowEnd, r.id
		}
		for tag, v := range r.vals {
			samples[tag] = append(samples[tag], sample{v, r.id})
		}
		for _, g := range r.icl {
			samples[tagICL] = append(samples[tagICL], sample{g, r.id})
		}
		outTok += r.vals[tagOSL]
		outCount += r.vals[tagOutCount]
		inTok += r.vals[tagISL]
		if b, ok := r.vals[tagRespBytes]; ok {
			respBytes += b
			haveBytes = true
		}
		if len(slos) > 0 {
			met := true
			for _, s := range slos {
				v, ok := r.vals[s.tag]
				met = met && ok && (s.larger && v >= s.threshold || !s.larger && v <= s.threshold)
			}
			if met {
				good++
			}
		}
	}
	for tag, s := range samples {
		if d, ok := describe(s); ok {
			pc.dists[tag] = d
		}
	}
	if pc.requests == 0 {
		pc.startNs, pc.endNs = 0, 0
		return pc
	}
	pc.window = nonEmpty(firstID, lastID)
	whole(tagReqCount, int64(valid))
	whole(tagErrCount, int64(failed))
	if cancelled > 0 {
		whole(tagCancelled, int64(cancelled))
	}
	if failed > 0 {
		whole(tagTotalErrISL, int64(errISL))
	}
	if valid > 0 {
		whole(tagTotalOut, int64(outCount))
		whole(tagTotalOSL, int64(outTok))
		whole(tagTotalISL, int64(inTok))
		whole(tagMinStart, vStart)
		whole(tagMaxEnd, vEnd)
		if dur := float64(vEnd-vStart) / 1e9; dur > 0 {
			pc.scalars[tagDuration] = dur
			pc.scalars[tagOutTput] = outTok / dur
			pc.scalars[tagReqTput] = float64(valid) / dur
			if len(slos) > 0 {
				pc.scalars[tagGoodput] = float64(good) / dur
			}
		}
	}
	if len(slos) > 0 {
		whole(tagGoodCount, int64(good))
	}
	if outTok > 0 {
		if haveBytes {
			pc.scalars[tagBytesPerTok] = respBytes / outTok
		}
		if cost != nil {
			for tag, ns := range map[string]int64{tagFrontendPerTok: cost.frontend, tagWorkerPerTok: cost.worker, tagClientPerTok: cost.client} {
				if ns > 0 {
					pc.scalars[tag] = float64(ns) / 1e3 / outTok
				}
			}
			if t, ok := pc.scalars[tagOutTput]; ok && cost.engineTPS > 0 {
				pc.scalars[tagHeadroom] = cost.engineTPS / t
			}
		}
	}
	return pc
}

// costInput is the CPU time the run measured (summary.json serving_cost): the per-token
// figures divide it by the records' output tokens.
type costInput struct {
	frontend, worker, client int64
	engineTPS                float64
}

// verifyText checks a run of the text layout.
func verifyText(dir string, sum *summaryJSON, rep *Report) error {
	client, err := readJSONL[clientRecord](filepath.Join(dir, clientRecordsFile))
	if err != nil {
		return err
	}
	rep.Requests = len(client)
	var server []serverRecord
	svPath := filepath.Join(dir, serverRecordsFile)
	if _, err := os.Stat(svPath); err == nil {
		if server, err = readJSONL[serverRecord](svPath); err != nil {
			return err
		}
		checkTextRecords(client, server, rep)
	} else {
		rep.note("%s: none (an external server): the server figures and the record checks are left out", serverRecordsFile)
	}
	byID := map[string][]*serverRecord{}
	for i := range server {
		byID[server[i].RequestID] = append(byID[server[i].RequestID], &server[i])
	}
	joined := func(id string) *serverRecord {
		if s := byID[id]; len(s) == 1 {
			return s[0]
		}
		return nil
	}
	open := sum.Sweep != nil && (sum.Sweep.Parameter == "request_rate" || sum.Sweep.Parameter == "fixed_schedule")
	split := false
	for i := range client {
		c := &client[i]
		open = open || c.ScheduledNs != 0 || c.LatenessNs != 0
		if s := joined(c.RequestID); s != nil && s.Vision != nil {
			split = true
		}
	}
	reqs := make([]request, len(client))
	for i := range client {
		reqs[i] = recompute(&client[i], joined(client[i].RequestID), open, split)
	}
	var slos []slo
	for _, s := range sum.SLOs {
		slos = append(slos, slo{s.Tag, s.Threshold, s.LargerIsBetter})
	}
	var cost *costInput
	if c := sum.Cost; c != nil {
		cost = &costInput{c.FrontendCPUNs, c.WorkerCPUNs, c.ClientCPUNs, c.EngineTokensPerSec}
	}
	prof := aggregate(reqs, phaseProfiling, slos, cost)
	warm := aggregate(reqs, phaseWarmup, nil, nil)

	diff := checkExportJSONL(filepath.Join(dir, exportJSONLFile), reqs, rep)
	comparePhase(rep, summaryFile+" profiling", sum.Profiling, prof, diff[phaseProfiling])
	comparePhase(rep, summaryFile+" warmup", sum.Warmup, warm, diff[phaseWarmup])

	am, aerrs, err := readAIPerfJSON(filepath.Join(dir, aiperfJSONFile))
	if err != nil {
		return err
	}
	comparePhase(rep, aiperfJSONFile, &phaseJSON{Metrics: am, Errors: aerrs}, prof, diff[phaseProfiling])
	return checkCSV(filepath.Join(dir, aiperfCSVFile), prof, diff[phaseProfiling], rep)
}

// checkExportJSONL compares profile_export.jsonl, line by line, with the recomputed
// requests, and returns, by phase and tag, the requests whose exported value differs ("@phase"
// for those whose phase or validity differs).
func checkExportJSONL(path string, reqs []request, rep *Report) map[string]map[string][]string {
	diff := map[string]map[string][]string{phaseProfiling: {}, phaseWarmup: {}}
	mark := func(phase, tag, id string) {
		if diff[phase] == nil {
			diff[phase] = map[string][]string{}
		}
		diff[phase][tag] = append(diff[phase][tag], id)
	}
	lines, err := readJSONL[exportLine](path)
	if err != nil {
		rep.add(Mismatch{Figure: exportJSONLFile, Reported: "unreadable", Recomputed: fmt.Sprintf("%d requests", len(reqs)), Why: err.Error()})
		return diff
	}
	byID := map[string]*request{}
	for i := range reqs {
		byID[reqs[i].id] = &reqs[i]
	}
	seen := map[string]bool{}
	unknown := map[string]bool{}
	bad := func(r *request, what, reported, recomputed string, tag string) {
		id := r.id
		mark(r.phase, tag, id)
		rep.add(Mismatch{Figure: fmt.Sprintf("%s %s %s", exportJSONLFile, id, what), Reported: reported, Recomputed: recomputed,
			Records: []string{id}, group: exportJSONLFile + " " + what})
	}
	for i := range lines {
		l := &lines[i]
		id := l.Metadata.XRequestID
		r, ok := byID[id]
		rep.Checked++
		switch {
		case !ok:
			rep.add(Mismatch{Figure: exportJSONLFile + " request " + id, Reported: "present", Recomputed: "absent",
				Why: "a line for a request the client never recorded", Records: []string{id}})
			continue
		case seen[id]:
			rep.add(Mismatch{Figure: exportJSONLFile + " request " + id, Reported: "twice", Recomputed: "once", Records: []string{id}})
			continue
		}
		seen[id] = true
		md := l.Metadata
		for _, f := range []struct {
			name      string
			got, want int64
		}{{"request_start_ns", md.RequestStartNs, r.startNs}, {"request_ack_ns", md.RequestAckNs, r.ackNs}, {"request_end_ns", md.RequestEndNs, r.httpEndNs}} {
			rep.Checked++
			if f.got != f.want {
				bad(r, "metadata."+f.name, strconv.FormatInt(f.got, 10), strconv.FormatInt(f.want, 10), "@phase")
			}
		}
		rep.Checked += 3
		if md.BenchmarkPhase != r.phase {
			bad(r, "metadata.benchmark_phase", md.BenchmarkPhase, r.phase, "@phase")
			mark(md.BenchmarkPhase, "@phase", id)
		}
		if (l.Error != nil) != r.failed {
			bad(r, "error", strconv.FormatBool(l.Error != nil), strconv.FormatBool(r.failed), "@phase")
		} else if l.Error != nil && (l.Error.Code != r.errCode || l.Error.Type != r.errType) {
			bad(r, "error code and type", fmt.Sprintf("%d %s", l.Error.Code, l.Error.Type), fmt.Sprintf("%d %s", r.errCode, r.errType), "@phase")
		}
		if md.WasCancelled != r.clientCx {
			bad(r, "metadata.was_cancelled", strconv.FormatBool(md.WasCancelled), strconv.FormatBool(r.clientCx), "@phase")
		}
		for _, tag := range sortedKeys(r.vals) {
			want := r.vals[tag]
			rep.Checked++
			m, ok := l.Metrics[tag]
			if !ok {
				bad(r, tag, "absent", num(want), tag)
				continue
			}
			v, _, isList, err := exportValue(m.Value)
			switch {
			case err != nil || isList:
				bad(r, tag, string(m.Value), num(want), tag)
			case !agree(v, want, 0):
				bad(r, tag, num(v), num(want), tag)
			case m.Unit != known[tag].unit:
				bad(r, tag+" unit", m.Unit, known[tag].unit, tag)
			}
		}
		if r.icl != nil {
			rep.Checked++
			m, ok := l.Metrics[tagICL]
			_, list, isList, err := exportValue(m.Value)
			switch {
			case !ok:
				bad(r, tagICL, "absent", fmt.Sprintf("%d gaps", len(r.icl)), tagICL)
			case err != nil || !isList || len(list) != len(r.icl):
				bad(r, tagICL, string(m.Value), fmt.Sprint(r.icl), tagICL)
			default:
				for k := range list {
					if !agree(list[k], r.icl[k], 0) {
						bad(r, fmt.Sprintf("%s[%d]", tagICL, k), num(list[k]), num(r.icl[k]), tagICL)
						break
					}
				}
			}
		}
		for tag := range l.Metrics {
			_, mine := r.vals[tag]
			switch {
			case mine || tag == tagICL && r.icl != nil:
			case known[tag].header != "":
				rep.Checked++
				bad(r, tag, "present", "absent", tag)
			case !unknown[tag]:
				unknown[tag] = true
				rep.note("%s: metric %q is not one this check knows; not verified", exportJSONLFile, tag)
			}
		}
	}
	for i := range reqs {
		if !seen[reqs[i].id] {
			rep.Checked++
			rep.add(Mismatch{Figure: exportJSONLFile + " request " + reqs[i].id, Reported: "absent", Recomputed: "present",
				Why: "a recorded request has no line", Records: []string{reqs[i].id}})
			mark(reqs[i].phase, "@phase", reqs[i].id)
		}
	}
	return diff
}

// comparePhase compares one phase's reported statistics (summary.json's or the AIPerf
// JSON's) with the recomputed ones.
func comparePhase(rep *Report, where string, got *phaseJSON, want phaseCalc, diff map[string][]string) {
	if got == nil {
		rep.add(Mismatch{Figure: where, Reported: "absent", Recomputed: fmt.Sprintf("%d requests", want.requests)})
		return
	}
	if got.Requests != nil {
		rep.Checked++
		if *got.Requests != want.requests {
			rep.add(Mismatch{Figure: where + " requests", Reported: strconv.Itoa(*got.Requests), Recomputed: strconv.Itoa(want.requests), Records: diff["@phase"]})
		}
	}
	for _, f := range []struct {
		name string
		got  *int64
		want int64
	}{{"start_ns", got.StartNs, want.startNs}, {"end_ns", got.EndNs, want.endNs}} {
		if f.got == nil {
			continue
		}
		rep.Checked++
		if *f.got != f.want {
			rep.add(Mismatch{Figure: where + " " + f.name, Reported: strconv.FormatInt(*f.got, 10), Recomputed: strconv.FormatInt(f.want, 10), Records: want.window})
		}
	}
	tags := make([]string, 0, len(got.Metrics))
	for tag := range got.Metrics {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	for _, tag := range tags {
		unit, vals := metricNumbers(got.Metrics[tag])
		if d, ok := want.dists[tag]; ok {
			rep.Checked++
			if unit != known[tag].unit {
				rep.add(Mismatch{Figure: fmt.Sprintf("%s %s unit", where, tag), Reported: unit, Recomputed: known[tag].unit})
			}
			var differ []statDiff
			for _, st := range distStats {
				w, _ := d.stat(st)
				g, ok := vals[st]
				rep.Checked++
				if !ok {
					rep.add(Mismatch{Figure: fmt.Sprintf("%s %s.%s", where, tag, st), Reported: "absent", Recomputed: num(w)})
					continue
				}
				scale := d.magnitude
				if st == "count" {
					scale = 0
				}
				if !agree(g, w, scale) {
					differ = append(differ, statDiff{st, num(g), w})
				}
			}
			if len(differ) > 0 {
				rep.add(distMismatch(where, tag, differ, d, diff))
			}
			continue
		}
		if w, ok := want.scalars[tag]; ok {
			rep.Checked++
			if unit != known[tag].unit {
				rep.add(Mismatch{Figure: fmt.Sprintf("%s %s unit", where, tag), Reported: unit, Recomputed: known[tag].unit})
			}
			g, ok := vals["avg"]
			if !ok || !agree(g, w, 0) {
				rep.add(scalarMismatch(where, tag, vals, ok, w, want, diff))
			} else if exact, isWhole := want.wholes[tag]; isWhole {
				// A report that writes a whole number as an integer literal is held to it
				// exactly (an epoch-ns timestamp is beyond float64's 2^53), or to the float64
				// nearest to it for a report that held it as a float64.
				var lit json.Number
				if json.Unmarshal(got.Metrics[tag]["avg"], &lit) == nil {
					if n, err := lit.Int64(); err == nil && n != exact && n != int64(float64(exact)) {
						m := scalarMismatch(where, tag, vals, ok, w, want, diff)
						m.Reported, m.Recomputed = lit.String(), strconv.FormatInt(exact, 10)
						rep.add(m)
					}
				}
			}
			continue
		}
		if known[tag].header != "" {
			rep.Checked++
			rep.add(Mismatch{Figure: fmt.Sprintf("%s %s", where, tag), Reported: "present", Recomputed: "absent",
				Why: "the records define no such figure for this phase", Records: diff[tag]})
			continue
		}
		rep.noteOnce("%s: metric %q is not one this check knows; not verified", where, tag)
	}
	for _, tag := range sortedKeys(want.dists) {
		d := want.dists[tag]
		if _, ok := got.Metrics[tag]; !ok {
			rep.Checked++
			rep.add(Mismatch{Figure: fmt.Sprintf("%s %s", where, tag), Reported: "absent", Recomputed: fmt.Sprintf("a distribution over %d values", d.n)})
		}
	}
	for _, tag := range sortedKeys(want.scalars) {
		w := want.scalars[tag]
		if _, ok := got.Metrics[tag]; !ok {
			rep.Checked++
			rep.add(Mismatch{Figure: fmt.Sprintf("%s %s", where, tag), Reported: "absent", Recomputed: num(w)})
		}
	}
	gotErr := map[string]int{}
	for _, g := range got.Errors {
		gotErr[strconv.Itoa(g.Details.Code)+" "+g.Details.Type] += g.Count
	}
	rep.Checked++
	if !sameCounts(gotErr, want.errors) {
		rep.add(Mismatch{Figure: where + " error_summary", Reported: fmt.Sprint(gotErr), Recomputed: fmt.Sprint(want.errors), Records: diff["@phase"]})
	}
}

func sameCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// statDiff is one statistic of a distribution that differs: as reported, and recomputed.
type statDiff struct {
	stat, reported string
	recomputed     float64
}

// distMismatch describes the statistics of one distribution that differ, naming the
// requests whose exported value differs, or else the requests the statistic rests on.
func distMismatch(where, tag string, differ []statDiff, d dist, diff map[string][]string) Mismatch {
	m := Mismatch{Figure: fmt.Sprintf("%s %s.%s", where, tag, differ[0].stat), Reported: differ[0].reported, Recomputed: num(differ[0].recomputed)}
	if len(differ) > 1 {
		// Three statistics say enough: the headline ones first.
		var got, want []string
		for _, pass := range []func(string) bool{
			func(st string) bool { return st == "avg" || st == "p50" || st == "p99" },
			func(st string) bool { return st != "avg" && st != "p50" && st != "p99" },
		} {
			for _, x := range differ {
				if pass(x.stat) && len(got) < 3 {
					got = append(got, x.stat+" "+x.reported)
					want = append(want, x.stat+" "+num(x.recomputed))
				}
			}
		}
		if len(differ) > 3 {
			got, want = append(got, "..."), append(want, "...")
		}
		m.Figure = fmt.Sprintf("%s %s (%d of %d statistics)", where, tag, len(differ), len(distStats))
		m.Reported, m.Recomputed = strings.Join(got, ", "), strings.Join(want, ", ")
	}
	if ids := append(append([]string(nil), diff[tag]...), diff["@phase"]...); len(ids) > 0 {
		m.Records, m.Why = ids, "these requests' exported values differ from their records"
		return m
	}
	m.Why = "every request's exported value agrees with its record: the statistic itself is miscomputed"
	if ids := d.statRecords(differ[0].stat); ids != nil && len(differ) == 1 {
		m.Records = ids
		m.Why += "; it rests on these requests"
	} else {
		m.Why += fmt.Sprintf(" (over all %d values)", d.n)
	}
	return m
}

// windowTags are the figures the benchmark window enters.
var windowTags = map[string]bool{tagDuration: true, tagOutTput: true, tagReqTput: true, tagGoodput: true,
	tagMinStart: true, tagMaxEnd: true, tagHeadroom: true}

// scalarMismatch describes a run-level figure that differs.
func scalarMismatch(where, tag string, vals map[string]float64, ok bool, want float64, pc phaseCalc, diff map[string][]string) Mismatch {
	m := Mismatch{Figure: fmt.Sprintf("%s %s", where, tag), Reported: "absent", Recomputed: num(want)}
	if ok {
		m.Reported = num(vals["avg"])
	}
	m.Records = append(m.Records, diff["@phase"]...)
	switch {
	case tag == tagOutTput || tag == tagTotalOSL || tag == tagTotalOut || tag == tagBytesPerTok:
		m.Records = append(m.Records, diff[tagOSL]...)
	case tag == tagTotalISL:
		m.Records = append(m.Records, diff[tagISL]...)
	}
	if windowTags[tag] {
		m.Records = append(m.Records, pc.window...)
		m.Why = fmt.Sprintf("the benchmark window runs from the first valid send to the last valid response over %d requests", pc.requests)
	}
	return m
}

// checkCSV compares profile_export_aiperf.csv with the recomputed profiling phase, each
// number to the decimals it was written with.
func checkCSV(path string, prof phaseCalc, diff map[string][]string, rep *Report) error {
	dists, scalars, err := readCSV(path)
	if err != nil {
		return err
	}
	within := func(c csvCell, want, scale float64) bool {
		tol := 0.5*math.Pow(10, -float64(c.decimals))*(1+1e-6) + precision*math.Max(math.Abs(want), scale)
		return math.Abs(c.v-want) <= tol
	}
	labels := map[string]string{}
	for tag := range known {
		labels[csvLabel(tag)] = tag
	}
	for label, row := range dists {
		tag, ok := labels[label]
		if !ok {
			rep.noteOnce("%s: row %q is not a metric this check knows; not verified", aiperfCSVFile, label)
			continue
		}
		d, ok := prof.dists[tag]
		rep.Checked++
		if !ok {
			rep.add(Mismatch{Figure: aiperfCSVFile + " " + label, Reported: "present", Recomputed: "absent", Records: diff[tag]})
			continue
		}
		var differ []statDiff
		for _, col := range distStats {
			c, in := row[col]
			w, ok := d.stat(col)
			if !in || !ok {
				continue
			}
			rep.Checked++
			if !within(c, w, d.magnitude) {
				differ = append(differ, statDiff{col, c.text, w})
			}
		}
		if len(differ) > 0 {
			rep.add(distMismatch(aiperfCSVFile, tag, differ, d, diff))
		}
	}
	for label, c := range scalars {
		tag, ok := labels[label]
		if !ok {
			rep.noteOnce("%s: row %q is not a metric this check knows; not verified", aiperfCSVFile, label)
			continue
		}
		rep.Checked++
		w, ok := prof.scalars[tag]
		if !ok {
			rep.add(Mismatch{Figure: aiperfCSVFile + " " + label, Reported: c.text, Recomputed: "absent"})
			continue
		}
		if !within(c, w, 0) {
			m := scalarMismatch(aiperfCSVFile, tag, map[string]float64{"avg": c.v}, true, w, prof, diff)
			m.Reported = c.text
			rep.add(m)
		}
	}
	for tag := range prof.dists {
		if _, ok := dists[csvLabel(tag)]; !ok {
			rep.Checked++
			rep.add(Mismatch{Figure: aiperfCSVFile + " " + csvLabel(tag), Reported: "absent", Recomputed: "a distribution"})
		}
	}
	for tag, w := range prof.scalars {
		if _, ok := scalars[csvLabel(tag)]; !ok {
			rep.Checked++
			rep.add(Mismatch{Figure: aiperfCSVFile + " " + csvLabel(tag), Reported: "absent", Recomputed: num(w)})
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
