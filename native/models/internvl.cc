// models/internvl.cc: InternVLForConditionalGeneration in fp32 (owner: internvl family).
//
// Architecture (transformers 5.17's modeling_internvl, the -HF checkpoints' layout):
//   vision tower (InternViT), per 448-pixel tile, tiles independent: Conv2d patch embedding
//   (kernel = stride = patch_size, as a linear map of each patch's channels-first pixels), a CLS
//   token in front, absolute position embeddings added (the tile size is the trained size, so
//   no interpolation) -> pre-norm blocks: LayerNorm or RMSNorm (norm_type) -> separate q/k/v
//   projections (biases when attention_bias) -> optional RMSNorm of q and k over the full width
//   (use_qk_norm) -> full attention, scale head_dim^-0.5 -> projection_layer, scaled by lambda_1,
//   residual; norm -> fc1, exact GELU, fc2, scaled by lambda_2, residual. The features are
//   hidden_states[vision_feature_layer] (-1: the last layer, through the final layernorm when
//   use_mean_pooling is false), the CLS token dropped (vision_feature_select_strategy
//   "default"), then InternVLModel.pixel_shuffle with downsample_ratio 0.5: token (r, c) of the
//   (side/2)^2 grid holds patches (2r + j, 2c + k) at channels ((2j + k) * width + ch); then the
//   projector LayerNorm (eps 1e-5) -> linear_1 -> GELU -> linear_2 into the text width.
//   text: the shared Qwen3 decoder (Qwen3Decoder; text_config model_type qwen3, or qwen2 as its
//   variant with q/k/v biases and no q/k norm) over token embeddings whose <IMG_CONTEXT> rows
//   are replaced, in order, by the image tokens (image_seq_length per tile: the tiles, then the
//   thumbnail); plain 1-D positions.
//
// The processor (server/vision/gotocr2.go) hands one image as grid (tiles, side, side) with
// pixel_values [tiles, 3, image_size, image_size].
//
// Faults (MODELQUAL_FAULTS): internvl.shuffle_transposed swaps the row and column offsets of
// pixel shuffle, internvl.drop_layer_scale skips lambda_1/lambda_2, internvl.drop_q_norm and
// internvl.rope_theta_x10 are the decoder's (qwen3_decoder.h). They prove the parity gates bite.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "qwen3_decoder.h"

