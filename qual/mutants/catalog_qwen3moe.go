package mutants

// The planted defects the qwen3moe family's premerge gate must catch: the mixture of experts
// of the shared Qwen3 decoder (qwen3_decoder.cc) and the family's resolve (qwen3moe.cc). The
// routing gate names the (layer, expert) counts that moved; the parity gate the logits.
func init() {
	declare("qwen3moe", []Mutant{
		{Name: "qwen3moe tokens routed to the experts after the chosen ones", Fault: "qwen3moe.route_wrong_expert",
			File: "native/models/qwen3_decoder.cc", Gates: "parity"},
		{Name: "qwen3moe router picks the least probable experts (top-k inverted)", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "if (!taken && (best < 0 || p[e] > p[best])) best = e;", New: "if (!taken && (best < 0 || p[e] < p[best])) best = e;"},
		{Name: "qwen3moe top-k weights not renormalised (norm_topk_prob ignored)", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "if (moe_.norm_topk_prob) wk[k] /= tot;", New: "(void)tot;"},
		{Name: "qwen3moe router softmax skipped (raw logits weight the experts)", File: "native/models/qwen3_decoder.cc", Gates: "parity",
			Old: "for (int e = 0; e < NE; e++) p[e] /= sum;", New: "for (int e = 0; e < NE; e++) p[e] = std::log(p[e]) + mx;"},
		{Name: "qwen3moe norm_topk_prob read with default true", File: "native/models/qwen3moe.cc", Gates: "parity",
			Old: `hp.set("norm_topk_prob", c.boolean("norm_topk_prob", false));`, New: `hp.set("norm_topk_prob", !c.boolean("norm_topk_prob", false));`},
	})
}
