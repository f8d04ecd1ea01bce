package native

import (
	"bytes"
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

// layoutOutput is what a bundle computes, compared bit for bit across layouts of one
// checkpoint: full logits for a text prompt (and, for a vision family, a prompt with an image),
// or the image bytes of a text-to-image family.
type layoutOutput struct {
	logits, imageLogits []float32
	rgb                 []byte
}

// buildLayoutBundle builds dir (a checkpoint of fixture name's revision) through the runtime's
// resolver, as qual bundle build does, opens the bundle and returns what it computes and its
// header.
func buildLayoutBundle(t *testing.T, name, dir string) (layoutOutput, *bundle.Header) {
	t.Helper()
	_, rev, err := fixtures.Ensure(fixtures.DefaultCacheDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "layout.mqb")
	if _, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: fixtures.ModelID(name), Revision: rev, Out: out, Resolve: BundleFamily}); err != nil {
		t.Fatalf("build %s: %v", dir, err)
	}
	b, err := bundle.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e, err := Open(b, Params{Threads: 2, MaxBatch: 1})
	if err != nil {
		t.Fatalf("open the bundle of %s: %v", dir, err)
	}
	defer e.Close()
	var o layoutOutput
	switch b.Header().Task {
	case "image":
		req := ImageRequest{Prompt: []int32{151644, 872, 198, 64, 8251, 151645}, Negative: []int32{151644, 872, 198, 151645},
			Width: 64, Height: 64, Steps: 2, Guidance: 1.5, Seed: 7}
		if b.Header().Family == "flux" { // CLIP's and T5's padded ids
			req.Prompt, req.Prompt2 = fluxIDs(512)
			req.Negative = nil
		}
		r, err := e.GenerateImage(req, false)
		if err != nil {
			t.Fatal(err)
		}
		o.rgb = r.RGB
	default:
		ids := []int32{15, 2000, 77, 31000, 5, 9}
		if o.logits, err = e.Logits(ids); err != nil {
			t.Fatal(err)
		}
		if b.Header().Task == "vision" {
			o.imageLogits = visionLogits(t, e, b.Header().Config)
		}
	}
	return o, b.Header()
}

