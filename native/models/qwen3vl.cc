// models/qwen3vl.cc: Qwen3VLForConditionalGeneration in fp32 (owner: qwen3vl family).
//
// Architecture (transformers 5.17's modeling_qwen3_vl), one or more images per sequence, each
// on its own grid:
//   vision tower: Conv3d patch embedding (kernel = stride = [temporal 2, 16, 16], as a linear
//   map of the processor's flattened patches) + learned positions bilinearly interpolated from
//   a sqrt(num_position_embeddings)^2 grid (fast_pos_embed_interpolate) -> blocks (LayerNorm,
//   fused qkv, 2-D rotary positions (row, column) over head_dim/2, full attention within each
//   image (cu_seqlens), proj; LayerNorm, fc1, gelu_pytorch_tanh, fc2) -> the 2x2 patch merger
//   (LayerNorm per patch, then four patches side by side, fc1, exact GELU, fc2). After each block listed in
//   deepstack_visual_indexes a post-shuffle merger (LayerNorm over the four patches) makes one
//   DeepStack feature.
//   text: the Qwen3 decoder (Qwen3Decoder, shared with qwen3) over token embeddings whose image
//   placeholder rows are replaced by the merged image embeddings, with interleaved M-RoPE
//   positions (get_rope_index: text advances all three axes together, image tokens take
//   (start, start + row, start + column) on their image's merged grid, the text after resumes
//   at the largest position + 1; decoding continues at cache position + that offset), and DeepStack
//   feature k added to the image rows after decoder layer k.
//
// Faults (MODELQUAL_FAULTS): qwen3vl.drop_deepstack skips the DeepStack additions,
// qwen3vl.flat_rope gives image tokens 1-D positions, qwen3vl.shared_image_start starts every
// image's positions where the first image's started, qwen3vl.joint_vision lets the patches of
// several images attend to each other in the tower, qwen3vl.drop_q_norm and
// qwen3vl.rope_theta_x10 are the decoder's (qwen3_decoder.h). They prove the parity gates bite.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "qwen3_decoder.h"
#include "qwen3vl_layout.h"

