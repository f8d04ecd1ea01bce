package bundle

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// FuzzSafetensorsIndex feeds arbitrary bytes to the index parser: it must never panic, an error
// must say it is the index's, and an index it accepts must only name *.safetensors files of the
// checkpoint's own directory, each once, sorted. The seed corpus is testdata/fuzz/FuzzSafetensorsIndex.
func FuzzSafetensorsIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		wm, shards, err := parseSafetensorsIndex(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "the safetensors index ") {
				t.Fatalf("error does not say it is the index's: %v", err)
			}
			return
		}
		if len(wm) == 0 || len(shards) == 0 || !slices.IsSorted(shards) || len(slices.Compact(slices.Clone(shards))) != len(shards) {
			t.Fatalf("accepted an index with weight map %v and shards %v", wm, shards)
		}
		for _, s := range shards {
			if s != filepath.Base(s) || strings.ContainsAny(s, `/\`) || !strings.HasSuffix(s, ".safetensors") {
				t.Fatalf("accepted shard %q", s)
			}
		}
		for name, s := range wm {
			if _, found := slices.BinarySearch(shards, s); !found {
				t.Fatalf("tensor %q is in shard %q, missing from the shard list %v", name, s, shards)
			}
		}
	})
}

func TestMatchPattern(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"lm_head.weight", "lm_head.weight", true},
		{"lm_head.weight", "lm_head.weight2", false},
		{"vae.encoder.*", "vae.encoder.conv_in.weight", true},
		{"vae.encoder.*", "vae.decoder.conv_in.weight", false},
		{"*.attn.bias", "h.0.attn.bias", true},
		{"*.attn.bias", "h.0.attn.bias.x", false},
		{"h.*.attn.*", "h.11.attn.masked_bias", true},
		{"a*b*a", "aba", true},
		{"a*b*a", "ab", false},
		{"*", "", true},
	} {
		if got := matchPattern(c.pattern, c.name); got != c.want {
			t.Errorf("matchPattern(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

// layoutResolve is testResolve with a layout: tinyGPT2Config's tensors under the hub's names,
// "transformer." accepted, lm_head dropped, causal-mask buffers carried.
func layoutResolve(t testing.TB) Resolver {
	var shapes []LayoutTensor
	for _, e := range gpt2Entries(t, nil) {
		shapes = append(shapes, LayoutTensor{Name: e.name, Shape: e.shape})
	}
	return func(arch string, config json.RawMessage) (Family, error) {
		f, err := testResolve(arch, config)
		f.Layout = &Layout{Tensors: shapes, Renames: []LayoutRename{{"transformer.", ""}}, Carried: []string{"*.attn.bias"}, Dropped: []string{"lm_head.weight"}}
		return f, err
	}
}

// TestBuildAppliesTheLayout: prefixed names are renamed (and recorded), a dropped tensor is
// left out (and recorded), a carried one kept, and the bundle's tensors are the layout's.
func TestBuildAppliesTheLayout(t *testing.T) {
	dir := t.TempDir()
	var entries []stEntry
	for _, e := range gpt2Entries(t, nil) {
		e.name = "transformer." + e.name
		entries = append(entries, e)
	}
	entries = append(entries, f32Tensor("lm_head.weight", 3, 6, 4), f32Tensor("transformer.h.0.attn.bias", 0, 1, 1, 8, 8))
	writeCheckpoint(t, filepath.Join(dir, "ckpt"), tinyGPT2Config, entries)
	out := filepath.Join(dir, "b.mqb")
	h, err := Build(context.Background(), BuildOptions{CheckpointDir: filepath.Join(dir, "ckpt"), Model: "test/tiny", Revision: testRev, Out: out, Resolve: layoutResolve(t)})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range h.Tensors {
		names = append(names, x.Name)
	}
	want := []string{"h.0.attn.bias"}
	for _, e := range gpt2Entries(t, nil) {
		want = append(want, e.name)
	}
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("tensors %v, want %v", names, want)
	}
	if p := h.Provenance; !slices.Equal(p.RenamedTensors, []string{`"transformer." -> "" (17 tensors)`}) ||
		!slices.Equal(p.SkippedTensors, []string{"lm_head.weight (dropped: family gpt2 does not load it)"}) {
		t.Errorf("provenance renamed %q, skipped %q", p.RenamedTensors, p.SkippedTensors)
	}
}

// TestBuildRefusesAnIndexThatMisleads: an index naming the wrong shard for a tensor, or a shard
// that does not hold one, is refused naming the tensor and the shard.
func TestBuildRefusesAnIndexThatMisleads(t *testing.T) {
	for _, c := range []struct {
		name string
		wm   map[string]string
		want string
	}{
		{"wrong shard", map[string]string{"wte.weight": "b.safetensors", "wpe.weight": "a.safetensors"}, `shard a.safetensors holds tensor "wte.weight", which the safetensors index puts in "b.safetensors"`},
		{"absent", map[string]string{"wte.weight": "a.safetensors", "wpe.weight": "b.safetensors", "ln_f.gamma": "b.safetensors"}, `the safetensors index puts tensor "ln_f.gamma" in shard b.safetensors, which does not hold it`},
		{"outside", map[string]string{"wte.weight": "../a.safetensors"}, `shard "../a.safetensors", outside the directory`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			entries := gpt2Entries(t, nil)
			writeCheckpoint(t, dir, tinyGPT2Config, nil)
			writeST(t, filepath.Join(dir, "a.safetensors"), entries[:1])
			writeST(t, filepath.Join(dir, "b.safetensors"), entries[1:])
			idx, _ := json.Marshal(map[string]any{"weight_map": c.wm})
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "test/tiny", Revision: testRev, Out: filepath.Join(t.TempDir(), "b.mqb"), Resolve: testResolve})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}