namespace mq {

void resolve_qwen3(const Config &c, HParams &hp);  // qwen3.cc

namespace {

Qwen3Decoder::Options internvl_decoder_options(const HParams &hp) {
  Qwen3Decoder::Options o;
  o.prefix = "model.language_model.";
  o.fault_prefix = "internvl";
  if (hp.b("text_qwen2")) {
    o.qk_norm = false;
    o.o_proj_bias = false;
  }
  return o;
}

inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }

class InternVL : public CausalLM {
 public:
  explicit InternVL(const ModelArgs &a) : InternVL(a, DecoderDims(*a.hp)) {}
  InternVL(const ModelArgs &a, const DecoderDims &d)
      : CausalLM(a.pool, d.hidden_size, d.vocab_size), dec_(a, d, internvl_decoder_options(*a.hp)), slots_(a.n_slots),
        transposed_(fault("internvl.shuffle_transposed")), no_scale_(fault("internvl.drop_layer_scale")) {
    const HParams &hp = *a.hp;
    const Weights &w = *a.w;
    vh_ = hp.i("vision_hidden_size");
    depth_ = hp.i("vision_num_layers");
    heads_ = hp.i("vision_num_heads");
    vi_ = hp.i("vision_intermediate_size");
    patch_ = hp.i("vision_patch_size");
    image_ = hp.i("vision_image_size");
    side_ = image_ / patch_;
    npos_ = side_ * side_ + 1;
    eps_ = (float)hp.f("vision_layer_norm_eps");
    rms_ = hp.b("vision_rms_norm");
    qk_norm_ = hp.b("vision_qk_norm");
    bias_ = hp.b("vision_attention_bias");
    run_layers_ = hp.i("vision_run_layers");
    final_ln_ = hp.b("vision_final_layernorm");
    image_token_ = hp.i("image_token_id");
    seq_ = (side_ / 2) * (side_ / 2);
    const int64_t vh = vh_, M = 4 * (int64_t)vh_;
    const std::string v = "model.vision_tower.";
    cls_ = w.get(v + "embeddings.cls_token", {1, 1, vh});
    pe_w_ = w.get(v + "embeddings.patch_embeddings.projection.weight", {vh, 3, patch_, patch_});
    pe_b_ = w.get(v + "embeddings.patch_embeddings.projection.bias", {vh});
    pos_ = w.get(v + "embeddings.position_embeddings", {1, npos_, vh});
    for (int l = 0; l < depth_; l++) {
      std::string b = v + "encoder.layer." + std::to_string(l) + ".";
      Block B;
      B.n1w = w.get(b + "layernorm_before.weight", {vh});
      B.n2w = w.get(b + "layernorm_after.weight", {vh});
      if (!rms_) {
        B.n1b = w.get(b + "layernorm_before.bias", {vh});
        B.n2b = w.get(b + "layernorm_after.bias", {vh});
      }
      const char *qkv[3] = {"q_proj", "k_proj", "v_proj"};
      for (int x = 0; x < 3; x++) {
        B.w[x] = w.get(b + "attention." + qkv[x] + ".weight", {vh, vh});
        if (bias_) B.b[x] = w.get(b + "attention." + qkv[x] + ".bias", {vh});
      }
      if (qk_norm_) {
        B.qn = w.get(b + "attention.q_norm.weight", {vh});
        B.kn = w.get(b + "attention.k_norm.weight", {vh});
      }
      B.proj_w = w.get(b + "attention.projection_layer.weight", {vh, vh});
      B.proj_b = w.get(b + "attention.projection_layer.bias", {vh});
      B.l1 = w.get(b + "lambda_1", {vh});
      B.l2 = w.get(b + "lambda_2", {vh});
      B.fc1_w = w.get(b + "mlp.fc1.weight", {vi_, vh});
      B.fc1_b = w.get(b + "mlp.fc1.bias", {vi_});
      B.fc2_w = w.get(b + "mlp.fc2.weight", {vh, vi_});
      B.fc2_b = w.get(b + "mlp.fc2.bias", {vh});
      blocks_.push_back(B);
    }
    if (final_ln_) {
      fln_w_ = w.get(v + "layernorm.weight", {vh});
      fln_b_ = w.get(v + "layernorm.bias", {vh});
    }
    const std::string p = "model.multi_modal_projector.";
    pln_w_ = w.get(p + "layer_norm.weight", {M});
    pln_b_ = w.get(p + "layer_norm.bias", {M});
    p1_w_ = w.get(p + "linear_1.weight", {E_, M});
    p1_b_ = w.get(p + "linear_1.bias", {E_});
    p2_w_ = w.get(p + "linear_2.weight", {E_, E_});
    p2_b_ = w.get(p + "linear_2.bias", {E_});
    head_ = decoder_lm_head(w, dec_);
  }

  void reset_slot(int slot) override { slots_[slot] = SlotImage(); }
  int64_t vision_ns(int slot) const override { return slots_[slot].vision_ns; }

