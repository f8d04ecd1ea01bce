// Package reference is the gpt2 family's own forward pass: GPT2LMHeadModel in float64 on
// gonum, written from the architecture's definition (Radford et al. 2019, "Language Models are
// Unsupervised Multitask Learners", and the Hugging Face GPT2 configuration), not from the
// native engine's code, so that the parity gate compares two independent implementations.
//
// The architecture: token embedding wte plus learned position embedding wpe; per block a
// pre-LayerNorm causal self-attention whose q, k and v come from one fused Conv1D projection
// c_attn (Conv1D stores weights in×out, so y = x·W + b), an output projection c_proj, then a
// pre-LayerNorm MLP c_fc → GELU (tanh approximation, "gelu_new") → c_proj; a final LayerNorm
// ln_f and an LM head tied to wte.
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

// Config is the subset of a GPT-2 config.json the forward pass reads.
type Config struct {
	VocabSize                  int      `json:"vocab_size"`
	NPositions                 int      `json:"n_positions"`
	NEmbd                      int      `json:"n_embd"`
	NLayer                     int      `json:"n_layer"`
	NHead                      int      `json:"n_head"`
	NInner                     *int     `json:"n_inner"`
	LayerNormEpsilon           float64  `json:"layer_norm_epsilon"`
	ActivationFunction         string   `json:"activation_function"`
	ScaleAttnWeights           *bool    `json:"scale_attn_weights"`
	ScaleAttnByInverseLayerIdx bool     `json:"scale_attn_by_inverse_layer_idx"`
	TieWordEmbeddings          *bool    `json:"tie_word_embeddings"`
	Architectures              []string `json:"architectures"`
	EOSTokenID                 *int     `json:"eos_token_id"`
	ReorderAndUpcastAttn       bool     `json:"reorder_and_upcast_attn"`
	AddCrossAttention          bool     `json:"add_cross_attention"`
	ModelType                  string   `json:"model_type"`
}

type block struct {
	ln1W, ln1B []float64
	cAttnW     numeric.Matrix // D × 3D (Conv1D: in × out)
	cAttnB     []float64
	attnProjW  numeric.Matrix // D × D
	attnProjB  []float64
	ln2W, ln2B []float64
	fcW        numeric.Matrix // D × inner
	fcB        []float64
	mlpProjW   numeric.Matrix // inner × D
	mlpProjB   []float64
}

// Model is a loaded GPT-2 checkpoint. It is safe for concurrent use: every call builds its
// own key/value caches.
type Model struct {
	// Decoder provides Logits, EachLogits, Greedy and GreedyLogits over this model's
	// forward pass.
	numeric.Decoder
	Config Config
	Dir    string
	wte    numeric.Matrix // V × D
	wpe    numeric.Matrix // P × D
	head   numeric.Matrix // V × D (wte when tied)
	blocks []block
	lnFW   []float64
	lnFB   []float64
}

// Load reads config.json and model.safetensors from a Hugging Face checkpoint directory.
func Load(dir string) (*Model, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("gpt2 reference: read config: %w; pass a checkpoint directory with config.json and model.safetensors", err)
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("gpt2 reference: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("gpt2 reference: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("gpt2 reference: %w", err)
	}
	m := &Model{Config: c, Dir: dir}
	if err := m.loadWeights(st); err != nil {
		return nil, fmt.Errorf("gpt2 reference: %w", err)
	}
	m.Decoder = numeric.Decoder{Name: "gpt2 reference", Session: m.session, Head: m.lmHead, MaxPositions: c.NPositions}
	return m, nil
}

func (c *Config) inner() int {
	if c.NInner != nil && *c.NInner > 0 {
		return *c.NInner
	}
	return 4 * c.NEmbd
}

func (c *Config) validate() error {
	switch {
	case c.VocabSize <= 0:
		return fmt.Errorf("vocab_size %d must be positive", c.VocabSize)
	case c.NEmbd <= 0 || c.NHead <= 0 || c.NEmbd%c.NHead != 0:
		return fmt.Errorf("n_embd %d must be a positive multiple of n_head %d", c.NEmbd, c.NHead)
	case c.NLayer <= 0:
		return fmt.Errorf("n_layer %d must be positive", c.NLayer)
	case c.NPositions <= 0:
		return fmt.Errorf("n_positions %d must be positive", c.NPositions)
	case c.ActivationFunction != "" && c.ActivationFunction != "gelu_new" && c.ActivationFunction != "gelu_pytorch_tanh":
		return fmt.Errorf("activation_function %q: this reference implements GELU-tanh (gelu_new) only", c.ActivationFunction)
	case c.ScaleAttnByInverseLayerIdx:
		return fmt.Errorf("scale_attn_by_inverse_layer_idx true is not implemented by this reference")
	case c.AddCrossAttention:
		return fmt.Errorf("add_cross_attention true is not a causal LM; not supported")
	}
	if c.LayerNormEpsilon == 0 {
		c.LayerNormEpsilon = 1e-5
	}
	return nil
}

