package mutants

// The planted defects in the harness's own numbers (issue 54): the per-request metrics, their
// aggregation, the records, the exports, and the non-model stages of the image and vision
// pipelines (scheduler, VAE scaling and shift, pixel rounding, the image processor's resize
// and normalisation). Each names the packages of `make test` whose unit tests concern it and
// the family whose premerge gate runs on a real server: the text harness's rows belong to
// gpt2 (its load and contract gates), the image pipeline's to zimage, the vision processor's
// to qwen3vl.
func init() {
	declare("gpt2", []Mutant{
		// qual/metrics: the per-request figures of METRICS.md.
		{Name: "ITL divided by the output tokens instead of tokens − 1", File: "qual/metrics/metrics.go", Gates: "load",
			Packages: []string{"./qual/metrics", "./qual/recount"},
			Old:      "m.ITLNs = float64(m.LatencyNs-m.TTFTNs) / float64(m.OutputTokens-1)", New: "m.ITLNs = float64(m.LatencyNs-m.TTFTNs) / float64(m.OutputTokens)"},
		{Name: "TTFT measured from the response headers instead of the send", File: "qual/metrics/metrics.go", Gates: "load",
			Packages: []string{"./qual/metrics"},
			Old:      "m.TTFTNs = chunks[0]\n", New: "m.TTFTNs = chunks[0] - r.AckNs\n"},
		{Name: "exported request_ack_ns is the send time", File: "qual/metrics/metrics.go", Gates: "load",
			Packages: []string{"./qual/metrics"},
			Old:      "RequestAckNs:      r.StartUnixNs + r.AckNs,", New: "RequestAckNs:      r.StartUnixNs,"},
		// reports: aggregation of a phase.
		{Name: "sample standard deviation (n − 1) instead of numpy's population std", File: "reports/stats.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "d.Std = stat.PopStdDev(x, nil)", New: "d.Std = stat.StdDev(x, nil)"},
		{Name: "percentile rank p/100·n instead of p/100·(n − 1)", File: "reports/stats.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "h := p / 100 * float64(n-1)", New: "h := p / 100 * float64(n)"},
		{Name: "request throughput counts failed requests", File: "reports/aggregate.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "set(TagRequestThroughput, float64(valid)/durSec)", New: "set(TagRequestThroughput, float64(ps.Requests)/durSec)"},
		{Name: "goodput counts a request that meets only the last SLO", File: "reports/aggregate.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "ok = ok && s.Met(r)", New: "ok = s.Met(r)"},
		{Name: "benchmark window ends at the end of the body, not send + request latency", File: "reports/aggregate.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "end = start + int64(math.Round(lat*1e6))", New: "end = r.Metadata.RequestEndNs + 0*int64(lat)"},
		// reports: the AIPerf exports.
		{Name: "AIPerf CSV p90 and p95 columns swapped", File: "reports/export.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "two(d.P90), two(d.P95)", New: "two(d.P95), two(d.P90)"},
		{Name: "AIPerf JSON error_summary of the warmup phase", File: "reports/export.go", Gates: "load",
			Packages: []string{"./reports"},
			Old:      "errs := s.Profiling.Errors", New: "errs := s.Warmup.Errors"},
		// Records: the client/server join and the server's own records.
		{Name: "HTTP − task also subtracts the queue wait", File: "qual/records/records.go", Gates: "load",
			Packages: []string{"./qual/records", "./qual/metrics"},
			Old:      "j.HTTPMinusTaskNs = j.HTTPLatencyNs - j.TaskWallNs", New: "j.HTTPMinusTaskNs = j.HTTPLatencyNs - j.TaskWallNs - j.QueueWaitNs"},
		// The server's own records: its unit tests do not compare them with the responses;
		// the contract gate's record check (spec.RecordsMatchResponses) does.
		{Name: "server record's output_sha256 leaves out the text's first byte", File: "server/generate.go", Gates: "contract",
			Old: "r.OutputSHA256, r.OutputBytes = sha256Hex(g.out), int64(len(g.out))", New: "r.OutputSHA256, r.OutputBytes = sha256Hex(g.out[min(1, len(g.out)):]), int64(len(g.out))"},
	})
	declare("zimage", []Mutant{
		{Name: "server image record's PNG byte count one short", File: "server/images.go", Gates: "contract",
			Old: "q.rec.OutputSHA256, q.rec.OutputBytes = sha256Hex(a.PNG), int64(len(a.PNG))", New: "q.rec.OutputSHA256, q.rec.OutputBytes = sha256Hex(a.PNG), int64(len(a.PNG)-1)"},
		{Name: "image throughput exported in images per millisecond", File: "qual/load/images.go", Gates: "load",
			Packages: []string{"./qual/load"}, Tests: "TestImageExportFromRecords|TestProfileImagesWritesTheTextLayout",
			Old: "reports.Scalar(n*1e9/float64(c.EndNs), \"images/sec\")", New: "reports.Scalar(n*1e6/float64(c.EndNs), \"images/sec\")"},
		// The pipeline's non-model stages (planted faults of zimage.cc: one native build serves
		// every row).
		{Name: "zimage scheduler shift ignored (shift 1 instead of the config's 3)", Fault: "zimage.scheduler_shift_ignored", File: "native/models/zimage.cc", Gates: "parity",
			Packages: []string{"./native"}, Tests: "TestZImageMatchesDiffusers"},
		{Name: "zimage VAE input multiplied by scaling_factor instead of divided", Fault: "zimage.vae_scaling_inverted", File: "native/models/zimage.cc", Gates: "parity",
			Packages: []string{"./native"}, Tests: "TestZImageMatchesDiffusers"},
		{Name: "zimage VAE shift_factor dropped", Fault: "zimage.vae_shift_dropped", File: "native/models/zimage.cc", Gates: "parity",
			Packages: []string{"./native"}, Tests: "TestZImageMatchesDiffusers"},
		{Name: "zimage 8-bit pixels truncated instead of rounded", Fault: "zimage.pixels_truncated", File: "native/models/zimage.cc", Gates: "parity",
			Packages: []string{"./native"}, Tests: "TestZImageMatchesDiffusers"},
	})
	declare("qwen3vl", []Mutant{
		{Name: "vision smart_resize rounds sides down instead of to the nearest multiple", File: "server/vision/qwen2vl.go", Gates: "parity",
			Packages: []string{"./server/vision"}, Tests: "TestSmartResize|TestProcessorParity|TestNativeCorpusParity",
			Old: "h := int(math.RoundToEven(float64(height)/f)) * factor", New: "h := int(math.Floor(float64(height)/f)) * factor"},
		{Name: "vision normalisation subtracts the mean after dividing by std", File: "server/vision/qwen2vl.go", Gates: "parity",
			Packages: []string{"./server/vision"}, Tests: "TestSmartResize|TestProcessorParity|TestNativeCorpusParity",
			Old: "r.Pixels[i] = (float32(src[3*x]) - mean[ch]) / std[ch]", New: "r.Pixels[i] = float32(src[3*x])/std[ch] - mean[ch]"},
		{Name: "vision bicubic resize with PIL's a = −0.75 instead of torchvision's −0.5", File: "server/vision/resize.go", Gates: "parity",
			Packages: []string{"./server/vision"}, Tests: "TestSmartResize|TestProcessorParity|TestNativeCorpusParity",
			Old: "const a = -0.5", New: "const a = -0.75"},
	})
}
