// models/llama.cc: LlamaForCausalLM and MistralForCausalLM in fp32 (owner: llama family).
//
// Architecture (transformers' modeling_llama / modeling_mistral): embed_tokens; per layer
// RMSNorm (input_layernorm) -> q/k/v projections (biases when attention_bias; Mistral has none)
// -> RoPE (rotate_half convention; inverse frequencies by the config's rope type, cos/sin times
// the type's attention scaling) -> grouped-query causal attention (scale 1/sqrt(head_dim);
// Mistral: only the last sliding_window keys) -> o_proj, residual; post_attention_layernorm ->
// SwiGLU MLP down(silu(gate(x)) * up(x)) (biases when mlp_bias), residual; final norm; lm_head,
// or embed_tokens when tie_word_embeddings.
//
// Rotary scaling is computed here once, at resolve, exactly as transformers' rope initialisation
// (modeling_rope_utils.py) does for rope types default, linear, dynamic, llama3 and yarn, from
// either config form (rope_theta + rope_scaling as published checkpoints store it, or
// transformers 5's rope_parameters). The inverse frequencies and attention scaling are handed on
// as hyper-parameters (rope_inv_freq.<i>, rope_attention_scaling), so the CPU model and the CUDA
// model (llama.cu) read the same numbers and neither re-interprets the config.
//
// Why not the Qwen3 decoder (qwen3_decoder.h): Llama is Qwen3's layer without q/k norms, plus
// MLP biases, scaled rotary tables and a sliding window. That decoder could take these as
// options; until its owner makes it so, this file composes the same shared kernels
// (kernels.cc: linear, rms_norm, attention) rather than copying that file.
//
// Faults (MODELQUAL_FAULTS, read at engine open): llama.rope_theta_x10 multiplies every inverse
// frequency by 10^(-2i/d) as a tenfold theta would; llama.kv_head_swap stores KV heads 0 and 1
// in each other's place. They exist to prove the llama-tiny gates bite; the rope types, biases
// and the sliding window, which llama-tiny does not use, are guarded by the golden tests on
// llama-tiny-llama3 and mistral-tiny (native/models/llama_test.go).
#include <cmath>
#include <cstring>

#include "runtime.h"

namespace mq {
namespace {

constexpr double kPi = 3.14159265358979323846;

// RopeInit is what transformers' rope init function returns: inv_freq (float32) and the
// attention scaling applied to cos and sin.
struct RopeInit {
  std::vector<float> inv_freq;
  double attention_scaling = 1.0;
};

// default_inv_freq: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)) in float32.
std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; i++) {
    float e = (float)(2 * i) / (float)dim;
    float p = (float)std::pow(base, (double)e);
    inv[i] = 1.0f / p;
  }
  return inv;
}

// RopeConfig reads the rotary settings from either config form: rope_parameters (transformers
// 5) or rope_theta + rope_scaling (what published checkpoints store).
struct RopeConfig {
  const Config &c;
  std::string prefix;  // "rope_parameters." or "rope_scaling."
  std::string type;
  double theta;
  explicit RopeConfig(const Config &cfg) : c(cfg) {
    const bool params = c.has("rope_parameters.rope_type") || c.has("rope_parameters.rope_theta");
    prefix = params ? "rope_parameters." : "rope_scaling.";
    type = c.string(prefix + "rope_type", c.string(prefix + "type", "default"));
    theta = c.first_number({"rope_parameters.rope_theta", "rope_theta"}, 10000);
  }
  bool has(const std::string &k) const { return c.has(prefix + k); }
  double num(const std::string &k) const {
    if (!c.has(prefix + k))
      throw Error(MQ_ERR_LOAD, "config.json: " + prefix + k + " is missing; rope type \"" + type + "\" needs it");
    return c.number(prefix + k);
  }
  double num(const std::string &k, double dflt) const { return c.number(prefix + k, dflt); }
};

