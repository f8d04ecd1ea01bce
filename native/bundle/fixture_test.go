package bundle_test

import (
	"os"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

// TestFixtureBundles builds bundles of the generated fixtures through the hub-cache path and
// checks what the runtime relies on: family, shapes read from config, tied heads, EOS ids.
func TestFixtureBundles(t *testing.T) {
	cache := t.TempDir()
	for _, c := range []struct {
		name, family string
		tensors      int
		embed        string
		shape        []int64
	}{
		{fixtures.GPT2Tiny, "gpt2", 2 + 2*12 + 2, "wte.weight", []int64{50257, 64}},
		{fixtures.Qwen3Tiny, "qwen3", 1 + 2*11 + 1, "model.embed_tokens.weight", []int64{151936, 64}},
	} {
		p, err := fixtures.Bundle(cache, c.name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := bundle.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		h := b.Header()
		if h.Family != c.family || len(h.Tensors) != c.tensors || h.Provenance.CheckpointID != fixtures.ModelID(c.name) {
			t.Errorf("%s: family %s, %d tensors, id %s", c.name, h.Family, len(h.Tensors), h.Provenance.CheckpointID)
		}
		ti, w, err := b.Float32s(c.embed)
		if err != nil || ti.Shape[0] != c.shape[0] || ti.Shape[1] != c.shape[1] {
			t.Errorf("%s: %s = %+v, %v", c.name, c.embed, ti, err)
		}
		var sum, sq float64
		for _, v := range w {
			sum += float64(v)
			sq += float64(v) * float64(v)
		}
		// Token embeddings N(0, 0.25²) (fixtures/textinit.go) over ~10^7 values: the sample std
		// is 0.25 to well within 1%.
		if std := sq / float64(len(w)); std < 0.2475*0.2475 || std > 0.2525*0.2525 {
			t.Errorf("%s: %s variance %g, want 0.25²", c.name, c.embed, std)
		}
		b.Close()
	}
}

// BenchmarkOpenQwen3Tiny measures bundle load: structural validation, mmap, and the sha256 of
// every data chunk (in parallel) and section of the ~50 MB file; b.SetBytes makes the figure
// a verification speed.
func BenchmarkOpenQwen3Tiny(b *testing.B) {
	p, err := fixtures.Bundle(b.TempDir(), fixtures.Qwen3Tiny)
	if err != nil {
		b.Fatal(err)
	}
	if st, err := os.Stat(p); err == nil {
		b.SetBytes(st.Size())
	}
	for b.Loop() {
		bu, err := bundle.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		bu.Close()
	}
}
