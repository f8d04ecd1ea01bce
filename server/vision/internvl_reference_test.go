package vision

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
)

// A float64 forward pass of InternVLForConditionalGeneration written in Go from transformers'
// modeling_internvl and modeling_qwen3 (not from native/models/internvl.cc), reading the
// fixture's model.safetensors directly. Until the transformers golden exists it is the internvl
// engine's only numeric reference: it checks the C++ tower, pixel shuffle, projector, image-row
// placement and the shared decoder's use against an independent implementation of the same
// definition (it cannot catch a misreading of transformers both share; the golden will).

type refTensors map[string][]float64

// loadSafetensors reads an F32 safetensors file (8-byte little-endian header length, JSON
// header, data) into float64 tensors by name.
func loadSafetensors(t *testing.T, path string) refTensors {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	out := refTensors{}
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var ti struct {
			DType   string  `json:"dtype"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &ti); err != nil || ti.DType != "F32" {
			t.Fatalf("%s: %v (dtype %s; the reference reads F32 only)", name, err, ti.DType)
		}
		seg := data[ti.Offsets[0]:ti.Offsets[1]]
		v := make([]float64, len(seg)/4)
		for i := range v {
			v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(seg[4*i:])))
		}
		out[name] = v
	}
	return out
}

func (w refTensors) get(t *testing.T, name string, n int) []float64 {
	t.Helper()
	v, ok := w[name]
	if !ok || len(v) != n {
		t.Fatalf("tensor %s: %d values, want %d", name, len(v), n)
	}
	return v
}

// linear is nn.Linear: y[r] = W·x[r] + b, W [out, in] row-major.
func linear(x []float64, rows, in int, w []float64, out int, b []float64) []float64 {
	y := make([]float64, rows*out)
	for r := 0; r < rows; r++ {
		xr := x[r*in : (r+1)*in]
		for o := 0; o < out; o++ {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			wo := w[o*in : (o+1)*in]
			for i, xv := range xr {
				s += wo[i] * xv
			}
			y[r*out+o] = s
		}
	}
	return y
}

func layerNorm(x []float64, width int, g, b []float64, eps float64) []float64 {
	y := make([]float64, len(x))
	for s := 0; s < len(x); s += width {
		mean, v := 0.0, 0.0
		for _, a := range x[s : s+width] {
			mean += a
		}
		mean /= float64(width)
		for _, a := range x[s : s+width] {
			v += (a - mean) * (a - mean)
		}
		inv := 1 / math.Sqrt(v/float64(width)+eps)
		for j := 0; j < width; j++ {
			y[s+j] = (x[s+j]-mean)*inv*g[j] + b[j]
		}
	}
	return y
}

func rmsNormRef(x []float64, width int, g []float64, eps float64) []float64 {
	y := make([]float64, len(x))
	for s := 0; s < len(x); s += width {
		ms := 0.0
		for _, a := range x[s : s+width] {
			ms += a * a
		}
		inv := 1 / math.Sqrt(ms/float64(width)+eps)
		for j := 0; j < width; j++ {
			y[s+j] = x[s+j] * inv * g[j]
		}
	}
	return y
}

func geluExact(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

// attention is softmax(q·kᵀ·scale [+ causal mask])·v per head; kv heads shared by groups.
func attention(q, k, v []float64, n, heads, kvHeads, hd int, causal bool) []float64 {
	out := make([]float64, n*heads*hd)
	scale := 1 / math.Sqrt(float64(hd))
	sc := make([]float64, n)
	for h := 0; h < heads; h++ {
		kh := h / (heads / kvHeads)
		for i := 0; i < n; i++ {
			last := n
			if causal {
				last = i + 1
			}
			mx := math.Inf(-1)
			for j := 0; j < last; j++ {
				s := 0.0
				for d := 0; d < hd; d++ {
					s += q[(i*heads+h)*hd+d] * k[(j*kvHeads+kh)*hd+d]
				}
				sc[j] = s * scale
				mx = math.Max(mx, sc[j])
			}
			sum := 0.0
			for j := 0; j < last; j++ {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			for j := 0; j < last; j++ {
				for d := 0; d < hd; d++ {
					out[(i*heads+h)*hd+d] += sc[j] / sum * v[(j*kvHeads+kh)*hd+d]
				}
			}
		}
	}
	return out
}

// refVisionTile is InternVLModel.get_image_features for one tile [3, 448, 448]: patch
// embedding, CLS, positions, the encoder layers, CLS dropped, pixel shuffle 0.5, projector.
func refVisionTile(t *testing.T, w refTensors, px []float32, vh, layers, heads, inter, patch, textE int) []float64 {
	return refVisionTileOpts(t, w, px, vh, layers, heads, inter, patch, textE, visionOpts{run: layers})
}

// visionOpts are the InternViT variants: RMSNorm blocks (norm_type rms_norm, no norm biases),
// q/k RMSNorm over the full width (use_qk_norm), how many layers the features come after
// (hidden_states[vision_feature_layer]) and the final layernorm (use_mean_pooling false with
// vision_feature_layer -1).
type visionOpts struct {
	rms, qkNorm, finalNorm bool
	run                    int
}

func refVisionTileOpts(t *testing.T, w refTensors, px []float32, vh, layers, heads, inter, patch, textE int, o visionOpts) []float64 {
	const tile = 448
	side := tile / patch
	P, K := side*side, 3*patch*patch
	v := "model.vision_tower."
	patches := make([]float64, P*K)
	for py := 0; py < side; py++ {
		for pxi := 0; pxi < side; pxi++ {
			for c := 0; c < 3; c++ {
				for ky := 0; ky < patch; ky++ {
					for kx := 0; kx < patch; kx++ {
						patches[(py*side+pxi)*K+(c*patch+ky)*patch+kx] = float64(px[(c*tile+py*patch+ky)*tile+pxi*patch+kx])
					}
				}
			}
		}
	}
	emb := linear(patches, P, K, w.get(t, v+"embeddings.patch_embeddings.projection.weight", vh*K), vh, w.get(t, v+"embeddings.patch_embeddings.projection.bias", vh))
	N := P + 1
	x := append(append([]float64{}, w.get(t, v+"embeddings.cls_token", vh)...), emb...)
	pos := w.get(t, v+"embeddings.position_embeddings", N*vh)
	for i := range x {
		x[i] += pos[i]
	}
	norm := func(x []float64, name string) []float64 {
		if o.rms {
			return rmsNormRef(x, vh, w.get(t, name+".weight", vh), 1e-6)
		}
		return layerNorm(x, vh, w.get(t, name+".weight", vh), w.get(t, name+".bias", vh), 1e-6)
	}
	for l := 0; l < o.run; l++ {
		p := fmt.Sprintf("%sencoder.layer.%d.", v, l)
		a := norm(x, p+"layernorm_before")
		q := linear(a, N, vh, w.get(t, p+"attention.q_proj.weight", vh*vh), vh, w.get(t, p+"attention.q_proj.bias", vh))
		k := linear(a, N, vh, w.get(t, p+"attention.k_proj.weight", vh*vh), vh, w.get(t, p+"attention.k_proj.bias", vh))
		vv := linear(a, N, vh, w.get(t, p+"attention.v_proj.weight", vh*vh), vh, w.get(t, p+"attention.v_proj.bias", vh))
		if o.qkNorm {
			q = rmsNormRef(q, vh, w.get(t, p+"attention.q_norm.weight", vh), 1e-6)
			k = rmsNormRef(k, vh, w.get(t, p+"attention.k_norm.weight", vh), 1e-6)
		}
		att := attention(q, k, vv, N, heads, heads, vh/heads, false)
		o := linear(att, N, vh, w.get(t, p+"attention.projection_layer.weight", vh*vh), vh, w.get(t, p+"attention.projection_layer.bias", vh))
		l1, l2 := w.get(t, p+"lambda_1", vh), w.get(t, p+"lambda_2", vh)
		for i := range x {
			x[i] += l1[i%vh] * o[i]
		}
		b := norm(x, p+"layernorm_after")
		f := linear(b, N, vh, w.get(t, p+"mlp.fc1.weight", inter*vh), inter, w.get(t, p+"mlp.fc1.bias", inter))
		for i := range f {
			f[i] = geluExact(f[i])
		}
		m := linear(f, N, inter, w.get(t, p+"mlp.fc2.weight", vh*inter), vh, w.get(t, p+"mlp.fc2.bias", vh))
		for i := range x {
			x[i] += l2[i%vh] * m[i]
		}
	}
	if o.finalNorm {
		x = layerNorm(x, vh, w.get(t, v+"layernorm.weight", vh), w.get(t, v+"layernorm.bias", vh), 1e-6)
	}
	// pixel_shuffle on (1, side, side, vh) exactly as transformers reshapes it: view
	// (side, side/2, 2vh), permute, view (side/2, side/2, 4vh), permute back.
	feat := x[vh:] // CLS dropped
	half := side / 2
	s1 := make([]float64, len(feat)) // [a][b2][c'] = feat[a][2*b2 + c'/vh][c' % vh], c' < 2vh
	copy(s1, feat)                   // a view: same memory order
	s2 := make([]float64, len(feat)) // permute(0,2,1,3): [b2][a][c']
	for a := 0; a < side; a++ {
		for b2 := 0; b2 < half; b2++ {
			copy(s2[(b2*side+a)*2*vh:(b2*side+a+1)*2*vh], s1[(a*half+b2)*2*vh:(a*half+b2+1)*2*vh])
		}
	}
	// view (half, half, 4vh): [b2][a2][c''] = s2[b2][2*a2 + c''/(2vh)][c'' % 2vh]: same memory.
	s3 := make([]float64, len(feat)) // permute(0,2,1,3): [a2][b2][c'']
	for b2 := 0; b2 < half; b2++ {
		for a2 := 0; a2 < half; a2++ {
			copy(s3[(a2*half+b2)*4*vh:(a2*half+b2+1)*4*vh], s2[(b2*half+a2)*4*vh:(b2*half+a2+1)*4*vh])
		}
	}
	pp := "model.multi_modal_projector."
	M := 4 * vh
	h := layerNorm(s3, M, w.get(t, pp+"layer_norm.weight", M), w.get(t, pp+"layer_norm.bias", M), 1e-5)
	h = linear(h, half*half, M, w.get(t, pp+"linear_1.weight", textE*M), textE, w.get(t, pp+"linear_1.bias", textE))
	for i := range h {
		h[i] = geluExact(h[i])
	}
	return linear(h, half*half, textE, w.get(t, pp+"linear_2.weight", textE*textE), textE, w.get(t, pp+"linear_2.bias", textE))
}

// refLastLogits is the Qwen3 decoder over ids with image rows replaced (in order) by embeds,
// returning the last position's logits (tied head). qwen2 is Qwen2's attention instead: q/k/v
// biases and no q/k norm.
func refLastLogits(t *testing.T, w refTensors, ids []int32, embeds []float64, imageToken int32, E, layers, heads, kv, hd, inter, vocab int, theta float64, qwen2 bool) []float64 {
	n := len(ids)
	m := "model.language_model."
	tok := w.get(t, m+"embed_tokens.weight", vocab*E)
	x := make([]float64, n*E)
	k := 0
	for i, id := range ids {
		if id == imageToken {
			copy(x[i*E:(i+1)*E], embeds[k*E:(k+1)*E])
			k++
		} else {
			copy(x[i*E:(i+1)*E], tok[int(id)*E:(int(id)+1)*E])
		}
	}
	if k*E != len(embeds) {
		t.Fatalf("%d image tokens for %d image rows", k, len(embeds)/E)
	}
	rope := func(v []float64, nh int) {
		for i := 0; i < n; i++ {
			for h := 0; h < nh; h++ {
				r := v[(i*nh+h)*hd : (i*nh+h+1)*hd]
				for j := 0; j < hd/2; j++ {
					ang := float64(i) * math.Pow(theta, -float64(2*j)/float64(hd))
					s, c := math.Sincos(ang)
					a, b := r[j], r[j+hd/2]
					r[j], r[j+hd/2] = a*c-b*s, b*c+a*s
				}
			}
		}
	}
	for l := 0; l < layers; l++ {
		p := fmt.Sprintf("%slayers.%d.", m, l)
		a := rmsNormRef(x, E, w.get(t, p+"input_layernorm.weight", E), 1e-6)
		var bq, bk, bv []float64
		if qwen2 {
			bq, bk, bv = w.get(t, p+"self_attn.q_proj.bias", heads*hd), w.get(t, p+"self_attn.k_proj.bias", kv*hd), w.get(t, p+"self_attn.v_proj.bias", kv*hd)
		}
		q := linear(a, n, E, w.get(t, p+"self_attn.q_proj.weight", heads*hd*E), heads*hd, bq)
		kk := linear(a, n, E, w.get(t, p+"self_attn.k_proj.weight", kv*hd*E), kv*hd, bk)
		vv := linear(a, n, E, w.get(t, p+"self_attn.v_proj.weight", kv*hd*E), kv*hd, bv)
		if !qwen2 {
			q = rmsNormRef(q, hd, w.get(t, p+"self_attn.q_norm.weight", hd), 1e-6)
			kk = rmsNormRef(kk, hd, w.get(t, p+"self_attn.k_norm.weight", hd), 1e-6)
		}
		rope(q, heads)
		rope(kk, kv)
		att := attention(q, kk, vv, n, heads, kv, hd, true)
		o := linear(att, n, heads*hd, w.get(t, p+"self_attn.o_proj.weight", E*heads*hd), E, nil)
		for i := range x {
			x[i] += o[i]
		}
		b := rmsNormRef(x, E, w.get(t, p+"post_attention_layernorm.weight", E), 1e-6)
		g := linear(b, n, E, w.get(t, p+"mlp.gate_proj.weight", inter*E), inter, nil)
		u := linear(b, n, E, w.get(t, p+"mlp.up_proj.weight", inter*E), inter, nil)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := linear(g, n, inter, w.get(t, p+"mlp.down_proj.weight", E*inter), E, nil)
		for i := range x {
			x[i] += d[i]
		}
	}
	last := rmsNormRef(x[(n-1)*E:], E, w.get(t, m+"norm.weight", E), 1e-6)
	return linear(last, 1, E, tok, vocab, nil)
}

// TestInternVLNativeMatchesFloat64Reference: the engine's last-position logits equal the
// float64 reference's within 1e-3 on a one-tile image, a three-tile image (tiles and thumbnail
// in order) and the two stacked in one prompt.
func TestInternVLNativeMatchesFloat64Reference(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := fixtures.Ensure("", fixtures.InternVLTiny)
	if err != nil {
		t.Fatal(err)
	}
	w := loadSafetensors(t, filepath.Join(snap, "model.safetensors"))
	c := internVLProcessor(t)
	e := openInternVL(t)
	// internvl-tiny's sizes (fixtures/internvl.go); the reference reads the tensors by name.
	const vh, vLayers, vHeads, vInter, patch, E = 32, 2, 2, 64, 28, 64
	embed := func(r *Result) []float64 {
		var out []float64
		for i := 0; i < r.Grid[0]; i++ {
			out = append(out, refVisionTile(t, w, r.Pixels[i*3*448*448:(i+1)*3*448*448], vh, vLayers, vHeads, vInter, patch, E)...)
		}
		return out
	}
	one, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/09-gray-300x300.png"))
	three, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	both := &Result{Grid: [3]int{one.Grid[0] + three.Grid[0], one.Grid[1], one.Grid[2]}, Tokens: one.Tokens + three.Tokens,
		Pixels: append(append([]float32{}, one.Pixels...), three.Pixels...)}
	for _, tc := range []struct {
		name string
		r    *Result
	}{{"one tile", one}, {"three tiles", three}, {"two images stacked", both}} {
		ids := internVLPrompt(tc.r.Tokens)
		got := lastLogits(t, e, ids, tc.r)
		want := refLastLogits(t, w, ids, embed(tc.r), 151671, E, 3, 4, 2, 16, 128, 151936, 1e6, false)
		worst, at := 0.0, 0
		for i := range want {
			if d := math.Abs(float64(got[i]) - want[i]); d > worst {
				worst, at = d, i
			}
		}
		if worst > 1e-3 {
			t.Errorf("%s: native vs float64 reference max |Δlogit| %.3g at token %d (%.6g vs %.6g)", tc.name, worst, at, got[at], want[at])
		}
		t.Logf("%s (%d tiles, %d ids): native vs float64 reference max |Δlogit| %.3g", tc.name, tc.r.Grid[0], len(ids), worst)
	}
}

// TestInternVLQwen2TextMatchesFloat64Reference: InternVL3's text model, Qwen2 (q/k/v biases, no
// q/k norm), as the shared decoder's variant: internvl-tiny rewritten with text_config
// model_type qwen2, the q/k norms left out and q/k/v biases added (copies of vision biases of the
// right sizes, so they are not constant), built through the runtime's resolver, against the
// float64 reference's Qwen2 attention.
func TestInternVLQwen2TextMatchesFloat64Reference(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	snap, rev, err := fixtures.Ensure("", fixtures.InternVLTiny)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "qwen2") // RewriteCheckpoint makes it
	add := map[string]string{}
	for l := 0; l < 3; l++ {
		p := fmt.Sprintf("model.language_model.layers.%d.self_attn.", l)
		add[p+"q_proj.bias"] = "model.vision_tower.encoder.layer.0.mlp.fc1.bias"                             // 64 = heads*head_dim
		add[p+"k_proj.bias"] = fmt.Sprintf("model.vision_tower.encoder.layer.%d.attention.q_proj.bias", l%2) // 32 = kv*head_dim
		add[p+"v_proj.bias"] = fmt.Sprintf("model.vision_tower.encoder.layer.%d.attention.v_proj.bias", l%2)
	}
	err = fixtures.RewriteCheckpoint(snap, dir, fixtures.Relayout{
		Rename: func(_, name string) string {
			if strings.HasPrefix(name, "model.language_model.") && (strings.HasSuffix(name, ".q_norm.weight") || strings.HasSuffix(name, ".k_norm.weight")) {
				return ""
			}
			return name
		},
		Add: map[string]map[string]string{"model.safetensors": add},
		Config: func(path string, cfg map[string]any) {
			if path == "config.json" {
				cfg["text_config"].(map[string]any)["model_type"] = "qwen2"
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "qwen2.mqb")
	if _, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: fixtures.ModelID(fixtures.InternVLTiny), Revision: rev, Out: out, Resolve: native.BundleFamily}); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e, err := native.Open(b, native.Params{Threads: 2, MaxBatch: 1, MaxContext: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w := loadSafetensors(t, filepath.Join(dir, "model.safetensors"))
	c := internVLProcessor(t)
	r, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	var emb []float64
	for i := 0; i < r.Grid[0]; i++ {
		emb = append(emb, refVisionTile(t, w, r.Pixels[i*3*448*448:(i+1)*3*448*448], 32, 2, 2, 64, 28, 64)...)
	}
	ids := internVLPrompt(r.Tokens)
	got := lastLogits(t, e, ids, r)
	want := refLastLogits(t, w, ids, emb, 151671, 64, 3, 4, 2, 16, 128, 151936, 1e6, true)
	noBias := refTensors{}
	for k, v := range w {
		noBias[k] = v
		if _, ok := add[k]; ok {
			noBias[k] = make([]float64, len(v))
		}
	}
	unbiased := refLastLogits(t, noBias, ids, emb, 151671, 64, 3, 4, 2, 16, 128, 151936, 1e6, true)
	worst, apart := 0.0, 0.0
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-want[i]))
		apart = math.Max(apart, math.Abs(unbiased[i]-want[i]))
	}
	if worst > 1e-3 {
		t.Fatalf("qwen2 text: native vs float64 reference max |Δlogit| %.3g", worst)
	}
	if apart < 1e-2 {
		t.Fatalf("the q/k/v biases move the reference's logits by only %.3g: they do not bite", apart)
	}
	t.Logf("qwen2 text: native vs float64 reference max |Δlogit| %.3g (dropping the biases would move them %.3g)", worst, apart)
}

// TestInternVLVisionVariantsMatchFloat64Reference: the InternViT settings internvl-tiny does not
// use, each on a rewritten copy built through the runtime's resolver, against the float64
// reference: RMSNorm blocks with q/k RMSNorm (the 6B towers' norm_type rms_norm and
// use_qk_norm), vision_feature_layer -2 (the features after the next-to-last layer), and the
// final layernorm (use_mean_pooling false).
func TestInternVLVisionVariantsMatchFloat64Reference(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	snap, rev, err := fixtures.Ensure("", fixtures.InternVLTiny)
	if err != nil {
		t.Fatal(err)
	}
	c := internVLProcessor(t)
	r, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/09-gray-300x300.png"))
	ids := internVLPrompt(r.Tokens)
	const vt = "model.vision_tower."
	for _, tc := range []struct {
		name string
		o    visionOpts
		rel  fixtures.Relayout
	}{
		{"rms_norm and use_qk_norm", visionOpts{rms: true, qkNorm: true, run: 2}, fixtures.Relayout{
			Rename: func(_, name string) string {
				if strings.HasPrefix(name, vt+"encoder.") && (strings.HasSuffix(name, "layernorm_before.bias") || strings.HasSuffix(name, "layernorm_after.bias")) {
					return ""
				}
				return name
			},
			Add: map[string]map[string]string{"model.safetensors": {
				vt + "encoder.layer.0.attention.q_norm.weight": vt + "encoder.layer.0.lambda_1",
				vt + "encoder.layer.0.attention.k_norm.weight": vt + "encoder.layer.0.lambda_2",
				vt + "encoder.layer.1.attention.q_norm.weight": vt + "encoder.layer.1.lambda_1",
				vt + "encoder.layer.1.attention.k_norm.weight": vt + "encoder.layer.1.layernorm_after.weight",
			}},
			Config: func(path string, cfg map[string]any) {
				if path == "config.json" {
					v := cfg["vision_config"].(map[string]any)
					v["norm_type"], v["use_qk_norm"] = "rms_norm", true
				}
			},
		}},
		{"vision_feature_layer -2", visionOpts{run: 1}, fixtures.Relayout{
			Config: func(path string, cfg map[string]any) {
				if path == "config.json" {
					cfg["vision_feature_layer"] = -2
				}
			},
		}},
		{"use_mean_pooling false", visionOpts{run: 2, finalNorm: true}, fixtures.Relayout{
			Add: map[string]map[string]string{"model.safetensors": {
				vt + "layernorm.weight": vt + "encoder.layer.1.layernorm_before.weight",
				vt + "layernorm.bias":   vt + "encoder.layer.1.layernorm_before.bias",
			}},
			Config: func(path string, cfg map[string]any) {
				if path == "config.json" {
					cfg["vision_config"].(map[string]any)["use_mean_pooling"] = false
				}
			},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "variant")
			if err := fixtures.RewriteCheckpoint(snap, dir, tc.rel); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "variant.mqb")
			if _, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: fixtures.ModelID(fixtures.InternVLTiny), Revision: rev, Out: out, Resolve: native.BundleFamily}); err != nil {
				t.Fatal(err)
			}
			b, err := bundle.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			e, err := native.Open(b, native.Params{Threads: 2, MaxBatch: 1, MaxContext: 1024})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			w := loadSafetensors(t, filepath.Join(dir, "model.safetensors"))
			emb := refVisionTileOpts(t, w, r.Pixels, 32, 2, 2, 64, 28, 64, tc.o)
			want := refLastLogits(t, w, ids, emb, 151671, 64, 3, 4, 2, 16, 128, 151936, 1e6, false)
			base := refLastLogits(t, w, ids, refVisionTile(t, loadSafetensors(t, filepath.Join(snap, "model.safetensors")), r.Pixels, 32, 2, 2, 64, 28, 64), 151671, 64, 3, 4, 2, 16, 128, 151936, 1e6, false)
			got := lastLogits(t, e, ids, r)
			worst, apart := 0.0, 0.0
			for i := range want {
				worst = math.Max(worst, math.Abs(float64(got[i])-want[i]))
				apart = math.Max(apart, math.Abs(base[i]-want[i]))
			}
			if worst > 1e-3 {
				t.Fatalf("native vs float64 reference max |Δlogit| %.3g", worst)
			}
			if apart < 1e-2 {
				t.Fatalf("the variant moves the reference's logits by only %.3g from internvl-tiny's: it does not bite", apart)
			}
			t.Logf("native vs float64 reference max |Δlogit| %.3g (the variant moves the logits %.3g)", worst, apart)
		})
	}
}

// TestInternVLProcessorConfigOnly: a checkpoint saved by transformers 5 may keep its image
// processor settings only in processor_config.json's image_processor block (with
// image_seq_length beside it). Such a copy of internvl-tiny builds into a bundle whose
// preprocessor section the processor reads to the same tiles, tokens and pixels.
func TestInternVLProcessorConfigOnly(t *testing.T) {
	snap, rev, err := fixtures.Ensure("", fixtures.InternVLTiny)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := os.ReadFile(filepath.Join(snap, "preprocessor_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "v5")
	err = fixtures.RewriteCheckpoint(snap, dir, fixtures.Relayout{Config: func(path string, cfg map[string]any) {
		if path == "processor_config.json" {
			var block map[string]any
			if err := json.Unmarshal(pre, &block); err != nil {
				t.Fatal(err)
			}
			cfg["image_processor"] = block
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "preprocessor_config.json")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "v5.mqb")
	if _, err := bundle.Build(context.Background(), bundle.BuildOptions{CheckpointDir: dir, Model: fixtures.ModelID(fixtures.InternVLTiny), Revision: rev, Out: out, Resolve: native.BundleFamily}); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sec, err := b.Section(bundle.SectionPreprocessorConfig)
	if err != nil {
		t.Fatalf("a bundle of a checkpoint with processor_config.json only: %v", err)
	}
	p, err := NewProcessor(sec)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := b.Section(bundle.SectionConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.(ModelConfigured).UseModelConfig(cfg); err != nil {
		t.Fatal(err)
	}
	root, _ := fixtures.RepoRoot()
	want, _ := internVLImage(t, internVLProcessor(t), filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	got, _ := internVLImage(t, p.(*GotOcr2Config), filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	if got.Grid != want.Grid || got.Tokens != want.Tokens || sha256Hex(got.Resized) != sha256Hex(want.Resized) {
		t.Fatalf("processor_config.json form: grid %v tokens %d; preprocessor_config.json form: grid %v tokens %d", got.Grid, got.Tokens, want.Grid, want.Tokens)
	}
}