// rope_init computes the inverse frequencies of rope type rc.type as transformers 5.17's
// modeling_rope_utils does (each step in float32 where torch computes in float32, in double
// where it computes with Python floats).
RopeInit rope_init(const RopeConfig &rc, int dim, int64_t max_pos) {
  RopeInit r;
  const double base = rc.theta;
  if (rc.type == "default") {
    r.inv_freq = default_inv_freq(base, dim);
  } else if (rc.type == "linear") {
    const float factor = (float)rc.num("factor");
    r.inv_freq = default_inv_freq(base, dim);
    for (float &f : r.inv_freq) f /= factor;
  } else if (rc.type == "dynamic") {
    // At init (and for every sequence within max_position_embeddings) the dynamic NTK base is
    // base * ((factor * seq_len / max) - (factor - 1)) ** (dim / (dim - 2)) with seq_len = max:
    // the base itself. resolve caps the context at max_position_embeddings, so the update
    // transformers makes for longer sequences never applies.
    const double factor = rc.num("factor");
    const double seq = (double)max_pos;
    const double b = base * std::pow(factor * seq / (double)max_pos - (factor - 1), (double)dim / (dim - 2));
    r.inv_freq = default_inv_freq(b, dim);
  } else if (rc.type == "llama3") {
    const float factor = (float)rc.num("factor");
    const double low = rc.num("low_freq_factor"), high = rc.num("high_freq_factor");
    const double old_ctx = rc.num("original_max_position_embeddings");
    const float low_wavelen = (float)(old_ctx / low), high_wavelen = (float)(old_ctx / high);
    r.inv_freq = default_inv_freq(base, dim);
    for (float &f : r.inv_freq) {
      const float inv = f;
      const float wavelen = (float)(2 * kPi) / inv;
      float scaled = wavelen > low_wavelen ? inv / factor : inv;
      const float smooth = ((float)old_ctx / wavelen - (float)low) / (float)(high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : scaled;
    }
  } else if (rc.type == "yarn") {
    // original_max_position_embeddings defaults to max_position_embeddings (transformers'
    // standardize_rope_params); factor, when absent, is their ratio (DeepSeek-V3's configs).
    const double orig = rc.num("original_max_position_embeddings", (double)max_pos);
    const double factor = rc.has("factor") ? rc.num("factor") : (double)max_pos / orig;
    auto mscale_of = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const double mscale = rc.num("mscale", 0), mscale_all = rc.num("mscale_all_dim", 0);
    if (rc.has("attention_factor"))
      r.attention_scaling = rc.num("attention_factor");
    else if (mscale != 0 && mscale_all != 0)
      r.attention_scaling = mscale_of(factor, mscale) / mscale_of(factor, mscale_all);
    else
      r.attention_scaling = mscale_of(factor, 1);
    const double beta_fast = rc.num("beta_fast", 0) != 0 ? rc.num("beta_fast") : 32;
    const double beta_slow = rc.num("beta_slow", 0) != 0 ? rc.num("beta_slow") : 1;
    const bool truncate = rc.c.boolean(rc.prefix + "truncate", true);
    auto corr_dim = [&](double rot) { return (dim * std::log(orig / (rot * 2 * kPi))) / (2 * std::log(base)); };
    double lo = corr_dim(beta_fast), hi = corr_dim(beta_slow);
    if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0);
    hi = std::min(hi, (double)(dim - 1));
    if (lo == hi) hi += 0.001;  // linear_ramp_factor's guard against a zero-width ramp
    const int half = dim / 2;
    r.inv_freq.resize(half);
    for (int i = 0; i < half; i++) {
      const float pos_freq = (float)std::pow(base, (double)((float)(2 * i) / (float)dim));
      const float extra = 1.0f / pos_freq;
      const float inter = 1.0f / ((float)factor * pos_freq);
      float ramp = ((float)i - (float)lo) / (float)(hi - lo);
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float ef = 1.0f - ramp;  // inv_freq_extrapolation_factor
      r.inv_freq[i] = inter * (1.0f - ef) + extra * ef;
    }
  } else {
    throw Error(MQ_ERR_LOAD, "config.json: rope type \"" + rc.type +
                                 "\" is not supported by the llama runtime; supported: default, linear, dynamic, llama3, yarn");
  }
  return r;
}