func (m *Model) loadWeights(st *safetensors.File) error {
	c := m.Config
	D, V, P, I := c.NEmbd, c.VocabSize, c.NPositions, c.inner()
	// GPT2LMHeadModel files name tensors "transformer.h.0..."; the original
	// openai-community/gpt2 file stores the bare GPT2Model names.
	w := &numeric.Weights{File: st, Prefixes: []string{"transformer.", ""}}
	m.wte = w.Mat("wte.weight", V, D)
	m.wpe = w.Mat("wpe.weight", P, D)
	// A tied head is wte itself, whatever lm_head.weight the file may also carry: that is what
	// transformers does when tie_word_embeddings is true (the default).
	m.head = m.wte
	if c.TieWordEmbeddings != nil && !*c.TieWordEmbeddings {
		// lm_head is a top-level module of GPT2LMHeadModel: no prefix.
		h := &numeric.Weights{File: st}
		if m.head = h.Mat("lm_head.weight", V, D); h.Err != nil {
			return h.Err
		}
	}
	for l := 0; l < c.NLayer; l++ {
		p := fmt.Sprintf("h.%d.", l)
		m.blocks = append(m.blocks, block{
			ln1W: w.Vec(p+"ln_1.weight", D), ln1B: w.Vec(p+"ln_1.bias", D),
			cAttnW: w.Mat(p+"attn.c_attn.weight", D, 3*D), cAttnB: w.Vec(p+"attn.c_attn.bias", 3*D),
			attnProjW: w.Mat(p+"attn.c_proj.weight", D, D), attnProjB: w.Vec(p+"attn.c_proj.bias", D),
			ln2W: w.Vec(p+"ln_2.weight", D), ln2B: w.Vec(p+"ln_2.bias", D),
			fcW: w.Mat(p+"mlp.c_fc.weight", D, I), fcB: w.Vec(p+"mlp.c_fc.bias", I),
			mlpProjW: w.Mat(p+"mlp.c_proj.weight", I, D), mlpProjB: w.Vec(p+"mlp.c_proj.bias", D),
		})
	}
	m.lnFW = w.Vec("ln_f.weight", D)
	m.lnFB = w.Vec("ln_f.bias", D)
	return w.Err
}

// VocabSize is the number of logits per position.
func (m *Model) VocabSize() int { return m.Config.VocabSize }

// MaxContext is n_positions, the longest sequence the learned position table covers.
func (m *Model) MaxContext() int { return m.Config.NPositions }

// layerNorm normalizes every row over its features with the biased variance, then scales and
// shifts: y = (x − mean)/√(var + ε)·w + b.
func layerNorm(x numeric.Matrix, w, b []float64, eps float64) numeric.Matrix {
	y := numeric.NewMatrix(x.Rows, x.Cols)
	for i := 0; i < x.Rows; i++ {
		r, o := x.Row(i), y.Row(i)
		mean := 0.0
		for _, v := range r {
			mean += v
		}
		mean /= float64(len(r))
		variance := 0.0
		for _, v := range r {
			variance += (v - mean) * (v - mean)
		}
		variance /= float64(len(r))
		inv := 1 / math.Sqrt(variance+eps)
		for j, v := range r {
			o[j] = (v-mean)*inv*w[j] + b[j]
		}
	}
	return y
}

// geluTanh is GELU's tanh approximation (Hendrycks & Gimpel 2016), GPT-2's "gelu_new".
func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// session returns a fresh incremental forward pass with its own per-layer caches.
func (m *Model) session() numeric.Forward {
	c := m.Config
	caches := make([]numeric.KVCache, c.NLayer)
	D, H := c.NEmbd, c.NHead
	hd := D / H
	scale := 1.0
	if c.ScaleAttnWeights == nil || *c.ScaleAttnWeights {
		scale = 1 / math.Sqrt(float64(hd))
	}
	return func(ids []int32, lastOnly bool) (numeric.Matrix, error) {
		start := caches[0].Len()
		if start+len(ids) > c.NPositions {
			return numeric.Matrix{}, fmt.Errorf("gpt2 reference: sequence of %d tokens exceeds n_positions %d", start+len(ids), c.NPositions)
		}
		x := numeric.NewMatrix(len(ids), D)
		for i, id := range ids {
			if id < 0 || int(id) >= c.VocabSize {
				return numeric.Matrix{}, fmt.Errorf("gpt2 reference: token id %d at position %d outside vocabulary [0,%d)", id, start+i, c.VocabSize)
			}
			row, te, pe := x.Row(i), m.wte.Row(int(id)), m.wpe.Row(start+i)
			for j := range row {
				row[j] = te[j] + pe[j]
			}
		}
		for l := range m.blocks {
			b := &m.blocks[l]
			h := layerNorm(x, b.ln1W, b.ln1B, c.LayerNormEpsilon)
			qkv := numeric.Mul(h, b.cAttnW, b.cAttnB) // n × 3D: q | k | v
			q, k, v := numeric.NewMatrix(len(ids), D), numeric.NewMatrix(len(ids), D), numeric.NewMatrix(len(ids), D)
			for i := 0; i < len(ids); i++ {
				r := qkv.Row(i)
				copy(q.Row(i), r[:D])
				copy(k.Row(i), r[D:2*D])
				copy(v.Row(i), r[2*D:])
			}
			a := numeric.CausalAttention(&caches[l], q, k, v, H, H, hd, scale)
			numeric.AddInPlace(x, numeric.Mul(a, b.attnProjW, b.attnProjB))
			h = layerNorm(x, b.ln2W, b.ln2B, c.LayerNormEpsilon)
			f := numeric.Mul(h, b.fcW, b.fcB)
			for i := range f.Data {
				f.Data[i] = geluTanh(f.Data[i])
			}
			numeric.AddInPlace(x, numeric.Mul(f, b.mlpProjW, b.mlpProjB))
		}
		if lastOnly {
			x = numeric.Matrix{Rows: 1, Cols: D, Data: x.Row(x.Rows - 1)}
		}
		return layerNorm(x, m.lnFW, m.lnFB, c.LayerNormEpsilon), nil
	}
}

// lmHead projects final hidden states onto the vocabulary: logits = h·headᵀ.
func (m *Model) lmHead(h numeric.Matrix) numeric.Matrix { return numeric.MulT(h, m.head, nil) }
