// models/gpt2.cc: GPT2LMHeadModel in fp32 (owner: gpt2 family).
//
// Architecture (transformers' modeling_gpt2): token embedding wte plus learned position
// embedding wpe; per block pre-LayerNorm attention with a fused Conv1D c_attn ([in, 3*out],
// q|k|v), scaled dot-product causal attention (1/sqrt(head_dim), optionally also 1/(layer+1)),
// Conv1D c_proj, residual; pre-LayerNorm MLP c_fc -> gelu_new (tanh approximation) -> c_proj,
// residual; final ln_f; LM head tied to wte. Tensor names may carry a "transformer." prefix.
#include <cmath>
#include <cstring>

#include "runtime.h"

namespace mq {
namespace {

class Gpt2 : public CausalLM {
 public:
  explicit Gpt2(const ModelArgs &a) : Gpt2(a, DecoderDims(*a.hp)) {}
  Gpt2(const ModelArgs &a, const DecoderDims &d)
      : CausalLM(a.pool, d.hidden_size, d.vocab_size), hp_(d), H_(d.num_heads), hd_(E_ / H_), I_(d.intermediate_size),
        ctx_(a.max_context), kv_(d.num_layers, a.n_slots, a.max_context, d.hidden_size) {
    const Weights &w = *a.w;
    // Older conversions carry the causal-mask buffers as tensors; they are not weights.
    w.ignore_suffix(".attn.bias");
    w.ignore_suffix(".attn.masked_bias");
    // Checkpoints name the tensors with or without the "transformer." prefix (hub gpt2 vs
    // save_pretrained); a tensor in neither form is reported by its plain name.
    auto name = [&](const std::string &n) {
      return w.has(n) || !w.has("transformer." + n) ? n : "transformer." + n;
    };
    wte_ = w.get(name("wte.weight"), {V_, E_});
    wpe_ = w.get(name("wpe.weight"), {hp_.max_positions, E_});
    for (int l = 0; l < hp_.num_layers; l++) {
      std::string p = "h." + std::to_string(l) + ".";
      Layer L;
      L.ln1g = w.get(name(p + "ln_1.weight"), {E_});
      L.ln1b = w.get(name(p + "ln_1.bias"), {E_});
      L.attn_w = w.get(name(p + "attn.c_attn.weight"), {E_, 3 * E_});
      L.attn_b = w.get(name(p + "attn.c_attn.bias"), {3 * E_});
      L.proj_w = w.get(name(p + "attn.c_proj.weight"), {E_, E_});
      L.proj_b = w.get(name(p + "attn.c_proj.bias"), {E_});
      L.ln2g = w.get(name(p + "ln_2.weight"), {E_});
      L.ln2b = w.get(name(p + "ln_2.bias"), {E_});
      L.fc_w = w.get(name(p + "mlp.c_fc.weight"), {E_, I_});
      L.fc_b = w.get(name(p + "mlp.c_fc.bias"), {I_});
      L.mproj_w = w.get(name(p + "mlp.c_proj.weight"), {I_, E_});
      L.mproj_b = w.get(name(p + "mlp.c_proj.bias"), {E_});
      layers_.push_back(L);
    }
    lnfg_ = w.get(name("ln_f.weight"), {E_});
    lnfb_ = w.get(name("ln_f.bias"), {E_});
    // GPT-2's LM head is always the token embedding (tie_word_embeddings); a separate
    // lm_head.weight, when a checkpoint carries one, is the same matrix.
    lm_ = w.has("lm_head.weight") ? w.get("lm_head.weight", {V_, E_}) : wte_;
    head_.reset(new LMHead(lm_, V_, E_, w.file_backed(lm_)));
  }

 private:
  struct Layer {
    const float *ln1g, *ln1b, *attn_w, *attn_b, *proj_w, *proj_b, *ln2g, *ln2b, *fc_w, *fc_b, *mproj_w, *mproj_b;
  };

