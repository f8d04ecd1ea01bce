package reports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
)

// SLO is one service-level objective for goodput: a request is good when it is valid and every
// SLO's metric meets its threshold (≥ for larger-is-better metrics, ≤ otherwise). Threshold is
// in the metric's unit (ms for latencies, tokens/sec/user for per-user throughput).
type SLO struct {
	Tag            string  `json:"tag"`
	Threshold      float64 `json:"threshold"`
	Unit           string  `json:"unit"`
	LargerIsBetter bool    `json:"larger_is_better"`
	Spec           string  `json:"spec,omitempty"` // as the user wrote it, e.g. "ttft:200ms"
}

// Met reports whether the record meets the SLO. A record lacking the metric (e.g. ITL of a
// one-token answer) does not meet it: goodput counts only requests proven good.
func (s SLO) Met(r *ExportRecord) bool {
	v, ok := r.Value(s.Tag)
	if !ok {
		return false
	}
	if s.LargerIsBetter {
		return v >= s.Threshold
	}
	return v <= s.Threshold
}

// ServingCost carries CPU times measured by the caller over the profiling window (from
// /proc/<pid>/stat utime+stime); zero means not measured and the figure is left out. Output
// tokens and response bytes come from the records.
type ServingCost struct {
	FrontendCPUNs int64 `json:"frontend_cpu_ns,omitempty"`
	WorkerCPUNs   int64 `json:"worker_cpu_ns,omitempty"`
	ClientCPUNs   int64 `json:"client_cpu_ns,omitempty"`
	// EngineTokensPerSec is the engine's direct token rate without HTTP, for headroom.
	EngineTokensPerSec float64 `json:"engine_tokens_per_sec,omitempty"`
}

// MetricStats is one metric of a phase: a Distribution for per-request metrics, a single
// value (Avg) for run-level ones. It marshals to AIPerf's flat
// {unit, avg, p1..p99, min, max, std} object (plus count).
type MetricStats struct {
	Unit string
	Avg  float64
	Dist *Distribution // nil for run-level values
	// Whole is a whole-number run-level value held exactly (counts, token sums, epoch-ns
	// timestamps): a float64 holds integers exactly only up to 2^53, and a timestamp in
	// nanoseconds is about 1.8e18, so Avg alone would round it by up to 256 ns.
	Whole *int64
}

