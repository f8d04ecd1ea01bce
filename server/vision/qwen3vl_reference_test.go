package vision

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
)

// A float64 forward pass of Qwen3VLForConditionalGeneration written in Go from transformers'
// modeling_qwen3_vl (read at huggingface/transformers commit
// 00709b862bb8f14a5435bb7195592579168496e4; not from native/models/qwen3vl.cc), reading the
// fixture's model.safetensors directly, for prompts with several images. It checks the C++
// engine's per-image tower passes (each image's own position-embedding interpolation, 2-D rotary
// angles, attention within the image, DeepStack features), the placement of each image's merged
// tokens at its placeholder run, and the 3-axis positions across images. The transformers
// golden for two-image requests (fixtures/golden/qwen3vl-tiny-pairs.json, from the GPU host)
// checks both against transformers itself.

// qwen3VLSizes is the part of a Qwen3-VL config.json the reference needs.
type qwen3VLSizes struct {
	ImageTokenID       int32 `json:"image_token_id"`
	VisionStartTokenID int32 `json:"vision_start_token_id"`
	Text               struct {
		Hidden     int     `json:"hidden_size"`
		Layers     int     `json:"num_hidden_layers"`
		Heads      int     `json:"num_attention_heads"`
		KVHeads    int     `json:"num_key_value_heads"`
		HeadDim    int     `json:"head_dim"`
		Inter      int     `json:"intermediate_size"`
		Vocab      int     `json:"vocab_size"`
		RopeTheta  float64 `json:"rope_theta"`
		RMSEps     float64 `json:"rms_norm_eps"`
		RopeScaled struct {
			Section []int `json:"mrope_section"`
		} `json:"rope_scaling"`
	} `json:"text_config"`
	Vision struct {
		Hidden    int   `json:"hidden_size"`
		Depth     int   `json:"depth"`
		Heads     int   `json:"num_heads"`
		Inter     int   `json:"intermediate_size"`
		NumPos    int   `json:"num_position_embeddings"`
		Patch     int   `json:"patch_size"`
		Temporal  int   `json:"temporal_patch_size"`
		Merge     int   `json:"spatial_merge_size"`
		Deepstack []int `json:"deepstack_visual_indexes"`
	} `json:"vision_config"`
}

// qwen3VLRef is the fixture's weights and sizes.
type qwen3VLRef struct {
	w refTensors
	c qwen3VLSizes
}