// resolve_llama reads LlamaConfig's (and MistralConfig's) fields with transformers' defaults and
// refuses what this runtime does not implement rather than computing something else.
void resolve_llama(const Config &c, HParams &hp) {
  const int64_t heads = c.positive("num_attention_heads"), hidden = c.positive("hidden_size");
  const int64_t kv = c.has("num_key_value_heads") ? c.positive("num_key_value_heads") : heads;
  const int64_t head_dim = c.has("head_dim") ? c.positive("head_dim") : hidden / heads;
  if (heads % kv != 0)
    throw Error(MQ_ERR_LOAD, "config.json: num_attention_heads " + std::to_string(heads) +
                                 " is not a multiple of num_key_value_heads " + std::to_string(kv));
  if (head_dim % 2 != 0)
    throw Error(MQ_ERR_LOAD, "config.json: head_dim " + std::to_string(head_dim) + " must be even (RoPE rotates halves)");
  if (c.string("hidden_act", "silu") != "silu")
    throw Error(MQ_ERR_LOAD, "config.json: hidden_act \"" + c.string("hidden_act") + "\" is not supported; the llama runtime implements silu");
  const double prf = c.first_number({"rope_parameters.partial_rotary_factor", "partial_rotary_factor"}, 1.0);
  if (prf != 1.0)
    throw Error(MQ_ERR_LOAD, "config.json: partial_rotary_factor " + std::to_string(prf) + " is not supported; Llama rotates the whole head");
  const std::string model_type = c.string("model_type", "llama");
  int64_t max_pos = c.positive("max_position_embeddings");
  RopeConfig rc(c);
  RopeInit ri = rope_init(rc, (int)head_dim, max_pos);
  if (rc.type == "dynamic" && rc.has("original_max_position_embeddings"))
    max_pos = std::min<int64_t>(max_pos, (int64_t)rc.num("original_max_position_embeddings"));
  // Mistral's sliding window: MistralConfig.sliding_window (null: none). Llama has none.
  int64_t window = 0;
  if (model_type == "mistral" && c.has("sliding_window")) window = c.positive("sliding_window");
  if (model_type == "llama" && c.boolean("use_sliding_window", false))
    throw Error(MQ_ERR_LOAD, "config.json: use_sliding_window true is not supported for model_type llama");

  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("hidden_size", (double)hidden);
  hp.set("num_layers", (double)c.positive("num_hidden_layers"));
  hp.set("num_heads", (double)heads);
  hp.set("num_kv_heads", (double)kv);
  hp.set("head_dim", (double)head_dim);
  hp.set("intermediate_size", (double)c.positive("intermediate_size"));
  hp.set("max_positions", (double)max_pos);
  hp.set("norm_eps", c.number("rms_norm_eps", 1e-6));
  hp.set("rope_theta", rc.theta);
  hp.set_string("rope_type", rc.type);
  hp.set("rope_attention_scaling", ri.attention_scaling);
  for (size_t i = 0; i < ri.inv_freq.size(); i++) hp.set("rope_inv_freq." + std::to_string(i), (double)ri.inv_freq[i]);
  hp.set("tie_word_embeddings", c.boolean("tie_word_embeddings", false));  // LlamaConfig's default
  hp.set("attention_bias", model_type == "mistral" ? false : c.boolean("attention_bias", false));
  hp.set("mlp_bias", model_type == "mistral" ? false : c.boolean("mlp_bias", false));
  hp.set("sliding_window", (double)window);
  hp.set("scale_attn_by_inverse_layer_idx", 0);
}

