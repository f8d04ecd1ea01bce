package mutants

// Catalog lists the planted defects of `qual mutants`. Each is a defect that has happened or
// could happen in review: the first fourteen are issue 40's (the premerge gate missed six of
// them before the natural-EOS, stop-string, chat-usage, concurrency, failure-records and
// percentile gates existed); the rest widen the net over the model math, the tokenizer, the
// server's contract and the harness's own statistics.
//
// To add a defect: copy an entry, name the defect as a reviewer would describe it, give the
// family whose premerge gate must catch it, and an Old text that occurs exactly once in File
// (TestCatalogApplies checks that every entry still applies to the current source), and the
// gates (labels) that concern it: parity for model math, tokenizer and generation semantics,
// contract for the request contract and records, load for the load generator and statistics.
var Catalog = []Mutant{
	{Name: "qwen3 RoPE base ×10 (rope_theta misread)", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "double theta = hp_.rope_theta *", New: "double theta = 10.0 * hp_.rope_theta *"},
	{Name: "qwen3 k_norm skipped", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "rms_norm(kr + hh * hd_, 1, hd_, L.k_norm, hp_.norm_eps, kr + hh * hd_);", New: ";"},
	{Name: "attention KV off-by-one (the current token's key left out)", Family: "gpt2", File: "native/kernels.cc", Gates: "parity",
		Old: "const int len = pos + i + 1;", New: "const int len = std::max(1, pos + i);"},
	{Name: "BPE merges: equal-rank pairs merged rightmost first", Family: "gpt2", File: "server/tokenizer/bpe.go", Gates: "parity",
		Old: "if r < bestRank {", New: "if r <= bestRank && r != noMerge {"},
	{Name: "last SSE content delta held back and never sent", Family: "gpt2", File: "server/generate.go", Gates: "parity",
		Old: "if g.s.faults.swallowFinalDelta {", New: "if true {"},
	{Name: "warmup requests recorded as measured", Family: "gpt2", File: "qual/load/load.go", Gates: "load",
		Old: "phase := records.PhaseWarmup\n", New: "phase := records.PhaseProfiling\n"},
	{Name: "gpt2 LayerNorm eps 1e-2 instead of config's 1e-5", Family: "gpt2", File: "native/models/gpt2.cc", Gates: "parity",
		Old: "layer_norm(h_.data(), R, E_, L.ln1g, L.ln1b, hp_.norm_eps, a_.data());", New: "layer_norm(h_.data(), R, E_, L.ln1g, L.ln1b, 1e-2f, a_.data());"},
	{Name: "qwen3 logits scaled by 1.0625 (final norm output scaled)", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);\n",
		New: "  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);\n  for (size_t x = 0; x < (size_t)rows * E_; x++) out[x] *= 1.0625f;\n"},
	{Name: "EOS ignored by the engine (ignore_eos test inverted)", Family: "qwen", File: "native/engine.cc", Gates: "parity",
		Old: "if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())",
		New: "if (q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())"},
	{Name: "EOS ids read from config.json instead of generation_config.json", Family: "qwen", File: "native/config.go", Gates: "parity",
		Old: "raw := g.EOSTokenID\n", New: "raw := c.EOSTokenID\n"},
	{Name: "add_generation_prompt dropped on the chat route only", Family: "qwen", File: "server/generate.go", Gates: "parity",
		Old: "s.render(req.Messages, req.AddGenerationPrompt, req.ChatTemplateKwargs)", New: "s.render(req.Messages, false, req.ChatTemplateKwargs)"},
	{Name: "failed requests missing from the records", Family: "gpt2", File: "server/server.go", Gates: "contract",
		Old: "	if q.recorded && !q.committed {\n		_ = s.records.write(&q.rec)", New: "	if q.recorded && !q.committed && q.status < 400 {\n		_ = s.records.write(&q.rec)"},
	{Name: "nearest-rank percentiles instead of numpy's linear", Family: "gpt2", File: "reports/stats.go", Gates: "load",
		Old: "	frac := h - float64(lo)\n	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])",
		New: "	k := max(1, int(math.Ceil(p/100*float64(n))))\n	return sorted[k-1]"},
	{Name: "qwen3 attention scale halved in batched decode only", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale,", New: "b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, b.n > 1 && b.ntok[i] == 1 ? 0.5f * scale : scale,"},
	{Name: "stop string split across tokens missed (no text held back)", Family: "gpt2", File: "server/stop.go", Gates: "parity",
		Old: "keep := m.stopPrefixSuffix(s)", New: "keep := 0"},

	{Name: "gpt2 position embedding off by one", Family: "gpt2", File: "native/models/gpt2.cc", Gates: "parity",
		Old: "const float *pe = wpe_ + (size_t)p * E_;", New: "const float *pe = wpe_ + (size_t)(p + 1) * E_;"},
	{Name: "gpt2 gelu_new with a wrong cubic coefficient", Family: "gpt2", File: "native/models/gpt2.cc", Gates: "parity",
		Old: "(x + 0.044715f * x * x * x)", New: "(x + 0.04f * x * x * x)"},
	{Name: "qwen3 SiLU replaced by ReLU in the MLP", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "g_[x] = g / (1.0f + std::exp(-g)) * u_[x];", New: "g_[x] = (g > 0 ? g : 0.0f) * u_[x];"},
	{Name: "grouped-query attention maps query heads to KV heads round-robin", Family: "qwen", File: "native/kernels.cc", Gates: "parity",
		Old: "const int kh = h / group;", New: "const int kh = h % Hkv;"},
	{Name: "batched decode reads the first sequence's KV cache for every sequence", Family: "qwen", File: "native/models/qwen3_decoder.cc", Gates: "parity",
		Old: "float *K = kv_.k(l, b.slot[i]), *V = kv_.v(l, b.slot[i]);", New: "float *K = kv_.k(l, b.slot[0]), *V = kv_.v(l, b.slot[0]);"},
	{Name: "stop string returned in the output", Family: "gpt2", File: "server/stop.go", Gates: "parity",
		Old: "return s[:cut], true", New: "return s, true"},
	{Name: "max_tokens beyond the context clamped instead of refused", Family: "gpt2", File: "server/generate.go", Gates: "contract",
		Old: "	if n+maxTok > ctx {\n		name := \"max_tokens\"", New: "	if n+maxTok > ctx {\n		return ctx - n, nil\n	}\n	if false {\n		name := \"max_tokens\""},
	{Name: "usage.completion_tokens leaves out the last token", Family: "gpt2", File: "server/generate.go", Gates: "parity",
		Old: "b = strconv.AppendInt(b, int64(g.ntok), 10)", New: "b = strconv.AppendInt(b, int64(max(0, g.ntok-1)), 10)"},
	{Name: "tokenizer NFC normalizer skipped", Family: "qwen", File: "server/tokenizer/normalize.go", Gates: "parity",
		Old: "return unicodeForm{norm.NFC}, nil", New: "return nil, nil"},
	{Name: "EOS token's text returned to the client", Family: "qwen", File: "server/generate.go", Gates: "parity",
		Old: "		if !g.req.IgnoreEOS && g.isEOS(tok) {\n			continue\n		}\n", New: ""},
	{Name: "logprobs not normalised (logit minus max, the log-sum-exp left out)", Family: "qwen", File: "native/engine.cc", Gates: "parity",
		Old: "double lse = (double)mx + std::log(sum);", New: "double lse = (double)mx;"},
	{Name: "logprobs of the candidates read one id off", Family: "gpt2", File: "native/engine.cc", Gates: "parity",
		Old: "out.top[j] = (float)((double)lg[out.top_ids[j]] - lse);", New: "out.top[j] = (float)((double)lg[std::min(V - 1, out.top_ids[j] + 1)] - lse);"},
	{Name: "a stream's finish chunk drops the logprobs of tokens without text (the EOS)", Family: "qwen", File: "server/generate.go", Gates: "parity",
		Old: "if g.lp != nil && len(g.lp.pending) > 0 && !g.s.faults.dropFinalLogprobs {", New: "if false {"},
	{Name: "include_stop_str_in_output ignored (the stop string dropped anyway)", Family: "gpt2", File: "server/stop.go", Gates: "parity",
		Old: "		if m.include {\n", New: "		if false {\n"},
	// gpt2's natural-EOS gate (fixtures/golden/gpt2-tiny-eos.json, prompts searched so the
	// retuned gpt2-tiny reaches 50256 on its own) must bite too.
	{Name: "EOS ignored by the engine, seen by gpt2's gate", Family: "gpt2", File: "native/engine.cc", Gates: "parity",
		Old: "if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())",
		New: "if (q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())"},
}