namespace mq {

void resolve_qwen3(const Config &c, HParams &hp);  // qwen3.cc

namespace {

Qwen3Decoder::Options decoder_options(const HParams &hp) {
  Qwen3Decoder::Options o;
  o.prefix = "model.language_model.";
  o.fault_prefix = "qwen3vl";
  o.mrope_section = {hp.i("mrope_section_t"), hp.i("mrope_section_h"), hp.i("mrope_section_w")};
  return o;
}

inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }

class Qwen3VL : public CausalLM {
 public:
  explicit Qwen3VL(const ModelArgs &a) : Qwen3VL(a, DecoderDims(*a.hp)) {}
  Qwen3VL(const ModelArgs &a, const DecoderDims &d)
      : CausalLM(a.pool, d.hidden_size, d.vocab_size), dec_(a, d, decoder_options(*a.hp)), ctx_(a.max_context),
        slots_(a.n_slots), drop_deepstack_(fault("qwen3vl.drop_deepstack")), flat_rope_(fault("qwen3vl.flat_rope")),
        shared_start_(fault("qwen3vl.shared_image_start")), joint_vision_(fault("qwen3vl.joint_vision")) {
    const HParams &hp = *a.hp;
    const Weights &w = *a.w;
    vh_ = hp.i("vision_hidden_size");
    depth_ = hp.i("vision_depth");
    heads_ = hp.i("vision_num_heads");
    vi_ = hp.i("vision_intermediate_size");
    p_ = hp.i("vision_patch_size");
    tp_ = hp.i("vision_temporal_patch_size");
    m_ = hp.i("vision_merge_size");
    npos_ = hp.i("vision_num_position_embeddings");
    side_ = (int)std::lround(std::sqrt((double)npos_));
    image_token_ = hp.i("image_token_id");
    for (int k = 0; k < hp.i("vision_deepstack_count"); k++) deepstack_.push_back(hp.i("vision_deepstack_" + std::to_string(k)));
    const int64_t vh = vh_, M = (int64_t)vh_ * m_ * m_;
    const std::string v = "model.visual.";
    pe_w_ = w.get(v + "patch_embed.proj.weight", {vh, 3, tp_, (int64_t)p_ * p_});
    pe_b_ = w.get(v + "patch_embed.proj.bias", {vh});
    pos_ = w.get(v + "pos_embed.weight", {npos_, vh});
    for (int l = 0; l < depth_; l++) {
      std::string b = v + "blocks." + std::to_string(l) + ".";
      Block B;
      B.n1w = w.get(b + "norm1.weight", {vh});
      B.n1b = w.get(b + "norm1.bias", {vh});
      B.n2w = w.get(b + "norm2.weight", {vh});
      B.n2b = w.get(b + "norm2.bias", {vh});
      B.qkv_w = w.get(b + "attn.qkv.weight", {3 * vh, vh});
      B.qkv_b = w.get(b + "attn.qkv.bias", {3 * vh});
      B.proj_w = w.get(b + "attn.proj.weight", {vh, vh});
      B.proj_b = w.get(b + "attn.proj.bias", {vh});
      B.fc1_w = w.get(b + "mlp.linear_fc1.weight", {vi_, vh});
      B.fc1_b = w.get(b + "mlp.linear_fc1.bias", {vi_});
      B.fc2_w = w.get(b + "mlp.linear_fc2.weight", {vh, vi_});
      B.fc2_b = w.get(b + "mlp.linear_fc2.bias", {vh});
      blocks_.push_back(B);
    }
    auto merger = [&](const std::string &pre, int64_t norm_width) {
      Merger g;
      g.nw = w.get(pre + "norm.weight", {norm_width});
      g.nb = w.get(pre + "norm.bias", {norm_width});
      g.fc1_w = w.get(pre + "linear_fc1.weight", {M, M});
      g.fc1_b = w.get(pre + "linear_fc1.bias", {M});
      g.fc2_w = w.get(pre + "linear_fc2.weight", {E_, M});
      g.fc2_b = w.get(pre + "linear_fc2.bias", {E_});
      g.post = norm_width == M;
      return g;
    };
    merger_ = merger(v + "merger.", vh);
    for (size_t k = 0; k < deepstack_.size(); k++)
      deep_mergers_.push_back(merger(v + "deepstack_merger_list." + std::to_string(k) + ".", M));
    head_ = decoder_lm_head(w, dec_);
    // Vision rotary frequencies: VisionRotaryEmbedding(head_dim / 2), theta 10000, in float32.
    const int hd = vh_ / heads_, dim = hd / 2;
    for (int j = 0; j < dim / 2; j++) vinv_.push_back((float)(1.0 / std::pow(10000.0, (double)(float)(2 * j) / dim)));
  }

  void reset_slot(int slot) override { slots_[slot] = SlotImage(); }
  int64_t vision_ns(int slot) const override { return slots_[slot].vision_ns; }

  bool several_images() const override { return true; }

  // set_image lays the images out in the prompt with qwen3vl_layout::layout (shared with the GPU
  // model): each image's grid and pixels checked against its placeholder run, and the 3-axis
  // M-RoPE positions as Qwen3VLModel.get_rope_index makes them.
  void set_image(int slot, std::shared_ptr<const ImageInput> img, const int32_t *prompt, int n) override {
    std::vector<qwen3vl_layout::Grid> grids;
    for (const ImageInput::Grid &g : img->images) grids.push_back({g.t, g.h, g.w, (int64_t)g.count});
    qwen3vl_layout::Layout L;
    try {
      L = qwen3vl_layout::layout(prompt, n, image_token_, m_, 3LL * tp_ * p_ * p_, grids,
                                 {flat_rope_, shared_start_});
    } catch (const std::invalid_argument &e) {
      throw Error(MQ_ERR_INVALID_ARGUMENT, e.what());
    }
    SlotImage S;
    S.pos3 = std::move(L.pos3);
    S.img_index = std::move(L.img_index);
    S.in = std::move(img);
    S.prompt_len = n;
    S.delta = L.delta;
    slots_[slot] = std::move(S);
  }