  void set_image(int slot, std::shared_ptr<const ImageInput> img, const int32_t *prompt, int n) override {
    const int tiles = img->grid_t;
    if (tiles < 1 || img->grid_h != side_ || img->grid_w != side_)
      throw Error(MQ_ERR_INVALID_ARGUMENT, "image: grid (" + std::to_string(img->grid_t) + ", " + std::to_string(img->grid_h) + ", " +
                                               std::to_string(img->grid_w) + ") must be (tiles >= 1, " + std::to_string(side_) +
                                               ", " + std::to_string(side_) + ")");
    const size_t want = (size_t)tiles * 3 * image_ * image_;
    if (img->pixels.size() != want)
      throw Error(MQ_ERR_INVALID_ARGUMENT, "image: " + std::to_string(img->pixels.size()) + " pixel values, " + std::to_string(tiles) +
                                               " tiles need " + std::to_string(want));
    SlotImage S;
    S.img_index.assign(n, -1);
    int k = 0;
    for (int i = 0; i < n; i++)
      if (prompt[i] == image_token_) S.img_index[i] = k++;
    if (k != tiles * seq_)
      throw Error(MQ_ERR_INVALID_ARGUMENT, "prompt holds " + std::to_string(k) + " image tokens; " + std::to_string(tiles) +
                                               " tiles need " + std::to_string(tiles * seq_) + " (image_seq_length " +
                                               std::to_string(seq_) + " per tile)");
    S.in = std::move(img);
    S.prompt_len = n;
    slots_[slot] = std::move(S);
  }

 private:
  struct Block {
    const float *n1w, *n1b = nullptr, *n2w, *n2b = nullptr;
    const float *w[3], *b[3] = {nullptr, nullptr, nullptr}, *qn = nullptr, *kn = nullptr;
    const float *proj_w, *proj_b, *l1, *l2, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };
  struct SlotImage {
    std::shared_ptr<const ImageInput> in;
    bool encoded = false;
    int64_t vision_ns = 0;  // encode's wall time
    std::vector<float> embeds;   // [tiles * seq, E]
    std::vector<int> img_index;  // per prompt position: image token index or -1
    int prompt_len = 0;
  };

  void norm(const float *x, int T, const float *g, const float *b, float *y) const {
    if (rms_)
      rms_norm(x, T, vh_, g, eps_, y);
    else
      layer_norm(x, T, vh_, g, b, eps_, y);
  }