class Llama : public CausalLM {
 public:
  explicit Llama(const ModelArgs &a) : Llama(a, DecoderDims(*a.hp)) {}
  Llama(const ModelArgs &a, const DecoderDims &d)
      : CausalLM(a.pool, d.hidden_size, d.vocab_size), hp_(d), H_(d.num_heads), Hkv_(d.num_kv_heads), hd_(d.head_dim),
        I_(d.intermediate_size), ctx_(a.max_context), window_(a.hp->i("sliding_window")),
        kv_(d.num_layers, a.n_slots, a.max_context, d.num_kv_heads * d.head_dim) {
    const Weights &w = *a.w;
    const HParams &hp = *a.hp;
    const int qd = H_ * hd_, kvd = Hkv_ * hd_;
    const bool mlp_bias = hp.b("mlp_bias");
    kv_swap_ = fault("llama.kv_head_swap") && Hkv_ > 1;
    embed_ = w.get("model.embed_tokens.weight", {V_, E_});
    for (int l = 0; l < d.num_layers; l++) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.in_ln = w.get(p + "input_layernorm.weight", {E_});
      L.wq = w.get(p + "self_attn.q_proj.weight", {qd, E_});
      L.wk = w.get(p + "self_attn.k_proj.weight", {kvd, E_});
      L.wv = w.get(p + "self_attn.v_proj.weight", {kvd, E_});
      L.wo = w.get(p + "self_attn.o_proj.weight", {E_, qd});
      if (d.attention_bias) {
        L.bq = w.get(p + "self_attn.q_proj.bias", {qd});
        L.bk = w.get(p + "self_attn.k_proj.bias", {kvd});
        L.bv = w.get(p + "self_attn.v_proj.bias", {kvd});
        L.bo = w.get(p + "self_attn.o_proj.bias", {E_});
      }
      L.post_ln = w.get(p + "post_attention_layernorm.weight", {E_});
      L.wg = w.get(p + "mlp.gate_proj.weight", {I_, E_});
      L.wu = w.get(p + "mlp.up_proj.weight", {I_, E_});
      L.wd = w.get(p + "mlp.down_proj.weight", {E_, I_});
      if (mlp_bias) {
        L.bg = w.get(p + "mlp.gate_proj.bias", {I_});
        L.bu = w.get(p + "mlp.up_proj.bias", {I_});
        L.bd = w.get(p + "mlp.down_proj.bias", {E_});
      }
      layers_.push_back(L);
    }
    norm_ = w.get("model.norm.weight", {E_});
    const float *lm;
    if (w.has("lm_head.weight"))
      lm = w.get("lm_head.weight", {V_, E_});
    else if (d.tie_word_embeddings)
      lm = embed_;
    else
      throw Error(MQ_ERR_LOAD, "tensor lm_head.weight is missing and config.json tie_word_embeddings is false");
    head_.reset(new LMHead(lm, V_, E_, w.file_backed(lm)));

