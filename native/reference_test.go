package native

// A deliberately naive float64 forward pass of both families, written from the architecture
// definitions (transformers' modeling_gpt2 / modeling_qwen3), sharing no code with the C++
// runtime. It recomputes everything per position with no KV cache, so it also checks the
// runtime's cache bookkeeping. The family-owned gonum references in families/ play this role
// for qualification; this one keeps package native's own tests self-contained.

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/modelqual/modelqual/native/bundle"
)

type refModel struct {
	t   testing.TB
	b   *bundle.Bundle
	cfg refConfig
}

// refConfig is what the reference reads from config.json, with transformers' defaults, parsed
// here on its own (not through the runtime's resolve step, which is under test).
type refConfig struct {
	HiddenSize, NumHeads, NumKVHeads, HeadDim, IntermediateSize, VocabSize, NumLayers int
	NormEps, RopeTheta                                                                float64
}

func readRefConfig(t testing.TB, h *bundle.Header) refConfig {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(h.Config, &c); err != nil {
		t.Fatal(err)
	}
	num := func(k string, d float64) float64 {
		if v, ok := c[k].(float64); ok {
			return v
		}
		return d
	}
	var r refConfig
	switch h.Family {
	case "qwen3":
		r.HiddenSize, r.NumHeads, r.IntermediateSize = int(num("hidden_size", 0)), int(num("num_attention_heads", 0)), int(num("intermediate_size", 0))
		r.NumKVHeads = int(num("num_key_value_heads", float64(r.NumHeads)))
		r.HeadDim = int(num("head_dim", float64(r.HiddenSize/r.NumHeads)))
		r.VocabSize, r.NumLayers = int(num("vocab_size", 0)), int(num("num_hidden_layers", 0))
		r.NormEps, r.RopeTheta = num("rms_norm_eps", 1e-6), num("rope_theta", 10000)
	case "gpt2":
		r.HiddenSize, r.NumHeads, r.VocabSize, r.NumLayers = int(num("n_embd", 0)), int(num("n_head", 0)), int(num("vocab_size", 0)), int(num("n_layer", 0))
		r.HeadDim, r.IntermediateSize = r.HiddenSize/r.NumHeads, int(num("n_inner", float64(4*r.HiddenSize)))
		r.NormEps = num("layer_norm_epsilon", 1e-5)
	}
	return r
}

func (m refModel) w(name string) []float32 {
	m.t.Helper()
	_, v, err := m.b.Float32s(name)
	if err != nil {
		m.t.Fatalf("reference: %v", err)
	}
	return v
}

func row(w []float32, r, n int) []float32 { return w[r*n : (r+1)*n] }

// matvec: y[o] = sum_k W[o*K+k] x[k] (nn.Linear, W [N,K]).
func matvec(w []float32, x []float64, n int) []float64 {
	k := len(x)
	y := make([]float64, n)
	for o := 0; o < n; o++ {
		var s float64
		for i, wv := range w[o*k : (o+1)*k] {
			s += float64(wv) * x[i]
		}
		y[o] = s
	}
	return y
}

// conv1dvec: y[o] = b[o] + sum_k x[k] W[k*N+o] (GPT-2 Conv1D, W [K,N]).
func conv1dvec(w, b []float32, x []float64, n int) []float64 {
	y := make([]float64, n)
	for o := range y {
		y[o] = float64(b[o])
	}
	for k, xv := range x {
		for o, wv := range w[k*n : (k+1)*n] {
			y[o] += xv * float64(wv)
		}
	}
	return y
}

func rmsNormRef(x []float64, g []float32, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(g[i]) * v * inv
	}
	return y
}

func layerNormRef(x []float64, g, b []float32, eps float64) []float64 {
	var mean, vr float64
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	for _, v := range x {
		vr += (v - mean) * (v - mean)
	}
	vr /= float64(len(x))
	inv := 1 / math.Sqrt(vr+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = (v-mean)*inv*float64(g[i]) + float64(b[i])
	}
	return y
}

func softmaxRef(s []float64) {
	mx := math.Inf(-1)
	for _, v := range s {
		mx = math.Max(mx, v)
	}
	var sum float64
	for i, v := range s {
		s[i] = math.Exp(v - mx)
		sum += s[i]
	}
	for i := range s {
		s[i] /= sum
	}
}

// causalAttention: q [T][H*hd], k,v [T][Hkv*hd] -> [T][H*hd].
func causalAttention(q, k, v [][]float64, H, Hkv, hd int) [][]float64 {
	out := make([][]float64, len(q))
	for t := range q {
		out[t] = make([]float64, H*hd)
		for h := 0; h < H; h++ {
			kh := h / (H / Hkv)
			s := make([]float64, t+1)
			for j := 0; j <= t; j++ {
				var d float64
				for i := 0; i < hd; i++ {
					d += q[t][h*hd+i] * k[j][kh*hd+i]
				}
				s[j] = d / math.Sqrt(float64(hd))
			}
			softmaxRef(s)
			for j := 0; j <= t; j++ {
				for i := 0; i < hd; i++ {
					out[t][h*hd+i] += s[j] * v[j][kh*hd+i]
				}
			}
		}
	}
	return out
}

func add(a, b []float64) {
	for i := range a {
		a[i] += b[i]
	}
}