func loadQwen3VLRef(t *testing.T) *qwen3VLRef {
	t.Helper()
	snap, _, err := fixtures.Ensure("", fixtures.Qwen3VLTiny)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(snap, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := &qwen3VLRef{w: loadSafetensors(t, filepath.Join(snap, "model.safetensors"))}
	if err := json.Unmarshal(b, &r.c); err != nil {
		t.Fatal(err)
	}
	if len(r.c.Text.RopeScaled.Section) != 3 {
		t.Fatalf("config.json: text_config.rope_scaling.mrope_section %v, want 3 entries", r.c.Text.RopeScaled.Section)
	}
	return r
}

// ropeIndex is Qwen3VLModel.get_rope_index for one unpadded sequence of images (no video):
// images are found as transformers finds them (a vision start token followed by the image
// token; the k-th such image takes grids[k]); text before an image counts on from the largest
// position so far + 1 on all three axes; the image's tokens take (start, start + row, start +
// column) of its merged grid, start being the position after that text; trailing text as text.
// It returns positions [3][len(ids)] (temporal, height, width) and the rope delta (largest
// position + 1 - len(ids)).
func ropeIndex(ids []int32, imageToken, visionStart int32, grids [][3]int, merge int) ([3][]int, int) {
	var pos [3][]int
	images := 0
	for i := 0; i+1 < len(ids); i++ {
		if ids[i] == visionStart && ids[i+1] == imageToken {
			images++
		}
	}
	largest := -1 // the largest position so far (st_idx = largest + 1)
	add := func(t, h, w int) {
		pos[0], pos[1], pos[2] = append(pos[0], t), append(pos[1], h), append(pos[2], w)
		largest = max(largest, t, h, w)
	}
	st := 0
	for k := 0; k < images; k++ {
		ed := st + slices.Index(ids[st:], imageToken)
		lt, lh, lw := grids[k][0], grids[k][1]/merge, grids[k][2]/merge
		stIdx := largest + 1
		for j := 0; j < ed-st; j++ {
			add(stIdx+j, stIdx+j, stIdx+j)
		}
		base := stIdx + ed - st
		for tt := 0; tt < lt; tt++ {
			for r := 0; r < lh; r++ {
				for c := 0; c < lw; c++ {
					add(base+tt, base+r, base+c)
				}
			}
		}
		st = ed + lt*lh*lw
	}
	stIdx := largest + 1
	for j := 0; j < len(ids)-st; j++ {
		add(stIdx+j, stIdx+j, stIdx+j)
	}
	return pos, largest + 1 - len(ids)
}

// vision is Qwen3VLVisionModel on one image's pixel_values [h*w patches of 3*tp*p*p] and grid:
// the merged tokens [h*w/merge², E] and one DeepStack feature of the same shape per tap. Several
// images go through it one by one (attention never crosses images: cu_seqlens).
func (r *qwen3VLRef) vision(t *testing.T, px []float32, grid [3]int) ([]float64, [][]float64) {
	t.Helper()
	v, w := r.c.Vision, r.w
	vh, hd, m := v.Hidden, v.Hidden/v.Heads, v.Merge
	gh, gw := grid[1], grid[2]
	n, K := grid[0]*gh*gw, 3*v.Temporal*v.Patch*v.Patch
	if len(px) != n*K {
		t.Fatalf("reference vision: %d pixel values for grid %v (%d patches of %d)", len(px), grid, n, K)
	}
	x64 := make([]float64, len(px))
	for i, p := range px {
		x64[i] = float64(p)
	}
	pre := "model.visual."
	x := linear(x64, n, K, w.get(t, pre+"patch_embed.proj.weight", vh*K), vh, w.get(t, pre+"patch_embed.proj.bias", vh))
	// Patch i in the processor's order (t, gh/m, gw/m, m, m): its row and column in the image.
	rows, cols := make([]int, n), make([]int, n)
	for i, bh := 0, 0; bh < gh/m; bh++ {
		for bw := 0; bw < gw/m; bw++ {
			for mh := 0; mh < m; mh++ {
				for mw := 0; mw < m; mw++ {
					rows[i], cols[i] = bh*m+mh, bw*m+mw
					i++
				}
			}
		}
	}
	// fast_pos_embed_interpolate: torch.linspace(0, side-1, h) and bilinear weights.
	side := int(math.Round(math.Sqrt(float64(v.NumPos))))
	lin := func(k int) []float64 {
		out := make([]float64, k)
		for i := range out {
			if k > 1 {
				out[i] = float64(side-1) * float64(i) / float64(k-1)
			}
		}
		return out
	}
	hs, ws := lin(gh), lin(gw)
	pe := w.get(t, pre+"pos_embed.weight", v.NumPos*vh)
	for i := 0; i < n; i++ {
		hv, wv := hs[rows[i]], ws[cols[i]]
		hf, wf := int(hv), int(wv)
		hc, wc := min(hf+1, side-1), min(wf+1, side-1)
		dh, dw := hv-float64(hf), wv-float64(wf)
		idx := [4]int{hf*side + wf, hf*side + wc, hc*side + wf, hc*side + wc}
		wt := [4]float64{(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw}
		for c := 0; c < vh; c++ {
			for q := range 4 {
				x[i*vh+c] += wt[q] * pe[idx[q]*vh+c]
			}
		}
	}
	// Qwen3VLVisionRotaryEmbedding(head_dim/2): row angles then column angles, rotate_half.
	dim := hd / 2
	rope := func(vec []float64, i int) {
		for j := 0; j < dim; j++ {
			var ang float64
			if j < dim/2 {
				ang = float64(rows[i]) * math.Pow(10000, -float64(2*j)/float64(dim))
			} else {
				ang = float64(cols[i]) * math.Pow(10000, -float64(2*(j-dim/2))/float64(dim))
			}
			s, c := math.Sincos(ang)
			a, b := vec[j], vec[j+dim]
			vec[j], vec[j+dim] = a*c-b*s, b*c+a*s
		}
	}
	merger := func(p string, x []float64, post bool) []float64 {
		M := vh * m * m
		var y []float64
		if post {
			y = layerNorm(x, M, w.get(t, p+"norm.weight", M), w.get(t, p+"norm.bias", M), 1e-6)
		} else {
			y = layerNorm(x, vh, w.get(t, p+"norm.weight", vh), w.get(t, p+"norm.bias", vh), 1e-6)
		}
		h := linear(y, n/(m*m), M, w.get(t, p+"linear_fc1.weight", M*M), M, w.get(t, p+"linear_fc1.bias", M))
		for i := range h {
			h[i] = geluExact(h[i])
		}
		E := r.c.Text.Hidden
		return linear(h, n/(m*m), M, w.get(t, p+"linear_fc2.weight", E*M), E, w.get(t, p+"linear_fc2.bias", E))
	}
	geluTanh := func(x float64) float64 {
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	}
	var deep [][]float64
	for l := 0; l < v.Depth; l++ {
		p := fmt.Sprintf("%sblocks.%d.", pre, l)
		a := layerNorm(x, vh, w.get(t, p+"norm1.weight", vh), w.get(t, p+"norm1.bias", vh), 1e-6)
		qkv := linear(a, n, vh, w.get(t, p+"attn.qkv.weight", 3*vh*vh), 3*vh, w.get(t, p+"attn.qkv.bias", 3*vh))
		q, k, vv := make([]float64, n*vh), make([]float64, n*vh), make([]float64, n*vh)
		for i := 0; i < n; i++ {
			copy(q[i*vh:], qkv[i*3*vh:i*3*vh+vh])
			copy(k[i*vh:], qkv[i*3*vh+vh:i*3*vh+2*vh])
			copy(vv[i*vh:], qkv[i*3*vh+2*vh:i*3*vh+3*vh])
			for h := 0; h < v.Heads; h++ {
				rope(q[i*vh+h*hd:i*vh+(h+1)*hd], i)
				rope(k[i*vh+h*hd:i*vh+(h+1)*hd], i)
			}
		}
		att := attention(q, k, vv, n, v.Heads, v.Heads, hd, false)
		o := linear(att, n, vh, w.get(t, p+"attn.proj.weight", vh*vh), vh, w.get(t, p+"attn.proj.bias", vh))
		for i := range x {
			x[i] += o[i]
		}
		b := layerNorm(x, vh, w.get(t, p+"norm2.weight", vh), w.get(t, p+"norm2.bias", vh), 1e-6)
		f := linear(b, n, vh, w.get(t, p+"mlp.linear_fc1.weight", v.Inter*vh), v.Inter, w.get(t, p+"mlp.linear_fc1.bias", v.Inter))
		for i := range f {
			f[i] = geluTanh(f[i])
		}
		d := linear(f, n, v.Inter, w.get(t, p+"mlp.linear_fc2.weight", vh*v.Inter), vh, w.get(t, p+"mlp.linear_fc2.bias", vh))
		for i := range x {
			x[i] += d[i]
		}
		if k := slices.Index(v.Deepstack, l); k >= 0 {
			deep = append(deep, merger(fmt.Sprintf("%sdeepstack_merger_list.%d.", pre, k), x, true))
		}
	}
	return merger(pre+"merger.", x, false), deep
}

// lastLogits is Qwen3VLTextModel + the tied head over ids: the image placeholder rows replaced,
// in order, by embeds; interleaved M-RoPE on positions pos (apply_interleaved_mrope: frequency
// j takes the height position when j%3 == 1 and j < 3*section[1], the width position when j%3
// == 2 and j < 3*section[2], else the temporal one); DeepStack feature l added to the image rows
// after decoder layer l. It returns the logits of the positions in at.
func (r *qwen3VLRef) logits(t *testing.T, ids []int32, embeds []float64, deep [][]float64, pos [3][]int, at []int) [][]float64 {
	t.Helper()
	c, w := r.c.Text, r.w
	E, hd, n := c.Hidden, c.HeadDim, len(ids)
	m := "model.language_model."
	tok := w.get(t, m+"embed_tokens.weight", c.Vocab*E)
	x := make([]float64, n*E)
	var imageRows []int
	for i, id := range ids {
		if id == r.c.ImageTokenID {
			k := len(imageRows)
			copy(x[i*E:(i+1)*E], embeds[k*E:(k+1)*E])
			imageRows = append(imageRows, i)
		} else {
			copy(x[i*E:(i+1)*E], tok[int(id)*E:(int(id)+1)*E])
		}
	}
	if len(imageRows)*E != len(embeds) {
		t.Fatalf("reference: %d image tokens for %d image rows", len(imageRows), len(embeds)/E)
	}
	sec := c.RopeScaled.Section
	axis := func(j int) int {
		switch {
		case j%3 == 1 && j < 3*sec[1]:
			return 1
		case j%3 == 2 && j < 3*sec[2]:
			return 2
		}
		return 0
	}
	rope := func(v []float64, nh int) {
		for i := 0; i < n; i++ {
			for h := 0; h < nh; h++ {
				rr := v[(i*nh+h)*hd : (i*nh+h+1)*hd]
				for j := 0; j < hd/2; j++ {
					ang := float64(pos[axis(j)][i]) * math.Pow(c.RopeTheta, -float64(2*j)/float64(hd))
					s, co := math.Sincos(ang)
					a, b := rr[j], rr[j+hd/2]
					rr[j], rr[j+hd/2] = a*co-b*s, b*co+a*s
				}
			}
		}
	}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("%slayers.%d.", m, l)
		a := rmsNormRef(x, E, w.get(t, p+"input_layernorm.weight", E), c.RMSEps)
		q := linear(a, n, E, w.get(t, p+"self_attn.q_proj.weight", c.Heads*hd*E), c.Heads*hd, nil)
		k := linear(a, n, E, w.get(t, p+"self_attn.k_proj.weight", c.KVHeads*hd*E), c.KVHeads*hd, nil)
		v := linear(a, n, E, w.get(t, p+"self_attn.v_proj.weight", c.KVHeads*hd*E), c.KVHeads*hd, nil)
		q = rmsNormRef(q, hd, w.get(t, p+"self_attn.q_norm.weight", hd), c.RMSEps)
		k = rmsNormRef(k, hd, w.get(t, p+"self_attn.k_norm.weight", hd), c.RMSEps)
		rope(q, c.Heads)
		rope(k, c.KVHeads)
		att := attention(q, k, v, n, c.Heads, c.KVHeads, hd, true)
		o := linear(att, n, c.Heads*hd, w.get(t, p+"self_attn.o_proj.weight", E*c.Heads*hd), E, nil)
		for i := range x {
			x[i] += o[i]
		}
		b := rmsNormRef(x, E, w.get(t, p+"post_attention_layernorm.weight", E), c.RMSEps)
		g := linear(b, n, E, w.get(t, p+"mlp.gate_proj.weight", c.Inter*E), c.Inter, nil)
		u := linear(b, n, E, w.get(t, p+"mlp.up_proj.weight", c.Inter*E), c.Inter, nil)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := linear(g, n, c.Inter, w.get(t, p+"mlp.down_proj.weight", E*c.Inter), E, nil)
		for i := range x {
			x[i] += d[i]
		}
		if l < len(deep) {
			for k, row := range imageRows {
				for j := 0; j < E; j++ {
					x[row*E+j] += deep[l][k*E+j]
				}
			}
		}
	}
	var out [][]float64
	for _, i := range at {
		h := rmsNormRef(x[i*E:(i+1)*E], E, w.get(t, m+"norm.weight", E), c.RMSEps)
		out = append(out, linear(h, 1, E, tok, c.Vocab, nil))
	}
	return out
}

// TestQwen3VLRopeIndexByHand: the reference's get_rope_index on two images, against positions
// worked out by hand from transformers' loop. The prompt: a, <vision_start>, image 1 (grid
// (1, 4, 6): merged 2 x 3 = 6 tokens), <vision_end>, b, <vision_start>, image 2 (grid (1, 8, 4):
// merged 4 x 2 = 8 tokens), <vision_end>, d; 21 ids.
//
//	text a, vs        st_idx 0           -> 0, 1 on all axes
//	image 1           start 0 + 2 = 2    -> t 2, h 2 + row (0..1), w 2 + col (0..2)
//	text ve, b, vs    st_idx max(4) + 1  -> 5, 6, 7
//	image 2           start 5 + 3 = 8    -> t 8, h 8 + row (0..3), w 8 + col (0..1)
//	text ve, d        st_idx max(11) + 1 -> 12, 13
//
// delta = 13 + 1 - 21 = -7. Image 2 starting at image 1's start (2) or taking image 1's grid
// would move every position from index 11 on.
func TestQwen3VLRopeIndexByHand(t *testing.T) {
	const img, vs, ve, a, b, d = 151655, 151652, 151653, 64, 65, 67
	ids := []int32{a, vs}
	for range 6 {
		ids = append(ids, img)
	}
	ids = append(ids, ve, b, vs)
	for range 8 {
		ids = append(ids, img)
	}
	ids = append(ids, ve, d)
	pos, delta := ropeIndex(ids, img, vs, [][3]int{{1, 4, 6}, {1, 8, 4}}, 2)
	want := [3][]int{
		{0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8, 12, 13},
		{0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 13},
		{0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 8, 9, 8, 9, 8, 9, 12, 13},
	}
	for x, name := range []string{"temporal", "height", "width"} {
		if !slices.Equal(pos[x], want[x]) {
			t.Errorf("%s positions\n got  %v\n want %v", name, pos[x], want[x])
		}
	}
	if delta != -7 {
		t.Errorf("rope delta %d, want -7", delta)
	}
}

// TestQwen3VLRopeIndexMatchesGolden: the reference's get_rope_index equals the positions
// transformers 5.17 recorded for the ten one-image corpus prompts (fixtures/golden/qwen3vl-tiny.json),
// so the two-image comparison below rests on a rope index already held to transformers.
func TestQwen3VLRopeIndexMatchesGolden(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Entries []struct {
			Name      string
			Grid      [3]int  `json:"grid_thw"`
			PromptIDs []int32 `json:"prompt_ids"`
			RopePos   [][]int `json:"rope_positions"`
			RopeDelta int     `json:"rope_delta"`
		}
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range g.Entries {
		if len(e.RopePos) != 3 {
			continue
		}
		pos, delta := ropeIndex(e.PromptIDs, 151655, 151652, [][3]int{e.Grid}, 2)
		for x := range 3 {
			if !slices.Equal(pos[x], e.RopePos[x]) {
				t.Errorf("%s: axis %d positions differ from transformers'\n got  %v\n want %v", e.Name, x, pos[x], e.RopePos[x])
			}
		}
		if delta != e.RopeDelta {
			t.Errorf("%s: rope delta %d, transformers %d", e.Name, delta, e.RopeDelta)
		}
		checked++
	}
	if checked != len(g.Entries) || checked == 0 {
		t.Fatalf("golden: %d of %d entries carry rope_positions", checked, len(g.Entries))
	}
}

// twoImagePrompt is a chat prompt with text before, between and after two images, each framed
// by <|vision_start|> ... <|vision_end|> with its merged token count of <|image_pad|>.
func twoImagePrompt(first, second int) []int32 {
	const img, vs, ve = 151655, 151652, 151653
	ids := []int32{151644, 872, 198, 5338, 6802, 25, vs} // <|im_start|>user\nFirst picture:
	for range first {
		ids = append(ids, img)
	}
	ids = append(ids, ve, 15666, 6802, 25, vs) // Second picture:
	for range second {
		ids = append(ids, img)
	}
	return append(ids, ve, 23085, 825, 702, 12463, 30, 151645, 198, 151644, 77091, 198)
}

// qwen3VLPair is the two corpus images of the comparison: 300x200 (grid 12x18, 54 tokens) and
// 96x130 gray (grid 8x6, 12 tokens), different sizes and aspect ratios.
func qwen3VLPair(t *testing.T) (a, b *Result) {
	t.Helper()
	root, g, cfg := loadGolden(t)
	a, _ = pixelsFor(t, root, cfg, g.Entries[1].Name, g.Entries[1].Image, g.Entries[1].RGBSHA256)
	b, _ = pixelsFor(t, root, cfg, g.Entries[3].Name, g.Entries[3].Image, g.Entries[3].RGBSHA256)
	if a.Grid == b.Grid {
		t.Fatalf("the pair must differ in size: both grids %v", a.Grid)
	}
	return a, b
}

// referencePair is the float64 reference's logits for the two-image prompt at positions at.
func referencePair(t *testing.T, r *qwen3VLRef, a, b *Result, ids []int32, at []int) [][]float64 {
	ea, da := r.vision(t, a.Pixels, a.Grid)
	eb, db := r.vision(t, b.Pixels, b.Grid)
	deep := make([][]float64, len(da))
	for l := range da {
		deep[l] = append(append([]float64{}, da[l]...), db[l]...)
	}
	pos, _ := ropeIndex(ids, r.c.ImageTokenID, r.c.VisionStartTokenID, [][3]int{a.Grid, b.Grid}, r.c.Vision.Merge)
	return r.logits(t, ids, append(ea, eb...), deep, pos, at)
}

// pairDiff is the largest |native - reference| logit over the positions at.
func pairDiff(e *native.Engine, lg []float32, want [][]float64, at []int) (float64, int, int) {
	V := e.Info().VocabSize
	worst, wp, wt := 0.0, 0, 0
	for k, p := range at {
		for i, v := range want[k] {
			if d := math.Abs(float64(lg[p*V+i]) - v); d > worst {
				worst, wp, wt = d, p, i
			}
		}
	}
	return worst, wp, wt
}

// TestQwen3VLTwoImagesMatchFloat64Reference: the native engine's logits on a prompt with two
// images of different sizes and text between them equal the float64 reference's within
// logitTolerance, at the token before the second image, the first token after it and the last.
// Swapping the images (the 12-token image first) must hold as well.
func TestQwen3VLTwoImagesMatchFloat64Reference(t *testing.T) {
	r := loadQwen3VLRef(t)
	a, b := qwen3VLPair(t)
	e := openTiny(t)
	for _, tc := range []struct {
		name   string
		first  *Result
		second *Result
	}{{"300x200 then 96x130", a, b}, {"96x130 then 300x200", b, a}} {
		ids := twoImagePrompt(tc.first.Tokens, tc.second.Tokens)
		before := slices.Index(ids[7+tc.first.Tokens:], 151652) + 7 + tc.first.Tokens // the second <|vision_start|>
		at := []int{before, before + tc.second.Tokens + 1, len(ids) - 1}
		want := referencePair(t, r, tc.first, tc.second, ids, at)
		lg, err := e.LogitsImages(ids, []*native.Image{{Pixels: tc.first.Pixels, Grid: tc.first.Grid}, {Pixels: tc.second.Pixels, Grid: tc.second.Grid}})
		if err != nil {
			t.Fatal(err)
		}
		worst, p, tok := pairDiff(e, lg, want, at)
		if worst > logitTolerance {
			t.Errorf("%s: native vs float64 reference max |Δlogit| %.3g at position %d token %d", tc.name, worst, p, tok)
		}
		t.Logf("%s (%d ids, %d + %d image tokens): native vs float64 reference max |Δlogit| %.3g", tc.name, len(ids), tc.first.Tokens, tc.second.Tokens, worst)
	}
	// Decoding after two images (the KV cache, positions at cache position + rope delta): three
	// greedy tokens, each the reference's argmax over the prompt and the tokens before it.
	ids := twoImagePrompt(a.Tokens, b.Tokens)
	id, err := e.AddImages(ids, []*native.Image{{Pixels: a.Pixels, Grid: a.Grid}, {Pixels: b.Pixels, Grid: b.Grid}}, native.Sampling{MaxNewTokens: 3, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			if ev.Seq == id && ev.Token >= 0 {
				got = append(got, ev.Token)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 3 {
		t.Fatalf("decoded %d tokens, want 3", len(got))
	}
	all := append(append([]int32{}, ids...), got[:2]...)
	want := referencePair(t, r, a, b, all, []int{len(ids) - 1, len(ids), len(ids) + 1})
	for s, row := range want {
		best := 0
		for i, v := range row {
			if v > row[best] {
				best = i
			}
		}
		if int32(best) != got[s] {
			t.Errorf("decode step %d after two images: engine token %d, reference argmax %d", s, got[s], best)
		}
	}
}

// TestQwen3VLTwoImageFaultsBreakReference proves the comparison bites on defects only several
// images expose: the second image's positions starting where the first image's started
// (qwen3vl.shared_image_start), and the two images' patches attending to each other in the
// tower (qwen3vl.joint_vision). Each moves the logits past the tolerance.
func TestQwen3VLTwoImageFaultsBreakReference(t *testing.T) {
	r := loadQwen3VLRef(t)
	a, b := qwen3VLPair(t)
	ids := twoImagePrompt(a.Tokens, b.Tokens)
	at := []int{len(ids) - 1}
	want := referencePair(t, r, a, b, ids, at)
	for _, f := range []string{"qwen3vl.shared_image_start", "qwen3vl.joint_vision"} {
		t.Run(f, func(t *testing.T) {
			t.Setenv("MODELQUAL_FAULTS", f)
			e := openTiny(t)
			lg, err := e.LogitsImages(ids, []*native.Image{{Pixels: a.Pixels, Grid: a.Grid}, {Pixels: b.Pixels, Grid: b.Grid}})
			if err != nil {
				t.Fatal(err)
			}
			worst, _, _ := pairDiff(e, lg, want, at)
			if worst <= logitTolerance {
				t.Fatalf("with %s the two-image logits still match the reference (max |Δ| %.3g)", f, worst)
			}
			t.Logf("%s: max |Δlogit| %.3g", f, worst)
		})
	}
}

// TestQwen3VLSeveralImagesRefusals: the engine refuses a list whose placeholder runs disagree
// with it (one run for two images, a run of the wrong length) naming the run and the image, and
// a valid two-image request still decodes after.
func TestQwen3VLSeveralImagesRefusals(t *testing.T) {
	a, b := qwen3VLPair(t)
	e := openTiny(t)
	ims := []*native.Image{{Pixels: a.Pixels, Grid: a.Grid}, {Pixels: b.Pixels, Grid: b.Grid}}
	one := twoImagePrompt(a.Tokens, 0)
	if _, err := e.AddImages(one, ims, native.Sampling{MaxNewTokens: 1}); err == nil {
		t.Fatal("one placeholder run for two images was accepted")
	} else {
		t.Logf("one run for two images: %v", err)
	}
	swapped := twoImagePrompt(b.Tokens, a.Tokens)
	if _, err := e.AddImages(swapped, ims, native.Sampling{MaxNewTokens: 1}); err == nil {
		t.Fatal("runs of the other image's lengths were accepted")
	} else {
		t.Logf("runs swapped: %v", err)
	}
	id, err := e.AddImages(twoImagePrompt(a.Tokens, b.Tokens), ims, native.Sampling{MaxNewTokens: 3, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			if ev.Seq == id && ev.Token >= 0 {
				n++
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n != 3 {
		t.Fatalf("valid two-image request after refusals produced %d tokens, want 3", n)
	}
}

// TestImageListRefusedByOneImageEngine: an engine whose model takes one image per sequence
// (internvl's, whose images stack into one grid instead) refuses a list of two, naming the
// server's --max-images-per-request, rather than misplacing the second image. (The CUDA
// backend takes a list for both vision families: its internvl model stacks the list's tiles.)
func TestImageListRefusedByOneImageEngine(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := internVLProcessor(t)
	r, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/09-gray-300x300.png"))
	e := openInternVL(t)
	im := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
	_, err = e.AddImages(internVLPrompt(r.Tokens), []*native.Image{im, im}, native.Sampling{MaxNewTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "--max-images-per-request 1") {
		t.Fatalf("two images to internvl's engine as a list: %v; want a refusal naming --max-images-per-request", err)
	}
	t.Log(err)
}

// TestQwen3VLPairsMatchTransformers holds the engine and the reference's rope index to
// transformers 5.17 on the two-image requests of families/qwen3vl/corpus-pairs.jsonl
// (fixtures/golden/qwen3vl-tiny-pairs.json, made on the GPU host): every image's grid and token
// count from the processor here, the 3-axis positions and delta of get_rope_index, and the
// engine's first-step top-20 logits and 32 greedy tokens on transformers' own prompt ids. It
// skips, saying so, until the golden exists.
func TestQwen3VLPairsMatchTransformers(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny-pairs.json")
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		t.Skip("NO GOLDEN: " + path + " is missing; make it with fixtures/golden/run_qwen3vl_pairs_golden.sh on the GPU host")
	}
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Pairs []struct {
			Name     string
			Error    string
			PerImage []struct {
				Image       string
				RGBSHA256   string `json:"rgb_sha256"`
				Grid        [3]int `json:"grid_thw"`
				ImageTokens int    `json:"image_tokens"`
			} `json:"per_image"`
			PromptIDs        []int32   `json:"prompt_ids"`
			RopePositions    [][]int   `json:"rope_positions"`
			RopeDelta        int       `json:"rope_delta"`
			GreedyIDs        []int32   `json:"greedy_ids"`
			FirstTop20IDs    []int32   `json:"first_top20_ids"`
			FirstTop20Logits []float64 `json:"first_top20_logits"`
			Steps            []struct {
				Top5IDs    []int32   `json:"top5_ids"`
				Top5Logits []float64 `json:"top5_logits"`
			} `json:"steps"`
		} `json:"pairs"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Pairs) == 0 {
		t.Fatal("the pairs golden holds no pairs")
	}
	_, _, cfg := loadGolden(t)
	e := openTiny(t)
	V := e.Info().VocabSize
	for _, p := range g.Pairs {
		t.Run(p.Name, func(t *testing.T) {
			if p.Error != "" {
				t.Fatalf("transformers failed: %s", p.Error)
			}
			var ims []*native.Image
			var grids [][3]int
			for k, pi := range p.PerImage {
				r, _ := pixelsFor(t, root, cfg, p.Name, pi.Image, pi.RGBSHA256)
				if r.Grid != pi.Grid || r.Tokens != pi.ImageTokens {
					t.Fatalf("image %d: grid %v, %d tokens; transformers %v, %d", k, r.Grid, r.Tokens, pi.Grid, pi.ImageTokens)
				}
				ims = append(ims, &native.Image{Pixels: r.Pixels, Grid: r.Grid})
				grids = append(grids, r.Grid)
			}
			pos, delta := ropeIndex(p.PromptIDs, 151655, 151652, grids, 2)
			for x := range 3 {
				if len(p.RopePositions) != 3 || !slices.Equal(pos[x], p.RopePositions[x]) {
					t.Errorf("axis %d positions differ from transformers' get_rope_index", x)
				}
			}
			if delta != p.RopeDelta {
				t.Errorf("rope delta %d, transformers %d", delta, p.RopeDelta)
			}
			all := append(append([]int32{}, p.PromptIDs...), p.GreedyIDs[:len(p.GreedyIDs)-1]...)
			lg, err := e.LogitsImages(all, ims)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			last := (len(p.PromptIDs) - 1) * V
			for j, id := range p.FirstTop20IDs {
				worst = math.Max(worst, math.Abs(float64(lg[last+int(id)])-p.FirstTop20Logits[j]))
			}
			for s, st := range p.Steps {
				row := (len(p.PromptIDs) - 1 + s) * V
				for j, id := range st.Top5IDs {
					worst = math.Max(worst, math.Abs(float64(lg[row+int(id)])-st.Top5Logits[j]))
				}
			}
			if worst > logitTolerance {
				t.Errorf("logits differ from transformers' by %.3g (bound %.3g)", worst, logitTolerance)
			}
			id, err := e.AddImages(p.PromptIDs, ims, native.Sampling{MaxNewTokens: len(p.GreedyIDs), IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			var got []int32
			for e.Active() > 0 {
				if _, err := e.Step(func(ev native.Event) {
					if ev.Seq == id && ev.Token >= 0 {
						got = append(got, ev.Token)
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(got, p.GreedyIDs) {
				t.Errorf("greedy tokens %v, transformers %v", got, p.GreedyIDs)
			}
			t.Logf("grids %v: positions and delta as transformers', logits max |Δ| %.3g over %d steps, greedy %d/%d", grids, worst, len(p.Steps), len(got), len(p.GreedyIDs))
		})
	}
}
