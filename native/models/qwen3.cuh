// models/qwen3.cuh: the Qwen3 decoder's GPU side, shared by the families built on it (qwen3,
// qwen3vl), as qwen3_decoder.h is on the CPU side (owner: qwen family).
#pragma once
#include "../cuda/env.cuh"
#include "../cuda/weights.cuh"

namespace mqcuda {
namespace qwen3 {

// configure: RMSNorm, SwiGLU, RoPE; fault_prefix.rope_theta_x10 multiplies rope_theta by 10.
void configure(Cfg &c, const std::string &fault_prefix);

// load_decoder names and uploads the decoder's tensors under prefix (past the "model." that
// TensorMap strips: "" for qwen3, "language_model." for qwen3vl) and makes the rotary table;
// fault_prefix.drop_q_norm skips q_norm. sparse (may be NULL) marks the layers whose MLP the
// family replaces (a mixture of experts, CudaFamily::ffn): their mlp.* tensors are not read.
void load_decoder(mqb_model &m, const TensorMap &tm, const std::string &prefix, const std::string &fault_prefix,
                  const std::vector<bool> *sparse = nullptr);

}  // namespace qwen3
}  // namespace mqcuda
