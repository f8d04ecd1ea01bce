// Package reference is the llama family's own forward pass: LlamaForCausalLM and
// MistralForCausalLM in float64 on gonum, written from the architecture's definition (the
// LLaMA papers, the Mistral 7B paper's sliding-window attention, the YaRN paper and Hugging
// Face's Llama configuration documentation for the rotary scaling types), not from the native
// engine's code, so that the parity gate compares two independent implementations.
//
// The architecture: token embedding; per layer a pre-RMSNorm grouped-query self-attention
// (q/k/v/o as nn.Linear, y = x·Wᵀ, biases when attention_bias) with rotary position embedding
// (rotate_half form) on q and k, causal, and for Mistral limited to the last sliding_window
// positions; then a pre-RMSNorm SwiGLU MLP down(silu(gate(x))·up(x)) (biases when mlp_bias); a
// final RMSNorm and an LM head, tied to the embedding or not.
package reference

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/modelqual/modelqual/families/internal/numeric"
	"github.com/modelqual/modelqual/families/internal/safetensors"
)

// Config is the subset of a Llama or Mistral config.json the forward pass reads.
type Config struct {
	ModelType             string   `json:"model_type"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	HeadDim               int      `json:"head_dim"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	AttentionBias         bool     `json:"attention_bias"`
	MLPBias               bool     `json:"mlp_bias"`
	HiddenAct             string   `json:"hidden_act"`
	SlidingWindow         *int     `json:"sliding_window"`
	RopeTheta             *float64 `json:"rope_theta"`
	// RopeScaling is the form published checkpoints store (with rope_theta at the top level);
	// RopeParameters is transformers 5's (rope_theta inside). Load reads either into Rope.
	RopeScaling    *Rope `json:"rope_scaling"`
	RopeParameters *Rope `json:"rope_parameters"`
	// Rope is the resolved rotary configuration.
	Rope Rope `json:"-"`
}

