// Package reference is the qwen3moe family's own forward pass: Qwen3MoeForCausalLM in float64
// on gonum, written from the architecture's definition (the Qwen3 technical report's MoE
// models, the Hugging Face Qwen3MoeConfig and the Switch/Mixtral-style top-k router it
// describes), not from the native engine's code, so that the parity and routing gates compare
// two independent implementations.
//
// The architecture: token embedding; per layer a pre-RMSNorm grouped-query self-attention with
// per-head q/k RMSNorm and rotate_half RoPE (Qwen3's); then a pre-RMSNorm feed-forward that is,
// in a sparse layer, a mixture of experts: router logits r = x·Gᵀ (no bias), p = softmax(r)
// over all experts, the k largest p (num_experts_per_tok), divided by their sum when
// norm_topk_prob, and y = Σ p_e·down_e(silu(gate_e(x))·up_e(x)) over those experts; in a dense
// layer (listed in mlp_only_layers, or not a multiple of decoder_sparse_step) one SwiGLU MLP.
// A final RMSNorm and an LM head, tied to the embedding or not.
//
// Both checkpoint layouts load: per-expert mlp.experts.<e>.{gate,up,down}_proj.weight (the
// published Qwen3-MoE checkpoints) and transformers 5's fused mlp.experts.gate_up_proj
// [experts, 2·width, hidden] (each expert's gate rows, then its up rows) and
// mlp.experts.down_proj [experts, hidden, width].
package reference

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/families/internal/safetensors"
)

// Config is the subset of a Qwen3-MoE config.json the forward pass reads.
type Config struct {
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	IntermediateSize      int     `json:"intermediate_size"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	NumKeyValueHeads      int     `json:"num_key_value_heads"`
	HeadDim               int     `json:"head_dim"`
	RMSNormEps            float64 `json:"rms_norm_eps"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	TieWordEmbeddings     bool    `json:"tie_word_embeddings"`
	AttentionBias         bool    `json:"attention_bias"`
	HiddenAct             string  `json:"hidden_act"`
	UseSlidingWindow      bool    `json:"use_sliding_window"`
	RopeTheta             float64 `json:"rope_theta"`
	RopeParameters        *rope   `json:"rope_parameters"`
	RopeScaling           *rope   `json:"rope_scaling"`
	// The mixture of experts.
	NumExperts        int   `json:"num_experts"`
	NumExpertsPerTok  int   `json:"num_experts_per_tok"`
	MoeIntermediate   int   `json:"moe_intermediate_size"`
	NormTopKProb      bool  `json:"norm_topk_prob"`
	DecoderSparseStep int   `json:"decoder_sparse_step"`
	MLPOnlyLayers     []int `json:"mlp_only_layers"`
}

type rope struct {
	RopeType  string  `json:"rope_type"`
	Type      string  `json:"type"`
	RopeTheta float64 `json:"rope_theta"`
}

// Sparse reports whether layer l's feed-forward is the mixture of experts.
func (c Config) Sparse(l int) bool {
	return !slices.Contains(c.MLPOnlyLayers, l) && c.NumExperts > 0 && (l+1)%c.DecoderSparseStep == 0
}

type expert struct{ gate, up, down numeric.Matrix }

type layer struct {
	inputNorm, postNorm []float64
	q, k, v, o          numeric.Matrix
	qBias, kBias, vBias []float64
	qNorm, kNorm        []float64
	gate, up, down      numeric.Matrix // dense layers
	router              numeric.Matrix // sparse layers: experts × hidden
	experts             []expert
}

// Model is a loaded Qwen3-MoE checkpoint, safe for concurrent use (every call builds its own
// caches).
type Model struct {
	numeric.Decoder
	Config  Config
	Dir     string
	embed   numeric.Matrix
	head    numeric.Matrix
	layers  []layer
	norm    []float64
	invFreq []float64
}

