// models/qwen3_decoder.h: the Qwen3 decoder stack as a building block (owner: qwen family).
//
// Why a header: the Qwen3 decoder is shared by calling it, never by copying. qwen3.cc wraps it as
// Qwen3ForCausalLM; a vision-language family (qwen3vl) feeds it merged text and image embeddings
// with 3-axis interleaved M-RoPE positions and adds DeepStack features after its first layers; a
// text-to-image family uses it as a text encoder and reads the hidden state after layer k.
//
// Architecture (transformers' modeling_qwen3): per layer RMSNorm (input_layernorm) -> q/k/v
// projections (nn.Linear, [out, in], biases when attention_bias) -> per-head RMSNorm of q and k
// over head_dim (q_norm, k_norm) -> RoPE (rotate_half convention, inv_freq =
// rope_theta^(-2i/head_dim)) -> grouped-query causal attention (num_key_value_heads, scale
// 1/sqrt(head_dim)) -> o_proj, residual; post_attention_layernorm -> SwiGLU MLP
// down(silu(gate(x)) * up(x)), residual; final norm.
//
// Llama and Mistral (transformers' modeling_llama / modeling_mistral) are this layer without the
// q/k norms (Options::qk_norm false), with optional MLP biases (Options::mlp_bias), a rotary
// table from precomputed inverse frequencies and attention scaling (Options::rope_inv_freq,
// rope_scaling: the rope types llama.cc resolves) and Mistral's sliding window
// (Options::sliding_window: query p sees keys p-window+1..p). With a window the KV cache keeps
// only what a query can still read: a mirrored ring of 2 * window rows a slot (Qwen3Decoder::ring_).
//
// Mixture of experts (transformers' modeling_qwen3_moe, Options::moe): a layer's FFN may instead
// be a sparse block: router logits = gate(x) (bias-free [num_experts, E]), softmax in float32
// over all experts, the top_k largest probabilities (lowest expert index first on ties),
// divided by their sum when norm_topk_prob, then sum_k w_k * down_k(silu(gate_k(x)) * up_k(x))
// over the chosen experts (each an MLP of width moe_intermediate_size). Which layers are sparse
// is the caller's (decoder_sparse_step, mlp_only_layers); dense layers keep mlp.*. Every sparse
// layer counts the tokens it routes to each expert (routing_counts), for the serving metrics.
//
// Use:
//
//   Qwen3Decoder dec(args, DecoderDims(*args.hp), {});      // reads model.embed_tokens, layers, norm
//   dec.embed(ids, n, h);                                    // or build h [rows, E] yourself
//   Qwen3Decoder::Pass p;
//   p.batch = &b;                                            // KV slots, cache positions, row offsets
//   p.rope_pos = mrope; p.rope_axes = 3;                     // optional: [rows][3] (t, h, w)
//   p.after_layer = [&](int l, float *h, int rows) { ... };  // DeepStack add, or capture
//   p.last_layer = k;                                        // optional: stop after layer k
//   dec.forward(p, h);                                       // h: layer output (before the norm)
//   dec.final_norm(h, rows, out);
#ifndef MODELQUAL_QWEN3_DECODER_H
#define MODELQUAL_QWEN3_DECODER_H

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime.h"

