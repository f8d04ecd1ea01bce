package mutants

// The planted faults the internvl family's gates must catch: its vision tower's pixel shuffle and
// layer scale. Their gate is the corpus parity against transformers' golden
// (fixtures/golden/internvl-tiny.json); until a GPU-host run has made that file, the family's
// parity specs skip and the campaign reports these rows missed. Meanwhile server/vision's
// TestInternVLNativeFaultsMoveLogits shows each fault moves the logits past the bound of the
// float64 reference written apart from the engine.
func init() {
	declare("internvl", []Mutant{
		{Name: "internvl pixel shuffle with rows and columns swapped (runtime fault)", Fault: "internvl.shuffle_transposed",
			File: "native/models/internvl.cc", Gates: "parity"},
		{Name: "internvl vision layer scale lambda_1/lambda_2 skipped (runtime fault)", Fault: "internvl.drop_layer_scale",
			File: "native/models/internvl.cc", Gates: "parity"},
	})
}
