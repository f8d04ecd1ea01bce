package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// TestBundleBuildLayout: the case end to end: a Z-Image pipeline whose text encoder is
// stored with Qwen3ForCausalLM's names (model.embed_tokens.weight ..., and its lm_head),
// sharded into 3 files with an index, builds with qual bundle build into a bundle that opens
// (the command reopens what it wrote), holding the names the family reads.
func TestBundleBuildLayout(t *testing.T) {
	cache := fixtures.DefaultCacheDir()
	snap, rev, err := fixtures.Ensure(cache, fixtures.ZImageTiny)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	enc := "text_encoder/model.safetensors"
	err = fixtures.RewriteCheckpoint(snap, dir, fixtures.Relayout{
		Rename: func(file, n string) string {
			if file == enc {
				return "model." + n
			}
			return n
		},
		Add:    map[string]map[string]string{enc: {"lm_head.weight": "embed_tokens.weight"}},
		Shards: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "text_encoder", "model.safetensors.index.json")); err != nil {
		t.Fatalf("the copy is not sharded: %v", err)
	}
	out := filepath.Join(t.TempDir(), "z.mqb")
	code, stdout, errs := bundleTestRun(bundleTestBundle, "build", "--checkpoint", dir, "--model", fixtures.ModelID(fixtures.ZImageTiny), "--revision", rev, "--out", out)
	if code != 0 {
		t.Fatalf("bundle build: %d %s", code, errs)
	}
	var res struct {
		Family  string   `json:"family"`
		Renamed []string `json:"renamed_tensors"`
		Skipped []string `json:"skipped_tensors"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Family != "zimage" || len(res.Renamed) != 1 || !strings.HasPrefix(res.Renamed[0], `"text_encoder.model." -> "text_encoder."`) ||
		len(res.Skipped) != 1 || !strings.HasPrefix(res.Skipped[0], "text_encoder.lm_head.weight (dropped") {
		t.Fatalf("bundle build output: %s", stdout)
	}
}

// TestBundleBuildLayoutErrors: a checkpoint missing one tensor, or holding one of another
// shape, fails qual bundle build naming the tensor, the expected and found shapes and the
// files searched, and leaves no bundle.
func TestBundleBuildLayoutErrors(t *testing.T) {
	cache := fixtures.DefaultCacheDir()
	snap, rev, err := fixtures.Ensure(cache, fixtures.GPT2Tiny)
	if err != nil {
		t.Fatal(err)
	}
	drop := func(name string) func(string, string) string {
		return func(_, n string) string {
			if n == name {
				return ""
			}
			return n
		}
	}
	for _, c := range []struct {
		name string
		l    fixtures.Relayout
		want []string
	}{
		{"missing", fixtures.Relayout{Rename: drop("h.1.mlp.c_fc.weight"), Shards: 3}, []string{
			`tensor "h.1.mlp.c_fc.weight": expected shape [64 256] (from config.json), found none (also looked for "transformer.h.1.mlp.c_fc.weight")`,
			"searched model-00001-of-00003.safetensors, model-00002-of-00003.safetensors, model-00003-of-00003.safetensors",
		}},
		{"wrong shape", fixtures.Relayout{Rename: drop("ln_f.bias"), Add: map[string]map[string]string{"model.safetensors": {"ln_f.bias": "h.0.attn.c_attn.bias"}}}, []string{
			`tensor "ln_f.bias": expected shape [64] (from config.json), found [192] as "ln_f.bias" in model.safetensors`,
			"searched model.safetensors",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			if err := fixtures.RewriteCheckpoint(snap, dir, c.l); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "g.mqb")
			code, _, errs := bundleTestRun(bundleTestBundle, "build", "--checkpoint", dir, "--model", fixtures.ModelID(fixtures.GPT2Tiny), "--revision", rev, "--out", out)
			if code != 1 {
				t.Fatalf("bundle build exit %d, want 1: %s", code, errs)
			}
			for _, w := range append(c.want, "family gpt2", "qual bundle build: bundle: checkpoint "+dir) {
				if !strings.Contains(errs, w) {
					t.Errorf("the error lacks %q:\n%s", w, errs)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("a bundle was written")
			}
		})
	}
}
