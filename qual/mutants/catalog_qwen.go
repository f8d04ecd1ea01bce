package mutants

// The planted defects the qwen family's premerge gate must catch: the Qwen3 decoder, the
// engine, the tokenizer and the chat route.
func init() {
	declare("qwen", []Mutant{
		{Name: "qwen3 RoPE base ×10 (rope_theta misread)", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "double theta = hp_.rope_theta *", New: "double theta = 10.0 * hp_.rope_theta *"},
		{Name: "qwen3 k_norm skipped", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "rms_norm(kr + hh * hd_, 1, hd_, L.k_norm, hp_.norm_eps, kr + hh * hd_);", New: ";"},
		{Name: "qwen3 logits scaled by 1.0625 (final norm output scaled)", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);\n",
			New: "  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);\n  for (size_t x = 0; x < (size_t)rows * E_; x++) out[x] *= 1.0625f;\n"},
		{Name: "EOS ignored by the engine (ignore_eos test inverted)", File: "native/engine.cc", Gates: "parity",
			Old: "if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())",
			New: "if (q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())"},
		{Name: "EOS ids read from config.json instead of generation_config.json", File: "native/config.go", Gates: "parity",
			Old: "raw := g.EOSTokenID\n", New: "raw := c.EOSTokenID\n"},
		{Name: "add_generation_prompt dropped on the chat route only", File: "server/generate.go", Gates: "parity",
			Old: "s.render(req.Messages, req.AddGenerationPrompt, req.ChatTemplateKwargs)", New: "s.render(req.Messages, false, req.ChatTemplateKwargs)"},
		{Name: "qwen3 attention scale halved in batched decode only", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale,", New: "b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, b.n > 1 && b.ntok[i] == 1 ? 0.5f * scale : scale,"},
		{Name: "qwen3 SiLU replaced by ReLU in the MLP", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "g_[x] = g / (1.0f + std::exp(-g)) * u_[x];", New: "g_[x] = (g > 0 ? g : 0.0f) * u_[x];"},
		{Name: "grouped-query attention maps query heads to KV heads round-robin", File: "native/kernels.cc", Gates: "parity",
			Old: "const int kh = h / group;", New: "const int kh = h % Hkv;"},
		{Name: "batched decode reads the first sequence's KV cache for every sequence", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "float *K = kv_.k(l, b.slot[i]), *V = kv_.v(l, b.slot[i]);", New: "float *K = kv_.k(l, b.slot[0]), *V = kv_.v(l, b.slot[0]);"},
		{Name: "tokenizer NFC normalizer skipped", File: "server/tokenizer/normalize.go", Gates: "parity",
			Old: "return unicodeForm{norm.NFC}, nil", New: "return nil, nil"},
		{Name: "EOS token's text returned to the client", File: "server/generate.go", Gates: "parity",
			Old: "		if !g.req.IgnoreEOS && g.isEOS(tok) {\n			continue\n		}\n", New: ""},
		{Name: "logprobs not normalised (logit minus max, the log-sum-exp left out)", File: "native/engine.cc", Gates: "parity",
			Old: "double lse = (double)mx + std::log(sum);", New: "double lse = (double)mx;"},
		{Name: "a stream's finish chunk drops the logprobs of tokens without text (the EOS)", Fault: "server.stream_drop_final_logprobs", File: "server/server.go", Gates: "parity"},
		// Planted faults (MODELQUAL_FAULTS) of the Qwen3 decoder and the engine the qwen gates must catch.
		{Name: "qwen3 rope_theta ×10 (runtime fault)", Fault: "qwen3.rope_theta_x10", File: "native/models/qwen3_decoder.cc", Gates: "parity"},
		{Name: "qwen3 q_norm skipped", Fault: "qwen3.drop_q_norm", File: "native/models/qwen3_decoder.cc", Gates: "parity"},
		{Name: "logprobs not normalised (runtime fault)", Fault: "engine.logprobs_unnormalised", File: "native/engine.cc", Gates: "parity"},
		{Name: "chat rendered without the generation prompt on every route", Fault: "server.template_no_generation_prompt", File: "server/server.go", Gates: "parity"},
	})
}
