package mutants

// The planted defects the zimage family's premerge gate must catch: the Z-Image pipeline of
// zimage.cc.
func init() {
	declare("zimage", []Mutant{
		{Name: "zimage image tokens' h and w RoPE positions swapped", Fault: "zimage.rope_swap_hw", File: "native/models/zimage.cc", Gates: "parity"},
		{Name: "zimage guidance ignored (the negative branch never runs)", Fault: "zimage.drop_cfg", File: "native/models/zimage.cc", Gates: "parity"},
	})
}
