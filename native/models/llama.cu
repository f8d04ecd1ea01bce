// models/llama.cu: LlamaForCausalLM and MistralForCausalLM on CUDA (owner: llama family), the GPU
// side of models/llama.cc: the shared decoder (native/cuda/decoder.cuh) with RMSNorm, SwiGLU and
// RoPE, no q/k norms, the Llama tensor names, optional attention and MLP biases.
//
// Rotary scaling: the CPU runtime's resolve computed the inverse frequencies and the attention
// scaling once (hyper-parameters rope_inv_freq.<i>, rope_attention_scaling; see llama.cc), so
// this file reads them and never re-interprets the config. The decoder's rotary table takes the
// frequencies as they are (Cfg::inv_freq); the scaling s multiplies both cos and sin, so it
// multiplies every q·k product by s², which is folded into the attention's query scale
// (s²/sqrt(head_dim)) instead of into the table: the same function, rounded once more.
//
// Not on the GPU: Mistral's sliding window (the shared attention kernels attend to the whole
// cache). configure refuses a window shorter than the model's context rather than computing
// something else; such checkpoints run on the CPU runtime.
//
// Faults (MODELQUAL_FAULTS, read at open; the CPU runtime's names): llama.rope_theta_x10 changes
// the frequencies as on the CPU, to prove the parity gates bite (llama.kv_head_swap is CPU-only).
#include <cmath>
#include <memory>

#include "../cuda/env.cuh"
#include "../cuda/weights.cuh"

namespace mqcuda {
namespace llama {
namespace {

void configure_llama(Cfg &c, const HParams &h) {
  c.norm = PREP_RMS;
  c.gated = true;
  const double window = h.num("sliding_window");
  if (window > 0 && window < h.num("max_positions"))
    throw Fail(fmt("cuda backend: llama: sliding_window %g is shorter than the context (%g positions); the CUDA "
                   "decoder attends to the whole cache, so this checkpoint runs on the cpu backend only",
                   window, h.num("max_positions")));
  const int half = c.D / 2;
  c.inv_freq.resize(half);
  for (int j = 0; j < half; ++j) {
    c.inv_freq[j] = (float)h.num(fmt("rope_inv_freq.%d", j).c_str());
    if (fault("llama.rope_theta_x10")) c.inv_freq[j] *= (float)std::pow(10.0, -(double)(2 * j) / c.D);
  }
}

// State is the family's own state (m.fstate): what load needs of the hyper-parameters beyond
// Cfg, read at open.
struct State {
  double rope_scaling = 1.0;
  bool mlp_bias = false;
};

void open_llama(mqb_model &m, const mqb_model_params *p) {
  const HParams h{p->hparams, p->n_hparams, "llama"};
  auto st = std::make_shared<State>();
  st->rope_scaling = h.num("rope_attention_scaling");
  st->mlp_bias = h.num("mlp_bias") != 0;
  m.fstate = st;
}

void load_llama(mqb_model &m, const TensorMap &tm) {
  const Cfg &c = m.c;
  const int64_t H = c.H, D = c.D, I = c.I, V = c.V, nh = c.nh, nkv = c.nkv;
  const State &st = *static_cast<const State *>(m.fstate.get());
  const double s = st.rope_scaling;
  const mqb_tensor *et = tm.need("embed_tokens.weight", {V, H});
  m.emb = upload_matrix(m, {{et, V, false}}, H);
  const mqb_tensor *lmh = tm.find("lm_head.weight");
  if (c.tied || !lmh) {
    if (!c.tied && !lmh) throw Fail("cuda backend: tensor lm_head.weight is missing and tie_word_embeddings is false");
    m.lm = m.emb;
  } else {
    m.lm = upload_matrix(m, {{tm.need("lm_head.weight", {V, H}), V, false}}, H);
  }
  m.normf_w = upload_f32(m, {tm.need("norm.weight", {H})});
  for (int l = 0; l < c.L; ++l) {
    Layer &ly = m.layers[l];
    const std::string pre = fmt("layers.%d.", l);
    ly.ln1_w = upload_f32(m, {tm.need(pre + "input_layernorm.weight", {H})});
    ly.ln2_w = upload_f32(m, {tm.need(pre + "post_attention_layernorm.weight", {H})});
    const mqb_tensor *q = tm.need(pre + "self_attn.q_proj.weight", {nh * D, H});
    const mqb_tensor *k = tm.need(pre + "self_attn.k_proj.weight", {nkv * D, H});
    const mqb_tensor *v = tm.need(pre + "self_attn.v_proj.weight", {nkv * D, H});
    ly.w_qkv = upload_matrix(m, {{q, nh * D, false}, {k, nkv * D, false}, {v, nkv * D, false}}, H);
    ly.w_o = upload_matrix(m, {{tm.need(pre + "self_attn.o_proj.weight", {H, nh * D}), H, false}}, nh * D);
    if (c.attn_bias) {
      ly.b_qkv = upload_f32(m, {tm.need(pre + "self_attn.q_proj.bias", {nh * D}),
                                tm.need(pre + "self_attn.k_proj.bias", {nkv * D}),
                                tm.need(pre + "self_attn.v_proj.bias", {nkv * D})});
      ly.b_o = upload_f32(m, {tm.need(pre + "self_attn.o_proj.bias", {H})});
    }
    const mqb_tensor *gt = tm.need(pre + "mlp.gate_proj.weight", {I, H});
    const mqb_tensor *ut = tm.need(pre + "mlp.up_proj.weight", {I, H});
    ly.w_up = upload_matrix(m, {{gt, I, false}, {ut, I, false}}, H);
    ly.w_down = upload_matrix(m, {{tm.need(pre + "mlp.down_proj.weight", {H, I}), H, false}}, I);
    if (st.mlp_bias) {
      // gate|up, as w_up stacks them
      ly.b_up = upload_f32(m, {tm.need(pre + "mlp.gate_proj.bias", {I}), tm.need(pre + "mlp.up_proj.bias", {I})});
      ly.b_down = upload_f32(m, {tm.need(pre + "mlp.down_proj.bias", {H})});
    }
    ly.qscale = (float)(s * s / std::sqrt((double)D));
  }
  rope_setup(m);
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"llama"};
  f.configure = configure_llama;
  f.open = open_llama;
  f.load = load_llama;
  return f;
}());

}  // namespace
}  // namespace llama
}  // namespace mqcuda
