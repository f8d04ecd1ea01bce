package bundle

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBuildOpenRoundTrip(t *testing.T) {
	path, _ := buildTiny(t)
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := b.Header()
	if h.Family != "gpt2" || h.Architecture != "GPT2LMHeadModel" || h.Provenance.Revision != testRev || h.Provenance.CheckpointID != "test/tiny" {
		t.Fatalf("header identity = %s %s %s %s", h.Family, h.Architecture, h.Provenance.Revision, h.Provenance.CheckpointID)
	}
	// n_positions 8 < the default cap: the default max context is the config's.
	if bs := h.Provenance.Build; bs.MaxContext != 8 || bs.MaxBatch != DefaultMaxBatch || bs.Precision != "fp32" || bs.Backend != "cpu" {
		t.Fatalf("build settings = %+v", bs)
	}
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} {
		if len(h.Provenance.Files[f]) != 64 {
			t.Errorf("provenance.files lacks a sha256 of %s: %v", f, h.Provenance.Files)
		}
	}
	// Values survive: wte.weight was written as i/100 + its index in RequiredTensors (0).
	info, w, err := b.Float32s("wte.weight")
	if err != nil {
		t.Fatal(err)
	}
	if info.Offset%Alignment != 0 || len(w) != 6*4 || w[0] != 0 || w[7] != 0.07 {
		t.Fatalf("wte.weight = %+v %v", info, w[:8])
	}
	sec, err := b.Section(SectionGenerationConfig)
	if err != nil || string(sec) != `{"bos_token_id":5,"eos_token_id":5}` {
		t.Fatalf("generation_config section = %q, %v", sec, err)
	}
	if _, _, err := b.Tensor("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("missing tensor error = %v", err)
	}
	if len(b.Digest()) != 64 || len(b.Data()) == 0 || b.Path() != path {
		t.Fatal("Digest/Data/Path not set")
	}
	if h.Provenance.Build.StorageDType != "F32" || h.Task != "text" {
		t.Fatalf("storage dtype %q, task %q", h.Provenance.Build.StorageDType, h.Task)
	}
}

func TestBuildIsStableApartFromBuildTime(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, tinyGPT2Config, gpt2Entries(t, tinyGPT2Config))
	var sums []string
	for i := range 2 {
		out := filepath.Join(dir, "b"+string(rune('0'+i))+".mqb")
		h, err := Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve})
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, strings.Join(h.Data.Chunks, ","))
	}
	if sums[0] != sums[1] {
		t.Fatalf("data differs between identical builds: %v", sums)
	}
}

func TestBuildConvertsHalfPrecisionAndShards(t *testing.T) {
	dir := t.TempDir()
	entries := gpt2Entries(t, tinyGPT2Config)
	// Store wte.weight as BF16 and wpe.weight as F16 with known values; HF names with the
	// "transformer." prefix and a causal-mask buffer, split over two shards with an index.
	for i := range entries {
		switch entries[i].name {
		case "wte.weight":
			var d []byte
			for j := range 24 {
				d = binary.LittleEndian.AppendUint16(d, uint16(math.Float32bits(float32(j)-3.5)>>16))
			}
			entries[i] = stEntry{"wte.weight", "BF16", []int64{6, 4}, d}
		case "wpe.weight":
			var d []byte
			for range 32 {
				d = binary.LittleEndian.AppendUint16(d, 0x3c00) // 1.0
			}
			binary.LittleEndian.PutUint16(d[:2], 0xc000) // -2.0
			entries[i] = stEntry{"wpe.weight", "F16", []int64{8, 4}, d}
		}
		entries[i].name = "transformer." + entries[i].name
	}
	entries = append(entries, stEntry{"transformer.h.0.attn.masked_bias", "U8", []int64{1}, []byte{1}})
	writeCheckpoint(t, dir, tinyGPT2Config, nil)
	half := len(entries) / 2
	writeST(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), entries[:half])
	writeST(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), entries[half:])
	wm := map[string]string{}
	for i, e := range entries {
		wm[e.name] = map[bool]string{true: "model-00001-of-00002.safetensors", false: "model-00002-of-00002.safetensors"}[i < half]
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
	out := filepath.Join(dir, "x.mqb")
	if _, err := Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve}); err != nil {
		t.Fatal(err)
	}
	b := must(Open(out))
	defer b.Close()
	_, wte, _ := b.Float32s("transformer.wte.weight")
	_, wpe, _ := b.Float32s("transformer.wpe.weight")
	if wte[0] != -3.5 || wte[23] != 19.5 || wpe[0] != -2 || wpe[1] != 1 {
		t.Fatalf("converted values: wte %v wpe %v", wte[:2], wpe[:2])
	}
	// Names stay the checkpoint's (the family reads them); a non-float buffer is left out and
	// said so.
	if _, ok := b.Header().Tensor("transformer.wte.weight"); !ok {
		t.Fatal("tensor names were changed")
	}
	if _, ok := b.Header().Tensor("transformer.h.0.attn.masked_bias"); ok || !slices.Equal(b.Header().Provenance.SkippedTensors, []string{"transformer.h.0.attn.masked_bias (U8)"}) {
		t.Fatalf("a U8 buffer was kept or not recorded: %v", b.Header().Provenance.SkippedTensors)
	}
	files := b.Header().Provenance.Files
	if files["model-00002-of-00002.safetensors"] == "" || files["model.safetensors.index.json"] == "" {
		t.Fatalf("shards missing from provenance: %v", sortedKeys(files))
	}
}

