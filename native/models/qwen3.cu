// models/qwen3.cu: Qwen3ForCausalLM on CUDA (owner: qwen family), the GPU side of models/qwen3.cc:
// the shared decoder (native/cuda/decoder.cuh) with RMSNorm, SwiGLU, q/k norms and RoPE, and the
// Qwen3 tensor names. load_decoder and configure serve the families built on the Qwen3 decoder
// (qwen3.cuh).
//
// Faults (MODELQUAL_FAULTS, read at open; the CPU runtime's names): qwen3.rope_theta_x10
// multiplies rope_theta by 10, qwen3.drop_q_norm skips q_norm. They prove the parity gates bite.
#include <cmath>

#include "qwen3.cuh"

namespace mqcuda {
namespace qwen3 {

void configure(Cfg &c, const std::string &fault_prefix) {
  c.norm = PREP_RMS;
  c.gated = true;
  if (fault((fault_prefix + ".rope_theta_x10").c_str())) c.theta *= 10;
}

void load_decoder(mqb_model &m, const TensorMap &tm, const DecoderOptions &o) {
  const Cfg &c = m.c;
  const int64_t H = c.H, D = c.D, I = c.I, V = c.V, nh = c.nh, nkv = c.nkv;
  const std::string &tp = o.prefix;
  const mqb_tensor *et = tm.need(tp + "embed_tokens.weight", {V, H});
  m.emb = upload_matrix(m, {{et, V, false}}, H);
  const mqb_tensor *lmh = tm.find("lm_head.weight");
  if (c.tied || !lmh) {
    if (!c.tied && !lmh) throw Fail("cuda backend: tensor lm_head.weight is missing and tie_word_embeddings is false");
    m.lm = m.emb;
  } else {
    m.lm = upload_matrix(m, {{tm.need("lm_head.weight", {V, H}), V, false}}, H);
  }
  m.normf_w = upload_f32(m, {tm.need(tp + "norm.weight", {H})});
  const bool drop_qn = fault((o.fault_prefix + ".drop_q_norm").c_str());
  const double s = o.rope_scaling;
  const float qscale = s == 1.0 ? 1.f / sqrtf((float)D) : (float)(s * s / std::sqrt((double)D));
  for (int l = 0; l < c.L; ++l) {
    Layer &ly = m.layers[l];
    const std::string pre = tp + fmt("layers.%d.", l);
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
      if (o.o_proj_bias) ly.b_o = upload_f32(m, {tm.need(pre + "self_attn.o_proj.bias", {H})});
    }
    if (o.qk_norm) {
      if (!drop_qn) ly.qn = upload_f32(m, {tm.need(pre + "self_attn.q_norm.weight", {D})});
      ly.kn = upload_f32(m, {tm.need(pre + "self_attn.k_norm.weight", {D})});
    }
    ly.qscale = qscale;
    if (o.sparse && (*o.sparse)[l]) continue;
    const mqb_tensor *gt = tm.need(pre + "mlp.gate_proj.weight", {I, H});
    const mqb_tensor *ut = tm.need(pre + "mlp.up_proj.weight", {I, H});
    ly.w_up = upload_matrix(m, {{gt, I, false}, {ut, I, false}}, H);
    ly.w_down = upload_matrix(m, {{tm.need(pre + "mlp.down_proj.weight", {H, I}), H, false}}, I);
    if (o.mlp_bias) {
      // gate|up, as w_up stacks them
      ly.b_up = upload_f32(m, {tm.need(pre + "mlp.gate_proj.bias", {I}), tm.need(pre + "mlp.up_proj.bias", {I})});
      ly.b_down = upload_f32(m, {tm.need(pre + "mlp.down_proj.bias", {H})});
    }
  }
  rope_setup(m);
}

namespace {

void configure_qwen3(Cfg &c, const HParams &) { configure(c, "qwen3"); }
void load_qwen3(mqb_model &m, const TensorMap &tm) { load_decoder(m, tm, {}); }

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"qwen3"};
  f.configure = configure_qwen3;
  f.load = load_qwen3;
  return f;
}());

}  // namespace
}  // namespace qwen3
}  // namespace mqcuda
