// models/llama.cu: LlamaForCausalLM and MistralForCausalLM on CUDA (owner: llama family), the GPU
// side of models/llama.cc: the shared decoder (native/cuda/decoder.cuh) with RMSNorm, SwiGLU and
// RoPE, loaded by the Qwen3 decoder's loader (qwen3.cuh) without q/k norms, with optional
// attention and MLP biases.
//
// Rotary scaling: the CPU runtime's resolve computed the inverse frequencies and the attention
// scaling once (hyper-parameters rope_inv_freq.<i>, rope_attention_scaling; see llama.cc), so
// this file reads them and never re-interprets the config. The decoder's rotary table takes the
// frequencies as they are (Cfg::inv_freq); the scaling s multiplies both cos and sin, so it
// multiplies every q·k product by s², which is folded into the attention's query scale
// (s²/sqrt(head_dim)) instead of into the table: the same function, rounded once more.
//
// Mistral's sliding window: the CPU runtime's resolve wrote sliding_window (0: none); configure
// hands a window shorter than the model's context to the shared decoder (Cfg::window), whose
// attention kernels then read only keys p - window < k <= p for a query at position p, as
// transformers' sliding_window_overlay masks them (ops/attention.cuh: window_lo).
//
// Faults (MODELQUAL_FAULTS, read at open; the CPU runtime's names): llama.rope_theta_x10 changes
// the frequencies as on the CPU, to prove the parity gates bite (llama.kv_head_swap is CPU-only).
#include <cmath>
#include <memory>

#include "qwen3.cuh"

namespace mqcuda {
namespace llama {
namespace {

void configure_llama(Cfg &c, const HParams &h) {
  c.norm = PREP_RMS;
  c.gated = true;
  const double window = h.num("sliding_window");
  if (window < 0 || window != std::floor(window))
    throw Fail(fmt("cuda backend: llama: sliding_window %g must be a non-negative integer", window));
  c.window = window > 0 && window < c.maxpos ? (int)window : 0;  // a window of the whole context is none
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

// load_llama: the shared decoder's loader (qwen3.cuh) without q/k norms, with the MLP biases and
// the rotary attention scaling.
void load_llama(mqb_model &m, const TensorMap &tm) {
  const State &st = *static_cast<const State *>(m.fstate.get());
  qwen3::DecoderOptions o{"", "llama"};
  o.qk_norm = false;
  o.mlp_bias = st.mlp_bias;
  o.rope_scaling = st.rope_scaling;
  qwen3::load_decoder(m, tm, o);
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
