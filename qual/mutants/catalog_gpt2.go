package mutants

// The planted defects the gpt2 family's premerge gate must catch: the GPT-2 model code
// (gpt2.cc), the shared attention kernel, the tokenizer, the serving stack and the load
// generator.
func init() {
	declare("gpt2", []Mutant{
		{Name: "attention KV off-by-one (the current token's key left out)", File: "native/kernels.cc", Gates: "parity",
			Old: "const int len = pos + i + 1;", New: "const int len = std::max(1, pos + i);"},
		{Name: "BPE merges: equal-rank pairs merged rightmost first", File: "server/tokenizer/bpe.go", Gates: "parity",
			Old: "if r < bestRank {", New: "if r <= bestRank && r != noMerge {"},
		{Name: "last SSE content delta held back and never sent", Fault: "server.swallow_final_delta", File: "server/server.go", Gates: "parity"},
		{Name: "warmup requests recorded as measured", File: "qual/load/load.go", Gates: "load",
			Old: "phase := records.PhaseWarmup\n", New: "phase := records.PhaseProfiling\n"},
		{Name: "gpt2 LayerNorm eps 1e-2 instead of config's 1e-5", File: "native/models/gpt2.cc", Gates: "parity",
			Old: "layer_norm(h_.data(), R, E_, L.ln1g, L.ln1b, hp_.norm_eps, a_.data());", New: "layer_norm(h_.data(), R, E_, L.ln1g, L.ln1b, 1e-2f, a_.data());"},
		{Name: "failed requests missing from the records", File: "server/server.go", Gates: "contract",
			Old: "	if q.recorded && !q.committed {\n		_ = s.records.write(&q.rec)", New: "	if q.recorded && !q.committed && q.status < 400 {\n		_ = s.records.write(&q.rec)"},
		{Name: "nearest-rank percentiles instead of numpy's linear", File: "reports/stats.go", Gates: "load",
			Old: "	frac := h - float64(lo)\n	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])",
			New: "	k := max(1, int(math.Ceil(p/100*float64(n))))\n	return sorted[k-1]"},
		{Name: "stop string split across tokens missed (no text held back)", File: "server/stop.go", Gates: "parity",
			Old: "keep := m.stopPrefixSuffix(s)", New: "keep := 0"},
		{Name: "gpt2 position embedding off by one", File: "native/models/gpt2.cc", Gates: "parity",
			Old: "const float *pe = wpe_ + (size_t)p * E_;", New: "const float *pe = wpe_ + (size_t)(p + 1) * E_;"},
		{Name: "gpt2 gelu_new with a wrong cubic coefficient", File: "native/models/gpt2.cc", Gates: "parity",
			Old: "(x + 0.044715f * x * x * x)", New: "(x + 0.04f * x * x * x)"},
		{Name: "stop string returned in the output", File: "server/stop.go", Gates: "parity",
			Old: "return s[:cut], true", New: "return s, true"},
		{Name: "max_tokens beyond the context clamped instead of refused", File: "server/generate.go", Gates: "contract",
			Old: "	if n+maxTok > ctx {\n		name := \"max_tokens\"", New: "	if n+maxTok > ctx {\n		return ctx - n, nil\n	}\n	if false {\n		name := \"max_tokens\""},
		{Name: "usage.completion_tokens leaves out the last token", File: "server/generate.go", Gates: "parity",
			Old: "b = strconv.AppendInt(b, int64(completion), 10)", New: "b = strconv.AppendInt(b, int64(max(0, completion-1)), 10)"},
		{Name: "logprobs of the candidates read one id off", File: "native/engine.cc", Gates: "parity",
			Old: "out.top[j] = (float)((double)lg[out.top_ids[j]] - lse);", New: "out.top[j] = (float)((double)lg[std::min(V - 1, out.top_ids[j] + 1)] - lse);"},
		{Name: "include_stop_str_in_output ignored (the stop string dropped anyway)", File: "server/stop.go", Gates: "parity",
			Old: "		if m.include {\n", New: "		if false {\n"},
		// gpt2's natural-EOS gate (fixtures/golden/gpt2-tiny-eos.json, prompts searched so the
		// retuned gpt2-tiny reaches 50256 on its own) must bite too.
		{Name: "EOS ignored by the engine, seen by gpt2's gate", File: "native/engine.cc", Gates: "parity",
			Old: "if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())",
			New: "if (q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())"},
		// Planted faults (MODELQUAL_FAULTS) the gpt2 gates must catch.
		{Name: "every 5th request record lost by the server", Fault: "server.drop_record", File: "server/server.go", Gates: "load"},
		{Name: "gRPC token updates repeat the whole output instead of the new text", Fault: "server.grpc_cumulative_deltas", File: "server/grpc.go", Gates: "parity"},
	})
}