namespace mq {

class Qwen3Decoder {
 public:
  struct Options {
    // prefix of the checkpoint's decoder tensors: "model." for Qwen3ForCausalLM,
    // "model.language_model." for Qwen3VLForConditionalGeneration.
    std::string prefix = "model.";
    // fault_prefix names this use's planted defects: <fault_prefix>.rope_theta_x10 multiplies
    // rope_theta by 10, <fault_prefix>.drop_q_norm skips q_norm (read once, here).
    std::string fault_prefix = "qwen3";
    // qk_norm: per-head RMSNorm of q and k (q_norm, k_norm tensors), as Qwen3; Llama has none.
    bool qk_norm = true;
    // mlp_bias: the dense MLP's gate, up and down projections carry biases (LlamaConfig.mlp_bias).
    bool mlp_bias = false;
    // rope_inv_freq: the head_dim/2 inverse frequencies as the config's rope type computes them
    // (llama.cc's rope_init); empty: default RoPE, 1/rope_theta^(2i/head_dim). rope_scaling
    // multiplies cos and sin (the rope type's attention scaling). A planted
    // <fault_prefix>.rope_theta_x10 scales the frequencies as a tenfold theta would.
    std::vector<float> rope_inv_freq;
    float rope_scaling = 1.0f;
    // sliding_window: each query attends to its last sliding_window keys (0: the whole cache),
    // as transformers' sliding_window_overlay does for Mistral.
    int sliding_window = 0;
    // mrope_section (t, h, w) frequency counts of interleaved multimodal RoPE (Qwen3-VL's
    // rope_scaling.mrope_section, summing to head_dim/2). Empty: plain 1-D RoPE. With it,
    // frequency i rotates by axis 1 (h) when i % 3 == 1 and i < 3*section[1], by axis 2 (w)
    // when i % 3 == 2 and i < 3*section[2], else by axis 0 (t), as transformers'
    // apply_interleaved_mrope does.
    std::vector<int> mrope_section;
    // Qwen2's attention as a variant of the same stack (InternVL3's text model): qk_norm false
    // (above) and o_proj_bias false, which reads no o_proj bias (Qwen2 has q/k/v biases only,
    // which attention_bias still switches).
    bool o_proj_bias = true;
    // moe: the sparse layers' mixture of experts; experts == 0 keeps every layer dense. Its
    // tensors: mlp.gate.weight [experts, E] and mlp.experts.<e>.{gate,up,down}_proj.weight.
    // Faults: <fault_prefix>.kv_head_swap stores KV heads 0 and 1 in each other's place;
    // <fault_prefix>.route_wrong_expert routes every token to the experts after its
    // chosen ones ((e + 1) % experts, same weights), to prove the routing gate bites.
    struct Moe {
      int experts = 0, top_k = 0, intermediate = 0;
      bool norm_topk_prob = true;
      std::vector<bool> sparse;  // per layer
    } moe;
  };

  // Pass is one forward pass over the rows of batch (entry i owns rows off[i]..off[i]+ntok[i]-1,
  // appended to KV slot slot[i] at cache positions pos[i]...).
  struct Pass {
    const Batch *batch = nullptr;
    // rope_pos: nullptr rotates each row by its cache position; otherwise rope_pos[r*rope_axes + a]
    // is row r's position on axis a (rope_axes 1, or 3 for M-RoPE: t, h, w; with rope_axes 1
    // under an mrope_section all three axes take that position, as text tokens do).
    const int32_t *rope_pos = nullptr;
    int rope_axes = 1;
    // after_layer(l, h, rows) runs after layer l with h [rows, E] the residual stream: add
    // per-layer features (DeepStack) or copy a hidden state out.
    std::function<void(int, float *, int)> after_layer;
    // last_layer: the last layer to run (-1: all). A text encoder reading transformers'
    // hidden_states[-2] stops after layer num_layers-2 and skips the rest.
    int last_layer = -1;
  };

  Qwen3Decoder(const ModelArgs &a, const DecoderDims &d, const Options &o);

  int hidden() const { return E_; }
  int layers() const { return hp_.num_layers; }
  const DecoderDims &dims() const { return hp_; }
  // embed_tokens weight [vocab, E].
  const float *embed_weight() const { return embed_; }
  // embed copies the embeddings of ids[0..n) into h [n, E].
  void embed(const int32_t *ids, int n, float *h) const;
  // forward runs the layers in place over h [rows, E] (input embeddings in, layer output out),
  // writing keys and values into the batch's KV slots.
  void forward(const Pass &p, float *h);
  // final_norm applies model.norm: out [rows, E].
  void final_norm(const float *h, int rows, float *out) const;
  // routing_counts adds into out [layers * experts] the tokens each sparse layer has routed to
  // each expert since the decoder was built (dense layers stay 0); experts() is 0 when dense.
  // Safe to call from another thread while forward runs (relaxed atomic reads).
  int experts() const { return moe_.experts; }
  void routing_counts(uint64_t *out) const;

