// models/qwen3.cc: Qwen3ForCausalLM in fp32 (owner: qwen family).
//
// Architecture (transformers' modeling_qwen3): embed_tokens; the decoder stack (Qwen3Decoder,
// qwen3_decoder.h, shared with the families built on it); final norm; lm_head, or embed_tokens
// when tie_word_embeddings: DecoderLM with the decoder's default options.
//
// Faults (MODELQUAL_FAULTS, read at engine open): qwen3.rope_theta_x10 multiplies rope_theta by
// 10, qwen3.drop_q_norm skips q_norm. They exist to prove parity gates bite.
#include "qwen3_decoder.h"

namespace mq {

// resolve_qwen3 reads Qwen3Config's fields with transformers' defaults and refuses what this
// runtime does not implement (other RoPE types, sliding windows, other activations) rather than
// computing something else.
void resolve_qwen3(const Config &c, HParams &hp) {
  resolve_decoder_shape(c, hp, "qwen3");
  const std::string rope_type = c.string(
      "rope_parameters.rope_type", c.string("rope_scaling.rope_type", c.string("rope_scaling.type", "default")));
  if (rope_type != "default")
    throw Error(MQ_ERR_LOAD, "config.json: rope type \"" + rope_type + "\" is not supported; only default RoPE");
  if (c.has("rope_scaling.factor"))
    throw Error(MQ_ERR_LOAD, "config.json: rope_scaling is not supported; only default RoPE");
  if (c.boolean("use_sliding_window", false))
    throw Error(MQ_ERR_LOAD, "config.json: use_sliding_window true is not supported");
  hp.set("max_positions", (double)c.positive("max_position_embeddings"));
  hp.set("rope_theta", c.first_number({"rope_theta", "rope_parameters.rope_theta"}, 10000));
}

std::unique_ptr<Backend> make_qwen3(const ModelArgs &a) { return std::unique_ptr<Backend>(new DecoderLM(a, {})); }

// layout_qwen3: the checkpoint layouts transformers loads into Qwen3ForCausalLM. A Qwen3Model
// checkpoint names the decoder without base_model_prefix "model." (transformers adds it when it
// loads a task model from a base model's state dict); with tie_word_embeddings the head is the
// token embedding (transformers ties lm_head.weight to it, so a stored lm_head.weight is not
// what it computes with, and the CUDA backend ignores it too).
void layout_qwen3(const HParams &hp, TensorLayout &l) {
  l.rename("", "model.");
  if (hp.b("tie_word_embeddings")) l.drop("lm_head.weight");
}

MQ_REGISTER_FAMILY(Family{"qwen3", "text", {"Qwen3ForCausalLM"}, resolve_qwen3, make_qwen3, 0, layout_qwen3});

}  // namespace mq