// refLogits returns the logits at every position of ids (float64).
func refLogits(t testing.TB, b *bundle.Bundle, ids []int32) [][]float64 {
	t.Helper()
	m := refModel{t: t, b: b, cfg: readRefConfig(t, b.Header())}
	switch b.Header().Family {
	case "qwen3":
		return m.qwen3(ids)
	case "gpt2":
		return m.gpt2(ids)
	}
	t.Fatalf("reference: no reference for family %s", b.Header().Family)
	return nil
}

func (m refModel) qwen3(ids []int32) [][]float64 {
	c := m.cfg
	E, H, Hkv, hd, I, V := c.HiddenSize, c.NumHeads, c.NumKVHeads, c.HeadDim, c.IntermediateSize, c.VocabSize
	eps := c.NormEps
	emb := m.w("model.embed_tokens.weight")
	x := make([][]float64, len(ids))
	for t, id := range ids {
		x[t] = make([]float64, E)
		for i, v := range row(emb, int(id), E) {
			x[t][i] = float64(v)
		}
	}
	rope := func(v []float64, pos int) {
		half := hd / 2
		for i := 0; i < half; i++ {
			ang := float64(pos) * math.Pow(c.RopeTheta, -float64(2*i)/float64(hd))
			c, s := math.Cos(ang), math.Sin(ang)
			a, b := v[i], v[i+half]
			v[i], v[i+half] = a*c-b*s, b*c+a*s
		}
	}
	for l := 0; l < c.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		q, k, v := make([][]float64, len(ids)), make([][]float64, len(ids)), make([][]float64, len(ids))
		for t := range ids {
			a := rmsNormRef(x[t], m.w(p+"input_layernorm.weight"), eps)
			q[t] = matvec(m.w(p+"self_attn.q_proj.weight"), a, H*hd)
			k[t] = matvec(m.w(p+"self_attn.k_proj.weight"), a, Hkv*hd)
			v[t] = matvec(m.w(p+"self_attn.v_proj.weight"), a, Hkv*hd)
			for h := 0; h < H; h++ {
				copy(q[t][h*hd:], rmsNormRef(q[t][h*hd:(h+1)*hd], m.w(p+"self_attn.q_norm.weight"), eps))
				rope(q[t][h*hd:(h+1)*hd], t)
			}
			for h := 0; h < Hkv; h++ {
				copy(k[t][h*hd:], rmsNormRef(k[t][h*hd:(h+1)*hd], m.w(p+"self_attn.k_norm.weight"), eps))
				rope(k[t][h*hd:(h+1)*hd], t)
			}
		}
		att := causalAttention(q, k, v, H, Hkv, hd)
		for t := range ids {
			add(x[t], matvec(m.w(p+"self_attn.o_proj.weight"), att[t], E))
			a := rmsNormRef(x[t], m.w(p+"post_attention_layernorm.weight"), eps)
			g := matvec(m.w(p+"mlp.gate_proj.weight"), a, I)
			u := matvec(m.w(p+"mlp.up_proj.weight"), a, I)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			add(x[t], matvec(m.w(p+"mlp.down_proj.weight"), g, E))
		}
	}
	head := emb
	if _, ok := m.b.Header().Tensor("lm_head.weight"); ok {
		head = m.w("lm_head.weight")
	}
	out := make([][]float64, len(ids))
	for t := range ids {
		out[t] = matvec(head, rmsNormRef(x[t], m.w("model.norm.weight"), eps), V)
	}
	return out
}

func (m refModel) gpt2(ids []int32) [][]float64 {
	c := m.cfg
	E, H, hd, I, V := c.HiddenSize, c.NumHeads, c.HeadDim, c.IntermediateSize, c.VocabSize
	eps := c.NormEps
	wte, wpe := m.w("wte.weight"), m.w("wpe.weight")
	x := make([][]float64, len(ids))
	for t, id := range ids {
		x[t] = make([]float64, E)
		for i := 0; i < E; i++ {
			x[t][i] = float64(wte[int(id)*E+i]) + float64(wpe[t*E+i])
		}
	}
	for l := 0; l < c.NumLayers; l++ {
		p := fmt.Sprintf("h.%d.", l)
		q, k, v := make([][]float64, len(ids)), make([][]float64, len(ids)), make([][]float64, len(ids))
		for t := range ids {
			a := layerNormRef(x[t], m.w(p+"ln_1.weight"), m.w(p+"ln_1.bias"), eps)
			qkv := conv1dvec(m.w(p+"attn.c_attn.weight"), m.w(p+"attn.c_attn.bias"), a, 3*E)
			q[t], k[t], v[t] = qkv[:E], qkv[E:2*E], qkv[2*E:]
		}
		att := causalAttention(q, k, v, H, H, hd)
		for t := range ids {
			add(x[t], conv1dvec(m.w(p+"attn.c_proj.weight"), m.w(p+"attn.c_proj.bias"), att[t], E))
			a := layerNormRef(x[t], m.w(p+"ln_2.weight"), m.w(p+"ln_2.bias"), eps)
			f := conv1dvec(m.w(p+"mlp.c_fc.weight"), m.w(p+"mlp.c_fc.bias"), a, I)
			for i, z := range f {
				f[i] = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
			}
			add(x[t], conv1dvec(m.w(p+"mlp.c_proj.weight"), m.w(p+"mlp.c_proj.bias"), f, E))
		}
	}
	out := make([][]float64, len(ids))
	for t := range ids {
		out[t] = matvec(wte, layerNormRef(x[t], m.w("ln_f.weight"), m.w("ln_f.bias"), eps), V)
	}
	return out
}