  // tower runs InternViT over one tile's pixels [3, image, image] into out [seq, E].
  void tower(const float *px, float *out) {
    const int N = npos_, P = side_ * side_, K = 3 * patch_ * patch_, hd = vh_ / heads_;
    patches_.resize((size_t)P * K);
    for (int py = 0; py < side_; py++)
      for (int pxi = 0; pxi < side_; pxi++) {
        float *dst = &patches_[(size_t)(py * side_ + pxi) * K];
        for (int c = 0; c < 3; c++)
          for (int ky = 0; ky < patch_; ky++) {
            const float *src = px + ((size_t)c * image_ + py * patch_ + ky) * image_ + pxi * patch_;
            std::memcpy(dst + (c * patch_ + ky) * patch_, src, sizeof(float) * patch_);
          }
      }
    x_.resize((size_t)N * vh_);
    linear(pool_, patches_.data(), P, K, pe_w_, vh_, pe_b_, x_.data() + vh_);
    std::memcpy(x_.data(), cls_, sizeof(float) * vh_);
    for (size_t z = 0; z < x_.size(); z++) x_[z] += pos_[z];
    a_.resize((size_t)N * vh_);
    q_.resize((size_t)N * vh_), k_.resize((size_t)N * vh_), v_.resize((size_t)N * vh_);
    att_.resize((size_t)N * vh_), tmp_.resize((size_t)N * vh_), f_.resize((size_t)N * vi_);
    const float scale = 1.0f / std::sqrt((float)hd);
    for (int l = 0; l < run_layers_; l++) {
      const Block &B = blocks_[l];
      norm(x_.data(), N, B.n1w, B.n1b, a_.data());
      float *qkv[3] = {q_.data(), k_.data(), v_.data()};
      for (int x = 0; x < 3; x++) linear(pool_, a_.data(), N, vh_, B.w[x], vh_, B.b[x], qkv[x]);
      if (qk_norm_) {
        rms_norm(q_.data(), N, vh_, B.qn, 1e-6f, q_.data());
        rms_norm(k_.data(), N, vh_, B.kn, 1e-6f, k_.data());
      }
      pool_->run([&](int ti, int nt) {
        std::vector<float> sc(N);
        for (int job = ti; job < heads_ * N; job += nt) {
          const int h = job / N, i = job % N;
          const float *q = &q_[(size_t)i * vh_ + h * hd];
          float mx = -INFINITY;
          for (int j = 0; j < N; j++) {
            sc[j] = dot(q, &k_[(size_t)j * vh_ + h * hd], hd) * scale;
            mx = std::max(mx, sc[j]);
          }
          float sum = 0;
          for (int j = 0; j < N; j++) sum += (sc[j] = std::exp(sc[j] - mx));
          float *o = &att_[(size_t)i * vh_ + h * hd];
          std::fill(o, o + hd, 0.0f);
          const float inv = 1.0f / sum;
          for (int j = 0; j < N; j++) axpy(sc[j] * inv, &v_[(size_t)j * vh_ + h * hd], o, hd);
        }
      });
      linear(pool_, att_.data(), N, vh_, B.proj_w, vh_, B.proj_b, tmp_.data());
      for (int i = 0; i < N; i++)
        for (int c = 0; c < vh_; c++) x_[(size_t)i * vh_ + c] += (no_scale_ ? 1.0f : B.l1[c]) * tmp_[(size_t)i * vh_ + c];
      norm(x_.data(), N, B.n2w, B.n2b, a_.data());
      linear(pool_, a_.data(), N, vh_, B.fc1_w, vi_, B.fc1_b, f_.data());
      for (auto &z : f_) z = gelu_erf(z);
      linear(pool_, f_.data(), N, vi_, B.fc2_w, vh_, B.fc2_b, tmp_.data());
      for (int i = 0; i < N; i++)
        for (int c = 0; c < vh_; c++) x_[(size_t)i * vh_ + c] += (no_scale_ ? 1.0f : B.l2[c]) * tmp_[(size_t)i * vh_ + c];
    }
    if (final_ln_) layer_norm(x_.data(), N, vh_, fln_w_, fln_b_, eps_, x_.data());
    // Drop CLS, pixel shuffle 0.5: token (r, c) <- patches (2r + j, 2c + k), channels (2j + k).
    const int half = side_ / 2, M = 4 * vh_;
    sh_.resize((size_t)seq_ * M);
    for (int r = 0; r < half; r++)
      for (int c = 0; c < half; c++)
        for (int j = 0; j < 2; j++)
          for (int k = 0; k < 2; k++) {
            const int pr = 2 * r + (transposed_ ? k : j), pc = 2 * c + (transposed_ ? j : k);
            std::memcpy(&sh_[(size_t)(r * half + c) * M + (2 * j + k) * vh_], &x_[(size_t)(1 + pr * side_ + pc) * vh_],
                        sizeof(float) * vh_);
          }
    pn_.resize((size_t)seq_ * M);
    layer_norm(sh_.data(), seq_, M, pln_w_, pln_b_, 1e-5f, pn_.data());
    pm_.resize((size_t)seq_ * E_);
    linear(pool_, pn_.data(), seq_, M, p1_w_, E_, p1_b_, pm_.data());
    for (auto &z : pm_) z = gelu_erf(z);
    linear(pool_, pm_.data(), seq_, E_, p2_w_, E_, p2_b_, out);
  }

  void encode(SlotImage &S) {
    const int64_t t0 = now_ns();
    const int tiles = S.in->grid_t;
    S.embeds.resize((size_t)tiles * seq_ * E_);
    for (int t = 0; t < tiles; t++)
      tower(S.in->pixels.data() + (size_t)t * 3 * image_ * image_, S.embeds.data() + (size_t)t * seq_ * E_);
    S.encoded = true;
    S.vision_ns = now_ns() - t0;
  }