    // The rotary table as transformers builds it in float32: angle = float(pos) * inv_freq,
    // cos/sin of that angle, each times the rope type's attention scaling.
    const int half = hd_ / 2;
    std::vector<float> inv(half);
    for (int i = 0; i < half; i++) inv[i] = (float)hp.f("rope_inv_freq." + std::to_string(i));
    if (fault("llama.rope_theta_x10"))
      for (int i = 0; i < half; i++) inv[i] *= (float)std::pow(10.0, -(double)(2 * i) / hd_);
    const float scaling = (float)hp.f("rope_attention_scaling");
    cos_.resize((size_t)ctx_ * half);
    sin_.resize((size_t)ctx_ * half);
    for (int p = 0; p < ctx_; p++)
      for (int i = 0; i < half; i++) {
        const float ang = (float)p * inv[i];
        cos_[(size_t)p * half + i] = (float)std::cos((double)ang) * scaling;
        sin_[(size_t)p * half + i] = (float)std::sin((double)ang) * scaling;
      }
  }

 private:
  struct Layer {
    const float *in_ln, *wq, *wk, *wv, *wo, *post_ln, *wg, *wu, *wd;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr, *bg = nullptr, *bu = nullptr,
                *bd = nullptr;
  };

  void rope(float *x, int p) const {
    const int half = hd_ / 2;
    const float *c = &cos_[(size_t)p * half], *s = &sin_[(size_t)p * half];
    for (int i = 0; i < half; i++) {
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c[i] - x2 * s[i];
      x[i + half] = x2 * c[i] + x1 * s[i];
    }
  }

  void run(const Batch &b) override {
    const int R = b.rows(), qd = H_ * hd_, kvd = Hkv_ * hd_;
    h_.resize((size_t)R * E_);
    hn_.resize((size_t)R * E_);
    a_.resize((size_t)R * E_);
    q_.resize((size_t)R * qd);
    k_.resize((size_t)R * kvd);
    v_.resize((size_t)R * kvd);
    att_.resize((size_t)R * qd);
    tmp_.resize((size_t)R * E_);
    g_.resize((size_t)R * I_);
    u_.resize((size_t)R * I_);
    scratch_.resize(ctx_);
    for (int r = 0; r < R; r++) {
      const int32_t id = b.tokens[r];
      if (id < 0 || id >= V_) throw Error(MQ_ERR_INVALID_ARGUMENT, "token id " + std::to_string(id) + " is outside the vocabulary");
      std::memcpy(&h_[(size_t)r * E_], embed_ + (size_t)id * E_, sizeof(float) * E_);
    }
    const float scale = 1.0f / std::sqrt((float)hd_);
    for (size_t l = 0; l < layers_.size(); l++) {
      const Layer &L = layers_[l];
      rms_norm(h_.data(), R, E_, L.in_ln, hp_.norm_eps, a_.data());
      linear(pool_, a_.data(), R, E_, L.wq, qd, L.bq, q_.data());
      linear(pool_, a_.data(), R, E_, L.wk, kvd, L.bk, k_.data());
      linear(pool_, a_.data(), R, E_, L.wv, kvd, L.bv, v_.data());
      for (int i = 0; i < b.n; i++) {
        float *K = kv_.k((int)l, b.slot[i]), *V = kv_.v((int)l, b.slot[i]);
        for (int j = 0; j < b.ntok[i]; j++) {
          const int r = b.off[i] + j, p = b.pos[i] + j;
          float *qr = &q_[(size_t)r * qd], *kr = &k_[(size_t)r * kvd];
          for (int hh = 0; hh < H_; hh++) rope(qr + hh * hd_, p);
          for (int hh = 0; hh < Hkv_; hh++) rope(kr + hh * hd_, p);
          if (kv_swap_) {  // planted defect: KV heads 0 and 1 trade places
            std::swap_ranges(kr, kr + hd_, kr + hd_);
            std::swap_ranges(&v_[(size_t)r * kvd], &v_[(size_t)r * kvd] + hd_, &v_[(size_t)r * kvd] + hd_);
          }
          std::memcpy(K + (size_t)p * kvd, kr, sizeof(float) * kvd);
          std::memcpy(V + (size_t)p * kvd, &v_[(size_t)r * kvd], sizeof(float) * kvd);
        }
        float *qe = &q_[(size_t)b.off[i] * qd], *oe = &att_[(size_t)b.off[i] * qd];
        if (window_ <= 0 || b.pos[i] + b.ntok[i] <= window_) {
          attention(qe, b.ntok[i], b.pos[i], H_, Hkv_, hd_, K, V, scale, oe, scratch_.data());
        } else {
          // Sliding window (transformers' sliding_window_overlay: key k is visible to query q
          // when q - k < window): each row attends to its last window_ keys, the shared kernel
          // run on the window's part of the cache.
          for (int j = 0; j < b.ntok[i]; j++) {
            const int p = b.pos[i] + j, start = std::max(0, p - window_ + 1);
            attention(qe + (size_t)j * qd, 1, p - start, H_, Hkv_, hd_, K + (size_t)start * kvd,
                      V + (size_t)start * kvd, scale, oe + (size_t)j * qd, scratch_.data());
          }
        }
      }
      linear(pool_, att_.data(), R, qd, L.wo, E_, L.bo, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
      rms_norm(h_.data(), R, E_, L.post_ln, hp_.norm_eps, a_.data());
      linear(pool_, a_.data(), R, E_, L.wg, I_, L.bg, g_.data());
      linear(pool_, a_.data(), R, E_, L.wu, I_, L.bu, u_.data());
      for (size_t x = 0; x < (size_t)R * I_; x++) {
        const float g = g_[x];
        g_[x] = g / (1.0f + std::exp(-g)) * u_[x];  // silu(gate) * up
      }
      linear(pool_, g_.data(), R, I_, L.wd, E_, L.bd, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
    }
    rms_norm(h_.data(), R, E_, norm_, hp_.norm_eps, hn_.data());
  }

  DecoderDims hp_;
  int H_, Hkv_, hd_, I_, ctx_, window_;
  bool kv_swap_ = false;
  KVCache kv_;
  const float *embed_, *norm_;
  std::vector<Layer> layers_;
  std::vector<float> cos_, sin_;
  std::vector<float> h_, a_, q_, k_, v_, att_, tmp_, g_, u_, scratch_;
};

std::unique_ptr<Backend> make_llama(const ModelArgs &a) { return std::unique_ptr<Backend>(new Llama(a)); }

// layout_llama: a LlamaModel checkpoint names the decoder without "model." (transformers adds it
// when it loads a task model from a base model's state dict); with tie_word_embeddings the head
// is the token embedding, so a stored lm_head.weight is dropped (transformers ties over it).
void layout_llama(const HParams &hp, TensorLayout &l) {
  l.rename("", "model.");
  if (hp.b("tie_word_embeddings")) l.drop("lm_head.weight");
}

}  // namespace

MQ_REGISTER_FAMILY(Family{"llama", "text", {"LlamaForCausalLM", "MistralForCausalLM"}, resolve_llama, make_llama, 0,
                          layout_llama});

}  // namespace mq
