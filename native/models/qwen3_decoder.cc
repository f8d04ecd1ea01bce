// models/qwen3_decoder.cc: the Qwen3 decoder stack (see qwen3_decoder.h; owner: qwen family).
#include "qwen3_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mq {

Qwen3Decoder::Qwen3Decoder(const ModelArgs &a, const DecoderDims &d, const Options &o)
    : pool_(a.pool), hp_(d), E_(d.hidden_size), H_(d.num_heads), Hkv_(d.num_kv_heads), hd_(d.head_dim),
      I_(d.intermediate_size), ctx_(a.max_context), window_(o.sliding_window),
      ring_(o.sliding_window > 0 && 2 * (int64_t)o.sliding_window < a.max_context ? o.sliding_window : 0),
      qk_norm_(o.qk_norm), drop_q_norm_(fault(o.fault_prefix + ".drop_q_norm")),
      kv_swap_(fault(o.fault_prefix + ".kv_head_swap") && d.num_kv_heads > 1),
      kv_(d.num_layers, a.n_slots, ring_ ? 2 * ring_ : a.max_context, d.num_kv_heads * d.head_dim), moe_(o.moe),
      route_wrong_(fault(o.fault_prefix + ".route_wrong_expert")) {
  const Weights &w = *a.w;
  const int qd = H_ * hd_, kvd = Hkv_ * hd_;
  const std::string &m = o.prefix;
  embed_ = w.get(m + "embed_tokens.weight", {d.vocab_size, E_});
  const int NE = moe_.experts, MI = moe_.intermediate;
  if (NE > 0) {
    if (moe_.top_k <= 0 || moe_.top_k > NE)
      throw Error(MQ_ERR_LOAD, "num_experts_per_tok " + std::to_string(moe_.top_k) + " must be in 1.." + std::to_string(NE) + " (num_experts)");
    if (MI <= 0) throw Error(MQ_ERR_LOAD, "moe_intermediate_size must be positive");
    if ((int)moe_.sparse.size() != hp_.num_layers)
      throw Error(MQ_ERR_LOAD, "the mixture of experts names " + std::to_string(moe_.sparse.size()) + " layers, the decoder has " +
                                   std::to_string(hp_.num_layers));
    counts_.reset(new std::atomic<uint64_t>[(size_t)hp_.num_layers * NE]);
    for (size_t x = 0; x < (size_t)hp_.num_layers * NE; x++) counts_[x].store(0, std::memory_order_relaxed);
  }
  for (int l = 0; l < hp_.num_layers; l++) {
    std::string p = m + "layers." + std::to_string(l) + ".";
    Layer L;
    L.in_ln = w.get(p + "input_layernorm.weight", {E_});
    L.wq = w.get(p + "self_attn.q_proj.weight", {qd, E_});
    L.wk = w.get(p + "self_attn.k_proj.weight", {kvd, E_});
    L.wv = w.get(p + "self_attn.v_proj.weight", {kvd, E_});
    L.wo = w.get(p + "self_attn.o_proj.weight", {E_, qd});
    if (hp_.attention_bias) {
      L.bq = w.get(p + "self_attn.q_proj.bias", {qd});
      L.bk = w.get(p + "self_attn.k_proj.bias", {kvd});
      L.bv = w.get(p + "self_attn.v_proj.bias", {kvd});
      if (o.o_proj_bias) L.bo = w.get(p + "self_attn.o_proj.bias", {E_});
    }
    L.q_norm = L.k_norm = nullptr;
    if (qk_norm_) {
      L.q_norm = w.get(p + "self_attn.q_norm.weight", {hd_});
      L.k_norm = w.get(p + "self_attn.k_norm.weight", {hd_});
    }
    L.post_ln = w.get(p + "post_attention_layernorm.weight", {E_});
    if (NE > 0 && moe_.sparse[l]) {
      L.router = w.get(p + "mlp.gate.weight", {NE, E_});
      for (int e = 0; e < NE; e++) {
        std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        L.eg.push_back(w.get(x + "gate_proj.weight", {MI, E_}));
        L.eu.push_back(w.get(x + "up_proj.weight", {MI, E_}));
        L.ed.push_back(w.get(x + "down_proj.weight", {E_, MI}));
      }
    } else {
      L.wg = w.get(p + "mlp.gate_proj.weight", {I_, E_});
      L.wu = w.get(p + "mlp.up_proj.weight", {I_, E_});
      L.wd = w.get(p + "mlp.down_proj.weight", {E_, I_});
      if (o.mlp_bias) {
        L.bg = w.get(p + "mlp.gate_proj.bias", {I_});
        L.bu = w.get(p + "mlp.up_proj.bias", {I_});
        L.bd = w.get(p + "mlp.down_proj.bias", {E_});
      }
    }
    layers_.push_back(L);
  }
  norm_ = w.get(m + "norm.weight", {E_});

  const int half = hd_ / 2;
  axis_.assign(half, 0);
  if (!o.mrope_section.empty()) {
    int sum = 0;
    for (int s : o.mrope_section) sum += s;
    if (o.mrope_section.size() != 3 || sum != half)
      throw Error(MQ_ERR_LOAD, "mrope_section must have 3 entries summing to head_dim/2 = " + std::to_string(half));
    for (int i = 0; i < half; i++) {
      if (i % 3 == 1 && i < 3 * o.mrope_section[1]) axis_[i] = 1;
      else if (i % 3 == 2 && i < 3 * o.mrope_section[2]) axis_[i] = 2;
    }
  }
  // RoPE tables computed as transformers does in float32: inv_freq = 1/theta^(2i/d) (or the
  // rope type's frequencies), angle = float(pos) * inv_freq, then cos/sin of that float angle,
  // each times the rope type's attention scaling.
  const bool theta_x10 = fault(o.fault_prefix + ".rope_theta_x10");
  std::vector<float> inv(half);
  if (!o.rope_inv_freq.empty()) {
    if ((int)o.rope_inv_freq.size() != half)
      throw Error(MQ_ERR_LOAD, "rope_inv_freq has " + std::to_string(o.rope_inv_freq.size()) + " frequencies; head_dim/2 is " +
                                   std::to_string(half));
    for (int i = 0; i < half; i++)
      inv[i] = o.rope_inv_freq[i] * (theta_x10 ? (float)std::pow(10.0, -(double)(2 * i) / hd_) : 1.0f);
  } else {
    double theta = hp_.rope_theta * (theta_x10 ? 10.0 : 1.0);
    for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / std::pow(theta, (double)(float)(2 * i) / (double)hd_));
  }
  cos_.resize((size_t)ctx_ * half);
  sin_.resize((size_t)ctx_ * half);
  for (int i = 0; i < half; i++) {
    for (int p = 0; p < ctx_; p++) {
      float ang = (float)p * inv[i];
      cos_[(size_t)p * half + i] = (float)std::cos((double)ang) * o.rope_scaling;
      sin_[(size_t)p * half + i] = (float)std::sin((double)ang) * o.rope_scaling;
    }
  }
}

