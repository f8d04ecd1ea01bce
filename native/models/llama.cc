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
// The layers are the shared decoder's (qwen3_decoder.h: Qwen3's layer without q/k norms, with
// the options above: MLP biases, this table, the window), served by DecoderLM as qwen3's are.
//
// Faults (MODELQUAL_FAULTS, read at engine open): llama.rope_theta_x10 multiplies every inverse
// frequency by 10^(-2i/d) as a tenfold theta would; llama.kv_head_swap stores KV heads 0 and 1
// in each other's place. They exist to prove the llama-tiny gates bite; the rope types, biases
// and the sliding window, which llama-tiny does not use, are guarded by the golden tests on
// llama-tiny-llama3 and mistral-tiny (native/models/llama_test.go).
#include <algorithm>
#include <cmath>

#include "qwen3_decoder.h"

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
  resolve_decoder_shape(c, hp, "llama");
  const int64_t head_dim = hp.i("head_dim");
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

  hp.set("max_positions", (double)max_pos);
  hp.set("rope_theta", rc.theta);
  hp.set_string("rope_type", rc.type);
  hp.set("rope_attention_scaling", ri.attention_scaling);
  for (size_t i = 0; i < ri.inv_freq.size(); i++) hp.set("rope_inv_freq." + std::to_string(i), (double)ri.inv_freq[i]);
  hp.set("attention_bias", model_type == "mistral" ? false : c.boolean("attention_bias", false));
  hp.set("mlp_bias", model_type == "mistral" ? false : c.boolean("mlp_bias", false));
  hp.set("sliding_window", (double)window);
}

// llama_options: the shared decoder without q/k norms, with the MLP biases, the rotary table and
// the sliding window resolve_llama wrote into hp.
Qwen3Decoder::Options llama_options(const HParams &hp) {
  Qwen3Decoder::Options o;
  o.fault_prefix = "llama";
  o.qk_norm = false;
  o.mlp_bias = hp.b("mlp_bias");
  const int half = hp.i("head_dim") / 2;
  for (int i = 0; i < half; i++) o.rope_inv_freq.push_back((float)hp.f("rope_inv_freq." + std::to_string(i)));
  o.rope_scaling = (float)hp.f("rope_attention_scaling");
  o.sliding_window = hp.i("sliding_window");
  return o;
}

std::unique_ptr<Backend> make_llama(const ModelArgs &a) { return std::unique_ptr<Backend>(new DecoderLM(a, llama_options(*a.hp))); }

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