// Load reads config.json and the safetensors weights (one model.safetensors, or the shards a
// model.safetensors.index.json names) of a checkpoint directory.
func Load(dir string) (*Model, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("qwen3moe reference: read config: %w; pass a checkpoint directory with config.json and model.safetensors", err)
	}
	c := Config{DecoderSparseStep: 1, NumExperts: 128, NumExpertsPerTok: 8, MoeIntermediate: 768} // Qwen3MoeConfig's defaults
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("qwen3moe reference: config.json: %w", err)
	}
	if err := c.resolve(); err != nil {
		return nil, fmt.Errorf("qwen3moe reference: config.json: %w", err)
	}
	files, err := openWeights(dir)
	if err != nil {
		return nil, fmt.Errorf("qwen3moe reference: %w", err)
	}
	m := &Model{Config: c, Dir: dir}
	if err := m.loadWeights(files); err != nil {
		return nil, fmt.Errorf("qwen3moe reference: %w", err)
	}
	m.Decoder = numeric.Decoder{Name: "qwen3moe reference", Session: func() numeric.Forward { return m.session(nil) }, Head: m.lmHead, MaxPositions: c.MaxPositionEmbeddings}
	m.invFreq = make([]float64, c.HeadDim/2)
	for i := range m.invFreq {
		m.invFreq[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
	}
	return m, nil
}

