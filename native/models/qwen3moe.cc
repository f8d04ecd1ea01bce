// models/qwen3moe.cc: Qwen3MoeForCausalLM in fp32 (owner: qwen3moe family).
//
// Architecture (transformers' modeling_qwen3_moe): Qwen3's attention and decoder stack (the
// shared Qwen3Decoder, qwen3_decoder.h: no copy of it here) whose FFN is, in the sparse layers,
// a mixture of experts: a bias-free router, softmax in float32 over all experts, the top
// num_experts_per_tok, renormalised when norm_topk_prob, and the chosen experts' SwiGLU MLPs of
// width moe_intermediate_size weighted by those probabilities. A layer is sparse when it is
// not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0; the others keep a dense MLP
// of intermediate_size.
//
// Checkpoint layouts: the published checkpoints (Qwen/Qwen3-30B-A3B) store each expert apart,
// mlp.experts.<e>.{gate,up,down}_proj.weight; transformers 5 saves them fused,
// mlp.experts.gate_up_proj [experts, 2*moe_intermediate, hidden] (gate rows, then up rows, per
// expert) and mlp.experts.down_proj [experts, hidden, moe_intermediate]. The bundle holds the
// per-expert layout: layout_qwen3moe splits the fused tensors into it (byte ranges, no
// arithmetic), so both checkpoints build the same bundle.
//
// Faults (MODELQUAL_FAULTS, read at engine open): qwen3moe.route_wrong_expert sends every
// token to the experts after its chosen ones; qwen3moe.rope_theta_x10 and qwen3moe.drop_q_norm
// as qwen3's. They exist to prove the gates bite.
#include <algorithm>

#include "qwen3_decoder.h"

namespace mq {

void resolve_qwen3(const Config &c, HParams &hp);  // qwen3.cc: the attention and dense fields

namespace {

// moe_options reads the mixture of experts resolve_qwen3moe wrote into hp.
Qwen3Decoder::Options moe_options(const HParams &hp) {
  Qwen3Decoder::Options o;
  o.fault_prefix = "qwen3moe";
  o.moe.experts = hp.i("num_experts");
  o.moe.top_k = hp.i("num_experts_per_tok");
  o.moe.intermediate = hp.i("moe_intermediate_size");
  o.moe.norm_topk_prob = hp.b("norm_topk_prob");
  const std::string s = hp.s("sparse_layers");
  for (char ch : s) o.moe.sparse.push_back(ch == '1');
  return o;
}

// resolve_qwen3moe reads Qwen3MoeConfig: Qwen3's fields (resolve_qwen3 refuses what the
// attention does not implement), then the experts with Qwen3MoeConfig's defaults
// (num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768, norm_topk_prob false,
// decoder_sparse_step 1, mlp_only_layers []). sparse_layers is one '0' or '1' per layer.
void resolve_qwen3moe(const Config &c, HParams &hp) {
  resolve_qwen3(c, hp);
  const int64_t experts = c.integer("num_experts", 128), top_k = c.integer("num_experts_per_tok", 8);
  const int64_t width = c.integer("moe_intermediate_size", 768), step = c.integer("decoder_sparse_step", 1);
  const int layers = hp.i("num_layers");
  if (experts < 0) throw Error(MQ_ERR_LOAD, "config.json: num_experts " + std::to_string(experts) + " must not be negative");
  if (experts > 0 && (top_k < 1 || top_k > experts))
    throw Error(MQ_ERR_LOAD, "config.json: num_experts_per_tok " + std::to_string(top_k) + " must be in 1.." + std::to_string(experts) +
                                 " (num_experts)");
  if (width < 1) throw Error(MQ_ERR_LOAD, "config.json: moe_intermediate_size must be positive");
  if (step < 1) throw Error(MQ_ERR_LOAD, "config.json: decoder_sparse_step " + std::to_string(step) + " must be at least 1");
  std::vector<double> dense;
  if (c.has("mlp_only_layers")) dense = c.numbers("mlp_only_layers");
  for (double x : dense)
    if (x != (int)x || x < 0 || x >= layers)
      throw Error(MQ_ERR_LOAD, "config.json: mlp_only_layers holds " + std::to_string(x) + ", not a layer index below num_hidden_layers " +
                                   std::to_string(layers));
  std::string sparse;
  for (int l = 0; l < layers; l++) {
    bool only_mlp = std::find(dense.begin(), dense.end(), (double)l) != dense.end();
    sparse += (!only_mlp && experts > 0 && (l + 1) % step == 0) ? '1' : '0';
  }
  hp.set("num_experts", (double)experts);
  hp.set("num_experts_per_tok", (double)top_k);
  hp.set("moe_intermediate_size", (double)width);
  hp.set("norm_topk_prob", c.boolean("norm_topk_prob", false));
  hp.set_string("sparse_layers", sparse);
}

std::unique_ptr<Backend> make_qwen3moe(const ModelArgs &a) { return std::unique_ptr<Backend>(new DecoderLM(a, moe_options(*a.hp))); }

// layout_qwen3moe: Qwen3's layouts (a Qwen3MoeModel checkpoint without "model.", a tied head)
// and transformers 5's fused experts, split into the per-expert tensors the bundle holds.
void layout_qwen3moe(const HParams &hp, TensorLayout &l) {
  l.split("mlp.experts.gate_up_proj", {"mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"});
  l.split("mlp.experts.down_proj", {"mlp.experts.*.down_proj.weight"});
  l.rename("", "model.");
  if (hp.b("tie_word_embeddings")) l.drop("lm_head.weight");
}

}  // namespace

MQ_REGISTER_FAMILY(Family{"qwen3moe", "text", {"Qwen3MoeForCausalLM"}, resolve_qwen3moe, make_qwen3moe, 0, layout_qwen3moe});

}  // namespace mq