// Rope is a rotary scaling configuration as the Hugging Face Llama configuration documents it.
// Zero values mean "not given".
type Rope struct {
	RopeType                      string   `json:"rope_type"`
	Type                          string   `json:"type"` // the older name of rope_type
	RopeTheta                     float64  `json:"rope_theta"`
	Factor                        float64  `json:"factor"`
	LowFreqFactor                 float64  `json:"low_freq_factor"`
	HighFreqFactor                float64  `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings float64  `json:"original_max_position_embeddings"`
	AttentionFactor               *float64 `json:"attention_factor"`
	BetaFast                      float64  `json:"beta_fast"`
	BetaSlow                      float64  `json:"beta_slow"`
	Mscale                        float64  `json:"mscale"`
	MscaleAllDim                  float64  `json:"mscale_all_dim"`
	Truncate                      *bool    `json:"truncate"`
}

type layer struct {
	inputNorm, postNorm        []float64
	q, k, v, o                 numeric.Matrix // nn.Linear: out × in
	qBias, kBias, vBias, oBias []float64
	gate, up, down             numeric.Matrix
	gateBias, upBias, downBias []float64
}

// Model is a loaded Llama or Mistral checkpoint. It is safe for concurrent use: every call
// builds its own key/value caches.
type Model struct {
	// Decoder provides Logits, EachLogits, Greedy and GreedyLogits over this model's
	// forward pass.
	numeric.Decoder
	Config Config
	Dir    string
	embed  numeric.Matrix
	head   numeric.Matrix
	layers []layer
	norm   []float64
	// InvFreq are the rotary inverse frequencies (head_dim/2) and AttentionScaling the factor
	// on cos and sin, both from the rope type.
	InvFreq          []float64
	AttentionScaling float64
	window           int // sliding window (0: none)
}

// ParseConfig reads a config.json and resolves its rotary configuration.
func ParseConfig(raw []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, err
	}
	return c, c.resolve()
}

// Load reads config.json and model.safetensors from a Hugging Face checkpoint directory.
func Load(dir string) (*Model, error) {
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("llama reference: read config: %w; pass a checkpoint directory with config.json and model.safetensors", err)
	}
	c, err := ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("llama reference: %s: %w", cfgPath, err)
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("llama reference: %w", err)
	}
	m := &Model{Config: c, Dir: dir}
	if err := m.loadWeights(st); err != nil {
		return nil, fmt.Errorf("llama reference: %w", err)
	}
	m.InvFreq, m.AttentionScaling, err = RotaryFrequencies(c)
	if err != nil {
		return nil, fmt.Errorf("llama reference: %s: %w", cfgPath, err)
	}
	if c.ModelType == "mistral" && c.SlidingWindow != nil {
		m.window = *c.SlidingWindow
	}
	m.Decoder = numeric.Decoder{Name: "llama reference", Session: m.session, Head: m.lmHead, MaxPositions: c.MaxPositionEmbeddings}
	return m, nil
}

func (c *Config) resolve() error {
	switch {
	case c.RopeParameters != nil:
		c.Rope = *c.RopeParameters
	case c.RopeScaling != nil:
		c.Rope = *c.RopeScaling
	}
	if c.Rope.RopeType == "" {
		c.Rope.RopeType = c.Rope.Type
	}
	if c.Rope.RopeType == "" {
		c.Rope.RopeType = "default"
	}
	if c.Rope.RopeTheta == 0 {
		c.Rope.RopeTheta = 10000 // LlamaConfig's default
		if c.RopeTheta != nil {
			c.Rope.RopeTheta = *c.RopeTheta
		}
	}
	if c.ModelType == "" {
		c.ModelType = "llama"
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
	if c.ModelType == "mistral" {
		c.AttentionBias, c.MLPBias = false, false // MistralAttention and MistralMLP have no biases
	}
	switch {
	case c.VocabSize <= 0 || c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.NumHiddenLayers <= 0:
		return fmt.Errorf("vocab_size %d, hidden_size %d, intermediate_size %d and num_hidden_layers %d must be positive",
			c.VocabSize, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers)
	case c.NumAttentionHeads <= 0 || c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return fmt.Errorf("num_attention_heads %d must be a positive multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d must be positive and even (RoPE rotates pairs)", c.HeadDim)
	case c.HiddenAct != "" && c.HiddenAct != "silu":
		return fmt.Errorf("hidden_act %q: this reference implements SwiGLU with silu only", c.HiddenAct)
	}
	return nil
}

// RotaryFrequencies returns the inverse frequencies θ_i (i < head_dim/2) and the scaling of
// cos and sin for the config's rope type:
//
//   - default (Su et al. 2021): θ_i = base^(−2i/d).
//   - linear (position interpolation, Chen et al. 2023): θ_i / factor.
//   - dynamic (dynamic NTK): the base grows only once a sequence exceeds
//     max_position_embeddings; within that context it is default RoPE (this reference refuses
//     longer sequences).
//   - llama3 (Llama 3.1): wavelengths 2π/θ_i above original_context/low_freq_factor are
//     divided by factor, those below original_context/high_freq_factor kept, and those between
//     blended by s = (original_context/wavelength − low)/(high − low): (1−s)·θ/factor + s·θ.
//   - yarn (Peng et al. 2023): θ_i blended between interpolation θ_i/factor and extrapolation
//     θ_i by a ramp over the dimensions whose number of rotations over the original context
//     lies between beta_fast and beta_slow (dimension bounds floored and ceiled unless
//     truncate is false), and cos/sin scaled by 0.1·ln(factor)+1 (or attention_factor, or the
//     ratio of mscale to mscale_all_dim terms). The original context defaults to
//     max_position_embeddings; factor, when not given, is max_position_embeddings over it.
func RotaryFrequencies(c Config) ([]float64, float64, error) {
	r, d := c.Rope, c.HeadDim
	base := r.RopeTheta
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = math.Pow(base, -float64(2*i)/float64(d))
	}
	need := func(name string, v float64) error {
		if v == 0 {
			return fmt.Errorf("rope type %q needs %s", r.RopeType, name)
		}
		return nil
	}
	switch r.RopeType {
	case "default", "dynamic":
		if r.RopeType == "dynamic" {
			if err := need("factor", r.Factor); err != nil {
				return nil, 0, err
			}
		}
		return inv, 1, nil
	case "linear":
		if err := need("factor", r.Factor); err != nil {
			return nil, 0, err
		}
		for i := range inv {
			inv[i] /= r.Factor
		}
		return inv, 1, nil
	case "llama3":
		for _, e := range []error{need("factor", r.Factor), need("low_freq_factor", r.LowFreqFactor),
			need("high_freq_factor", r.HighFreqFactor), need("original_max_position_embeddings", r.OriginalMaxPositionEmbeddings)} {
			if e != nil {
				return nil, 0, e
			}
		}
		lowWave, highWave := r.OriginalMaxPositionEmbeddings/r.LowFreqFactor, r.OriginalMaxPositionEmbeddings/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / r.Factor
			default:
				s := (r.OriginalMaxPositionEmbeddings/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				inv[i] = (1-s)*f/r.Factor + s*f
			}
		}
		return inv, 1, nil
	case "yarn":
		factor, orig := r.Factor, float64(c.MaxPositionEmbeddings)
		if r.OriginalMaxPositionEmbeddings != 0 {
			orig = r.OriginalMaxPositionEmbeddings
		}
		if factor == 0 {
			factor = float64(c.MaxPositionEmbeddings) / orig
		}
		mscale := func(scale, m float64) float64 {
			if scale <= 1 {
				return 1
			}
			return 0.1*m*math.Log(scale) + 1
		}
		att := mscale(factor, 1)
		switch {
		case r.AttentionFactor != nil:
			att = *r.AttentionFactor
		case r.Mscale != 0 && r.MscaleAllDim != 0:
			att = mscale(factor, r.Mscale) / mscale(factor, r.MscaleAllDim)
		}
		fast, slow := r.BetaFast, r.BetaSlow
		if fast == 0 {
			fast = 32
		}
		if slow == 0 {
			slow = 1
		}
		// The dimension whose wavelength fits `rot` times into the original context.
		dimOf := func(rot float64) float64 {
			return float64(d) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		lo, hi := dimOf(fast), dimOf(slow)
		if r.Truncate == nil || *r.Truncate {
			lo, hi = math.Floor(lo), math.Ceil(hi)
		}
		lo, hi = math.Max(lo, 0), math.Min(hi, float64(d-1))
		if lo == hi {
			hi += 0.001
		}
		for i, f := range inv {
			ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
			extrapolate := 1 - ramp
			inv[i] = f/factor*(1-extrapolate) + f*extrapolate
		}
		return inv, att, nil
	}
	return nil, 0, fmt.Errorf("rope type %q: this reference implements default, linear, dynamic, llama3 and yarn", r.RopeType)
}

func (m *Model) loadWeights(st *safetensors.File) error {
	c := m.Config
	D, V, I := c.HiddenSize, c.VocabSize, c.IntermediateSize
	H, KV, hd := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	w := &numeric.Weights{File: st}
	m.embed = w.Mat("model.embed_tokens.weight", V, D)
	m.head = m.embed
	if !c.TieWordEmbeddings {
		m.head = w.Mat("lm_head.weight", V, D)
	}
	for l := 0; l < c.NumHiddenLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := layer{
			inputNorm: w.Vec(p+"input_layernorm.weight", D),
			postNorm:  w.Vec(p+"post_attention_layernorm.weight", D),
			q:         w.Mat(p+"self_attn.q_proj.weight", H*hd, D),
			k:         w.Mat(p+"self_attn.k_proj.weight", KV*hd, D),
			v:         w.Mat(p+"self_attn.v_proj.weight", KV*hd, D),
			o:         w.Mat(p+"self_attn.o_proj.weight", D, H*hd),
			gate:      w.Mat(p+"mlp.gate_proj.weight", I, D),
			up:        w.Mat(p+"mlp.up_proj.weight", I, D),
			down:      w.Mat(p+"mlp.down_proj.weight", D, I),
		}
		if c.AttentionBias {
			ly.qBias = w.Vec(p+"self_attn.q_proj.bias", H*hd)
			ly.kBias = w.Vec(p+"self_attn.k_proj.bias", KV*hd)
			ly.vBias = w.Vec(p+"self_attn.v_proj.bias", KV*hd)
			ly.oBias = w.Vec(p+"self_attn.o_proj.bias", D)
		}
		if c.MLPBias {
			ly.gateBias = w.Vec(p+"mlp.gate_proj.bias", I)
			ly.upBias = w.Vec(p+"mlp.up_proj.bias", I)
			ly.downBias = w.Vec(p+"mlp.down_proj.bias", D)
		}
		m.layers = append(m.layers, ly)
	}
	m.norm = w.Vec("model.norm.weight", D)
	return w.Err
}

// VocabSize is the number of logits per position.
func (m *Model) VocabSize() int { return m.Config.VocabSize }

// MaxContext is max_position_embeddings.
func (m *Model) MaxContext() int { return m.Config.MaxPositionEmbeddings }

// rmsNorm scales every width-wide chunk of x in place: y = x/√(mean(x²) + ε)·w (Zhang &
// Sennrich 2019).
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

// rope rotates every head of row (position pos) in place: x·cos + rotate_half(x)·sin with
// rotate_half(x) = (−x₂, x₁) over the head's two halves, the angle of dimensions j and
// j+head_dim/2 being pos·θ_j, and cos and sin scaled by the rope type's attention scaling.
func (m *Model) rope(row []float64, pos int) {
	hd := m.Config.HeadDim
	half := hd / 2
	for s := 0; s < len(row); s += hd {
		h := row[s : s+hd]
		for j := 0; j < half; j++ {
			sin, cos := math.Sincos(float64(pos) * m.InvFreq[j])
			sin, cos = sin*m.AttentionScaling, cos*m.AttentionScaling
			x1, x2 := h[j], h[j+half]
			h[j] = x1*cos - x2*sin
			h[j+half] = x2*cos + x1*sin
		}
	}
}

// attention appends k and v to the layer's cache and returns softmax(q·kᵀ·scale)·v where query
// position p sees key positions max(0, p−window+1)..p (window 0: all up to p), query head h
// reading key/value head h/(heads/kvHeads).
func attention(keys, values *[][]float64, q, k, v numeric.Matrix, heads, kvHeads, hd, window int, scale float64) numeric.Matrix {
	start := len(*keys)
	for i := 0; i < k.Rows; i++ {
		*keys = append(*keys, append([]float64(nil), k.Row(i)...))
		*values = append(*values, append([]float64(nil), v.Row(i)...))
	}
	group := heads / kvHeads
	out := numeric.NewMatrix(q.Rows, q.Cols)
	for i := 0; i < q.Rows; i++ {
		p := start + i
		first := 0
		if window > 0 {
			first = max(0, p-window+1)
		}
		for h := 0; h < heads; h++ {
			qh := q.Row(i)[h*hd : (h+1)*hd]
			kvh := h / group
			scores := make([]float64, p-first+1)
			best := math.Inf(-1)
			for j := range scores {
				kh := (*keys)[first+j][kvh*hd : (kvh+1)*hd]
				s := 0.0
				for x := range qh {
					s += qh[x] * kh[x]
				}
				scores[j] = s * scale
				best = math.Max(best, scores[j])
			}
			sum := 0.0
			for j := range scores {
				scores[j] = math.Exp(scores[j] - best)
				sum += scores[j]
			}
			oh := out.Row(i)[h*hd : (h+1)*hd]
			for j, s := range scores {
				vh := (*values)[first+j][kvh*hd : (kvh+1)*hd]
				for x := range oh {
					oh[x] += s / sum * vh[x]
				}
			}
		}
	}
	return out
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// session returns a fresh incremental forward pass with its own per-layer caches.
func (m *Model) session() numeric.Forward {
	c := m.Config
	keys := make([][][]float64, c.NumHiddenLayers)
	values := make([][][]float64, c.NumHiddenLayers)
	D, H, KV, hd := c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	scale := 1 / math.Sqrt(float64(hd))
	return func(ids []int32, lastOnly bool) (numeric.Matrix, error) {
		start := len(keys[0])
		if c.MaxPositionEmbeddings > 0 && start+len(ids) > c.MaxPositionEmbeddings {
			return numeric.Matrix{}, fmt.Errorf("llama reference: sequence of %d tokens exceeds max_position_embeddings %d", start+len(ids), c.MaxPositionEmbeddings)
		}
		n := len(ids)
		x := numeric.NewMatrix(n, D)
		for i, id := range ids {
			if id < 0 || int(id) >= c.VocabSize {
				return numeric.Matrix{}, fmt.Errorf("llama reference: token id %d at position %d outside vocabulary [0,%d)", id, start+i, c.VocabSize)
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
			for i := 0; i < n; i++ {
				m.rope(q.Row(i), start+i)
				m.rope(k.Row(i), start+i)
			}
			a := attention(&keys[l], &values[l], q, k, v, H, KV, hd, m.window, scale)
			numeric.AddInPlace(x, numeric.MulT(a, ly.o, ly.oBias))
			h = numeric.Matrix{Rows: n, Cols: D, Data: append([]float64(nil), x.Data...)}
			rmsNorm(h.Data, D, ly.postNorm, c.RMSNormEps)
			g := numeric.MulT(h, ly.gate, ly.gateBias)
			u := numeric.MulT(h, ly.up, ly.upBias)
			for i := range g.Data {
				g.Data[i] = silu(g.Data[i]) * u.Data[i]
			}
			numeric.AddInPlace(x, numeric.MulT(g, ly.down, ly.downBias))
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