// MarshalJSON writes the AIPerf layout with keys in AIPerf's order.
func (m MetricStats) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	u, _ := json.Marshal(m.Unit)
	avg := formatFloat(m.Avg)
	if m.Whole != nil {
		avg = strconv.FormatInt(*m.Whole, 10)
	}
	fmt.Fprintf(&b, `{"unit":%s,"avg":%s`, u, avg)
	if d := m.Dist; d != nil {
		ps := d.percentileFields()
		for i, p := range Percentiles {
			fmt.Fprintf(&b, `,"%s":%s`, percentileName(p), formatFloat(*ps[i]))
		}
		fmt.Fprintf(&b, `,"min":%s,"max":%s,"std":%s,"count":%d`,
			formatFloat(d.Min), formatFloat(d.Max), formatFloat(d.Std), d.Count)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads what MarshalJSON writes; an object with p50 is a distribution, and a
// run-level avg written as an integer literal is read exactly into Whole.
func (m *MetricStats) UnmarshalJSON(data []byte) error {
	var raw struct {
		Unit string      `json:"unit"`
		Avg  json.Number `json:"avg"`
		P50  *float64    `json:"p50"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*m = MetricStats{Unit: raw.Unit}
	if raw.Avg != "" {
		avg, err := raw.Avg.Float64()
		if err != nil {
			return fmt.Errorf("metric avg %s: %w", raw.Avg, err)
		}
		m.Avg = avg
		if raw.P50 == nil {
			if w, err := strconv.ParseInt(string(raw.Avg), 10, 64); err == nil {
				m.Whole = &w
			}
		}
	}
	if raw.P50 != nil {
		var d Distribution
		if err := json.Unmarshal(data, &d); err != nil {
			return err
		}
		m.Dist = &d
	}
	return nil
}

// ErrorGroup counts the errors of one code and type (AIPerf's error_summary entry); Details
// keeps the first message seen.
type ErrorGroup struct {
	Details ErrorDetails `json:"error_details"`
	Count   int          `json:"count"`
}

// ShardWindow is the measured window of one shard of a merged run: its first valid request's
// start to its last valid response (epoch ns), and its own throughputs over that window.
type ShardWindow struct {
	Shard                 string  `json:"shard"`
	StartNs               int64   `json:"start_ns"`
	EndNs                 int64   `json:"end_ns"`
	DurationSec           float64 `json:"duration_sec"`
	Requests              int     `json:"requests"` // valid requests
	RequestThroughput     float64 `json:"request_throughput"`
	OutputTokenThroughput float64 `json:"output_token_throughput"`
}

// PhaseStats are the statistics of one benchmark phase.
type PhaseStats struct {
	Phase    string                 `json:"phase"`
	Requests int                    `json:"requests"` // all requests of the phase, errors included
	Metrics  map[string]MetricStats `json:"metrics"`
	Errors   []ErrorGroup           `json:"error_summary"`
	StartNs  int64                  `json:"start_ns"` // epoch ns, min request start (errors included)
	EndNs    int64                  `json:"end_ns"`   // epoch ns, max request end (errors included)
	// Shards are the per-shard windows of a merged run (records carrying mq_shard_id), in
	// start order; nil for a single run. The phase's benchmark duration is then the length of
	// the union of these windows: shards run one after another add up instead of counting
	// the idle gap between them.
	Shards []ShardWindow `json:"shard_windows,omitempty"`
	// ShardGapSec is how much of the wall-clock span from the first shard's start to the
	// last shard's end no shard was measuring (0 when the windows overlap or touch).
	ShardGapSec float64 `json:"shard_gap_sec,omitempty"`
}

// Stat returns a metric's statistic ("avg", "p99", ...); ok is false when the metric or
// statistic is absent (a run-level metric has only "avg").
func (p *PhaseStats) Stat(tag, stat string) (float64, bool) {
	m, ok := p.Metrics[tag]
	if !ok {
		return 0, false
	}
	if m.Dist == nil {
		return m.Avg, stat == "avg"
	}
	return m.Dist.Stat(stat)
}

// Tags returns the phase's metric tags in report order (known tags first, in Metrics order,
// then unknown ones sorted).
func (p *PhaseStats) Tags() []string { return orderedTags(p.Metrics) }

func orderedTags[V any](m map[string]V) []string {
	var out []string
	known := map[string]bool{}
	for _, d := range Metrics {
		known[d.Tag] = true
		if _, ok := m[d.Tag]; ok {
			out = append(out, d.Tag)
		}
	}
	var rest []string
	for t := range m {
		if !known[t] {
			rest = append(rest, t)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// Aggregate computes the statistics of one phase from export records (records of other
// phases are ignored), exactly as METRICS.md defines them:
//   - per-request metrics: a Distribution over valid requests only (errors are never averaged
//     into latency); inter_chunk_latency pools every gap of every valid request;
//   - benchmark duration: max(request start + request latency) − min(request start) over the
//     phase's valid requests (failed requests have no latency and are left out);
//   - output token throughput = Σ output_sequence_length / duration;
//     request throughput = valid requests / duration; goodput = good requests / duration;
//   - errors counted by code and type; error_isl is the distribution of failed requests'
//     input lengths and total_error_isl their sum;
//   - total_output_tokens, total_osl and total_isl sum output_token_count,
//     output_sequence_length and input_sequence_length over valid requests;
//     min_request_timestamp and max_response_timestamp (epoch ns) bound the duration.
//
// Run-level values that cannot be computed (no valid request, zero duration) are left out
// rather than reported as NaN or Inf.
func Aggregate(recs []ExportRecord, phase string, slos []SLO, cost *ServingCost) PhaseStats {
	ps := PhaseStats{Phase: phase, Metrics: map[string]MetricStats{}, Errors: []ErrorGroup{}}
	values := map[string][]float64{}
	units := map[string]string{}
	var (
		valid, good, cancelled int
		outTokens, respBytes   float64
		outCount, inTokens     float64
		errISL                 float64
		haveErrISL             bool
		haveBytes              bool
		haveOSL                bool                                 // token figures apply (not to image generation)
		startMin, endMax       int64 = math.MaxInt64, math.MinInt64 // all requests
		vStart, vEnd           int64 = math.MaxInt64, math.MinInt64 // valid requests
		errs                         = map[[2]string]*ErrorGroup{}
		errOrder               []*ErrorGroup
		shards                 = map[string]*ShardWindow{}
		shardTokens            = map[string]float64{}
	)
	for i := range recs {
		r := &recs[i]
		if r.Metadata.BenchmarkPhase != phase {
			continue
		}
		ps.Requests++
		start := r.Metadata.RequestStartNs
		startMin = min(startMin, start)
		if !r.Valid() {
			endMax = max(endMax, r.Metadata.RequestEndNs)
			if r.Error.Code == CancelledCode || r.Metadata.WasCancelled {
				cancelled++
			}
			key := [2]string{fmt.Sprint(r.Error.Code), r.Error.Type}
			g, ok := errs[key]
			if !ok {
				g = &ErrorGroup{Details: *r.Error}
				errs[key] = g
				errOrder = append(errOrder, g)
			}
			g.Count++
			if v, ok := r.Value(TagErrorISL); ok {
				values[TagErrorISL] = append(values[TagErrorISL], v)
				units[TagErrorISL] = r.Metrics[TagErrorISL].Unit
				errISL += v
				haveErrISL = true
			}
			continue
		}
		valid++
		end := r.Metadata.RequestEndNs
		if lat, ok := r.Value(TagRequestLatency); ok {
			end = start + int64(math.Round(lat*1e6))
		}
		endMax = max(endMax, end)
		vStart, vEnd = min(vStart, start), max(vEnd, end)
		if id := r.Metadata.ShardID; id != "" {
			w, ok := shards[id]
			if !ok {
				w = &ShardWindow{Shard: id, StartNs: start, EndNs: end}
				shards[id] = w
			}
			w.StartNs, w.EndNs = min(w.StartNs, start), max(w.EndNs, end)
			w.Requests++
			if v, ok := r.Value(TagOutputSequenceLength); ok {
				shardTokens[id] += v
			}
		}
		for tag, v := range r.Metrics {
			units[tag] = v.Unit
			if v.IsList {
				values[tag] = append(values[tag], v.List...)
			} else {
				values[tag] = append(values[tag], v.Value)
			}
		}
		if v, ok := r.Value(TagOutputSequenceLength); ok {
			outTokens += v
			haveOSL = true
		}
		if v, ok := r.Value(TagOutputTokenCount); ok {
			outCount += v
		}
		if v, ok := r.Value(TagInputSequenceLength); ok {
			inTokens += v
		}
		if v, ok := r.Value(TagResponseBytes); ok {
			respBytes += v
			haveBytes = true
		}
		if len(slos) > 0 {
			ok := true
			for _, s := range slos {
				ok = ok && s.Met(r)
			}
			if ok {
				good++
			}
		}
	}
	for tag, vs := range values {
		if d, ok := Describe(vs); ok {
			ps.Metrics[tag] = MetricStats{Unit: units[tag], Avg: d.Avg, Dist: &d}
		}
	}
	for _, g := range errOrder {
		ps.Errors = append(ps.Errors, *g)
	}
	sort.SliceStable(ps.Errors, func(i, j int) bool { return ps.Errors[i].Count > ps.Errors[j].Count })
	if ps.Requests == 0 {
		return ps
	}
	ps.StartNs, ps.EndNs = startMin, endMax

	set := func(tag string, v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		m, _ := LookupMetric(tag)
		ps.Metrics[tag] = MetricStats{Unit: m.Unit, Avg: v}
	}
	// setWhole records a whole-number value exactly (Whole) beside its float64 (Avg).
	setWhole := func(tag string, v int64) {
		m, _ := LookupMetric(tag)
		ps.Metrics[tag] = MetricStats{Unit: m.Unit, Avg: float64(v), Whole: &v}
	}
	setWhole(TagRequestCount, int64(valid))
	setWhole(TagErrorRequestCount, int64(ps.Requests-valid))
	if cancelled > 0 {
		setWhole(TagCancelledRequestCount, int64(cancelled))
	}
	if haveErrISL {
		setWhole(TagTotalErrorISL, int64(math.Round(errISL)))
	}
	if valid > 0 && haveOSL {
		setWhole(TagTotalOutputTokens, int64(math.Round(outCount)))
		setWhole(TagTotalOSL, int64(math.Round(outTokens)))
		setWhole(TagTotalISL, int64(math.Round(inTokens)))
	}
	if valid > 0 {
		setWhole(TagMinRequestTimestamp, vStart)
		setWhole(TagMaxResponseTimestamp, vEnd)
	}
	durSec := float64(vEnd-vStart) / 1e9
	if len(shards) > 1 {
		durSec = shardUnion(&ps, shards, shardTokens, durSec)
	}
	if valid > 0 && durSec > 0 {
		set(TagBenchmarkDuration, durSec)
		if haveOSL {
			set(TagOutputTokenThroughput, outTokens/durSec)
		}
		set(TagRequestThroughput, float64(valid)/durSec)
		if len(slos) > 0 {
			set(TagGoodput, float64(good)/durSec)
		}
	}
	if len(slos) > 0 {
		setWhole(TagGoodRequestCount, int64(good))
	}
	if outTokens > 0 {
		if haveBytes {
			set(TagResponseBytesPerToken, respBytes/outTokens)
		}
		if cost != nil {
			perToken := func(ns int64) float64 { return float64(ns) / 1e3 / outTokens }
			if cost.FrontendCPUNs > 0 {
				set(TagFrontendUsPerToken, perToken(cost.FrontendCPUNs))
			}
			if cost.WorkerCPUNs > 0 {
				set(TagWorkerUsPerToken, perToken(cost.WorkerCPUNs))
			}
			if cost.ClientCPUNs > 0 {
				set(TagClientUsPerToken, perToken(cost.ClientCPUNs))
			}
			if tput, ok := ps.Metrics[TagOutputTokenThroughput]; ok && cost.EngineTokensPerSec > 0 {
				set(TagHeadroom, cost.EngineTokensPerSec/tput.Avg)
			}
		}
	}
	return ps
}

// shardUnion fills ps.Shards and ps.ShardGapSec and returns the length of the union of the
// shards' windows in seconds (span is the wall-clock span from first start to last end).
func shardUnion(ps *PhaseStats, shards map[string]*ShardWindow, tokens map[string]float64, span float64) float64 {
	for id, w := range shards {
		w.DurationSec = float64(w.EndNs-w.StartNs) / 1e9
		if w.DurationSec > 0 {
			w.RequestThroughput = float64(w.Requests) / w.DurationSec
			w.OutputTokenThroughput = tokens[id] / w.DurationSec
		}
		ps.Shards = append(ps.Shards, *w)
	}
	sort.Slice(ps.Shards, func(i, j int) bool {
		if ps.Shards[i].StartNs != ps.Shards[j].StartNs {
			return ps.Shards[i].StartNs < ps.Shards[j].StartNs
		}
		return ps.Shards[i].Shard < ps.Shards[j].Shard
	})
	var union int64
	curS, curE := ps.Shards[0].StartNs, ps.Shards[0].EndNs
	for _, w := range ps.Shards[1:] {
		if w.StartNs > curE {
			union += curE - curS
			curS, curE = w.StartNs, w.EndNs
			continue
		}
		curE = max(curE, w.EndNs)
	}
	union += curE - curS
	u := float64(union) / 1e9
	ps.ShardGapSec = span - u
	if ps.ShardGapSec < 1e-9 {
		ps.ShardGapSec = 0
	}
	return u
}

// SweepPoint places a run in a sweep: Parameter is "concurrency" or "request_rate".
type SweepPoint struct {
	Parameter string  `json:"parameter"`
	Value     float64 `json:"value"`
}

// Run is everything a run directory is written from. Records holds both phases; all
// statistics are derived from it. The JSON blobs are opaque to this package and copied
// verbatim into the exports (InputConfig into profile_export_aiperf.json's input_config).
type Run struct {
	Name        string          `json:"name"`
	Records     []ExportRecord  `json:"-"`
	SLOs        []SLO           `json:"slos,omitempty"`
	Cost        *ServingCost    `json:"serving_cost,omitempty"`
	Sweep       *SweepPoint     `json:"sweep,omitempty"`
	InputConfig json.RawMessage `json:"input_config,omitempty"`
	Environment json.RawMessage `json:"environment,omitempty"`
	// Provenance refers to the run's provenance file (ProvenanceFile beside summary.json:
	// {"file", "sha256", ...}) rather than holding the fingerprints, which run to hundreds of
	// kilobytes for a source tree.
	Provenance json.RawMessage `json:"provenance,omitempty"`
	// Seed is the random seed the run used and the base seed of its sweep.
	Seed *SeedUse `json:"seed,omitempty"`
	// Notes are what a reader must know to read the figures right (e.g. that no server
	// records could be joined, so the run holds client-side metrics only); summary.md shows
	// them under the heading.
	Notes        []string        `json:"notes,omitempty"`
	GPUTelemetry json.RawMessage `json:"gpu_telemetry,omitempty"`
	// EngineSteps are the server's engine steps during the profiling phase, where it reports
	// them (qual-server's /metrics); nil otherwise.
	EngineSteps *EngineSteps `json:"engine_steps,omitempty"`
	// StartTime and EndTime bound the run; zero values are taken from the records.
	StartTime time.Time `json:"start_time"`
	EndTime   time.Time `json:"end_time"`
	// Shards lists the runs a merged run was made from.
	Shards []string `json:"shards,omitempty"`
	// Target names what was measured, for people reading summary.md.
	Target *Target `json:"target,omitempty"`
	// WasCancelled says the run was interrupted (Ctrl-C, a cancelled context) before it sent
	// what it was asked to: AIPerf's top-level was_cancelled.
	WasCancelled bool `json:"was_cancelled"`
}

// SeedUse records the seeds of one run of a sweep: Used drove the run's random choices (arrival
// gaps, cancellations), Base is the sweep's seed (the --seed given, or the one picked), from
// which each point's is derived as Base + the point's 0-based index in sweep order.
type SeedUse struct {
	Base uint64 `json:"base"`
	Used uint64 `json:"used"`
}

// Target is what a run measured and with which code: the server (its launcher and flags),
// the URL and model, the bundle served and its digest, and the source commit of the harness.
type Target struct {
	Server string `json:"server"` // "qual-server (process)", "external", ...
	URL    string `json:"url"`
	Model  string `json:"model"`
	Bundle string `json:"bundle,omitempty"`
	// BundleDigest identifies the bundle served: its digest (native/bundle's Bundle.Digest),
	// the identity qual-server logs and serves at /mq/v1/bundle and qualification suites
	// record as bundle_digest, so one name and one value mean "this bundle" everywhere.
	BundleDigest string `json:"bundle_digest,omitempty"`
	Commit       string `json:"commit"`
	Dirty        bool   `json:"dirty,omitempty"`
	// Pacer says how the client kept an open loop's schedule (its clock and the scheduling
	// policy of its thread), which the schedule-lateness figures depend on; empty otherwise.
	Pacer string `json:"pacer,omitempty"`
}

// EngineSteps sums a server's engine steps by kind: "prefill" steps prefilled at least one
// prompt (beside any decodes), "decode" steps only decoded. They say where the engine's time
// went: a burst of requests waits for the prefill steps (its time to first token), streams
// for the decode steps (their inter-token latency).
type EngineSteps struct {
	Prefill StepStats `json:"prefill"`
	Decode  StepStats `json:"decode"`
	// Experts is a mixture-of-experts model's routing over the same interval: tokens[layer]
	// [expert] (a token counts once per chosen expert), from the server's
	// qual_server_moe_routed_tokens_total; absent for dense models.
	Experts [][]float64 `json:"experts,omitempty"`
}

// ExpertImbalance is the expert-load imbalance of a routing: per sparse layer (one with tokens)
// the busiest expert's tokens over the mean per expert (1 when every expert got as many,
// the number of experts when one got all: a collapsed router); worst is the largest over the
// layers and layer its index, mean their average. ok is false without routing.
func (s EngineSteps) ExpertImbalance() (worst float64, layer int, mean float64, ok bool) {
	n, experts := 0, 0
	for _, row := range s.Experts {
		experts = max(experts, len(row)) // a layer's experts no token chose may be missing
	}
	for l, row := range s.Experts {
		var sum, top float64
		for _, v := range row {
			sum += v
			top = max(top, v)
		}
		if sum <= 0 {
			continue
		}
		r := top / (sum / float64(experts))
		if r > worst {
			worst, layer = r, l
		}
		mean += r
		n++
	}
	if n == 0 {
		return 0, 0, 0, false
	}
	return worst, layer, mean / float64(n), true
}

// StepStats sums one kind of engine step: how many, their wall seconds, and the tokens they
// ran through the model (prompt tokens plus one per decoded sequence).
type StepStats struct {
	Steps   float64 `json:"steps"`
	Seconds float64 `json:"seconds"`
	Tokens  float64 `json:"tokens"`
}

// Add sums o into s (merging shards).
func (s *EngineSteps) Add(o *EngineSteps) {
	s.Prefill, s.Decode = s.Prefill.plus(o.Prefill, 1), s.Decode.plus(o.Decode, 1)
	s.Experts = addExperts(s.Experts, o.Experts, 1)
}

// addExperts is a + k·b, row by row (rows and experts missing from one side count 0).
func addExperts(a, b [][]float64, k float64) [][]float64 {
	if a == nil && b == nil {
		return nil
	}
	out := make([][]float64, max(len(a), len(b)))
	for l := range out {
		var ra, rb []float64
		if l < len(a) {
			ra = a[l]
		}
		if l < len(b) {
			rb = b[l]
		}
		out[l] = make([]float64, max(len(ra), len(rb)))
		for e := range out[l] {
			if e < len(ra) {
				out[l][e] += ra[e]
			}
			if e < len(rb) {
				out[l][e] += k * rb[e]
			}
		}
	}
	return out
}

// Since is what the engine did between an earlier reading of its totals and s; an error when
// a total went down (the server or its metrics were restarted between the two).
func (s EngineSteps) Since(earlier EngineSteps) (*EngineSteps, error) {
	d := &EngineSteps{Prefill: s.Prefill.plus(earlier.Prefill, -1), Decode: s.Decode.plus(earlier.Decode, -1),
		Experts: addExperts(s.Experts, earlier.Experts, -1)}
	for _, row := range d.Experts {
		for _, v := range row {
			if v < 0 {
				return nil, fmt.Errorf("the server's expert routing totals went down during the point (was it restarted?)")
			}
		}
	}
	for kind, st := range map[string]StepStats{"prefill": d.Prefill, "decode": d.Decode} {
		if st.Steps < 0 || st.Seconds < 0 || st.Tokens < 0 {
			return nil, fmt.Errorf("the server's %s step totals went down during the point (was it restarted?)", kind)
		}
	}
	return d, nil
}

// plus is s + k·o, field by field.
func (s StepStats) plus(o StepStats, k float64) StepStats {
	return StepStats{Steps: s.Steps + k*o.Steps, Seconds: s.Seconds + k*o.Seconds, Tokens: s.Tokens + k*o.Tokens}
}

// SchemaVersion is the version of summary.json; bump it on incompatible changes.
const SchemaVersion = 1

// Summary is summary.json: the run's settings and the statistics of both phases.
type Summary struct {
	SchemaVersion int `json:"schema_version"`
	Run
	Profiling PhaseStats `json:"profiling"`
	Warmup    PhaseStats `json:"warmup"`
}

// Summarize computes a run's Summary from its records.
func Summarize(run *Run) *Summary {
	s := &Summary{SchemaVersion: SchemaVersion, Run: *run}
	s.Run.Records = nil
	s.Profiling = Aggregate(run.Records, PhaseProfiling, run.SLOs, run.Cost)
	s.Warmup = Aggregate(run.Records, PhaseWarmup, nil, nil)
	if s.StartTime.IsZero() {
		s.StartTime = firstStart(run.Records)
	}
	if s.EndTime.IsZero() {
		s.EndTime = lastEnd(run.Records)
	}
	return s
}

func firstStart(recs []ExportRecord) time.Time {
	var t int64 = math.MaxInt64
	for i := range recs {
		t = min(t, recs[i].Metadata.RequestStartNs)
	}
	if t == math.MaxInt64 {
		return time.Time{}
	}
	return time.Unix(0, t).UTC()
}

func lastEnd(recs []ExportRecord) time.Time {
	var t int64 = math.MinInt64
	for i := range recs {
		t = max(t, recs[i].Metadata.RequestEndNs)
	}
	if t == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, t).UTC()
}

// KeyFigure is one named number of a run, for JUnit report entries and CI summaries.
type KeyFigure struct {
	Name  string  // e.g. "time_to_first_token.p99"
	Value float64 // in Unit
	Unit  string
}

// KeyFigures lists the profiling phase's headline numbers: avg, p50, p90 and p99 of every
// per-request metric, then every run-level value, in report order.
func (s *Summary) KeyFigures() []KeyFigure {
	var out []KeyFigure
	for _, tag := range s.Profiling.Tags() {
		m := s.Profiling.Metrics[tag]
		if m.Dist == nil {
			out = append(out, KeyFigure{Name: tag, Value: m.Avg, Unit: m.Unit})
			continue
		}
		for _, st := range []string{"avg", "p50", "p90", "p99"} {
			v, _ := m.Dist.Stat(st)
			out = append(out, KeyFigure{Name: tag + "." + st, Value: v, Unit: m.Unit})
		}
	}
	return out
}
