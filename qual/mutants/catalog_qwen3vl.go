package mutants

// The planted defects the qwen3vl family's premerge gate must catch: the vision tower and the
// multimodal positions of qwen3vl.cc (its Qwen3 decoder is the qwen family's).
func init() {
	declare("qwen3vl", []Mutant{
		{Name: "qwen3vl DeepStack additions skipped", Fault: "qwen3vl.drop_deepstack", File: "native/models/qwen3vl.cc", Gates: "parity"},
		{Name: "qwen3vl image tokens given 1-D positions instead of M-RoPE's (t, h, w)", Fault: "qwen3vl.flat_rope", File: "native/models/qwen3vl.cc", Gates: "parity"},
	})
}