void resolve_decoder_shape(const Config &c, HParams &hp, const std::string &runtime) {
  const int64_t heads = c.positive("num_attention_heads"), hidden = c.positive("hidden_size");
  const int64_t kv = c.has("num_key_value_heads") ? c.positive("num_key_value_heads") : heads;
  const int64_t head_dim = c.has("head_dim") ? c.positive("head_dim") : hidden / heads;
  if (heads % kv != 0)
    throw Error(MQ_ERR_LOAD, "config.json: num_attention_heads " + std::to_string(heads) +
                                 " is not a multiple of num_key_value_heads " + std::to_string(kv));
  if (head_dim % 2 != 0)
    throw Error(MQ_ERR_LOAD, "config.json: head_dim " + std::to_string(head_dim) + " must be even (RoPE rotates halves)");
  if (c.string("hidden_act", "silu") != "silu")
    throw Error(MQ_ERR_LOAD, "config.json: hidden_act \"" + c.string("hidden_act") + "\" is not supported; the " + runtime +
                                 " runtime implements silu");
  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("hidden_size", (double)hidden);
  hp.set("num_layers", (double)c.positive("num_hidden_layers"));
  hp.set("num_heads", (double)heads);
  hp.set("num_kv_heads", (double)kv);
  hp.set("head_dim", (double)head_dim);
  hp.set("intermediate_size", (double)c.positive("intermediate_size"));
  hp.set("norm_eps", c.number("rms_norm_eps", 1e-6));
  hp.set("tie_word_embeddings", c.boolean("tie_word_embeddings", false));  // Qwen3Config's and LlamaConfig's default
  hp.set("attention_bias", c.boolean("attention_bias", false));
  hp.set("scale_attn_by_inverse_layer_idx", 0);
}

