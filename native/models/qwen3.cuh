// models/qwen3.cuh: the Qwen3 decoder's GPU side, shared by the families built on it (qwen3,
// qwen3vl), as qwen3_decoder.h is on the CPU side (owner: qwen family).
#pragma once
#include "../cuda/env.cuh"
#include "../cuda/weights.cuh"

namespace mqcuda {
namespace qwen3 {

// configure: RMSNorm, SwiGLU, RoPE; fault_prefix.rope_theta_x10 multiplies rope_theta by 10.
void configure(Cfg &c, const std::string &fault_prefix);

// DecoderOptions says which decoder load_decoder reads: Qwen3's by default; Llama's is the same
// layer without q/k norms, with optional MLP biases and a rotary attention scaling.
struct DecoderOptions {
  // prefix of the decoder's tensors past the "model." that TensorMap strips: "" for qwen3 and
  // llama, "language_model." for qwen3vl and internvl, "text_encoder." for zimage.
  std::string prefix;
  // fault_prefix names this use's planted defects: fault_prefix.drop_q_norm skips q_norm.
  std::string fault_prefix = "qwen3";
  bool qk_norm = true;   // q_norm and k_norm tensors (Qwen3); Llama has none
  bool mlp_bias = false;  // mlp.{gate,up,down}_proj.bias (LlamaConfig.mlp_bias)
  // With attention_bias, whether o_proj has a bias too (Qwen3's and Llama's do); Qwen2's
  // attention biases are q/k/v only (the internvl family's qwen2 text variant).
  bool o_proj_bias = true;
  // rope_scaling: the rope type's attention scaling s, which multiplies cos and sin and so every
  // q·k by s²: folded into the query scale (s²/sqrt(head_dim)) instead of the table.
  double rope_scaling = 1.0;
  // sparse (may be NULL) marks the layers whose MLP the family replaces (a mixture of experts,
  // CudaFamily::ffn): their mlp.* tensors are not read.
  const std::vector<bool> *sparse = nullptr;
};

// load_decoder names and uploads the decoder's tensors (o says which) and makes the rotary table.
void load_decoder(mqb_model &m, const TensorMap &tm, const DecoderOptions &o);

}  // namespace qwen3
}  // namespace mqcuda
