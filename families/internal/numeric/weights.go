package numeric

import "github.com/modelqual/modelqual/families/internal/safetensors"

// Weights reads a checkpoint's tensors with the shapes its config implies, keeping the first
// error, so that a reference's loader reads as the list of tensor names of its architecture.
type Weights struct {
	File *safetensors.File
	// Prefixes are tried in order for every name, e.g. "transformer." then "" for GPT-2,
	// whose files come both with and without the GPT2LMHeadModel prefix. Empty means none.
	Prefixes []string
	// Err is the first missing or misshaped tensor.
	Err error
}

// Vec reads a 1-D tensor of n values.
func (w *Weights) Vec(name string, n int) []float64 { return w.get(name, n) }

// Mat reads a rows×cols tensor.
func (w *Weights) Mat(name string, rows, cols int) Matrix {
	return Matrix{Rows: rows, Cols: cols, Data: w.get(name, rows, cols)}
}

func (w *Weights) get(name string, shape ...int) []float64 {
	if w.Err != nil {
		return nil
	}
	prefixes := w.Prefixes
	if len(prefixes) == 0 {
		prefixes = []string{""}
	}
	full := prefixes[0] + name
	for _, p := range prefixes {
		if w.File.Has(p + name) {
			full = p + name
			break
		}
	}
	t, err := w.File.Get(full, shape...)
	if err != nil {
		w.Err = err
		return nil
	}
	return t.Data
}