  // run leaves the final LayerNorm output of every row in hn_.
  void run(const Batch &b) override {
    const int R = b.rows();
    h_.resize((size_t)R * E_);
    a_.resize((size_t)R * E_);
    qkv_.resize((size_t)R * 3 * E_);
    q_.resize((size_t)R * E_);
    att_.resize((size_t)R * E_);
    tmp_.resize((size_t)R * E_);
    ff_.resize((size_t)R * I_);
    hn_.resize((size_t)R * E_);
    scratch_.resize(ctx_);
    for (int i = 0; i < b.n; i++)
      for (int j = 0; j < b.ntok[i]; j++) {
        int r = b.off[i] + j, p = b.pos[i] + j;
        float *hr = &h_[(size_t)r * E_];
        std::memcpy(hr, wte_ + (size_t)b.tokens[r] * E_, sizeof(float) * E_);
        const float *pe = wpe_ + (size_t)p * E_;
        for (int d = 0; d < E_; d++) hr[d] += pe[d];
      }
    for (int l = 0; l < hp_.num_layers; l++) {
      const Layer &L = layers_[l];
      layer_norm(h_.data(), R, E_, L.ln1g, L.ln1b, hp_.norm_eps, a_.data());
      conv1d(pool_, a_.data(), R, E_, L.attn_w, 3 * E_, L.attn_b, qkv_.data());
      float scale = 1.0f / std::sqrt((float)hd_);
      if (hp_.scale_attn_by_inverse_layer_idx) scale /= (float)(l + 1);
      for (int i = 0; i < b.n; i++) {
        float *K = kv_.k(l, b.slot[i]), *V = kv_.v(l, b.slot[i]);
        for (int j = 0; j < b.ntok[i]; j++) {
          int r = b.off[i] + j, p = b.pos[i] + j;
          const float *row = &qkv_[(size_t)r * 3 * E_];
          std::memcpy(&q_[(size_t)r * E_], row, sizeof(float) * E_);
          std::memcpy(K + (size_t)p * E_, row + E_, sizeof(float) * E_);
          std::memcpy(V + (size_t)p * E_, row + 2 * E_, sizeof(float) * E_);
        }
        attention(&q_[(size_t)b.off[i] * E_], b.ntok[i], b.pos[i], H_, H_, hd_, K, V, scale,
                  &att_[(size_t)b.off[i] * E_], scratch_.data());
      }
      conv1d(pool_, att_.data(), R, E_, L.proj_w, E_, L.proj_b, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
      layer_norm(h_.data(), R, E_, L.ln2g, L.ln2b, hp_.norm_eps, a_.data());
      conv1d(pool_, a_.data(), R, E_, L.fc_w, I_, L.fc_b, ff_.data());
      for (auto &x : ff_) x = gelu_new(x);
      conv1d(pool_, ff_.data(), R, I_, L.mproj_w, E_, L.mproj_b, tmp_.data());
      for (size_t x = 0; x < (size_t)R * E_; x++) h_[x] += tmp_[x];
    }
    layer_norm(h_.data(), R, E_, lnfg_, lnfb_, hp_.norm_eps, hn_.data());
  }

  // gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), Hendrycks & Gimpel 2016.
  static float gelu_new(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
  }

  DecoderDims hp_;
  int H_, hd_, I_, ctx_;
  KVCache kv_;
  const float *wte_, *wpe_, *lnfg_, *lnfb_, *lm_;
  std::vector<Layer> layers_;
  std::vector<float> h_, a_, qkv_, q_, att_, tmp_, ff_, scratch_;
};

}  // namespace

// resolve_gpt2 reads GPT2Config's fields with transformers' defaults and refuses what this
// runtime does not implement.
void resolve_gpt2(const Config &c, HParams &hp) {
  const int64_t hidden = c.positive("n_embd"), heads = c.positive("n_head");
  if (hidden % heads != 0)
    throw Error(MQ_ERR_LOAD, "config.json: n_embd " + std::to_string(hidden) + " is not a multiple of n_head " + std::to_string(heads));
  if (c.string("activation_function", "gelu_new") != "gelu_new")
    throw Error(MQ_ERR_LOAD, "config.json: activation_function \"" + c.string("activation_function") +
                                 "\" is not supported; the gpt2 runtime implements gelu_new");
  if (!c.boolean("scale_attn_weights", true)) throw Error(MQ_ERR_LOAD, "config.json: scale_attn_weights false is not supported");
  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("hidden_size", (double)hidden);
  hp.set("num_layers", (double)c.positive("n_layer"));
  hp.set("num_heads", (double)heads);
  hp.set("num_kv_heads", (double)heads);
  hp.set("head_dim", (double)(hidden / heads));
  hp.set("intermediate_size", (double)(c.has("n_inner") ? c.positive("n_inner") : 4 * hidden));
  hp.set("max_positions", (double)c.positive("n_positions"));
  hp.set("norm_eps", c.number("layer_norm_epsilon", 1e-5));
  hp.set("rope_theta", 0);
  hp.set("tie_word_embeddings", 1);  // GPT-2's head is always wte
  hp.set("attention_bias", 1);
  hp.set("scale_attn_by_inverse_layer_idx", c.boolean("scale_attn_by_inverse_layer_idx", false));
}

std::unique_ptr<Backend> make_gpt2(const ModelArgs &a) { return std::unique_ptr<Backend>(new Gpt2(a)); }

// layout_gpt2: the hub's gpt2 names the tensors without base_model_prefix "transformer.",
// save_pretrained of GPT2LMHeadModel with it; bundles carry the hub's names. GPT-2's head is
// wte (tie_word_embeddings), so a stored lm_head.weight is dropped as transformers' tying
// discards it.
void layout_gpt2(const HParams &, TensorLayout &l) {
  l.rename("transformer.", "");
  l.drop("lm_head.weight");
}

MQ_REGISTER_FAMILY(Family{"gpt2", "text", {"GPT2LMHeadModel"}, resolve_gpt2, make_gpt2, 0, layout_gpt2});

}  // namespace mq
