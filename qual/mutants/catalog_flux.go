package mutants

// The planted faults the flux family's gates must catch: the FLUX.1 pipeline of flux.cc. Their
// gate is the image parity against diffusers' golden (fixtures/golden/flux-tiny-dev.json); until
// a GPU-host run has made that file, the parity spec skips and the campaign reports these rows
// missed. Meanwhile families/flux's gates_bite specs show each fault makes the served image
// differ from qual generate-image's unplanted one.
func init() {
	declare("flux", []Mutant{
		{Name: "flux rotary table built from [image ids, text ids] against the [text, image] tokens", Fault: "flux.swap_text_image_ids",
			File: "native/models/flux.cc", Gates: "parity"},
		{Name: "flux CLIP pooled output dropped (zeroed) from the conditioning", Fault: "flux.drop_pooled",
			File: "native/models/flux.cc", Gates: "parity"},
	})
}
