package native

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

// TestRegistryListsTheFamilies: every native/models/<family>.cc registered itself, with its
// task and architectures, and BundleFamily answers for a registered architecture only.
func TestRegistryListsTheFamilies(t *testing.T) {
	want := map[string]string{"gpt2": "GPT2LMHeadModel", "qwen3": "Qwen3ForCausalLM", "mock": "MockForCausalLM"}
	got := map[string]FamilyInfo{}
	for _, f := range Families() {
		got[f.Name] = f
	}
	for name, arch := range want {
		f, ok := got[name]
		if !ok || f.Task != "text" || !slices.Contains(f.Architectures, arch) {
			t.Errorf("family %s: %+v (registered: %v)", name, f, Families())
		}
	}
	cfg := json.RawMessage(`{"architectures":["Qwen3ForCausalLM"],"vocab_size":10,"hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,"intermediate_size":16,"max_position_embeddings":77}`)
	fam, err := BundleFamily("Qwen3ForCausalLM", cfg)
	if err != nil || fam.Name != "qwen3" || fam.Task != "text" || fam.MaxPositions != 77 {
		t.Fatalf("BundleFamily(Qwen3ForCausalLM) = %+v, %v", fam, err)
	}
	if _, err := BundleFamily("FalconForCausalLM", cfg); err == nil || !strings.Contains(err.Error(), `"FalconForCausalLM" has no native family`) || !strings.Contains(err.Error(), "Qwen3ForCausalLM") {
		t.Fatalf("unknown architecture: %v", err)
	}
}

