package mutants

// The planted defects the llama family's premerge gate (llama-tiny: TinyLlama's layout) must
// catch: the Llama decoder's math and its two runtime faults. Defects of what llama-tiny does
// not use (rope scaling types, biases, the sliding window) are caught by the golden tests on
// llama-tiny-llama3 and mistral-tiny (native/models/llama_test.go, families/llama/reference),
// not by this gate, so they are not listed here.
func init() {
	declare("llama", []Mutant{
		// llama's layers are the shared decoder's with llama_options (qk_norm off, its rotary
		// table): defects planted in that decoder's code must fail the llama gate too.
		{Name: "llama (shared decoder) SiLU replaced by ReLU in the MLP", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "g_[x] = g / (1.0f + std::exp(-g)) * u_[x];", New: "g_[x] = (g > 0 ? g : 0.0f) * u_[x];"},
		{Name: "llama (shared decoder) key not rotated", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "          rope(kr + hh * hd_, p3);\n", New: "\n"},
		{Name: "llama untied head read from the token embedding", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "  if (w.has(\"lm_head.weight\"))\n    lm = w.get(\"lm_head.weight\", {V, E});\n  else if",
			New: "  if (w.has(\"lm_head.weight\"))\n    lm = dec.embed_weight();\n  else if"},
		{Name: "llama (shared decoder) post-attention norm applied with the input norm's weights", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "rms_norm(h, R, E_, L.post_ln, hp_.norm_eps, a_.data());", New: "rms_norm(h, R, E_, L.in_ln, hp_.norm_eps, a_.data());"},
		{Name: "llama rotary table from default RoPE instead of the resolved frequencies", File: "native/models/llama.cc", Gates: "parity",
			Old: "  for (int i = 0; i < half; i++) o.rope_inv_freq.push_back((float)hp.f(\"rope_inv_freq.\" + std::to_string(i)));\n",
			New: "  for (int i = 0; i < half; i++) o.rope_inv_freq.push_back((float)(1.0 / std::pow(500000.0, 2.0 * i / (2 * half))));\n"},
		// llama's natural-EOS gate (fixtures/golden/llama-tiny-eos.json: prompts after which
		// transformers' greedy path reaches </s>) sees an engine that ignores EOS.
		{Name: "EOS ignored by the engine, seen by llama's gate", File: "native/engine.cc", Gates: "parity",
			Old: "if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())",
			New: "if (q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())"},
		// Planted faults (MODELQUAL_FAULTS) of the llama runtime the llama gates must catch.
		{Name: "llama rope_theta ×10 (runtime fault)", Fault: "llama.rope_theta_x10", File: "native/models/qwen3_decoder.cc", Gates: "parity"},
		{Name: "llama KV heads 0 and 1 swapped in the cache (runtime fault)", Fault: "llama.kv_head_swap", File: "native/models/qwen3_decoder.cc", Gates: "parity"},
	})
}