// visionLogits runs a prompt holding a 4x4-patch image (4 merged image tokens) with
// deterministic pixel values.
func visionLogits(t *testing.T, e *Engine, config json.RawMessage) []float32 {
	t.Helper()
	var c struct {
		ImageToken int32 `json:"image_token_id"`
		Vision     struct {
			Patch    int `json:"patch_size"`
			Temporal int `json:"temporal_patch_size"`
		} `json:"vision_config"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		t.Fatal(err)
	}
	im := &Image{Grid: [3]int{1, 4, 4}, Pixels: make([]float32, 16*3*c.Vision.Temporal*c.Vision.Patch*c.Vision.Patch)}
	for i := range im.Pixels {
		im.Pixels[i] = float32(math.Sin(float64(i) * 0.37))
	}
	ids := []int32{151644, 872, 198, 151652, c.ImageToken, c.ImageToken, c.ImageToken, c.ImageToken, 151653, 3838, 151645}
	lg, err := e.LogitsImage(ids, im)
	if err != nil {
		t.Fatal(err)
	}
	return lg
}

// firstDifference is the first name of a or b at which the sorted lists part.
func firstDifference(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return min(a[i], b[i])
		}
	}
	if len(a) > len(b) {
		return a[len(b)]
	}
	if len(b) > len(a) {
		return b[len(a)]
	}
	return ""
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// layoutCase is a fixture's checkpoint saved in another layout.
type layoutCase struct {
	name string
	l    fixtures.Relayout
}

// untiedHead: the cases whose bundle holds lm_head.weight beyond the original's tensors.
var untiedHead = map[string]bool{"untied, lm_head the embedding": true, "untied, language_model.lm_head the embedding": true}

// prefixed renames every tensor of a weights file: from at the start becomes to.
func prefixed(file, from, to string) func(string, string) string {
	return func(f, n string) string {
		if (file == "" || f == file) && strings.HasPrefix(n, from) {
			return to + n[len(from):]
		}
		return n
	}
}

// qwen3MoeFused is qwen3moe-tiny saved with transformers 5's fused experts.
func qwen3MoeFused(t *testing.T) fixtures.Relayout {
	l, err := fixtures.Qwen3MoeFused(fixtures.Qwen3MoeTiny)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLayoutsComputeAsTheOriginal rewrites each family's fixture checkpoint in the layouts
// transformers and diffusers load (prefixed and unprefixed names, a tied head stored or not,
// an untied head, sharded weights with an index, diffusers' sharded component folders) and
// checks that every copy builds, through the runtime's resolver, into a bundle that opens and
// computes bit for bit what the original's bundle computes.
func TestLayoutsComputeAsTheOriginal(t *testing.T) {
	untie := func(path string, cfg map[string]any) {
		if path == "config.json" {
			cfg["tie_word_embeddings"] = false
			if tc, ok := cfg["text_config"].(map[string]any); ok {
				tc["tie_word_embeddings"] = false
			}
		}
	}
	families := []struct {
		fixture string
		cases   []layoutCase
	}{
		{fixtures.GPT2Tiny, []layoutCase{
			{"prefixed transformer.", fixtures.Relayout{Rename: prefixed("", "", "transformer.")}},
			// GPT-2's head is wte: a stored lm_head (here with other values) is not what
			// transformers computes with.
			{"tied, lm_head stored", fixtures.Relayout{Add: map[string]map[string]string{"model.safetensors": {"lm_head.weight": "neg:wte.weight"}}}},
			{"sharded into 3", fixtures.Relayout{Shards: 3}},
			{"prefixed, sharded", fixtures.Relayout{Rename: prefixed("", "", "transformer."), Shards: 3}},
		}},
		{fixtures.Qwen3Tiny, []layoutCase{
			{"unprefixed (Qwen3Model)", fixtures.Relayout{Rename: prefixed("", "model.", "")}},
			{"tied, lm_head stored as the embedding", fixtures.Relayout{Add: map[string]map[string]string{"model.safetensors": {"lm_head.weight": "model.embed_tokens.weight"}}}},
			{"tied, lm_head stored with other values", fixtures.Relayout{Add: map[string]map[string]string{"model.safetensors": {"lm_head.weight": "neg:model.embed_tokens.weight"}}}},
			{"untied, lm_head the embedding", fixtures.Relayout{Config: untie, Add: map[string]map[string]string{"model.safetensors": {"lm_head.weight": "model.embed_tokens.weight"}}}},
			{"sharded into 3", fixtures.Relayout{Shards: 3}},
			{"unprefixed, sharded", fixtures.Relayout{Rename: prefixed("", "model.", ""), Shards: 3}},
		}},
		{fixtures.Qwen3VLTiny, []layoutCase{
			{"Qwen3VLModel (no model.)", fixtures.Relayout{Rename: prefixed("", "model.", "")}},
			{"language_model.model. and visual.", fixtures.Relayout{Rename: func(_, n string) string {
				if r, ok := strings.CutPrefix(n, "model.language_model."); ok {
					return "language_model.model." + r
				}
				return strings.Replace(n, "model.visual.", "visual.", 1)
			}}},
			{"model. and visual. (Qwen2-VL's)", fixtures.Relayout{Rename: func(_, n string) string {
				if r, ok := strings.CutPrefix(n, "model.language_model."); ok {
					return "model." + r
				}
				return strings.Replace(n, "model.visual.", "visual.", 1)
			}}},
			{"tied, lm_head stored", fixtures.Relayout{Add: map[string]map[string]string{"model.safetensors": {"lm_head.weight": "neg:model.language_model.embed_tokens.weight"}}}},
			{"untied, language_model.lm_head the embedding", fixtures.Relayout{Config: untie, Rename: prefixed("", "model.language_model.", "language_model.model."),
				Add: map[string]map[string]string{"model.safetensors": {"language_model.lm_head.weight": "model.language_model.embed_tokens.weight"}}}},
			{"sharded into 3", fixtures.Relayout{Shards: 3}},
		}},
		{fixtures.Qwen3MoeTiny, []layoutCase{
			{"fused experts (transformers 5)", qwen3MoeFused(t)},
			{"fused experts, unprefixed (Qwen3MoeModel), sharded", func() fixtures.Relayout {
				l := qwen3MoeFused(t)
				l.Rename, l.Shards = prefixed("", "model.", ""), 3
				for i, x := range l.Stack["model.safetensors"] {
					x.Name = strings.TrimPrefix(x.Name, "model.")
					for j := range x.Of {
						x.Of[j] = strings.TrimPrefix(x.Of[j], "model.")
					}
					l.Stack["model.safetensors"][i] = x
				}
				return l
			}()},
		}},
		{fixtures.ZImageTiny, []layoutCase{
			// The case: the text encoder saved by Qwen3ForCausalLM.
			{"text encoder as Qwen3ForCausalLM", fixtures.Relayout{Rename: prefixed("text_encoder/model.safetensors", "", "model."),
				Add: map[string]map[string]string{"text_encoder/model.safetensors": {"lm_head.weight": "neg:embed_tokens.weight"}}}},
			{"components sharded into 3", fixtures.Relayout{Shards: 3}},
			{"Qwen3ForCausalLM encoder, sharded", fixtures.Relayout{Rename: prefixed("text_encoder/model.safetensors", "", "model."), Shards: 3}},
		}},
		{fixtures.FluxTinyDev, []layoutCase{
			// CLIPTextModel's tensors without "text_model.", T5's tied embedding saved under the
			// encoder's name, both as transformers loads them.
			{"CLIP unprefixed, T5 embedding as encoder.embed_tokens", fixtures.Relayout{Rename: func(f, n string) string {
				switch f {
				case "text_encoder/model.safetensors":
					return strings.TrimPrefix(n, "text_model.")
				case "text_encoder_2/model.safetensors":
					if n == "shared.weight" {
						return "encoder.embed_tokens.weight"
					}
				}
				return n
			}}},
			{"components sharded into 3", fixtures.Relayout{Shards: 3}},
		}},
	}
	for _, f := range families {
		t.Run(f.fixture, func(t *testing.T) {
			snap, _, err := fixtures.Ensure(fixtures.DefaultCacheDir(), f.fixture)
			if err != nil {
				t.Fatal(err)
			}
			want, wh := buildLayoutBundle(t, f.fixture, snap)
			for _, c := range f.cases {
				t.Run(c.name, func(t *testing.T) {
					dir := filepath.Join(t.TempDir(), "ckpt")
					if err := fixtures.RewriteCheckpoint(snap, dir, c.l); err != nil {
						t.Fatal(err)
					}
					if c.l.Shards > 1 {
						idx, _ := filepath.Glob(filepath.Join(dir, "*", "*.index.json"))
						top, _ := filepath.Glob(filepath.Join(dir, "*.index.json"))
						if len(idx)+len(top) == 0 {
							t.Fatal("the sharded copy has no index")
						}
					}
					got, gh := buildLayoutBundle(t, f.fixture, dir)
					var names, wantNames []string
					for _, x := range gh.Tensors {
						names = append(names, x.Name)
					}
					for _, x := range wh.Tensors {
						wantNames = append(wantNames, x.Name)
					}
					if untiedHead[c.name] {
						wantNames = append(wantNames, "lm_head.weight")
					}
					slices.Sort(wantNames)
					if !slices.Equal(names, wantNames) {
						t.Errorf("the bundle's tensors differ from the original's: got %d, want %d; first difference %q",
							len(names), len(wantNames), firstDifference(names, wantNames))
					}
					if !sameBits(got.logits, want.logits) || !sameBits(got.imageLogits, want.imageLogits) || !bytes.Equal(got.rgb, want.rgb) {
						t.Fatalf("the %s layout computes other outputs than the original (logits equal %v, image logits equal %v, image bytes equal %v)",
							c.name, sameBits(got.logits, want.logits), sameBits(got.imageLogits, want.imageLogits), bytes.Equal(got.rgb, want.rgb))
					}
					if len(want.logits)+len(want.rgb) == 0 {
						t.Fatal("nothing was computed")
					}
					t.Logf("renamed %v; skipped %v", gh.Provenance.RenamedTensors, gh.Provenance.SkippedTensors)
				})
			}
		})
	}
}

// TestLayoutNamesWhatIsWrong: a checkpoint missing one tensor, or holding one of another shape,
// or one the family never reads, fails the build naming the tensor, the expected and found
// shapes and the files searched; no bundle is written.
func TestLayoutNamesWhatIsWrong(t *testing.T) {
	snap, rev, err := fixtures.Ensure(fixtures.DefaultCacheDir(), fixtures.Qwen3Tiny)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		l    fixtures.Relayout
		want []string
	}{
		{"missing", fixtures.Relayout{Shards: 3, Rename: func(_, n string) string {
			if n == "model.layers.1.mlp.up_proj.weight" {
				return ""
			}
			return n
		}}, []string{`tensor "model.layers.1.mlp.up_proj.weight": expected shape [128 64] (from config.json), found none (also looked for "layers.1.mlp.up_proj.weight")`,
			"searched model-00001-of-00003.safetensors, model-00002-of-00003.safetensors, model-00003-of-00003.safetensors"}},
		{"wrong shape", fixtures.Relayout{Rename: func(_, n string) string {
			if n == "model.norm.weight" {
				return ""
			}
			return n
		}, Add: map[string]map[string]string{"model.safetensors": {"norm.weight": "model.layers.0.self_attn.q_norm.weight"}}},
			[]string{`tensor "model.norm.weight": expected shape [64] (from config.json), found [16] as "norm.weight" in model.safetensors`, "searched model.safetensors"}},
		{"not read", fixtures.Relayout{Add: map[string]map[string]string{"model.safetensors": {"model.layers.0.mlp.extra.weight": "model.norm.weight"}}},
			[]string{`tensor "model.layers.0.mlp.extra.weight" in model.safetensors: family qwen3 reads it under no name it accepts`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			if err := fixtures.RewriteCheckpoint(snap, dir, c.l); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "b.mqb")
			_, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: fixtures.ModelID(fixtures.Qwen3Tiny), Revision: rev, Out: out, Resolve: BundleFamily})
			if err == nil {
				t.Fatal("the build succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q:\n%v", w, err)
				}
			}
			if _, serr := os.Stat(out); serr == nil {
				t.Error("a bundle was written")
			}
		})
	}
}

// TestLayoutDeclaresWhatTheModelReads: the layout lists what the family's constructor reads
// for the config (an untied head and attention biases only when the config has them), its
// carried patterns and its rules.
func TestLayoutDeclaresWhatTheModelReads(t *testing.T) {
	cfg := func(tied, bias bool) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
			"intermediate_size": 16, "max_position_embeddings": 77, "tie_word_embeddings": tied, "attention_bias": bias})
		return b
	}
	for _, c := range []struct {
		tied, bias bool
		n          int // embedding, 2 layers of 11 (15 with biases), norm, the head
	}{{true, false, 1 + 2*11 + 1 + 1}, {false, false, 1 + 2*11 + 1 + 1}, {false, true, 1 + 2*15 + 1 + 1}} {
		l, err := Layout("qwen3", cfg(c.tied, c.bias))
		if err != nil {
			t.Fatal(err)
		}
		names := map[string][]int64{}
		for _, x := range l.Tensors {
			names[x.Name] = x.Shape
		}
		if len(l.Tensors) != c.n || !slices.Equal(names["model.layers.1.mlp.down_proj.weight"], []int64{8, 16}) || !slices.Equal(names["lm_head.weight"], []int64{10, 8}) {
			t.Errorf("tied %v, bias %v: %d tensors, want %d: %v", c.tied, c.bias, len(l.Tensors), c.n, l.Tensors)
		}
		if _, ok := names["model.layers.0.self_attn.q_proj.bias"]; ok != c.bias {
			t.Errorf("bias %v: q_proj.bias declared %v", c.bias, ok)
		}
		if dropped := slices.Contains(l.Dropped, "lm_head.weight"); dropped != c.tied {
			t.Errorf("tied %v: lm_head.weight dropped %v", c.tied, dropped)
		}
		if !slices.Contains(l.Renames, bundle.LayoutRename{From: "", To: "model."}) {
			t.Errorf("renames %v lack the Qwen3Model layout", l.Renames)
		}
	}
	if _, err := Layout("qwen3", json.RawMessage(`{"vocab_size":10}`)); err == nil || !strings.Contains(err.Error(), "config.json: num_attention_heads is missing") {
		t.Errorf("a config the family refuses: %v", err)
	}
}
