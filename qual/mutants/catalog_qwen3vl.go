package mutants

// The planted defects the qwen3vl family's premerge gate must catch: the vision tower and the
// multimodal positions of qwen3vl.cc (its Qwen3 decoder is the qwen family's).
func init() {
	declare("qwen3vl", []Mutant{
		{Name: "qwen3vl DeepStack additions skipped", Fault: "qwen3vl.drop_deepstack", File: "native/models/qwen3vl.cc", Gates: "parity"},
		{Name: "qwen3vl image tokens given 1-D positions instead of M-RoPE's (t, h, w)", Fault: "qwen3vl.flat_rope", File: "native/models/qwen3vl.cc", Gates: "parity"},
		// Two-image defects: server/vision's TestQwen3VLTwoImageFaultsBreakReference catches both
		// against the float64 reference; the family's two-image parity gate catches them once the
		// transformers golden (fixtures/golden/qwen3vl-tiny-pairs.json) exists.
		{Name: "qwen3vl second image's positions start where the first image's started", Fault: "qwen3vl.shared_image_start", File: "native/models/qwen3vl.cc", Gates: "parity"},
		{Name: "qwen3vl patches of several images attend across images in the vision tower", Fault: "qwen3vl.joint_vision", File: "native/models/qwen3vl.cc", Gates: "parity"},
	})
}