 private:
  struct Layer {
    const float *in_ln, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *post_ln, *wg, *wu, *wd;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr, *bg = nullptr, *bu = nullptr, *bd = nullptr;
    // sparse layers: the router and each expert's gate, up, down (wg, wu, wd stay null).
    const float *router = nullptr;
    std::vector<const float *> eg, eu, ed;
  };
  void rope(float *x, const int *pos3) const;
  void dense_mlp(const Layer &L, int R, float *h);
  void sparse_mlp(int l, const Layer &L, int R, float *h);

  ThreadPool *pool_;
  DecoderDims hp_;
  int E_, H_, Hkv_, hd_, I_, ctx_, window_;
  // ring_: with a sliding window W shorter than half the context, the KV cache holds a mirrored
  // ring of 2 W rows a slot instead of every position: position p is stored in rows p mod W and
  // p mod W + W, so the W keys a query at p reads (p-W+1..p) are the contiguous rows from
  // (p-W+1) mod W, and the shared attention kernel reads them in place. A windowed entry's rows
  // are attended one at a time right after each is stored (a later row of the same entry would
  // overwrite keys an earlier row still reads). 0: a row per position.
  int ring_;
  bool qk_norm_, drop_q_norm_, kv_swap_;
  KVCache kv_;
  const float *embed_, *norm_;
  std::vector<Layer> layers_;
  std::vector<int> axis_;  // per frequency: which position axis rotates it
  std::vector<float> cos_, sin_;
  std::vector<float> a_, q_, k_, v_, att_, tmp_, g_, u_, scratch_;
  Options::Moe moe_;
  bool route_wrong_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [layer * experts + e]
  std::vector<float> probs_, xs_, ys_;
  std::vector<int> choice_, rows_of_;
  std::vector<float> weight_of_;
};

// decoder_lm_head is the LM head of a causal LM over dec: lm_head.weight [vocab, hidden], or the
// token embedding when config.json ties them and no lm_head.weight is stored (a tied checkpoint's
// stored head is dropped by the layout, as transformers ties over it).
std::unique_ptr<LMHead> decoder_lm_head(const Weights &w, const Qwen3Decoder &dec);

// resolve_decoder_shape reads the fields every family on this decoder shares (vocab_size,
// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the heads),
// head_dim (default hidden/heads), intermediate_size, rms_norm_eps, tie_word_embeddings,
// attention_bias, hidden_act silu) with transformers' defaults into hp, refusing shapes the
// decoder cannot compute; runtime names the family in the errors.
void resolve_decoder_shape(const Config &c, HParams &hp, const std::string &runtime);

// DecoderLM is a causal LM over the decoder: token embeddings, the layers, the final norm and
// lm_head (the token embedding when tie_word_embeddings and no lm_head.weight is stored). The
// text families built on the decoder (qwen3, qwen3moe, llama) are this class with their options.
class DecoderLM : public CausalLM {
 public:
  DecoderLM(const ModelArgs &a, const Qwen3Decoder::Options &o) : DecoderLM(a, DecoderDims(*a.hp), o) {}
  DecoderLM(const ModelArgs &a, const DecoderDims &d, const Qwen3Decoder::Options &o);
  int routing_counts(std::vector<uint64_t> *out, int *layers) const override;

 private:
  void run(const Batch &b) override;
  Qwen3Decoder dec_;
  std::vector<float> h_;
};

}  // namespace mq

#endif
