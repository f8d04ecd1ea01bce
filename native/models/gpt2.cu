// models/gpt2.cu: GPT2LMHeadModel on CUDA (owner: gpt2 family), the GPU side of models/gpt2.cc:
// the shared decoder (native/cuda/decoder.cuh) with LayerNorm (and biases), gelu_new, learned
// positions and no rotary, and GPT-2's tensor names (Conv1D weights stored [in, out], transposed
// at upload; the LM head tied to wte).
#include "../cuda/weights.cuh"

namespace mqcuda {
namespace gpt2 {
namespace {

void configure(Cfg &c, const HParams &) {
  c.norm = PREP_LN;
  c.gated = false;
}

void load(mqb_model &m, const TensorMap &tm) {
  const Cfg &c = m.c;
  const int64_t H = c.H, D = c.D, I = c.I, V = c.V;
  const mqb_tensor *wte = tm.need("wte.weight", {V, H});
  m.emb = upload_matrix(m, {{wte, V, false}}, H);
  m.lm = m.emb;
  m.wpe = upload_f32(m, {tm.need("wpe.weight", {(int64_t)c.maxpos, H})});
  m.normf_w = upload_f32(m, {tm.need("ln_f.weight", {H})});
  m.normf_b = upload_f32(m, {tm.need("ln_f.bias", {H})});
  for (int l = 0; l < c.L; ++l) {
    Layer &ly = m.layers[l];
    const std::string pre = fmt("h.%d.", l);
    ly.ln1_w = upload_f32(m, {tm.need(pre + "ln_1.weight", {H})});
    ly.ln1_b = upload_f32(m, {tm.need(pre + "ln_1.bias", {H})});
    ly.ln2_w = upload_f32(m, {tm.need(pre + "ln_2.weight", {H})});
    ly.ln2_b = upload_f32(m, {tm.need(pre + "ln_2.bias", {H})});
    ly.w_qkv = upload_matrix(m, {{tm.need(pre + "attn.c_attn.weight", {H, 3 * H}), 3 * H, true}}, H);
    ly.b_qkv = upload_f32(m, {tm.need(pre + "attn.c_attn.bias", {3 * H})});
    ly.w_o = upload_matrix(m, {{tm.need(pre + "attn.c_proj.weight", {H, H}), H, true}}, H);
    ly.b_o = upload_f32(m, {tm.need(pre + "attn.c_proj.bias", {H})});
    ly.w_up = upload_matrix(m, {{tm.need(pre + "mlp.c_fc.weight", {H, I}), I, true}}, H);
    ly.b_up = upload_f32(m, {tm.need(pre + "mlp.c_fc.bias", {I})});
    ly.w_down = upload_matrix(m, {{tm.need(pre + "mlp.c_proj.weight", {I, H}), H, true}}, I);
    ly.b_down = upload_f32(m, {tm.need(pre + "mlp.c_proj.bias", {H})});
    ly.qscale = 1.f / sqrtf((float)D);
    if (c.inv_layer_scale) ly.qscale /= (float)(l + 1);
  }
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"gpt2"};
  f.configure = configure;
  f.load = load;
  return f;
}());

}  // namespace
}  // namespace gpt2
}  // namespace mqcuda
