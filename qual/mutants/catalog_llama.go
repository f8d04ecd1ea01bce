package mutants

// The planted defects the llama family's premerge gate (llama-tiny: TinyLlama's layout) must
// catch: the Llama decoder's math and its two runtime faults. Defects of what llama-tiny does
// not use (rope scaling types, biases, the sliding window) are caught by the golden tests on
// llama-tiny-llama3 and mistral-tiny (native/models/llama_test.go, families/llama/reference),
// not by this gate, so they are not listed here.
func init() {
	declare("llama", []Mutant{
		{Name: "llama SiLU replaced by ReLU in the MLP", File: "native/models/llama.cc", Gates: "parity",
			Old: "g_[x] = g / (1.0f + std::exp(-g)) * u_[x];", New: "g_[x] = (g > 0 ? g : 0.0f) * u_[x];"},
		{Name: "llama rotary angle of the key left at position 0 (k not rotated)", File: "native/models/llama.cc", Gates: "parity",
			Old: "for (int hh = 0; hh < Hkv_; hh++) rope(kr + hh * hd_, p);", New: ";"},
		{Name: "llama untied head read from the token embedding", File: "native/models/llama.cc", Gates: "parity",
			Old: "    if (w.has(\"lm_head.weight\"))\n      lm = w.get(\"lm_head.weight\", {V_, E_});\n    else if",
			New: "    if (w.has(\"lm_head.weight\"))\n      lm = embed_;\n    else if"},
		{Name: "llama post-attention norm applied with the input norm's weights", File: "native/models/llama.cc", Gates: "parity",
			Old: "rms_norm(h_.data(), R, E_, L.post_ln, hp_.norm_eps, a_.data());", New: "rms_norm(h_.data(), R, E_, L.in_ln, hp_.norm_eps, a_.data());"},
		// Planted faults (MODELQUAL_FAULTS) of the llama runtime the llama gates must catch.
		{Name: "llama rope_theta ×10 (runtime fault)", Fault: "llama.rope_theta_x10", File: "native/models/llama.cc", Gates: "parity"},
		{Name: "llama KV heads 0 and 1 swapped in the cache (runtime fault)", Fault: "llama.kv_head_swap", File: "native/models/llama.cc", Gates: "parity"},
	})
}
