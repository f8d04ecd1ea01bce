// models/qwen3_decoder.cc: the Qwen3 decoder stack (see qwen3_decoder.h; owner: qwen family).
#include "qwen3_decoder.h"

#include <cmath>
#include <cstring>

namespace mq {

Qwen3Decoder::Qwen3Decoder(const ModelArgs &a, const DecoderDims &d, const Options &o)
    : pool_(a.pool), hp_(d), E_(d.hidden_size), H_(d.num_heads), Hkv_(d.num_kv_heads), hd_(d.head_dim),
      I_(d.intermediate_size), ctx_(a.max_context), drop_q_norm_(fault(o.fault_prefix + ".drop_q_norm")),
      kv_(d.num_layers, a.n_slots, a.max_context, d.num_kv_heads * d.head_dim) {
  const Weights &w = *a.w;
  const int qd = H_ * hd_, kvd = Hkv_ * hd_;
  const std::string &m = o.prefix;
  embed_ = w.get(m + "embed_tokens.weight", {d.vocab_size, E_});
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
      L.bo = w.get(p + "self_attn.o_proj.bias", {E_});
    }
    L.q_norm = w.get(p + "self_attn.q_norm.weight", {hd_});
    L.k_norm = w.get(p + "self_attn.k_norm.weight", {hd_});
    L.post_ln = w.get(p + "post_attention_layernorm.weight", {E_});
    L.wg = w.get(p + "mlp.gate_proj.weight", {I_, E_});
    L.wu = w.get(p + "mlp.up_proj.weight", {I_, E_});
    L.wd = w.get(p + "mlp.down_proj.weight", {E_, I_});
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
  // RoPE tables computed as transformers does in float32: inv_freq = 1/theta^(2i/d),
  // angle = float(pos) * inv_freq, then cos/sin of that float angle.
  double theta = hp_.rope_theta * (fault(o.fault_prefix + ".rope_theta_x10") ? 10.0 : 1.0);
  cos_.resize((size_t)ctx_ * half);
  sin_.resize((size_t)ctx_ * half);
  for (int i = 0; i < half; i++) {
    float inv = (float)(1.0 / std::pow(theta, (double)(float)(2 * i) / (double)hd_));
    for (int p = 0; p < ctx_; p++) {
      float ang = (float)p * inv;
      cos_[(size_t)p * half + i] = (float)std::cos((double)ang);
      sin_[(size_t)p * half + i] = (float)std::sin((double)ang);
    }
  }
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
          if (!drop_q_norm_) rms_norm(qr + hh * hd_, 1, hd_, L.q_norm, hp_.norm_eps, qr + hh * hd_);
          rope(qr + hh * hd_, p3);
        }
        for (int hh = 0; hh < Hkv_; hh++) {
          rms_norm(kr + hh * hd_, 1, hd_, L.k_norm, hp_.norm_eps, kr + hh * hd_);
          rope(kr + hh * hd_, p3);
        }
        std::memcpy(K + (size_t)p * kvd, kr, sizeof(float) * kvd);
        std::memcpy(V + (size_t)p * kvd, &v_[(size_t)r * kvd], sizeof(float) * kvd);
      }
      attention(&q_[(size_t)b.off[i] * qd], b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale,
                &att_[(size_t)b.off[i] * qd], scratch_.data());
    }
    linear(pool_, att_.data(), R, qd, L.wo, E_, L.bo, tmp_.data());
    for (size_t x = 0; x < (size_t)R * E_; x++) h[x] += tmp_[x];
    rms_norm(h, R, E_, L.post_ln, hp_.norm_eps, a_.data());
    linear(pool_, a_.data(), R, E_, L.wg, I_, nullptr, g_.data());
    linear(pool_, a_.data(), R, E_, L.wu, I_, nullptr, u_.data());
    for (size_t x = 0; x < (size_t)R * I_; x++) {
      float g = g_[x];
      g_[x] = g / (1.0f + std::exp(-g)) * u_[x];  // silu(gate) * up
    }
    linear(pool_, g_.data(), R, I_, L.wd, E_, nullptr, tmp_.data());
    for (size_t x = 0; x < (size_t)R * E_; x++) h[x] += tmp_[x];
    if (ps.after_layer) ps.after_layer(l, h, R);
  }
}

void Qwen3Decoder::final_norm(const float *h, int rows, float *out) const {
  rms_norm(h, rows, E_, norm_, hp_.norm_eps, out);
}

}  // namespace mq
