package tokenizer

import (
	"slices"
	"sort"
	"strconv"
	"testing"
)

// fluxGolden is fixtures/golden/flux_tokenizer_golden.json, written by
// fixtures/golden/make_flux_tokenizer_golden.py with transformers 5.17 on the GPU host's CPU
// (fixtures/PROVENANCE.md): FLUX's CLIP and T5 tokenizers, each loaded as a user would, on a
// varied string set.
type fluxGolden struct {
	Versions   map[string]any `json:"versions"`
	Tokenizers map[string]struct {
		Info    map[string]any     `json:"info"`
		Strings []fluxGoldenString `json:"strings"`
	} `json:"tokenizers"`
	Differences []string `json:"differences"`
	Errors      []string `json:"errors"`
}

type fluxGoldenString struct {
	Text        string             `json:"text"`
	IDs         []int32            `json:"ids"`
	IDsSpecial  []int32            `json:"ids_special"`
	Tokens      []string           `json:"tokens"`
	Padded      map[string][]int32 `json:"padded"`
	Mask        map[string][]int32 `json:"mask"`
	Decoded     *string            `json:"decoded"`
	DecodedSkip *string            `json:"decoded_skip"`
	Normalized  *string            `json:"normalized"`
}

// fluxGoldenLoaders maps each golden tokenizer to the Go loading that must reproduce it.
func fluxGoldenLoaders(t *testing.T) map[string]*Tokenizer {
	clip := clipLoadings(t)
	t5, err := Load(fixtureDir(t, t5Dir))
	if err != nil {
		t.Fatal(err)
	}
	t5File := rawTokenizerJSON(t, fixtureDir(t, t5Dir))
	return map[string]*Tokenizer{
		"clip":       clip["tokenizer.json+class"],
		"clip_vocab": clip["vocab.json+merges.txt"],
		"clip_file":  clip["tokenizer.json alone"],
		"t5":         t5,
		"t5_auto":    t5,
		"t5_file":    t5File,
	}
}

// TestFluxTokenizerGolden holds CLIP's and T5's tokenizers to transformers: ids with and
// without special tokens, token strings, the padded and truncated ids and attention masks of
// FluxPipeline's calls (CLIP 77; T5 512 and 256; and 16 for truncation), and decoded text.
func TestFluxTokenizerGolden(t *testing.T) {
	var g fluxGolden
	readOptionalGolden(t, "flux_tokenizer_golden.json", "run fixtures/golden/make_flux_tokenizer_golden.sh OUT on a host with transformers 5.17 and copy OUT/flux_tokenizer_golden.json there (fixtures/PROVENANCE.md); the known-id tests in flux_test.go still run", &g)
	for _, e := range g.Errors {
		t.Errorf("the golden script could not load a tokenizer (%s); rerun it", e)
	}
	for _, d := range g.Differences {
		t.Logf("transformers itself: %s", d)
	}
	loaders := fluxGoldenLoaders(t)
	names := make([]string, 0, len(loaders))
	for n := range loaders {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		tok := loaders[name]
		rec, ok := g.Tokenizers[name]
		if !ok {
			t.Errorf("golden has no %q tokenizer", name)
			continue
		}
		if len(rec.Strings) < 40 {
			t.Errorf("%s: golden holds %d strings, want at least 40", name, len(rec.Strings))
		}
		t.Run(name, func(t *testing.T) {
			if v, ok := rec.Info["vocab_size"].(float64); ok && int(v) != tok.VocabSize() {
				t.Errorf("VocabSize %d, want %v", tok.VocabSize(), v)
			}
			for _, e := range rec.Strings {
				checkFluxGolden(t, tok, e)
			}
		})
	}
}

func checkFluxGolden(t *testing.T, tok *Tokenizer, e fluxGoldenString) {
	t.Helper()
	ids := tok.Encode(e.Text)
	if !slices.Equal(ids, e.IDs) {
		t.Errorf("Encode(%q)\n got %v\nwant %v", e.Text, ids, e.IDs)
	}
	special, err := tok.EncodeWithSpecialTokens(e.Text)
	if err != nil || !slices.Equal(special, e.IDsSpecial) {
		t.Errorf("EncodeWithSpecialTokens(%q)\n got %v (%v)\nwant %v", e.Text, special, err, e.IDsSpecial)
	}
	if e.Tokens != nil {
		toks := make([]string, len(ids))
		for i, id := range ids {
			toks[i], _ = tok.TokenString(id)
		}
		if !slices.Equal(toks, e.Tokens) {
			t.Errorf("tokens of %q\n got %q\nwant %q", e.Text, toks, e.Tokens)
		}
	}
	if e.Normalized != nil && tok.normalizer != nil {
		if n := tok.normalizer.normalize(e.Text); n != *e.Normalized {
			t.Errorf("normalized %q\n got %q\nwant %q", e.Text, n, *e.Normalized)
		}
	}
	for ns, want := range e.Padded {
		n, err := strconv.Atoi(ns)
		if err != nil {
			t.Fatalf("padded length %q: %v", ns, err)
		}
		got, mask, err := tok.EncodePadded(e.Text, n)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("EncodePadded(%q, %d)\n got %v (%v)\nwant %v", e.Text, n, got, err, want)
		}
		if wm := e.Mask[ns]; !slices.Equal(mask, wm) {
			t.Errorf("EncodePadded(%q, %d) mask\n got %v\nwant %v", e.Text, n, mask, wm)
		}
	}
	if e.Decoded != nil {
		if got := tok.Decode(e.IDsSpecial); got != *e.Decoded {
			t.Errorf("Decode(ids of %q) = %q, want %q", e.Text, got, *e.Decoded)
		}
	}
	if e.DecodedSkip != nil {
		if got := tok.DecodeSkipSpecial(e.IDsSpecial); got != *e.DecodedSkip {
			t.Errorf("DecodeSkipSpecial(ids of %q) = %q, want %q", e.Text, got, *e.DecodedSkip)
		}
	}
}