  void run(const Batch &b) override {
    const int R = b.rows();
    h_.resize((size_t)R * E_);
    hn_.resize((size_t)R * E_);
    dec_.embed(b.tokens.data(), R, h_.data());
    for (int i = 0; i < b.n; i++) {
      SlotImage &S = slots_[b.slot[i]];
      if (!S.in) continue;
      for (int j = 0; j < b.ntok[i]; j++) {
        const int r = b.off[i] + j, p = b.pos[i] + j;
        if (p >= S.prompt_len || S.img_index[p] < 0) continue;
        if (!S.encoded) encode(S);
        std::memcpy(&h_[(size_t)r * E_], &S.embeds[(size_t)S.img_index[p] * E_], sizeof(float) * E_);
      }
    }
    Qwen3Decoder::Pass ps;
    ps.batch = &b;
    dec_.forward(ps, h_.data());
    dec_.final_norm(h_.data(), R, hn_.data());
  }

  Qwen3Decoder dec_;
  std::vector<SlotImage> slots_;
  bool transposed_, no_scale_;
  int vh_, depth_, heads_, vi_, patch_, image_, side_, npos_, run_layers_, image_token_, seq_;
  float eps_;
  bool rms_, qk_norm_, bias_, final_ln_;
  const float *cls_, *pe_w_, *pe_b_, *pos_, *fln_w_ = nullptr, *fln_b_ = nullptr;
  const float *pln_w_, *pln_b_, *p1_w_, *p1_b_, *p2_w_, *p2_b_;
  std::vector<Block> blocks_;
  std::vector<float> patches_, x_, a_, q_, k_, v_, att_, tmp_, f_, sh_, pn_, pm_, h_;
};

// square reads an int or a square [h, w] pair (InternVLVisionConfig keeps image_size and
// patch_size as pairs).
int64_t square(const Config &v, const std::string &key, int64_t dflt) {
  if (!v.has(key)) return dflt;
  try {
    return v.positive(key);
  } catch (const Error &) {
  }
  const std::vector<double> p = v.numbers(key);
  if (p.size() != 2 || p[0] != p[1] || p[0] <= 0)
    throw Error(MQ_ERR_LOAD, "config.json: vision_config." + key + " must be a positive integer or a square [h, w] pair");
  return (int64_t)p[0];
}

}  // namespace