void Qwen3Decoder::embed(const int32_t *ids, int n, float *h) const {
  for (int r = 0; r < n; r++) std::memcpy(h + (size_t)r * E_, embed_ + (size_t)ids[r] * E_, sizeof(float) * E_);
}

// rope rotates one head x by the positions pos3 (t, h, w), each frequency taking its axis.
void Qwen3Decoder::rope(float *x, const int *pos3) const {
  const int half = hd_ / 2;
  for (int i = 0; i < half; i++) {
    int p = pos3[axis_[i]];
    float c = cos_[(size_t)p * half + i], s = sin_[(size_t)p * half + i];
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

void Qwen3Decoder::forward(const Pass &ps, float *h) {
  const Batch &b = *ps.batch;
  const int R = b.rows(), qd = H_ * hd_, kvd = Hkv_ * hd_;
  a_.resize((size_t)R * E_);
  q_.resize((size_t)R * qd);
  k_.resize((size_t)R * kvd);
  v_.resize((size_t)R * kvd);
  att_.resize((size_t)R * qd);
  tmp_.resize((size_t)R * E_);
  g_.resize((size_t)R * I_);
  u_.resize((size_t)R * I_);
  scratch_.resize(ctx_);
  const float scale = 1.0f / std::sqrt((float)hd_);
  const int last = ps.last_layer < 0 ? hp_.num_layers - 1 : ps.last_layer;
  for (int l = 0; l <= last; l++) {
    const Layer &L = layers_[l];
    rms_norm(h, R, E_, L.in_ln, hp_.norm_eps, a_.data());
    linear(pool_, a_.data(), R, E_, L.wq, qd, L.bq, q_.data());
    linear(pool_, a_.data(), R, E_, L.wk, kvd, L.bk, k_.data());
    linear(pool_, a_.data(), R, E_, L.wv, kvd, L.bv, v_.data());
    for (int i = 0; i < b.n; i++) {
      float *K = kv_.k(l, b.slot[i]), *V = kv_.v(l, b.slot[i]);
      float *qe = &q_[(size_t)b.off[i] * qd], *oe = &att_[(size_t)b.off[i] * qd];
      // A windowed entry past the window: each row attends its last window_ keys (the shared
      // kernel run on the window's part of the cache) as soon as its own key is stored (ring_).
      const bool per_row = window_ > 0 && b.pos[i] + b.ntok[i] > window_;
      for (int j = 0; j < b.ntok[i]; j++) {
        int r = b.off[i] + j, p = b.pos[i] + j;
        int p3[3] = {p, p, p};
        if (ps.rope_pos) {
          const int32_t *rp = ps.rope_pos + (size_t)r * ps.rope_axes;
          for (int x = 0; x < 3; x++) {
            p3[x] = rp[ps.rope_axes == 3 ? x : 0];
            if (p3[x] < 0 || p3[x] >= ctx_)
              throw Error(MQ_ERR_INVALID_ARGUMENT, "rotary position " + std::to_string(p3[x]) + " is outside the context");
          }
        }
        float *qr = &q_[(size_t)r * qd], *kr = &k_[(size_t)r * kvd];
        for (int hh = 0; hh < H_; hh++) {
          if (qk_norm_ && !drop_q_norm_) rms_norm(qr + hh * hd_, 1, hd_, L.q_norm, hp_.norm_eps, qr + hh * hd_);
          rope(qr + hh * hd_, p3);
        }
        for (int hh = 0; hh < Hkv_; hh++) {
          if (qk_norm_) rms_norm(kr + hh * hd_, 1, hd_, L.k_norm, hp_.norm_eps, kr + hh * hd_);
          rope(kr + hh * hd_, p3);
        }
        if (kv_swap_) {  // planted defect: KV heads 0 and 1 trade places
          float *vr = &v_[(size_t)r * kvd];
          std::swap_ranges(kr, kr + hd_, kr + hd_);
          std::swap_ranges(vr, vr + hd_, vr + hd_);
        }
        for (int row : {ring_ ? p % ring_ : p, ring_ ? p % ring_ + ring_ : -1}) {  // the ring's mirror too
          if (row < 0) continue;
          std::memcpy(K + (size_t)row * kvd, kr, sizeof(float) * kvd);
          std::memcpy(V + (size_t)row * kvd, &v_[(size_t)r * kvd], sizeof(float) * kvd);
        }
        if (per_row) {
          const int start = std::max(0, p - window_ + 1), at = ring_ ? start % ring_ : start;
          attention(qe + (size_t)j * qd, 1, p - start, H_, Hkv_, hd_, K + (size_t)at * kvd, V + (size_t)at * kvd, scale,
                    oe + (size_t)j * qd, scratch_.data());
        }
      }
      // Otherwise every key is in the rows of its position (a ring's first window_ rows).
      if (!per_row) attention(qe, b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale, oe, scratch_.data());
    }
    linear(pool_, att_.data(), R, qd, L.wo, E_, L.bo, tmp_.data());
    for (size_t x = 0; x < (size_t)R * E_; x++) h[x] += tmp_[x];
    rms_norm(h, R, E_, L.post_ln, hp_.norm_eps, a_.data());
    if (L.router)
      sparse_mlp(l, L, R, h);
    else
      dense_mlp(L, R, h);
    if (ps.after_layer) ps.after_layer(l, h, R);
  }
}

// dense_mlp adds down(silu(gate(a)) * up(a)) to h, a_ holding the normed rows.
void Qwen3Decoder::dense_mlp(const Layer &L, int R, float *h) {
  g_.resize((size_t)R * I_);  // a sparse layer before this one may have resized them
  u_.resize((size_t)R * I_);
  linear(pool_, a_.data(), R, E_, L.wg, I_, L.bg, g_.data());
  linear(pool_, a_.data(), R, E_, L.wu, I_, L.bu, u_.data());
  for (size_t x = 0; x < (size_t)R * I_; x++) {
    float g = g_[x];
    g_[x] = g / (1.0f + std::exp(-g)) * u_[x];  // silu(gate) * up
  }
  linear(pool_, g_.data(), R, I_, L.wd, E_, L.bd, tmp_.data());
  for (size_t x = 0; x < (size_t)R * E_; x++) h[x] += tmp_[x];
}

// sparse_mlp routes each row of a_ to its top_k experts and adds their weighted outputs to h.
// Rows are grouped by expert, so each expert's three products run once over all its rows (as
// the GPU's grouped products do); outputs are added in expert order, as transformers'
// index_add_ over its expert loop does.
void Qwen3Decoder::sparse_mlp(int l, const Layer &L, int R, float *h) {
  const int NE = moe_.experts, K = moe_.top_k, MI = moe_.intermediate;
  probs_.resize((size_t)R * NE);
  choice_.resize((size_t)R * K);
  weight_of_.resize((size_t)R * K);
  linear(pool_, a_.data(), R, E_, L.router, NE, nullptr, probs_.data());
  for (int r = 0; r < R; r++) {
    float *p = &probs_[(size_t)r * NE];
    float mx = p[0];
    for (int e = 1; e < NE; e++) mx = std::max(mx, p[e]);
    float sum = 0;
    for (int e = 0; e < NE; e++) sum += (p[e] = std::exp(p[e] - mx));
    for (int e = 0; e < NE; e++) p[e] /= sum;
    // top-k by selection: the largest remaining probability, lowest index on ties.
    int *c = &choice_[(size_t)r * K];
    float *wk = &weight_of_[(size_t)r * K];
    float tot = 0;
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < NE; e++) {
        bool taken = false;
        for (int j = 0; j < k; j++) taken |= c[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      c[k] = best;
      wk[k] = p[best];
      tot += p[best];
    }
    for (int k = 0; k < K; k++) {
      if (moe_.norm_topk_prob) wk[k] /= tot;
      if (route_wrong_) c[k] = (c[k] + 1) % NE;
    }
  }
  std::fill(tmp_.begin(), tmp_.begin() + (size_t)R * E_, 0.0f);
  for (int e = 0; e < NE; e++) {
    rows_of_.clear();
    std::vector<float> wt;
    for (int r = 0; r < R; r++)
      for (int k = 0; k < K; k++)
        if (choice_[(size_t)r * K + k] == e) {
          rows_of_.push_back(r);
          wt.push_back(weight_of_[(size_t)r * K + k]);
        }
    const int n = (int)rows_of_.size();
    if (n == 0) continue;
    counts_[(size_t)l * NE + e].fetch_add((uint64_t)n, std::memory_order_relaxed);
    xs_.resize((size_t)n * E_);
    g_.resize((size_t)n * MI);
    u_.resize((size_t)n * MI);
    ys_.resize((size_t)n * E_);
    for (int i = 0; i < n; i++) std::memcpy(&xs_[(size_t)i * E_], &a_[(size_t)rows_of_[i] * E_], sizeof(float) * E_);
    linear(pool_, xs_.data(), n, E_, L.eg[e], MI, nullptr, g_.data());
    linear(pool_, xs_.data(), n, E_, L.eu[e], MI, nullptr, u_.data());
    for (size_t x = 0; x < (size_t)n * MI; x++) g_[x] *= u_[x] / (1.0f + std::exp(-g_[x]));  // silu(gate) * up
    linear(pool_, g_.data(), n, MI, L.ed[e], E_, nullptr, ys_.data());
    for (int i = 0; i < n; i++) {
      float *dst = &tmp_[(size_t)rows_of_[i] * E_];
      const float *src = &ys_[(size_t)i * E_];
      for (int x = 0; x < E_; x++) dst[x] += src[x] * wt[i];
    }
  }
  for (size_t x = 0; x < (size_t)R * E_; x++) h[x] += tmp_[x];
}

void Qwen3Decoder::routing_counts(uint64_t *out) const {
  if (!counts_) return;
  for (size_t x = 0; x < (size_t)hp_.num_layers * moe_.experts; x++) out[x] += counts_[x].load(std::memory_order_relaxed);
}

void Qwen3Decoder::final_norm(const float *h, int rows, float *out) const {
  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);
}

std::unique_ptr<LMHead> decoder_lm_head(const Weights &w, const Qwen3Decoder &dec) {
  const DecoderDims &d = dec.dims();
  const int V = d.vocab_size, E = dec.hidden();
  const float *lm;
  if (w.has("lm_head.weight"))
    lm = w.get("lm_head.weight", {V, E});
  else if (d.tie_word_embeddings)
    lm = dec.embed_weight();
  else
    throw Error(MQ_ERR_LOAD, "tensor lm_head.weight is missing and config.json tie_word_embeddings is false");
  return std::unique_ptr<LMHead>(new LMHead(lm, V, E, w.file_backed(lm)));
}

DecoderLM::DecoderLM(const ModelArgs &a, const DecoderDims &d, const Qwen3Decoder::Options &o)
    : CausalLM(a.pool, d.hidden_size, d.vocab_size), dec_(a, d, o) {
  head_ = decoder_lm_head(*a.w, dec_);
}

void DecoderLM::run(const Batch &b) {
  const int R = b.rows();
  h_.resize((size_t)R * E_);
  hn_.resize((size_t)R * E_);
  dec_.embed(b.tokens.data(), R, h_.data());
  Qwen3Decoder::Pass p;
  p.batch = &b;
  dec_.forward(p, h_.data());
  dec_.final_norm(h_.data(), R, hn_.data());
}

int DecoderLM::routing_counts(std::vector<uint64_t> *out, int *layers) const {
  if (dec_.experts() == 0) return 0;
  *layers = dec_.layers();
  out->assign((size_t)dec_.layers() * dec_.experts(), 0);
  dec_.routing_counts(out->data());
  return dec_.experts();
}

}  // namespace mq
