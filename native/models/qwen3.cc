// models/qwen3.cc: Qwen3ForCausalLM in fp32 (owner: qwen family).
//
// Architecture (transformers' modeling_qwen3): embed_tokens; per layer RMSNorm
// (input_layernorm) -> q/k/v projections (nn.Linear, [out, in], biases when attention_bias)
// -> per-head RMSNorm of q and k over head_dim (q_norm, k_norm) -> RoPE (rotate_half
// convention, inv_freq = rope_theta^(-2i/head_dim)) -> grouped-query causal attention
// (num_key_value_heads, scale 1/sqrt(head_dim)) -> o_proj, residual; post_attention_layernorm ->
// SwiGLU MLP down(silu(gate(x)) * up(x)), residual; final norm; lm_head, or embed_tokens when
// tie_word_embeddings.
//
// Faults (MODELQUAL_FAULTS, read at engine open): qwen3.rope_theta_x10 multiplies rope_theta by
// 10, qwen3.drop_q_norm skips q_norm. They exist to prove parity gates bite.
#include <cmath>
#include <cstring>

#include "runtime.h"

namespace mq {
namespace {

class Qwen3 : public CausalLM {
 public:
  explicit Qwen3(const ModelArgs &a) : Qwen3(a, DecoderDims(*a.hp)) {}
  Qwen3(const ModelArgs &a, const DecoderDims &d)
      : CausalLM(a.pool, d.hidden_size, d.vocab_size), hp_(d), H_(d.num_heads), Hkv_(d.num_kv_heads),
        hd_(d.head_dim), I_(d.intermediate_size), ctx_(a.max_context),
        drop_q_norm_(fault("qwen3.drop_q_norm")), kv_(d.num_layers, a.n_slots, a.max_context, d.num_kv_heads * d.head_dim) {
    const Weights &w = *a.w;
    const int qd = H_ * hd_, kvd = Hkv_ * hd_;
    embed_ = w.get("model.embed_tokens.weight", {V_, E_});
    for (int l = 0; l < hp_.num_layers; l++) {
      std::string p = "model.layers." + std::to_string(l) + ".";
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
    norm_ = w.get("model.norm.weight", {E_});
    if (w.has("lm_head.weight"))
      lm_ = w.get("lm_head.weight", {V_, E_});
    else if (hp_.tie_word_embeddings)
      lm_ = embed_;
    else
      throw Error(MQ_ERR_LOAD, "tensor lm_head.weight is missing and config.json tie_word_embeddings is false");
    head_.reset(new LMHead(lm_, V_, E_, w.file_backed(lm_)));

    // RoPE tables computed as transformers does in float32: inv_freq = 1/theta^(2i/d),
    // angle = float(pos) * inv_freq, then cos/sin of that float angle.
    double theta = hp_.rope_theta * (fault("qwen3.rope_theta_x10") ? 10.0 : 1.0);
    const int half = hd_ / 2;
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

 private:
  struct Layer {
    const float *in_ln, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *post_ln, *wg, *wu, *wd;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  };

  void rope(float *x, int p) const {
    const int half = hd_ / 2;
    const float *c = &cos_[(size_t)p * half], *s = &sin_[(size_t)p * half];
    for (int i = 0; i < half; i++) {
      float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c[i] - x2 * s[i];
      x[i + half] = x2 * c[i] + x1 * s[i];
    }
  }

  void run(const Batch &b) override {
    const int R = b.rows(), qd = H_ * hd_, kvd = Hkv_ * hd_;
    h_.resize((size_t)R * E_);
    a_.resize((size_t)R * E_);
    q_.resize((size_t)R * qd);
    k_.resize((size_t)R * kvd);
    v_.resize((size_t)R * kvd);
    att_.resize((size_t)R * qd);
    tmp_.resize((size_t)R * E_);
    g_.resize((size_t)R * I_);
    u_.resize((size_t)R * I_);
    hn_.resize((size_t)R * E_);
    scratch_.resize(ctx_);
    for (int r = 0; r < R; r++)
      std::memcpy(&h_[(size_t)r * E_], embed_ + (size_t)b.tokens[r] * E_, sizeof(float) * E_);
    const float scale = 1.0f / std::sqrt((float)hd_);
    for (int l = 0; l < hp_.num_layers; l++) {
      const Layer &L = layers_[l];
      rms_norm(h_.data(), R, E_, L.in_ln, hp_.norm_eps, a_.data());
      linear(pool_, a_.data(), R, E_, L.wq, qd, L.bq, q_.data());
      linear(pool_, a_.data(), R, E_, L.wk, kvd, L.bk, k_.data());
      linear(pool_, a_.data(), R, E_, L.wv, kvd, L.bv, v_.data());
      for (int i = 0; i < b.n; i++) {
        float *K = kv_.k(l, b.slot[i]), *V = kv_.v(l, b.slot[i]);
        for (int j = 0; j < b.ntok[i]; j++) {
          int r = b.off[i] + j, p = b.pos[i] + j;
          float *qr = &q_[(size_t)r * qd], *kr = &k_[(size_t)r * kvd];
          for (int h = 0; h < H_; h++) {
            if (!drop_q_norm_) rms_norm(qr + h * hd_, 1, hd_, L.q_norm, hp_.norm_eps, qr + h * hd_);
            rope(qr + h * hd_, p);
          }
          for (int h = 0; h < Hkv_; h++) {
            rms_norm(kr + h * hd_, 1, hd_, L.k_norm, hp_.norm_eps, kr + h * hd_);
            rope(kr + h * hd_, p);
          }
          std::memcpy(K + (size_t)p * kvd, kr, sizeof(float) * kvd);
          std::memcpy(V + (size_t)p * kvd, &v_[(size_t)r * kvd], sizeof(float) * kvd);
        }
        attention(&q_[(size_t)b.off[i] * qd], b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale,
                  &att_[(size_t)b.off[i] * qd], scratch_.data());
      }
      linear(pool_, att_.data(), R, qd, L.wo, E_, L.bo, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
      rms_norm(h_.data(), R, E_, L.post_ln, hp_.norm_eps, a_.data());
      linear(pool_, a_.data(), R, E_, L.wg, I_, nullptr, g_.data());
      linear(pool_, a_.data(), R, E_, L.wu, I_, nullptr, u_.data());
      for (size_t x = 0; x < (size_t)R * I_; x++) {
        float g = g_[x];
        g_[x] = g / (1.0f + std::exp(-g)) * u_[x];  // silu(gate) * up
      }
      linear(pool_, g_.data(), R, I_, L.wd, E_, nullptr, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
    }
    rms_norm(h_.data(), R, E_, norm_, hp_.norm_eps, hn_.data());
  }

  DecoderDims hp_;
  int H_, Hkv_, hd_, I_, ctx_;
  bool drop_q_norm_;
  KVCache kv_;
  const float *embed_, *norm_, *lm_;
  std::vector<Layer> layers_;
  std::vector<float> cos_, sin_;
  std::vector<float> h_, a_, q_, k_, v_, att_, tmp_, g_, u_, scratch_;
};

}  // namespace

// resolve_qwen3 reads Qwen3Config's fields with transformers' defaults and refuses what this
// runtime does not implement (other RoPE types, sliding windows, other activations) rather than
// computing something else.
void resolve_qwen3(const Config &c, HParams &hp) {
  const int64_t heads = c.positive("num_attention_heads"), hidden = c.positive("hidden_size");
  const int64_t kv = c.has("num_key_value_heads") ? c.positive("num_key_value_heads") : heads;
  const int64_t head_dim = c.has("head_dim") ? c.positive("head_dim") : hidden / heads;
  if (heads % kv != 0)
    throw Error(MQ_ERR_LOAD, "config.json: num_attention_heads " + std::to_string(heads) +
                                 " is not a multiple of num_key_value_heads " + std::to_string(kv));
  if (head_dim % 2 != 0)
    throw Error(MQ_ERR_LOAD, "config.json: head_dim " + std::to_string(head_dim) + " must be even (RoPE rotates halves)");
  const std::string rope_type = c.string(
      "rope_parameters.rope_type", c.string("rope_scaling.rope_type", c.string("rope_scaling.type", "default")));
  if (rope_type != "default")
    throw Error(MQ_ERR_LOAD, "config.json: rope type \"" + rope_type + "\" is not supported; only default RoPE");
  if (c.has("rope_scaling.factor"))
    throw Error(MQ_ERR_LOAD, "config.json: rope_scaling is not supported; only default RoPE");
  if (c.string("hidden_act", "silu") != "silu")
    throw Error(MQ_ERR_LOAD, "config.json: hidden_act \"" + c.string("hidden_act") + "\" is not supported; the qwen3 runtime implements silu");
  if (c.boolean("use_sliding_window", false))
    throw Error(MQ_ERR_LOAD, "config.json: use_sliding_window true is not supported");
  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("hidden_size", (double)hidden);
  hp.set("num_layers", (double)c.positive("num_hidden_layers"));
  hp.set("num_heads", (double)heads);
  hp.set("num_kv_heads", (double)kv);
  hp.set("head_dim", (double)head_dim);
  hp.set("intermediate_size", (double)c.positive("intermediate_size"));
  hp.set("max_positions", (double)c.positive("max_position_embeddings"));
  hp.set("norm_eps", c.number("rms_norm_eps", 1e-6));
  hp.set("rope_theta", c.first_number({"rope_theta", "rope_parameters.rope_theta"}, 10000));
  hp.set("tie_word_embeddings", c.boolean("tie_word_embeddings", false));  // Qwen3Config's default
  hp.set("attention_bias", c.boolean("attention_bias", false));
  hp.set("scale_attn_by_inverse_layer_idx", 0);
}

std::unique_ptr<Backend> make_qwen3(const ModelArgs &a) { return std::unique_ptr<Backend>(new Qwen3(a)); }

MQ_REGISTER_FAMILY(Family{"qwen3", "text", {"Qwen3ForCausalLM"}, resolve_qwen3, make_qwen3});

}  // namespace mq