 private:
  struct Block {
    const float *n1w, *n1b, *n2w, *n2b, *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };
  struct Merger {
    const float *nw, *nb, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    bool post;  // LayerNorm over the four merged patches (DeepStack) rather than per patch
  };
  struct SlotImage {
    std::shared_ptr<const ImageInput> in;
    bool encoded = false;
    int64_t vision_ns = 0;  // encode's wall time
    std::vector<float> embeds;              // [image tokens, E]
    std::vector<std::vector<float>> deep;   // per DeepStack tap: [image tokens, E]
    std::vector<int32_t> pos3;              // per prompt position: (t, h, w)
    std::vector<int> img_index;             // per prompt position: image token index or -1
    int prompt_len = 0, delta = 0;
  };

  // merge runs a patch merger over x [N, vh] (N a multiple of 4, merge blocks contiguous).
  void merge(const Merger &g, const float *x, int N, float *out) {
    const int M = vh_ * m_ * m_, R = N / (m_ * m_);
    mt_.resize((size_t)N * vh_);
    if (g.post)
      layer_norm(x, R, M, g.nw, g.nb, 1e-6f, mt_.data());
    else
      layer_norm(x, N, vh_, g.nw, g.nb, 1e-6f, mt_.data());
    mu_.resize((size_t)R * M);
    linear(pool_, mt_.data(), R, M, g.fc1_w, M, g.fc1_b, mu_.data());
    for (auto &v : mu_) v = gelu_erf(v);
    linear(pool_, mu_.data(), R, M, g.fc2_w, E_, g.fc2_b, out);
  }