func (c *Config) resolve() error {
	for _, rp := range []*rope{c.RopeParameters, c.RopeScaling} {
		if rp == nil {
			continue
		}
		kind := rp.RopeType
		if kind == "" {
			kind = rp.Type
		}
		if kind != "" && kind != "default" {
			return fmt.Errorf("rope type %q: this reference implements default RoPE only", kind)
		}
		if rp.RopeTheta != 0 {
			c.RopeTheta = rp.RopeTheta
		}
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	switch {
	case c.VocabSize <= 0 || c.HiddenSize <= 0 || c.NumHiddenLayers <= 0:
		return fmt.Errorf("vocab_size %d, hidden_size %d and num_hidden_layers %d must be positive", c.VocabSize, c.HiddenSize, c.NumHiddenLayers)
	case c.NumAttentionHeads <= 0 || c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return fmt.Errorf("num_attention_heads %d must be a positive multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d must be positive and even", c.HeadDim)
	case c.RopeTheta <= 0:
		return fmt.Errorf("rope_theta %v must be positive", c.RopeTheta)
	case c.HiddenAct != "" && c.HiddenAct != "silu":
		return fmt.Errorf("hidden_act %q: this reference implements silu only", c.HiddenAct)
	case c.UseSlidingWindow:
		return fmt.Errorf("use_sliding_window true is not implemented by this reference")
	case c.DecoderSparseStep < 1:
		return fmt.Errorf("decoder_sparse_step %d must be at least 1", c.DecoderSparseStep)
	case c.NumExperts > 0 && (c.NumExpertsPerTok < 1 || c.NumExpertsPerTok > c.NumExperts):
		return fmt.Errorf("num_experts_per_tok %d must be in 1..num_experts %d", c.NumExpertsPerTok, c.NumExperts)
	}
	return nil
}

// files is a checkpoint's safetensors files, looked up by tensor name.
type files []*safetensors.File

func openWeights(dir string) (files, error) {
	names := []string{"model.safetensors"}
	if raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &ix); err != nil {
			return nil, fmt.Errorf("model.safetensors.index.json: %w", err)
		}
		names = names[:0]
		for _, f := range ix.WeightMap {
			if !slices.Contains(names, f) {
				names = append(names, f)
			}
		}
		sort.Strings(names)
	}
	var out files
	for _, n := range names {
		f, err := safetensors.Open(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func (fs files) find(name string) *safetensors.File {
	for _, f := range fs {
		if f.Has(name) {
			return f
		}
	}
	return nil
}

// reader reads tensors by name, with or without the Qwen3MoeModel prefix, keeping the first
// error.
type reader struct {
	fs  files
	err error
}

func (r *reader) get(name string, shape ...int) []float64 {
	if r.err != nil {
		return nil
	}
	full := name
	if r.fs.find(full) == nil {
		if alt, ok := cutPrefix(name, "model."); ok && r.fs.find(alt) != nil {
			full = alt
		}
	}
	f := r.fs.find(full)
	if f == nil {
		r.err = fmt.Errorf("tensor %q missing; the checkpoint does not match its config.json", name)
		return nil
	}
	t, err := f.Get(full, shape...)
	if err != nil {
		r.err = err
		return nil
	}
	return t.Data
}

func (r *reader) has(name string) bool {
	alt, _ := cutPrefix(name, "model.")
	return r.fs.find(name) != nil || r.fs.find(alt) != nil
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return s, false
}

func (r *reader) mat(name string, rows, cols int) numeric.Matrix {
	return numeric.Matrix{Rows: rows, Cols: cols, Data: r.get(name, rows, cols)}
}

func (m *Model) loadWeights(fs files) error {
	c := m.Config
	D, V, I, MI, NE := c.HiddenSize, c.VocabSize, c.IntermediateSize, c.MoeIntermediate, c.NumExperts
	H, KV, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	r := &reader{fs: fs}
	m.embed = r.mat("model.embed_tokens.weight", V, D)
	m.head = m.embed
	if !c.TieWordEmbeddings {
		m.head = r.mat("lm_head.weight", V, D)
	}
	for l := 0; l < c.NumHiddenLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := layer{
			inputNorm: r.get(p+"input_layernorm.weight", D),
			postNorm:  r.get(p+"post_attention_layernorm.weight", D),
			q:         r.mat(p+"self_attn.q_proj.weight", H*hd, D),
			k:         r.mat(p+"self_attn.k_proj.weight", KV*hd, D),
			v:         r.mat(p+"self_attn.v_proj.weight", KV*hd, D),
			o:         r.mat(p+"self_attn.o_proj.weight", D, H*hd),
			qNorm:     r.get(p+"self_attn.q_norm.weight", hd),
			kNorm:     r.get(p+"self_attn.k_norm.weight", hd),
		}
		if c.AttentionBias {
			ly.qBias = r.get(p+"self_attn.q_proj.bias", H*hd)
			ly.kBias = r.get(p+"self_attn.k_proj.bias", KV*hd)
			ly.vBias = r.get(p+"self_attn.v_proj.bias", KV*hd)
		}
		if !c.Sparse(l) {
			ly.gate = r.mat(p+"mlp.gate_proj.weight", I, D)
			ly.up = r.mat(p+"mlp.up_proj.weight", I, D)
			ly.down = r.mat(p+"mlp.down_proj.weight", D, I)
			m.layers = append(m.layers, ly)
			continue
		}
		ly.router = r.mat(p+"mlp.gate.weight", NE, D)
		if r.has(p + "mlp.experts.gate_up_proj") {
			gu := r.get(p+"mlp.experts.gate_up_proj", NE, 2*MI, D)
			dn := r.get(p+"mlp.experts.down_proj", NE, D, MI)
			for e := 0; e < NE && r.err == nil; e++ {
				g := gu[e*2*MI*D : (e*2+1)*MI*D]
				u := gu[(e*2+1)*MI*D : (e+1)*2*MI*D]
				ly.experts = append(ly.experts, expert{
					gate: numeric.Matrix{Rows: MI, Cols: D, Data: g},
					up:   numeric.Matrix{Rows: MI, Cols: D, Data: u},
					down: numeric.Matrix{Rows: D, Cols: MI, Data: dn[e*D*MI : (e+1)*D*MI]},
				})
			}
		} else {
			for e := 0; e < NE; e++ {
				x := fmt.Sprintf("%smlp.experts.%d.", p, e)
				ly.experts = append(ly.experts, expert{
					gate: r.mat(x+"gate_proj.weight", MI, D),
					up:   r.mat(x+"up_proj.weight", MI, D),
					down: r.mat(x+"down_proj.weight", D, MI),
				})
			}
		}
		m.layers = append(m.layers, ly)
	}
	m.norm = r.get("model.norm.weight", D)
	return r.err
}

// VocabSize is the number of logits per position.
func (m *Model) VocabSize() int { return m.Config.VocabSize }

// MaxContext is max_position_embeddings.
func (m *Model) MaxContext() int { return m.Config.MaxPositionEmbeddings }

// Route is one sparse layer's routing of a sequence: for every token, the chosen experts in
// descending probability and their weights (renormalised when norm_topk_prob).
type Route struct {
	Layer   int
	Experts [][]int
	Weights [][]float64
}

// Routes runs ids through the model and returns every sparse layer's routing of them.
func (m *Model) Routes(ids []int32) ([]Route, error) {
	var out []Route
	fwd := m.session(func(r Route) { out = append(out, r) })
	if _, err := fwd(ids, true); err != nil {
		return nil, err
	}
	return out, nil
}

// ExpertCounts is how many of ids' tokens each sparse layer sends to each expert (a token's k
// choices count once each): counts[layer][expert], nil rows for dense layers.
func (m *Model) ExpertCounts(ids []int32) ([][]uint64, error) {
	rs, err := m.Routes(ids)
	if err != nil {
		return nil, err
	}
	out := make([][]uint64, m.Config.NumHiddenLayers)
	for _, r := range rs {
		out[r.Layer] = make([]uint64, m.Config.NumExperts)
		for _, es := range r.Experts {
			for _, e := range es {
				out[r.Layer][e]++
			}
		}
	}
	return out, nil
}

func rmsNorm(data []float64, width int, w []float64, eps float64) {
	for s := 0; s < len(data); s += width {
		r := data[s : s+width]
		ms := 0.0
		for _, v := range r {
			ms += v * v
		}
		inv := 1 / math.Sqrt(ms/float64(width)+eps)
		for j := range r {
			r[j] = r[j] * inv * w[j]
		}
	}
}

// rope rotates every head of row in the rotate_half form (Su et al. 2021, as transformers
// writes it).
func (m *Model) rope(row []float64, pos int) {
	hd := m.Config.HeadDim
	half := hd / 2
	for s := 0; s < len(row); s += hd {
		h := row[s : s+hd]
		for j := 0; j < half; j++ {
			sin, cos := math.Sincos(float64(pos) * m.invFreq[j])
			x1, x2 := h[j], h[j+half]
			h[j] = x1*cos - x2*sin
			h[j+half] = x2*cos + x1*sin
		}
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func swiglu(h, gate, up, down numeric.Matrix) numeric.Matrix {
	g := numeric.MulT(h, gate, nil)
	u := numeric.MulT(h, up, nil)
	for i := range g.Data {
		g.Data[i] = silu(g.Data[i]) * u.Data[i]
	}
	return numeric.MulT(g, down, nil)
}

// topK returns the indices of the k largest p, largest first (lowest index among equals).
func topK(p []float64, k int) []int {
	idx := make([]int, len(p))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	return idx[:k]
}

// moe is the sparse feed-forward over the rows of h (see the package comment); it reports the
// routing to route when non-nil.
func (m *Model) moe(l int, ly *layer, h numeric.Matrix, route func(Route)) numeric.Matrix {
	c := m.Config
	logits := numeric.MulT(h, ly.router, nil)
	out := numeric.NewMatrix(h.Rows, h.Cols)
	r := Route{Layer: l}
	for i := 0; i < h.Rows; i++ {
		row := logits.Row(i)
		mx := slices.Max(row)
		p := make([]float64, len(row))
		sum := 0.0
		for e, v := range row {
			p[e] = math.Exp(v - mx)
			sum += p[e]
		}
		for e := range p {
			p[e] /= sum
		}
		chosen := topK(p, c.NumExpertsPerTok)
		w := make([]float64, len(chosen))
		tot := 0.0
		for j, e := range chosen {
			w[j] = p[e]
			tot += p[e]
		}
		if c.NormTopKProb {
			for j := range w {
				w[j] /= tot
			}
		}
		x := numeric.Matrix{Rows: 1, Cols: h.Cols, Data: h.Row(i)}
		dst := out.Row(i)
		for j, e := range chosen {
			ex := ly.experts[e]
			y := swiglu(x, ex.gate, ex.up, ex.down)
			for d := range dst {
				dst[d] += w[j] * y.Data[d]
			}
		}
		r.Experts = append(r.Experts, chosen)
		r.Weights = append(r.Weights, w)
	}
	if route != nil {
		route(r)
	}
	return out
}

// session returns a fresh incremental forward pass with its own caches; route, when non-nil,
// receives every sparse layer's routing of each call's tokens.
func (m *Model) session(route func(Route)) numeric.Forward {
	c := m.Config
	caches := make([]numeric.KVCache, c.NumHiddenLayers)
	D, H, KV, hd := c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	scale := 1 / math.Sqrt(float64(hd))
	return func(ids []int32, lastOnly bool) (numeric.Matrix, error) {
		start := caches[0].Len()
		if c.MaxPositionEmbeddings > 0 && start+len(ids) > c.MaxPositionEmbeddings {
			return numeric.Matrix{}, fmt.Errorf("qwen3moe reference: sequence of %d tokens exceeds max_position_embeddings %d", start+len(ids), c.MaxPositionEmbeddings)
		}
		n := len(ids)
		x := numeric.NewMatrix(n, D)
		for i, id := range ids {
			if id < 0 || int(id) >= c.VocabSize {
				return numeric.Matrix{}, fmt.Errorf("qwen3moe reference: token id %d at position %d outside vocabulary [0,%d)", id, start+i, c.VocabSize)
			}
			copy(x.Row(i), m.embed.Row(int(id)))
		}
		for l := range m.layers {
			ly := &m.layers[l]
			h := numeric.Matrix{Rows: n, Cols: D, Data: append([]float64(nil), x.Data...)}
			rmsNorm(h.Data, D, ly.inputNorm, c.RMSNormEps)
			q := numeric.MulT(h, ly.q, ly.qBias)
			k := numeric.MulT(h, ly.k, ly.kBias)
			v := numeric.MulT(h, ly.v, ly.vBias)
			rmsNorm(q.Data, hd, ly.qNorm, c.RMSNormEps)
			rmsNorm(k.Data, hd, ly.kNorm, c.RMSNormEps)
			for i := 0; i < n; i++ {
				m.rope(q.Row(i), start+i)
				m.rope(k.Row(i), start+i)
			}
			a := numeric.CausalAttention(&caches[l], q, k, v, H, KV, hd, scale)
			numeric.AddInPlace(x, numeric.MulT(a, ly.o, nil))
			h = numeric.Matrix{Rows: n, Cols: D, Data: append([]float64(nil), x.Data...)}
			rmsNorm(h.Data, D, ly.postNorm, c.RMSNormEps)
			if ly.router.Data != nil {
				numeric.AddInPlace(x, m.moe(l, ly, h, route))
			} else {
				numeric.AddInPlace(x, swiglu(h, ly.gate, ly.up, ly.down))
			}
		}
		if lastOnly {
			x = numeric.Matrix{Rows: 1, Cols: D, Data: append([]float64(nil), x.Row(n-1)...)}
		}
		rmsNorm(x.Data, D, m.norm, c.RMSNormEps)
		return x, nil
	}
}

// lmHead projects final hidden states onto the vocabulary: logits = h·headᵀ.
func (m *Model) lmHead(h numeric.Matrix) numeric.Matrix { return numeric.MulT(h, m.head, nil) }
