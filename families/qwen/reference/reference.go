// Package reference is the qwen family's own forward pass: Qwen3ForCausalLM in float64 on
// gonum, written from the architecture's definition (the Qwen3 technical report and the Hugging
// Face Qwen3 configuration), not from the native engine's code, so that the parity gate compares
// two independent implementations.
//
// The architecture: token embedding; per layer a pre-RMSNorm grouped-query self-attention
// (q/k/v/o as nn.Linear, y = x·Wᵀ, optional q/k/v bias), where each head of q and k is
// RMS-normalized over head_dim (q_norm, k_norm) before rotary position embedding (RoPE,
// rotate_half form with the config's rope_theta); then a pre-RMSNorm SwiGLU MLP
// down(silu(gate(x))·up(x)); a final RMSNorm and an LM head, tied to the embedding or not.
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

// Config is the subset of a Qwen3 config.json the forward pass reads.
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
	// RopeTheta is the RoPE base. transformers 4.x writes it at the top level; 5.x moves it into
	// rope_parameters. Load resolves both into this field.
	RopeTheta      float64         `json:"rope_theta"`
	RopeParameters *ropeParameters `json:"rope_parameters"`
	RopeScaling    *ropeParameters `json:"rope_scaling"`
}

type ropeParameters struct {
	RopeType  string  `json:"rope_type"`
	Type      string  `json:"type"`
	RopeTheta float64 `json:"rope_theta"`
}

type layer struct {
	inputNorm, postNorm []float64
	q, k, v, o          numeric.Matrix // nn.Linear: out × in
	qBias, kBias, vBias []float64
	qNorm, kNorm        []float64 // head_dim
	gate, up, down      numeric.Matrix
}

// Model is a loaded Qwen3 checkpoint. It is safe for concurrent use: every call builds its
// own key/value caches.
type Model struct {
	// Decoder provides Logits, EachLogits, Greedy and GreedyLogits over this model's
	// forward pass.
	numeric.Decoder
	Config Config
	Dir    string
	embed  numeric.Matrix // V × D
	head   numeric.Matrix // V × D (embed when tied)
	layers []layer
	norm   []float64
	// invFreq[i] = rope_theta^(−2i/head_dim), i < head_dim/2.
	invFreq []float64
}

// Load reads config.json and model.safetensors from a Hugging Face checkpoint directory.
func Load(dir string) (*Model, error) {
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("qwen reference: read config: %w; pass a checkpoint directory with config.json and model.safetensors", err)
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("qwen reference: %s: %w", cfgPath, err)
	}
	if err := c.resolve(); err != nil {
		return nil, fmt.Errorf("qwen reference: %s: %w", cfgPath, err)
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("qwen reference: %w", err)
	}
	m := &Model{Config: c, Dir: dir}
	if err := m.loadWeights(st); err != nil {
		return nil, fmt.Errorf("qwen reference: %w", err)
	}
	m.Decoder = numeric.Decoder{Name: "qwen reference", Session: m.session, Head: m.lmHead, MaxPositions: c.MaxPositionEmbeddings}
	hd := c.HeadDim
	m.invFreq = make([]float64, hd/2)
	for i := range m.invFreq {
		m.invFreq[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(hd))
	}
	return m, nil
}

func (c *Config) resolve() error {
	for _, rp := range []*ropeParameters{c.RopeParameters, c.RopeScaling} {
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
	case c.VocabSize <= 0 || c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.NumHiddenLayers <= 0:
		return fmt.Errorf("vocab_size %d, hidden_size %d, intermediate_size %d and num_hidden_layers %d must be positive",
			c.VocabSize, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers)
	case c.NumAttentionHeads <= 0 || c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return fmt.Errorf("num_attention_heads %d must be a positive multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d must be positive and even (RoPE rotates pairs)", c.HeadDim)
	case c.RopeTheta <= 0:
		return fmt.Errorf("rope_theta %v must be positive (top level or rope_parameters.rope_theta)", c.RopeTheta)
	case c.HiddenAct != "" && c.HiddenAct != "silu":
		return fmt.Errorf("hidden_act %q: this reference implements SwiGLU with silu only", c.HiddenAct)
	case c.UseSlidingWindow:
		return fmt.Errorf("use_sliding_window true is not implemented by this reference")
	}
	return nil
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
			qNorm:     w.Vec(p+"self_attn.q_norm.weight", hd),
			kNorm:     w.Vec(p+"self_attn.k_norm.weight", hd),
			gate:      w.Mat(p+"mlp.gate_proj.weight", I, D),
			up:        w.Mat(p+"mlp.up_proj.weight", I, D),
			down:      w.Mat(p+"mlp.down_proj.weight", D, I),
		}
		if c.AttentionBias {
			ly.qBias = w.Vec(p+"self_attn.q_proj.bias", H*hd)
			ly.kBias = w.Vec(p+"self_attn.k_proj.bias", KV*hd)
			ly.vBias = w.Vec(p+"self_attn.v_proj.bias", KV*hd)
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
// Sennrich 2019). width is the row width for the block norms and head_dim for q_norm/k_norm.
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

// rope rotates every head of row (position pos) in place in the rotate_half form of
// Su et al. 2021 as transformers writes it: x·cos + rotate_half(x)·sin, where
// rotate_half(x) = (−x₂, x₁) for the two halves of the head and the angle of dimension j and
// j+head_dim/2 is pos·invFreq[j].
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

// session returns a fresh incremental forward pass with its own per-layer caches.
func (m *Model) session() numeric.Forward {
	c := m.Config
	caches := make([]numeric.KVCache, c.NumHiddenLayers)
	D, H, KV, hd := c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	scale := 1 / math.Sqrt(float64(hd))
	return func(ids []int32, lastOnly bool) (numeric.Matrix, error) {
		start := caches[0].Len()
		if c.MaxPositionEmbeddings > 0 && start+len(ids) > c.MaxPositionEmbeddings {
			return numeric.Matrix{}, fmt.Errorf("qwen reference: sequence of %d tokens exceeds max_position_embeddings %d", start+len(ids), c.MaxPositionEmbeddings)
		}
		n := len(ids)
		x := numeric.NewMatrix(n, D)
		for i, id := range ids {
			if id < 0 || int(id) >= c.VocabSize {
				return numeric.Matrix{}, fmt.Errorf("qwen reference: token id %d at position %d outside vocabulary [0,%d)", id, start+i, c.VocabSize)
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
			g := numeric.MulT(h, ly.gate, nil)
			u := numeric.MulT(h, ly.up, nil)
			for i := range g.Data {
				g.Data[i] = silu(g.Data[i]) * u.Data[i]
			}
			numeric.AddInPlace(x, numeric.MulT(g, ly.down, nil))
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