  // encode runs the vision tower over every image of S at once, as Qwen3VLVisionModel does
  // with several grids: patch embedding; each image's learned positions interpolated to its own
  // grid and its own 2-D rotary angles (row, column within the image); attention within each
  // image only (cu_seqlens); the mergers over groups of m*m patches, which never straddle two
  // images. The merged tokens (and DeepStack features) come out image after image.
  void encode(SlotImage &S) {
    const int64_t t0 = now_ns();
    const ImageInput &im = *S.in;
    int N = 0;
    for (const auto &g : im.images) N += g.t * g.h * g.w;
    const int K = 3 * tp_ * p_ * p_;
    const int hd = vh_ / heads_, half = hd / 2, quarter = hd / 4;
    std::vector<float> x((size_t)N * vh_), a((size_t)N * vh_), qkv((size_t)N * 3 * vh_), att((size_t)N * vh_),
        tmp((size_t)N * vh_), f((size_t)N * vi_), cs((size_t)N * half), sn((size_t)N * half);
    linear(pool_, im.pixels.data(), N, K, pe_w_, vh_, pe_b_, x.data());
    // Positions bilinearly interpolated from the learned grid (torch.linspace in float32).
    auto lin = [&](int n) {
      std::vector<float> v(n);
      if (n == 1) {
        v[0] = 0;
        return v;
      }
      const float start = 0, end = (float)(side_ - 1), step = (end - start) / (float)(n - 1);
      for (int i = 0; i < n; i++) v[i] = i < n / 2 ? start + step * (float)i : end - step * (float)(n - 1 - i);
      return v;
    };
    std::vector<int> lo(N), hi(N);  // the patches patch i attends to: [lo, hi)
    for (int i0 = 0, k = 0; k < (int)im.images.size(); k++) {
      const int gh = im.images[k].h, gw = im.images[k].w, n = gh * gw;
      const std::vector<float> hs = lin(gh), ws = lin(gw);
      for (int i = i0, bh = 0; bh < gh / m_; bh++)
        for (int bw = 0; bw < gw / m_; bw++)
          for (int mh = 0; mh < m_; mh++)
            for (int mw = 0; mw < m_; mw++, i++) {
              const int row = bh * m_ + mh, col = bw * m_ + mw;
              lo[i] = joint_vision_ ? 0 : i0, hi[i] = joint_vision_ ? N : i0 + n;
              const float hv = hs[row], wv = ws[col];
              const int hf = (int)hv, wf = (int)wv, hc = std::min(hf + 1, side_ - 1), wc = std::min(wf + 1, side_ - 1);
              const float dh = hv - (float)hf, dw = wv - (float)wf;
              const float wt[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
              const int idx[4] = {hf * side_ + wf, hf * side_ + wc, hc * side_ + wf, hc * side_ + wc};
              float *xr = &x[(size_t)i * vh_];
              for (int c = 0; c < vh_; c++) {
                float s = pos_[(size_t)idx[0] * vh_ + c] * wt[0];
                for (int q = 1; q < 4; q++) s += pos_[(size_t)idx[q] * vh_ + c] * wt[q];
                xr[c] += s;
              }
              // 2-D rotary angles: the first quarter of head_dim by row, the second by column.
              for (int j = 0; j < half; j++) {
                float ang = j < quarter ? (float)row * vinv_[j] : (float)col * vinv_[j - quarter];
                cs[(size_t)i * half + j] = (float)std::cos((double)ang);
                sn[(size_t)i * half + j] = (float)std::sin((double)ang);
              }
            }
      i0 += n;
    }
    auto rope = [&](float *v, int i) {
      for (int j = 0; j < half; j++) {
        float c = cs[(size_t)i * half + j], s = sn[(size_t)i * half + j], x1 = v[j], x2 = v[j + half];
        v[j] = x1 * c - x2 * s;
        v[j + half] = x2 * c + x1 * s;
      }
    };
    const float scale = 1.0f / std::sqrt((float)hd);
    S.deep.clear();
    for (int l = 0; l < depth_; l++) {
      const Block &B = blocks_[l];
      layer_norm(x.data(), N, vh_, B.n1w, B.n1b, 1e-6f, a.data());
      linear(pool_, a.data(), N, vh_, B.qkv_w, 3 * vh_, B.qkv_b, qkv.data());
      for (int i = 0; i < N; i++)
        for (int h = 0; h < heads_; h++) {
          rope(&qkv[(size_t)i * 3 * vh_ + h * hd], i);
          rope(&qkv[(size_t)i * 3 * vh_ + vh_ + h * hd], i);
        }
      pool_->run([&](int ti, int nt) {
        std::vector<float> sc(N);
        for (int h = ti; h < heads_; h += nt)
          for (int i = 0; i < N; i++) {
            const float *q = &qkv[(size_t)i * 3 * vh_ + h * hd];
            float mx = -INFINITY;
            for (int j = lo[i]; j < hi[i]; j++) {
              sc[j] = dot(q, &qkv[(size_t)j * 3 * vh_ + vh_ + h * hd], hd) * scale;
              mx = std::max(mx, sc[j]);
            }
            float sum = 0;
            for (int j = lo[i]; j < hi[i]; j++) sum += (sc[j] = std::exp(sc[j] - mx));
            float *o = &att[(size_t)i * vh_ + h * hd];
            std::fill(o, o + hd, 0.0f);
            for (int j = lo[i]; j < hi[i]; j++) axpy(sc[j] / sum, &qkv[(size_t)j * 3 * vh_ + 2 * vh_ + h * hd], o, hd);
          }
      });
      linear(pool_, att.data(), N, vh_, B.proj_w, vh_, B.proj_b, tmp.data());
      for (size_t z = 0; z < x.size(); z++) x[z] += tmp[z];
      layer_norm(x.data(), N, vh_, B.n2w, B.n2b, 1e-6f, a.data());
      linear(pool_, a.data(), N, vh_, B.fc1_w, vi_, B.fc1_b, f.data());
      for (auto &v : f) v = gelu_tanh(v);
      linear(pool_, f.data(), N, vi_, B.fc2_w, vh_, B.fc2_b, tmp.data());
      for (size_t z = 0; z < x.size(); z++) x[z] += tmp[z];
      auto it = std::find(deepstack_.begin(), deepstack_.end(), l);
      if (it != deepstack_.end()) {
        S.deep.resize(deepstack_.size());
        size_t k = it - deepstack_.begin();
        S.deep[k].resize((size_t)(N / (m_ * m_)) * E_);
        merge(deep_mergers_[k], x.data(), N, S.deep[k].data());
      }
    }
    S.embeds.resize((size_t)(N / (m_ * m_)) * E_);
    merge(merger_, x.data(), N, S.embeds.data());
    S.encoded = true;
    S.vision_ns = now_ns() - t0;
  }

  void run(const Batch &b) override {
    const int R = b.rows();
    h_.resize((size_t)R * E_);
    hn_.resize((size_t)R * E_);
    rope_.resize((size_t)R * 3);
    rowimg_.assign(R, nullptr);
    rowidx_.assign(R, -1);
    dec_.embed(b.tokens.data(), R, h_.data());
    bool images = false;
    for (int i = 0; i < b.n; i++) {
      SlotImage &S = slots_[b.slot[i]];
      for (int j = 0; j < b.ntok[i]; j++) {
        const int r = b.off[i] + j, p = b.pos[i] + j;
        int32_t *rp = &rope_[(size_t)r * 3];
        if (S.in && p < S.prompt_len) {
          std::memcpy(rp, &S.pos3[(size_t)p * 3], sizeof(int32_t) * 3);
          const int k = S.img_index[p];
          if (k >= 0) {
            if (!S.encoded) encode(S);
            std::memcpy(&h_[(size_t)r * E_], &S.embeds[(size_t)k * E_], sizeof(float) * E_);
            rowimg_[r] = &S, rowidx_[r] = k, images = true;
          }
        } else {
          rp[0] = rp[1] = rp[2] = p + (S.in ? S.delta : 0);
        }
      }
    }
    Qwen3Decoder::Pass ps;
    ps.batch = &b;
    ps.rope_pos = rope_.data();
    ps.rope_axes = 3;
    if (images && !drop_deepstack_)
      ps.after_layer = [&](int l, float *h, int rows) {
        for (int r = 0; r < rows; r++) {
          const SlotImage *S = rowimg_[r];
          if (!S || l >= (int)S->deep.size()) continue;
          const float *d = &S->deep[l][(size_t)rowidx_[r] * E_];
          float *hr = h + (size_t)r * E_;
          for (int c = 0; c < E_; c++) hr[c] += d[c];
        }
      };
    dec_.forward(ps, h_.data());
    dec_.final_norm(h_.data(), R, hn_.data());
  }

  Qwen3Decoder dec_;
  int ctx_;
  std::vector<SlotImage> slots_;
  bool drop_deepstack_, flat_rope_, shared_start_, joint_vision_;
  int vh_, depth_, heads_, vi_, p_, tp_, m_, npos_, side_, image_token_;
  std::vector<int> deepstack_;
  const float *pe_w_, *pe_b_, *pos_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deep_mergers_;
  std::vector<float> vinv_;
  std::vector<float> h_, mt_, mu_;
  std::vector<int32_t> rope_;
  std::vector<const SlotImage *> rowimg_;
  std::vector<int> rowidx_;
};

}  // namespace

// resolve_qwen3vl reads Qwen3VLConfig: the text model as Qwen3 (text_config, refusing what the
// Qwen3 decoder does not implement), interleaved M-RoPE's sections, and the vision tower.
void resolve_qwen3vl(const Config &c, HParams &hp) {
  const Config t = c.sub("text_config");
  resolve_qwen3(t, hp);
  hp.set("tie_word_embeddings", c.boolean("tie_word_embeddings", t.boolean("tie_word_embeddings", false)));
  const std::string sec_key = t.has("rope_parameters.mrope_section") ? "rope_parameters.mrope_section" : "rope_scaling.mrope_section";
  const std::vector<double> sec = t.numbers(sec_key);
  const int half = hp.i("head_dim") / 2;
  if (sec.size() != 3 || (int)(sec[0] + sec[1] + sec[2]) != half)
    throw Error(MQ_ERR_LOAD, "config.json: text_config." + sec_key + " must have 3 entries summing to head_dim/2 = " + std::to_string(half));
  const std::string il_key = t.has("rope_parameters.mrope_interleaved") ? "rope_parameters.mrope_interleaved" : "rope_scaling.mrope_interleaved";
  if (!t.boolean(il_key, true))
    throw Error(MQ_ERR_LOAD, "config.json: text_config." + il_key + " false (chunked M-RoPE) is not supported; Qwen3-VL interleaves");
  hp.set("mrope_section_t", sec[0]);
  hp.set("mrope_section_h", sec[1]);
  hp.set("mrope_section_w", sec[2]);
  const Config v = c.sub("vision_config");
  const int64_t vh = v.positive("hidden_size"), heads = v.positive("num_heads");
  if (vh % heads || (vh / heads) % 4)
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.hidden_size / num_heads must be a multiple of 4 (2-D rotary halves)");
  if (v.string("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh")
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.hidden_act \"" + v.string("hidden_act") + "\" is not supported; gelu_pytorch_tanh");
  if (v.integer("in_channels", 3) != 3) throw Error(MQ_ERR_LOAD, "config.json: vision_config.in_channels must be 3");
  const int64_t npos = v.positive("num_position_embeddings");
  const int64_t side = (int64_t)std::llround(std::sqrt((double)npos));
  if (side * side != npos) throw Error(MQ_ERR_LOAD, "config.json: vision_config.num_position_embeddings must be a square");
  if (v.positive("out_hidden_size") != hp.i("hidden_size"))
    throw Error(MQ_ERR_LOAD, "config.json: vision_config.out_hidden_size must equal text_config.hidden_size");
  hp.set("vision_hidden_size", (double)vh);
  hp.set("vision_depth", (double)v.positive("depth"));
  hp.set("vision_num_heads", (double)heads);
  hp.set("vision_intermediate_size", (double)v.positive("intermediate_size"));
  hp.set("vision_patch_size", (double)v.integer("patch_size", 16));
  hp.set("vision_temporal_patch_size", (double)v.integer("temporal_patch_size", 2));
  hp.set("vision_merge_size", (double)v.integer("spatial_merge_size", 2));
  hp.set("vision_num_position_embeddings", (double)npos);
  const std::vector<double> ds = v.numbers("deepstack_visual_indexes");
  hp.set("vision_deepstack_count", (double)ds.size());
  for (size_t k = 0; k < ds.size(); k++) {
    if (ds[k] < 0 || ds[k] >= hp.i("vision_depth"))
      throw Error(MQ_ERR_LOAD, "config.json: vision_config.deepstack_visual_indexes holds " + std::to_string((int)ds[k]) + ", outside the blocks");
    hp.set("vision_deepstack_" + std::to_string(k), ds[k]);
  }
  hp.set("image_token_id", (double)c.integer("image_token_id", 151655));
}

std::unique_ptr<Backend> make_qwen3vl(const ModelArgs &a) { return std::unique_ptr<Backend>(new Qwen3VL(a)); }

// layout_qwen3vl: transformers 5 saves Qwen3VLForConditionalGeneration as "model.language_model.",
// "model.visual." and "lm_head."; a Qwen3VLModel (base model) checkpoint has no "model."; the
// older vision-language layouts name the decoder "language_model.model." (head
// "language_model.lm_head.") or "model." and the tower "visual.". A tied head is the embedding.
void layout_qwen3vl(const HParams &hp, TensorLayout &l) {
  l.rename("language_model.model.", "model.language_model.");
  l.rename("language_model.lm_head.", "lm_head.");
  l.rename("language_model.", "model.language_model.");
  l.rename("visual.", "model.visual.");
  l.rename("model.", "model.language_model.");
  if (hp.b("tie_word_embeddings")) l.drop("lm_head.weight");
}

MQ_REGISTER_FAMILY(Family{"qwen3vl", "vision", {"Qwen3VLForConditionalGeneration"}, resolve_qwen3vl, make_qwen3vl, 0,
                          layout_qwen3vl});

}  // namespace mq