// resolve_internvl reads InternVLConfig: text_config through the Qwen3 decoder's resolve (qwen3,
// or qwen2 as the decoder's variant), the InternViT tower and the projector, refusing what this
// file does not implement.
void resolve_internvl(const Config &c, HParams &hp) {
  const Config t = c.sub("text_config");
  const std::string text_type = t.string("model_type", "qwen2");  // InternVLConfig's default
  if (text_type != "qwen3" && text_type != "qwen2")
    throw Error(MQ_ERR_LOAD, "config.json: text_config.model_type \"" + text_type +
                                 "\" is not supported; the internvl family runs qwen3 and qwen2 text models");
  resolve_qwen3(t, hp);
  hp.set("text_qwen2", text_type == "qwen2");
  // Qwen2's attention always has q/k/v biases (and no o_proj bias): Qwen2Config has no switch.
  if (text_type == "qwen2") hp.set("attention_bias", 1);
  hp.set("tie_word_embeddings", c.boolean("tie_word_embeddings", t.boolean("tie_word_embeddings", true)));
  const Config v = c.sub("vision_config");
  const int64_t vh = v.integer("hidden_size", 1024), heads = v.integer("num_attention_heads", 16);
  if (vh <= 0 || heads <= 0 || vh % heads)
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.hidden_size must be a positive multiple of num_attention_heads");
  if (v.string("hidden_act", "gelu") != "gelu")
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.hidden_act \"" + v.string("hidden_act") + "\" is not supported; gelu");
  if (c.string("projector_hidden_act", "gelu") != "gelu")
    throw Error(MQ_ERR_LOAD, "config.json: projector_hidden_act \"" + c.string("projector_hidden_act") + "\" is not supported; gelu");
  const std::string norm = v.string("norm_type", "layer_norm");
  if (norm != "layer_norm" && norm != "rms_norm")
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.norm_type \"" + norm + "\" is not supported; layer_norm or rms_norm");
  if (v.integer("num_channels", 3) != 3) throw Error(MQ_ERR_LOAD, "config.json: vision_config.num_channels must be 3");
  if (!v.boolean("use_absolute_position_embeddings", true))
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.use_absolute_position_embeddings false is not supported");
  const int64_t image = square(v, "image_size", 448), patch = square(v, "patch_size", 14);
  if (image % patch || (image / patch) % 2)
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.image_size / patch_size must be an even integer (pixel shuffle halves it)");
  if (std::fabs(c.number("downsample_ratio", 0.5) - 0.5) > 1e-12)
    throw Error(MQ_ERR_LOAD, "config.json: downsample_ratio " + std::to_string(c.number("downsample_ratio", 0.5)) +
                                 " is not supported; 0.5");
  if (c.string("vision_feature_select_strategy", "default") != "default")
    throw Error(MQ_ERR_LOAD, "config.json: vision_feature_select_strategy \"" + c.string("vision_feature_select_strategy") +
                                 "\" is not supported; \"default\" (the CLS token dropped)");
  const int64_t depth = v.integer("num_hidden_layers", 24);
  const int64_t layer = c.integer("vision_feature_layer", -1);
  int64_t run = layer == -1 ? depth : layer >= 0 ? layer : depth + 1 + layer;
  if (run < 0 || run > depth)
    throw Error(MQ_ERR_LOAD, "config.json: vision_feature_layer " + std::to_string(layer) + " is outside the tower's " +
                                 std::to_string(depth) + " layers");
  const int64_t side = image / patch;
  if (c.has("image_seq_length") && c.integer("image_seq_length") != (side / 2) * (side / 2))
    throw Error(MQ_ERR_LOAD, "config.json: image_seq_length " + std::to_string(c.integer("image_seq_length")) +
                                 " differs from (image_size / patch_size / 2)^2 = " + std::to_string((side / 2) * (side / 2)));
  hp.set("vision_hidden_size", (double)vh);
  hp.set("vision_num_layers", (double)depth);
  hp.set("vision_num_heads", (double)heads);
  hp.set("vision_intermediate_size", (double)v.integer("intermediate_size", 4096));
  hp.set("vision_patch_size", (double)patch);
  hp.set("vision_image_size", (double)image);
  hp.set("vision_layer_norm_eps", v.number("layer_norm_eps", 1e-6));
  hp.set("vision_rms_norm", norm == "rms_norm");
  hp.set("vision_qk_norm", v.boolean("use_qk_norm", false));
  hp.set("vision_attention_bias", v.boolean("attention_bias", false));
  hp.set("vision_run_layers", (double)run);
  hp.set("vision_final_layernorm", layer == -1 && !v.boolean("use_mean_pooling", true));
  hp.set("image_token_id", (double)c.integer("image_token_id", 151667));
}

std::unique_ptr<Backend> make_internvl(const ModelArgs &a) { return std::unique_ptr<Backend>(new InternVL(a)); }

// layout_internvl: transformers 5 saves InternVLForConditionalGeneration as
// "model.language_model.", "model.vision_tower.", "model.multi_modal_projector." and "lm_head.";
// the older layout (its _checkpoint_conversion_mapping) names them "language_model.model.",
// "vision_tower.", "multi_modal_projector." and "language_model.lm_head."; an InternVLModel
// (base model) checkpoint has no "model.". A tied head is the embedding.
void layout_internvl(const HParams &hp, TensorLayout &l) {
  l.rename("language_model.model.", "model.language_model.");
  l.rename("language_model.lm_head.", "lm_head.");
  l.rename("language_model.", "model.language_model.");
  l.rename("vision_tower.", "model.vision_tower.");
  l.rename("multi_modal_projector.", "model.multi_modal_projector.");
  if (hp.b("tie_word_embeddings")) l.drop("lm_head.weight");
}

MQ_REGISTER_FAMILY(Family{"internvl", "vision", {"InternVLForConditionalGeneration"}, resolve_internvl, make_internvl, 0,
                          layout_internvl});

}  // namespace mq