// TestConcurrentBuildsOfOneOutput: parallel test processes may build the same cached bundle at
// once; each writes its own temporary file, so the result is always a complete bundle.
func TestConcurrentBuildsOfOneOutput(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, tinyGPT2Config, gpt2Entries(t, tinyGPT2Config))
	out := filepath.Join(dir, "same.mqb")
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if left, _ := filepath.Glob(out + ".tmp-*"); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestF16Conversion(t *testing.T) {
	for _, c := range []struct {
		h    uint16
		want float32
	}{{0x0000, 0}, {0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 1.0 / (1 << 24)}, {0x3555, 0.333251953125}} {
		if got := f16ToF32(c.h); got != c.want {
			t.Errorf("f16ToF32(%#04x) = %v, want %v", c.h, got, c.want)
		}
	}
	if !math.IsInf(float64(f16ToF32(0x7c00)), 1) || !math.IsNaN(float64(f16ToF32(0x7e00))) {
		t.Error("inf/NaN not preserved")
	}
}

func TestBuildRejectsBadCheckpoints(t *testing.T) {
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for a, b := range tinyGPT2Config {
			c[a] = b
		}
		c[k] = v
		return c
	}
	cases := []struct {
		name    string
		config  map[string]any
		entries func([]stEntry) []stEntry
		opts    func(*BuildOptions)
		want    []string
	}{
		{name: "unknown architecture", config: with("architectures", []string{"LlamaForCausalLM"}),
			want: []string{`architecture "LlamaForCausalLM" has no native family`}},
		{name: "two architectures", config: with("architectures", []string{"GPT2LMHeadModel", "X"}),
			want: []string{`config.architectures is ["GPT2LMHeadModel" "X"], want exactly one architecture`}},
		{name: "no resolver", opts: func(o *BuildOptions) { o.Resolve = nil }, want: []string{"BuildOptions.Resolve is nil"}},
		{name: "branch revision", opts: func(o *BuildOptions) { o.Revision = "main" },
			want: []string{`bundle: checkpoint revision "main" is not immutable; pass a 40-hex commit`}},
		{name: "no revision", opts: func(o *BuildOptions) { o.Revision = "" }, want: []string{"pass --revision"}},
		{name: "bad model id", opts: func(o *BuildOptions) { o.Model = "gpt2" }, want: []string{`model "gpt2" is not of the form ORG/NAME`}},
		{name: "unknown precision", opts: func(o *BuildOptions) { o.Precision = "int4" }, want: []string{`precision "int4" is not one of fp32, bf16, fp16`}},
		{name: "context too long", opts: func(o *BuildOptions) { o.MaxContext = 9 }, want: []string{"--max-context 9 exceeds the position limit 8"}},
		{name: "two sources", opts: func(o *BuildOptions) { o.Mock = true }, want: []string{"exactly one of"}},
		{name: "bad tensor size", entries: func(e []stEntry) []stEntry {
			e[0] = stEntry{e[0].name, "F32", []int64{4}, make([]byte, 12)}
			return e
		}, want: []string{`tensor "wte.weight": 12 bytes for shape [4] of F32 (want 16)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := c.config
			if cfg == nil {
				cfg = tinyGPT2Config
			}
			e := gpt2Entries(t, tinyGPT2Config)
			if c.entries != nil {
				e = c.entries(e)
			}
			writeCheckpoint(t, dir, cfg, e)
			o := BuildOptions{CheckpointDir: dir, Model: "a/b", Revision: testRev, Out: filepath.Join(dir, "o.mqb"), Resolve: testResolve}
			if c.opts != nil {
				c.opts(&o)
			}
			_, err := Build(context.Background(), o)
			if err == nil {
				t.Fatal("Build succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if left, _ := filepath.Glob(o.Out + "*"); len(left) != 0 {
				t.Errorf("a failed build left files behind: %v", left)
			}
		})
	}
}

func TestResolveHubCache(t *testing.T) {
	cache := t.TempDir()
	md := filepath.Join(cache, "hub", "models--org--m")
	snap := filepath.Join(md, "snapshots", testRev)
	writeCheckpoint(t, snap, tinyGPT2Config, gpt2Entries(t, tinyGPT2Config))
	os.MkdirAll(filepath.Join(md, "refs"), 0o755)
	os.WriteFile(filepath.Join(md, "refs", "main"), []byte(testRev), 0o644)

	for _, dir := range []string{cache, filepath.Join(cache, "hub")} {
		s, rev, err := ResolveHubCache(dir, "org/m", "")
		if err != nil || s != snap || rev != testRev {
			t.Fatalf("ResolveHubCache(%s) = %s %s %v", dir, s, rev, err)
		}
	}
	if _, _, err := ResolveHubCache(cache, "org/m", "main"); err == nil || err.Error() != `bundle: checkpoint revision "main" is not immutable; pass a 40-hex commit` {
		t.Fatalf("branch revision: %v", err)
	}
	if _, _, err := ResolveHubCache(cache, "org/m", strings.Repeat("a", 40)); err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Fatalf("unknown revision: %v", err)
	}
	if _, _, err := ResolveHubCache(cache, "org/other", ""); err == nil || !strings.Contains(err.Error(), "models--org--other") {
		t.Fatalf("unknown model: %v", err)
	}
	// Build through the hub cache resolves refs/main; a checkpoint dir inside snapshots/ names
	// its own revision.
	out := filepath.Join(cache, "a.mqb")
	h, err := Build(context.Background(), BuildOptions{HubCache: cache, Model: "org/m", Out: out, Resolve: testResolve})
	if err != nil || h.Provenance.Revision != testRev {
		t.Fatalf("hub-cache build: %v", err)
	}
	h, err = Build(context.Background(), BuildOptions{CheckpointDir: snap, Out: out, Resolve: testResolve})
	if err != nil || h.Provenance.Revision != testRev || h.Provenance.CheckpointID != "org/m" {
		t.Fatalf("snapshot-dir build: %v", err)
	}
}

func TestMockBundle(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, tinyGPT2Config, nil)
	out := filepath.Join(dir, "mock.mqb")
	_, err := Build(context.Background(), BuildOptions{Mock: true, MockStepDelay: 3 * time.Millisecond, MockVocab: 100, TokenizerDir: dir, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	b := must(Open(out))
	defer b.Close()
	h := b.Header()
	var cfg struct {
		Vocab int   `json:"vocab_size"`
		Delay int64 `json:"step_delay_ns"`
		Ctx   int   `json:"max_position_embeddings"`
		EOS   int   `json:"eos_token_id"`
	}
	json.Unmarshal(h.Config, &cfg)
	if h.Family != "mock" || cfg.Vocab != 100 || cfg.Delay != 3e6 || cfg.Ctx != MaxDefaultContext || cfg.EOS != -1 || len(h.Tensors) != 0 {
		t.Fatalf("mock header: %s %+v", h.Family, cfg)
	}
	if d, _ := h.MockStepDelay(); d != 3*time.Millisecond {
		t.Fatalf("MockStepDelay = %v", d)
	}
	tok, _ := b.Section(SectionTokenizer)
	if !strings.Contains(string(tok), "BPE") {
		t.Fatalf("mock lacks the tokenizer section: %q", tok)
	}
	if _, err := Build(context.Background(), BuildOptions{Mock: true, Out: out}); err == nil || !strings.Contains(err.Error(), "TokenizerDir") {
		t.Fatalf("mock without tokenizer: %v", err)
	}
}

func TestHeaderCheck(t *testing.T) {
	path, _ := buildTiny(t)
	b := must(Open(path))
	defer b.Close()
	h := b.Header()
	ok := Expect{Family: "gpt2", CheckpointID: "test/tiny", Revision: testRev, Precision: "fp32", Backend: "cpu", MaxContext: 8}
	if err := h.Check(ok); err != nil {
		t.Fatal(err)
	}
	if err := h.Check(Expect{}); err != nil {
		t.Fatalf("empty expectation: %v", err)
	}
	cases := []struct {
		mut   func(*Expect)
		field string
	}{
		{func(e *Expect) { e.Family = "qwen3" }, "family"},
		{func(e *Expect) { e.CheckpointID = "test/other" }, "provenance.checkpoint_id"},
		{func(e *Expect) { e.Revision = strings.Repeat("b", 40) }, "provenance.revision"},
		{func(e *Expect) { e.Precision = "bf16" }, "provenance.build.precision"},
		{func(e *Expect) { e.Backend = "cuda" }, "provenance.build.backend"},
		{func(e *Expect) { e.MaxContext = 4096 }, "provenance.build.max_context"},
		// Two mismatches: the first in Check's order is named.
		{func(e *Expect) { e.MaxContext = 1; e.Revision = strings.Repeat("c", 40) }, "provenance.revision"},
	}
	for _, c := range cases {
		e := ok
		c.mut(&e)
		err := h.Check(e)
		var m *MismatchError
		if !errors.As(err, &m) || m.Field != c.field || !strings.Contains(err.Error(), path) {
			t.Errorf("Check(%+v) = %v, want a mismatch naming %s and the file", e, err, c.field)
		}
	}
}

func BenchmarkOpenGPT2Tiny(b *testing.B) {
	path, _ := buildTiny(b)
	for b.Loop() {
		bu, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		bu.Close()
	}
}

// TestBuildStoresAtPrecision: a bf16 or fp16 build stores every tensor at that dtype, rounded
// to nearest even from the checkpoint's fp32 (as torch's .to does), and the runtime's
// expectation (storage_dtype) says so.
func TestBuildStoresAtPrecision(t *testing.T) {
	dir := t.TempDir()
	entries := gpt2Entries(t, tinyGPT2Config)
	// wte.weight: values chosen to round up, down and to even in both half formats.
	vals := []float32{1, -2.5, 1 + 1.0/256 + 1.0/65536, 1 + 1.0/512, 65520, 1e-8, 3.14159265, 0}
	var d []byte
	for i := range 24 {
		d = binary.LittleEndian.AppendUint32(d, math.Float32bits(vals[i%len(vals)]))
	}
	entries[0] = stEntry{"wte.weight", "F32", []int64{6, 4}, d}
	writeCheckpoint(t, dir, tinyGPT2Config, entries)
	for _, c := range []struct {
		precision, dtype string
		want             []uint16 // the first len(vals) elements
	}{
		// bf16 keeps 8 significant bits: 1+2^-8+2^-16 rounds up to 1+2^-7; 1+2^-9 is a tie to
		// even (1); 65520 rounds up to 65536.
		{"bf16", "BF16", []uint16{0x3f80, 0xc020, 0x3f81, 0x3f80, 0x4780, 0x322c, 0x4049, 0x0000}},
		// fp16 keeps 11: 1+2^-8+2^-16 rounds down to 1+2^-8; 1+2^-9 is exact; 65520 is the tie
		// between 65504 and infinity, to even: infinity; 1e-8 underflows to 0.
		{"fp16", "F16", []uint16{0x3c00, 0xc100, 0x3c04, 0x3c02, 0x7c00, 0x0000, 0x4248, 0x0000}},
	} {
		out := filepath.Join(dir, c.precision+".mqb")
		if _, err := Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "a/b", Revision: testRev, Out: out,
			Precision: c.precision, Backend: "cuda", Resolve: testResolve}); err != nil {
			t.Fatal(err)
		}
		b := must(Open(out))
		ti, raw, err := b.Tensor("wte.weight")
		if err != nil || ti.DType != c.dtype || ti.Size != 6*4*2 || b.Header().Provenance.Build.StorageDType != c.dtype {
			t.Fatalf("%s: wte.weight %+v, storage %q, %v", c.precision, ti, b.Header().Provenance.Build.StorageDType, err)
		}
		for i, w := range c.want {
			if got := binary.LittleEndian.Uint16(raw[2*i:]); got != w {
				t.Errorf("%s: element %d (%g) stored as %#04x, want %#04x", c.precision, i, vals[i], got, w)
			}
		}
		if _, _, err := b.Float32s("wte.weight"); err == nil {
			t.Errorf("%s: Float32s of a %s tensor succeeded", c.precision, c.dtype)
		}
		b.Close()
	}
}

// TestF16RoundTrip: every finite binary16 survives f16 -> f32 -> f16 exactly, and the midpoint
// between two neighbours rounds to the even one.
func TestF16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := f16ToF32(uint16(h))
		if f != f {
			continue
		}
		if got := f32ToF16(f); got != uint16(h) {
			t.Fatalf("f32ToF16(f16ToF32(%#04x) = %g) = %#04x", h, f, got)
		}
		if h&0x7fff < 0x7bff { // the midpoint to the next larger magnitude
			next := f16ToF32(uint16(h + 1))
			mid := float32((float64(f) + float64(next)) / 2)
			want := uint16(h)
			if h&1 == 1 {
				want = uint16(h + 1)
			}
			if float64(mid) == (float64(f)+float64(next))/2 {
				if got := f32ToF16(mid); got != want {
					t.Fatalf("midpoint %g of %#04x and %#04x rounds to %#04x, want %#04x", mid, h, h+1, got, want)
				}
			}
		}
	}
}

// TestPipelineLayout: a diffusers pipeline folder (model_index.json, component folders with
// their configs and weights, tokenizer/) becomes one bundle whose config holds each
// component's and whose tensors carry their component's prefix.
func TestPipelineLayout(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("model_index.json", `{"_class_name": "ToyPipeline", "_diffusers_version": "0.36.0", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
		"tokenizer": ["transformers", "Qwen2Tokenizer"], "transformer": ["diffusers", "ToyTransformer"], "vae": ["diffusers", "AutoencoderKL"], "safety_checker": [null, null]}`)
	write("scheduler/scheduler_config.json", `{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}`)
	write("transformer/config.json", `{"_class_name": "ToyTransformer", "dim": 4}`)
	write("vae/config.json", `{"_class_name": "AutoencoderKL", "scaling_factor": 0.3611}`)
	write("tokenizer/tokenizer.json", `{"version":"1.0","model":{"type":"BPE","vocab":{"a":0}}}`)
	write("tokenizer/tokenizer_config.json", `{}`)
	writeST(t, filepath.Join(dir, "transformer", "diffusion_pytorch_model.safetensors"), []stEntry{f32Tensor("layers.0.w", 1, 4, 4)})
	writeST(t, filepath.Join(dir, "vae", "diffusion_pytorch_model.safetensors"), []stEntry{f32Tensor("decoder.conv_in.weight", 2, 4)})
	var gotArch string
	var gotConfig map[string]map[string]any
	resolve := func(arch string, config json.RawMessage) (Family, error) {
		gotArch = arch
		json.Unmarshal(config, &gotConfig)
		return Family{Name: "toy", Task: "image"}, nil
	}
	out := filepath.Join(dir, "p.mqb")
	if _, err := Build(context.Background(), BuildOptions{CheckpointDir: dir, Model: "a/toy", Revision: testRev, Out: out, Resolve: resolve}); err != nil {
		t.Fatal(err)
	}
	b := must(Open(out))
	defer b.Close()
	h := b.Header()
	if gotArch != "ToyPipeline" || h.Family != "toy" || h.Task != "image" || h.Provenance.Build.MaxContext != MaxDefaultContext {
		t.Fatalf("arch %q, family %q, task %q, context %d", gotArch, h.Family, h.Task, h.Provenance.Build.MaxContext)
	}
	if gotConfig["transformer"]["dim"] != 4.0 || gotConfig["scheduler"]["shift"] != 3.0 || gotConfig["vae"]["scaling_factor"] != 0.3611 || gotConfig["model_index"]["_class_name"] != "ToyPipeline" {
		t.Fatalf("merged config: %v", gotConfig)
	}
	if _, ok := h.Tensor("transformer.layers.0.w"); !ok {
		t.Fatalf("tensors: %+v", h.Tensors)
	}
	if _, ok := h.Tensor("vae.decoder.conv_in.weight"); !ok {
		t.Fatalf("tensors: %+v", h.Tensors)
	}
	if tok, _ := b.Section(SectionTokenizer); !bytes.Contains(tok, []byte("BPE")) {
		t.Fatalf("tokenizer section %q", tok)
	}
	for _, f := range []string{"model_index.json", "transformer/config.json", "vae/diffusion_pytorch_model.safetensors", "tokenizer/tokenizer.json", "scheduler/scheduler_config.json"} {
		if h.Provenance.Files[f] == "" {
			t.Errorf("provenance.files lacks %s: %v", f, sortedKeys(h.Provenance.Files))
		}
	}
}