// TestResolveNamesTheConfigKey: a family's resolve step fills transformers' defaults and refuses
// what the model does not implement, naming the config key.
func TestResolveNamesTheConfigKey(t *testing.T) {
	base := map[string]any{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
		"intermediate_size": 16, "max_position_embeddings": 77}
	with := func(k string, v any) json.RawMessage {
		c := map[string]any{}
		for a, b := range base {
			c[a] = b
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		return b
	}
	hp, err := Resolve("qwen3", with("x", 1))
	if err != nil {
		t.Fatal(err)
	}
	// Defaults: kv heads = heads, head_dim = hidden / heads, rms eps 1e-6, theta 10000, untied.
	for k, v := range map[string]float64{"num_kv_heads": 2, "head_dim": 4, "norm_eps": 1e-6, "rope_theta": 10000, "tie_word_embeddings": 0} {
		if hp[k] != v {
			t.Errorf("resolved %s = %v, want %v", k, hp[k], v)
		}
	}
	if hp, _ := Resolve("qwen3", with("rope_parameters", map[string]any{"rope_theta": 1e6, "rope_type": "default"})); hp["rope_theta"] != 1e6 {
		t.Errorf("rope_parameters.rope_theta not read: %v", hp["rope_theta"])
	}
	for _, c := range []struct {
		cfg  json.RawMessage
		want string
	}{
		{with("hidden_size", nil), "config.json: hidden_size is missing"},
		{with("hidden_size", "8"), "config.json: hidden_size must be a number"},
		{with("num_hidden_layers", 1.5), "config.json: num_hidden_layers must be an integer"},
		{with("num_key_value_heads", 3), "num_attention_heads 2 is not a multiple of num_key_value_heads 3"},
		{with("rope_scaling", map[string]any{"rope_type": "yarn", "factor": 4}), `rope type "yarn" is not supported`},
		{with("hidden_act", "gelu"), `hidden_act "gelu" is not supported`},
		{with("use_sliding_window", true), "use_sliding_window true is not supported"},
	} {
		if _, err := Resolve("qwen3", c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Resolve(%s) = %v, want an error with %q", c.cfg, err, c.want)
		}
	}
	if _, err := Resolve("falcon", with("x", 1)); err == nil || !strings.Contains(err.Error(), `family "falcon" has no native model; known:`) {
		t.Errorf("unknown family: %v", err)
	}
}

// TestFlattenConfig: nested objects become dotted keys; lists of numbers and of strings keep
// their elements; null stays null.
func TestFlattenConfig(t *testing.T) {
	kvs, err := flattenConfig(json.RawMessage(`{"a":1,"b":{"c":true,"d":{"e":"x"}},"l":[1,2.5],"s":["p","q"],"n":null,"m":[{"x":1}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]kv{}
	for _, v := range kvs {
		got[v.key] = v
	}
	if got["a"].kind != kvNumber || got["a"].number != 1 || got["b.c"].kind != kvBool || got["b.c"].number != 1 ||
		got["b.d.e"].str != "x" || !slices.Equal(got["l"].numbers, []float64{1, 2.5}) || !slices.Equal(got["s"].strs, []string{"p", "q"}) ||
		got["n"].kind != kvNull {
		t.Fatalf("flattened: %+v", kvs)
	}
	if _, ok := got["m"]; ok {
		t.Errorf("a list of objects was kept: %+v", got["m"])
	}
	if _, err := flattenConfig(json.RawMessage(`[1]`)); err == nil {
		t.Error("a JSON array was accepted as config.json")
	}
}

// copyCheckpoint copies a fixture snapshot into a fresh directory (hub snapshots are shared).
func copyCheckpoint(t *testing.T, name string) (dir, rev string) {
	t.Helper()
	snap, rev, err := fixtures.Ensure(fixtures.DefaultCacheDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	entries, _ := os.ReadDir(snap)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(snap, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, rev
}

// TestOpenRefusesTensorsThatDoNotFit: a checkpoint whose tensors do not fit its config is
// refused twice over, each time naming the tensor: by the build (the family's layout check,
// so such a checkpoint never becomes a bundle), and, for a bundle made without that check
// (an older builder, a hand-made file), by the family's model at open, so it never serves.
func TestOpenRefusesTensorsThatDoNotFit(t *testing.T) {
	good := testBundle(t, fixtures.GPT2Tiny)
	// unchecked resolves the family as BundleFamily does but without its layout: the bundle a
	// builder that predates the check would write.
	unchecked := func(arch string, config json.RawMessage) (bundle.Family, error) {
		f, err := BundleFamily(arch, config)
		f.Layout = nil
		return f, err
	}
	for _, c := range []struct {
		name      string
		edit      func(cfg map[string]any)
		want      string // from Open
		wantBuild string // from Build with the layout check
	}{
		{"misshaped", func(cfg map[string]any) { cfg["n_positions"] = 2048 }, "tensor wpe.weight has shape [1024,64], config.json implies [2048,64]",
			`tensor "wpe.weight": expected shape [2048 64] (from config.json), found [1024 64]`},
		{"missing layer", func(cfg map[string]any) { cfg["n_layer"] = 3 }, "tensor h.2.ln_1.weight is missing",
			`tensor "h.2.ln_1.weight": expected shape [64] (from config.json), found none`},
		{"foreign tensors", func(cfg map[string]any) { cfg["n_layer"] = 1 }, "tensor h.1.",
			`family gpt2 reads it under no name it accepts`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, rev := copyCheckpoint(t, fixtures.GPT2Tiny)
			var cfg map[string]any
			json.Unmarshal(good.Header().Config, &cfg)
			c.edit(cfg)
			b, _ := json.Marshal(cfg)
			os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
			out := filepath.Join(t.TempDir(), "x.mqb")
			_, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: "t/x", Revision: rev, Out: out, Resolve: BundleFamily, MaxContext: 64})
			if err == nil || !strings.Contains(err.Error(), c.wantBuild) {
				t.Fatalf("build with the layout check: error %v, want one naming %q", err, c.wantBuild)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("the refused build left %s behind", out)
			}
			if _, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: "t/x", Revision: rev, Out: out, Resolve: unchecked, MaxContext: 64}); err != nil {
				t.Fatal(err)
			}
			bu, err := bundle.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer bu.Close()
			e, err := Open(bu, Params{Threads: 1})
			if err == nil {
				e.Close()
				t.Fatal("Open served a bundle whose tensors do not fit its config")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q lacks %q", err, c.want)
			}
		})
	}
}

// TestHalfPrecisionBundlesOnCPU: a bf16 or fp16 bundle stores half the bytes; the CPU engine
// converts its tensors to fp32 at open and computes what the same checkpoint rounded to that
// precision computes: its logits equal the reference's on the rounded weights to float32
// rounding, and differ from the fp32 bundle's by about the rounding (a defect that skipped the
// conversion would read garbage).
func TestHalfPrecisionBundlesOnCPU(t *testing.T) {
	full := testBundle(t, fixtures.Qwen3Tiny)
	ids := []int32{9707, 11, 1879, 0, 151644}
	ef := openEngine(t, fixtures.Qwen3Tiny, Params{Threads: 2, MaxBatch: 1, MaxContext: 64})
	lf, err := ef.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, prec := range []string{"bf16", "fp16"} {
		out := filepath.Join(t.TempDir(), prec+".mqb")
		if _, err := fixtures.BuildBundle(context.Background(), fixtures.DefaultCacheDir(), fixtures.Qwen3Tiny, bundle.BuildOptions{Out: out, Precision: prec, MaxContext: 64}); err != nil {
			t.Fatal(err)
		}
		b, err := bundle.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if h, f := b.Header().TensorData.Size, full.Header().TensorData.Size; float64(h) > 0.51*float64(f) {
			t.Errorf("%s tensors take %d bytes, the fp32 ones %d: not stored at half precision", prec, h, f)
		}
		e, err := Open(b, Params{Threads: 2, MaxBatch: 1, MaxContext: 64})
		if err != nil {
			t.Fatal(err)
		}
		lh, err := e.Logits(ids)
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
		b.Close()
		var maxd, maxl float64
		for i := range lh {
			maxd = math.Max(maxd, math.Abs(float64(lh[i]-lf[i])))
			maxl = math.Max(maxl, math.Abs(float64(lf[i])))
		}
		// Weights rounded to 8 (bf16) or 11 (fp16) significant bits move the logits (up to
		// ~12 on the retuned qwen3-tiny) by about 1 % (bf16: 0.15 measured) or 0.15 % (fp16:
		// 0.017) of their largest magnitude; a bundle read as the wrong dtype moves them by far
		// more or gives NaN.
		bound := map[string]float64{"bf16": 0.03, "fp16": 0.004}[prec] * maxl
		if !(maxd > 0 && maxd < bound) {
			t.Errorf("%s: max |logit - fp32 logit| = %g, want rounding-sized (0, %.3g) with logits up to %.3g", prec, maxd, bound, maxl)
		}
	}
}
