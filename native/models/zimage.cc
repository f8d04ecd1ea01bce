// models/zimage.cc: the Z-Image text-to-image pipeline in fp32, as diffusers' ZImagePipeline
// runs it (owner: zimage family).
//
// Pipeline (diffusers pipelines/z_image/pipeline_z_image.py at 58eb52c0):
//  1. text encoder: the prompt, formatted by the tokenizer's chat template (user turn, generation
//     prompt, enable_thinking; declared by resolve_zimage as prompt.*, applied in Go), through the Qwen3 decoder (the shared Qwen3Decoder, tensors
//     "text_encoder.*"); the embeddings are transformers' hidden_states[-2], the residual stream
//     after layer L-2, without the final norm. With guidance > 0 the negative prompt ("" by
//     default, formatted the same way) is encoded too.
//  2. latents: torch.randn(1, C, H/8, W/8) of a CPU generator seeded with seed (torch_randn).
//  3. scheduler (FlowMatchEulerDiscreteScheduler): sigmas = linspace(1, 1/N, N) in float32,
//     shifted by shift*s/(1+(shift-1)*s) (or, with use_dynamic_shifting, the exponential time
//     shift by mu from the image's token count), timesteps = 1000*sigma, a final sigma 0;
//     each step latents += (sigma_next - sigma) * -v.
//  4. transformer (models/transformers/transformer_z_image.py): t = (1000 - timestep)/1000;
//     adaLN input = t_embedder(t * t_scale); latents patchified 2x2 and embedded, padded to a
//     multiple of 32 with x_pad_token, through the noise refiner (modulated blocks); caption
//     embeddings RMS-normed and embedded, padded with cap_pad_token, through the context refiner
//     (plain blocks); then [image tokens, caption tokens] through the main blocks, the final
//     adaLN layer, and unpatchified. Blocks: RMSNorm -> (adaLN scale) -> attention with per-head
//     RMS q/k norms and 3-axis complex RoPE (caption token j at (1+j, 0, 0), image token (h, w)
//     at (caption_len+1, h, w), padding at (0, 0, 0)) -> RMSNorm -> tanh gate, residual; the same
//     around a SwiGLU FFN. Guidance: v = pos + g * (pos - neg).
//  5. VAE (AutoencoderKL decoder): z / scaling_factor + shift_factor, conv_in, mid block (resnet,
//     single-head attention, resnet), up blocks (resnets, nearest 2x upsample + conv), GroupNorm,
//     SiLU, conv_out; image = clamp(x/2 + 1/2, 0, 1), 8-bit by round-half-even of 255*x.
//
// Faults (MODELQUAL_FAULTS): zimage.drop_cfg ignores the negative branch (guidance off),
// zimage.rope_swap_hw swaps the image tokens' h and w positions. They prove the parity gates bite.
#include <algorithm>
#include <cmath>
#include <cstring>


#include "mq_backend.h"
#include "diffusion.h"
#include "qwen3_decoder.h"
#include "runtime.h"

namespace mq {

void resolve_qwen3(const Config &c, HParams &hp);  // models/qwen3.cc: the text encoder's config

namespace {

constexpr int kSeqMultiple = 32;  // diffusers' SEQ_MULTI_OF
constexpr int kPatch = 2;         // all_patch_size [2], all_f_patch_size [1]
constexpr int kFreqDim = 256;     // timestep frequency embedding size
constexpr int kTMid = 1024;       // t_embedder mid size
constexpr int kMaxSteps = 200;

using diffusion::full_attention;
using diffusion::silu;

// HParams keys under a prefix, back into their own HParams (the text encoder's).
HParams sub_hparams(const HParams &hp, const std::string &prefix) {
  HParams out;
  for (const auto &kv : hp.numbers())
    if (kv.first.compare(0, prefix.size(), prefix) == 0) out.set(kv.first.substr(prefix.size()), kv.second);
  return out;
}

// ---- the Z-Image transformer ---------------------------------------------------------------

struct Block {
  const float *wq, *wk, *wv, *wo, *nq, *nk, *w1, *w2, *w3, *an1, *an2, *fn1, *fn2;
  const float *mod_w = nullptr, *mod_b = nullptr;  // adaLN_modulation.0 (modulated blocks)
};

class Transformer {
 public:
  Transformer(const HParams &hp, const Weights &w, ThreadPool *pool, bool rope_swap_hw)
      : pool_(pool), rope_swap_hw_(rope_swap_hw) {
    D_ = hp.i("transformer.dim");
    H_ = hp.i("transformer.n_heads");
    hd_ = D_ / H_;
    C_ = hp.i("transformer.in_channels");
    cap_ = hp.i("transformer.cap_feat_dim");
    eps_ = (float)hp.f("transformer.norm_eps");
    t_scale_ = (float)hp.f("transformer.t_scale");
    ffn_ = (int)((double)D_ / 3 * 8);
    ada_ = std::min(D_, 256);
    const int P = kPatch * kPatch * C_;
    const std::string t = "transformer.";
    x_w_ = w.get(t + "all_x_embedder.2-1.weight", {D_, P});
    x_b_ = w.get(t + "all_x_embedder.2-1.bias", {D_});
    f_w_ = w.get(t + "all_final_layer.2-1.linear.weight", {P, D_});
    f_b_ = w.get(t + "all_final_layer.2-1.linear.bias", {P});
    fm_w_ = w.get(t + "all_final_layer.2-1.adaLN_modulation.1.weight", {D_, ada_});
    fm_b_ = w.get(t + "all_final_layer.2-1.adaLN_modulation.1.bias", {D_});
    t0_w_ = w.get(t + "t_embedder.mlp.0.weight", {kTMid, kFreqDim});
    t0_b_ = w.get(t + "t_embedder.mlp.0.bias", {kTMid});
    t2_w_ = w.get(t + "t_embedder.mlp.2.weight", {ada_, kTMid});
    t2_b_ = w.get(t + "t_embedder.mlp.2.bias", {ada_});
    cap_norm_ = w.get(t + "cap_embedder.0.weight", {cap_});
    cap_w_ = w.get(t + "cap_embedder.1.weight", {D_, cap_});
    cap_b_ = w.get(t + "cap_embedder.1.bias", {D_});
    x_pad_ = w.get(t + "x_pad_token", {1, D_});
    cap_pad_ = w.get(t + "cap_pad_token", {1, D_});
    const int R = hp.i("transformer.n_refiner_layers"), N = hp.i("transformer.n_layers");
    for (int i = 0; i < R; i++) noise_.push_back(block(w, t + "noise_refiner." + std::to_string(i) + ".", true));
    for (int i = 0; i < R; i++) context_.push_back(block(w, t + "context_refiner." + std::to_string(i) + ".", false));
    for (int i = 0; i < N; i++) layers_.push_back(block(w, t + "layers." + std::to_string(i) + ".", true));
    // RoPE frequencies per axis, as RopeEmbedder.precompute_freqs_cis: 1/theta^(2k/d) in float64.
    const double theta = hp.f("transformer.rope_theta");
    int sum = 0;
    for (int a = 0; a < 3; a++) {
      const int d = hp.i("transformer.axes_dims." + std::to_string(a));
      axes_lens_[a] = hp.i("transformer.axes_lens." + std::to_string(a));
      for (int k = 0; k < d / 2; k++) {
        freq_axis_.push_back(a);
        freq_.push_back(1.0 / std::pow(theta, (double)(2 * k) / (double)d));
      }
      sum += d;
    }
    if (sum != hd_)
      throw Error(MQ_ERR_LOAD, "config transformer.axes_dims sum to " + std::to_string(sum) + ", not the head dim " + std::to_string(hd_));
  }

  int channels() const { return C_; }
  int axis0_len() const { return axes_lens_[0]; }

  // forward computes the velocity out [C, h, w] for latents [C, h, w] at model time t.
  void forward(const float *lat, int h, int w, float t, const float *capf, int ncap, float *out) {
    // adaLN input: t_embedder(t * t_scale).
    std::vector<float> freq(kFreqDim), mid(kTMid), adaln(ada_);
    const float tt = t * t_scale_;
    const int half = kFreqDim / 2;
    const float neg_log = (float)(-std::log(10000.0));
    for (int i = 0; i < half; i++) {
      const float f = std::exp(neg_log * (float)i / (float)half);
      const float arg = tt * f;
      freq[i] = std::cos(arg);
      freq[half + i] = std::sin(arg);
    }
    linear(pool_, freq.data(), 1, kFreqDim, t0_w_, kTMid, t0_b_, mid.data());
    for (float &x : mid) x = silu(x);
    linear(pool_, mid.data(), 1, kTMid, t2_w_, ada_, t2_b_, adaln.data());

    // Image tokens: 2x2 patches, feature index (ph*2 + pw)*C + c.
    const int ht = h / kPatch, wt = w / kPatch, nimg = ht * wt, P = kPatch * kPatch * C_;
    const int Lx = round_up(nimg), Lc = round_up(ncap);
    std::vector<float> patches((size_t)nimg * P);
    for (int y = 0; y < ht; y++)
      for (int x = 0; x < wt; x++)
        for (int ph = 0; ph < kPatch; ph++)
          for (int pw = 0; pw < kPatch; pw++)
            for (int c = 0; c < C_; c++)
              patches[(size_t)(y * wt + x) * P + (ph * kPatch + pw) * C_ + c] =
                  lat[((size_t)c * h + (y * kPatch + ph)) * w + (x * kPatch + pw)];
    std::vector<float> seq((size_t)(Lx + Lc) * D_);
    float *xs = seq.data(), *cs = seq.data() + (size_t)Lx * D_;
    linear(pool_, patches.data(), nimg, P, x_w_, D_, x_b_, xs);
    for (int r = nimg; r < Lx; r++) std::memcpy(xs + (size_t)r * D_, x_pad_, sizeof(float) * D_);
    // Caption tokens: RMSNorm then Linear, padded with cap_pad_token.
    std::vector<float> cn((size_t)ncap * cap_);
    rms_norm(capf, ncap, cap_, cap_norm_, eps_, cn.data());
    linear(pool_, cn.data(), ncap, cap_, cap_w_, D_, cap_b_, cs);
    for (int r = ncap; r < Lc; r++) std::memcpy(cs + (size_t)r * D_, cap_pad_, sizeof(float) * D_);
    // Positions.
    if (Lc + 1 >= axes_lens_[0])
      throw Error(MQ_ERR_INVALID_ARGUMENT, "prompt: " + std::to_string(ncap) + " tokens exceed the transformer's position table (axes_lens[0] " +
                                               std::to_string(axes_lens_[0]) + ")");
    if (ht > axes_lens_[1] || wt > axes_lens_[2])
      throw Error(MQ_ERR_INVALID_ARGUMENT, "size: the image is larger than the transformer's position table");
    std::vector<int> pos((size_t)(Lx + Lc) * 3, 0);
    for (int r = 0; r < nimg; r++) {
      int *p = &pos[(size_t)r * 3];
      p[0] = Lc + 1;
      p[1] = r / wt;
      p[2] = r % wt;
      if (rope_swap_hw_) std::swap(p[1], p[2]);
    }
    for (int j = 0; j < Lc; j++) pos[(size_t)(Lx + j) * 3] = 1 + j;
    std::vector<float> cosv, sinv;
    rope_tables(pos, Lx + Lc, cosv, sinv);

    for (const Block &b : noise_) run_block(b, xs, Lx, cosv.data(), sinv.data(), adaln.data());
    const size_t off = (size_t)Lx * (hd_ / 2);
    for (const Block &b : context_) run_block(b, cs, Lc, cosv.data() + off, sinv.data() + off, nullptr);
    for (const Block &b : layers_) run_block(b, seq.data(), Lx + Lc, cosv.data(), sinv.data(), adaln.data());

    // Final layer on the image tokens: LayerNorm (no affine, eps 1e-6) * (1 + adaLN(SiLU(c))).
    std::vector<float> sc(D_), sa(ada_);
    for (int i = 0; i < ada_; i++) sa[i] = silu(adaln[i]);
    linear(pool_, sa.data(), 1, ada_, fm_w_, D_, fm_b_, sc.data());
    std::vector<float> xn((size_t)nimg * D_), po((size_t)nimg * P);
    for (int r = 0; r < nimg; r++) {
      const float *xr = xs + (size_t)r * D_;
      double mean = 0, var = 0;
      for (int i = 0; i < D_; i++) mean += xr[i];
      mean /= D_;
      for (int i = 0; i < D_; i++) var += (xr[i] - mean) * (xr[i] - mean);
      const float inv = (float)(1.0 / std::sqrt(var / D_ + 1e-6)), m = (float)mean;
      for (int i = 0; i < D_; i++) xn[(size_t)r * D_ + i] = (xr[i] - m) * inv * (1.0f + sc[i]);
    }
    linear(pool_, xn.data(), nimg, D_, f_w_, P, f_b_, po.data());
    for (int y = 0; y < ht; y++)
      for (int x = 0; x < wt; x++)
        for (int ph = 0; ph < kPatch; ph++)
          for (int pw = 0; pw < kPatch; pw++)
            for (int c = 0; c < C_; c++)
              out[((size_t)c * h + (y * kPatch + ph)) * w + (x * kPatch + pw)] =
                  po[(size_t)(y * wt + x) * P + (ph * kPatch + pw) * C_ + c];
  }

 private:
  static int round_up(int n) { return (n + kSeqMultiple - 1) / kSeqMultiple * kSeqMultiple; }

  Block block(const Weights &w, const std::string &p, bool modulated) const {
    Block b;
    b.wq = w.get(p + "attention.to_q.weight", {D_, D_});
    b.wk = w.get(p + "attention.to_k.weight", {D_, D_});
    b.wv = w.get(p + "attention.to_v.weight", {D_, D_});
    b.wo = w.get(p + "attention.to_out.0.weight", {D_, D_});
    b.nq = w.get(p + "attention.norm_q.weight", {hd_});
    b.nk = w.get(p + "attention.norm_k.weight", {hd_});
    b.w1 = w.get(p + "feed_forward.w1.weight", {ffn_, D_});
    b.w2 = w.get(p + "feed_forward.w2.weight", {D_, ffn_});
    b.w3 = w.get(p + "feed_forward.w3.weight", {ffn_, D_});
    b.an1 = w.get(p + "attention_norm1.weight", {D_});
    b.an2 = w.get(p + "attention_norm2.weight", {D_});
    b.fn1 = w.get(p + "ffn_norm1.weight", {D_});
    b.fn2 = w.get(p + "ffn_norm2.weight", {D_});
    if (modulated) {
      b.mod_w = w.get(p + "adaLN_modulation.0.weight", {4 * D_, ada_});
      b.mod_b = w.get(p + "adaLN_modulation.0.bias", {4 * D_});
    }
    return b;
  }

  // rope_tables: per row and frequency, cos and sin of float32(pos[axis] * freq) (the angle is
  // formed in float64 and rounded, as torch.outer in float64 then .float() does).
  void rope_tables(const std::vector<int> &pos, int L, std::vector<float> &c, std::vector<float> &s) const {
    const int nf = hd_ / 2;
    c.resize((size_t)L * nf);
    s.resize((size_t)L * nf);
    for (int r = 0; r < L; r++)
      for (int k = 0; k < nf; k++) {
        const float ang = (float)((double)pos[(size_t)r * 3 + freq_axis_[k]] * freq_[k]);
        c[(size_t)r * nf + k] = std::cos(ang);
        s[(size_t)r * nf + k] = std::sin(ang);
      }
  }

  // rope rotates consecutive pairs (x[2k], x[2k+1]) as the complex number times e^{i angle}.
  void rope(float *x, const float *c, const float *s) const {
    for (int k = 0; k < hd_ / 2; k++) {
      const float a = x[2 * k], b = x[2 * k + 1];
      x[2 * k] = a * c[k] - b * s[k];
      x[2 * k + 1] = a * s[k] + b * c[k];
    }
  }

  void run_block(const Block &b, float *x, int L, const float *cosv, const float *sinv, const float *adaln) {
    const size_t n = (size_t)L * D_;
    a_.resize(n), q_.resize(n), k_.resize(n), v_.resize(n), o_.resize(n), t_.resize(n);
    g1_.resize((size_t)L * ffn_), g3_.resize((size_t)L * ffn_);
    std::vector<float> mod;
    if (b.mod_w) {
      mod.resize(4 * D_);
      linear(pool_, adaln, 1, ada_, b.mod_w, 4 * D_, b.mod_b, mod.data());
      for (int i = 0; i < D_; i++) {
        mod[i] = 1.0f + mod[i];                    // scale_msa
        mod[D_ + i] = std::tanh(mod[D_ + i]);      // gate_msa
        mod[2 * D_ + i] = 1.0f + mod[2 * D_ + i];  // scale_mlp
        mod[3 * D_ + i] = std::tanh(mod[3 * D_ + i]);  // gate_mlp
      }
    }
    // Attention.
    rms_norm(x, L, D_, b.an1, eps_, a_.data());
    if (b.mod_w)
      for (int r = 0; r < L; r++)
        for (int i = 0; i < D_; i++) a_[(size_t)r * D_ + i] *= mod[i];
    linear(pool_, a_.data(), L, D_, b.wq, D_, nullptr, q_.data());
    linear(pool_, a_.data(), L, D_, b.wk, D_, nullptr, k_.data());
    linear(pool_, a_.data(), L, D_, b.wv, D_, nullptr, v_.data());
    const int nf = hd_ / 2;
    for (int r = 0; r < L; r++)
      for (int h = 0; h < H_; h++) {
        float *qh = &q_[(size_t)r * D_ + h * hd_], *kh = &k_[(size_t)r * D_ + h * hd_];
        rms_norm(qh, 1, hd_, b.nq, 1e-5f, qh);
        rms_norm(kh, 1, hd_, b.nk, 1e-5f, kh);
        rope(qh, cosv + (size_t)r * nf, sinv + (size_t)r * nf);
        rope(kh, cosv + (size_t)r * nf, sinv + (size_t)r * nf);
      }
    full_attention(pool_, q_.data(), k_.data(), v_.data(), L, H_, hd_, o_.data());
    linear(pool_, o_.data(), L, D_, b.wo, D_, nullptr, t_.data());
    rms_norm(t_.data(), L, D_, b.an2, eps_, t_.data());
    for (int r = 0; r < L; r++)
      for (int i = 0; i < D_; i++) x[(size_t)r * D_ + i] += (b.mod_w ? mod[D_ + i] : 1.0f) * t_[(size_t)r * D_ + i];
    // Feed-forward.
    rms_norm(x, L, D_, b.fn1, eps_, a_.data());
    if (b.mod_w)
      for (int r = 0; r < L; r++)
        for (int i = 0; i < D_; i++) a_[(size_t)r * D_ + i] *= mod[2 * D_ + i];
    linear(pool_, a_.data(), L, D_, b.w1, ffn_, nullptr, g1_.data());
    linear(pool_, a_.data(), L, D_, b.w3, ffn_, nullptr, g3_.data());
    for (size_t i = 0; i < g1_.size(); i++) g1_[i] = silu(g1_[i]) * g3_[i];
    linear(pool_, g1_.data(), L, ffn_, b.w2, D_, nullptr, t_.data());
    rms_norm(t_.data(), L, D_, b.fn2, eps_, t_.data());
    for (int r = 0; r < L; r++)
      for (int i = 0; i < D_; i++) x[(size_t)r * D_ + i] += (b.mod_w ? mod[3 * D_ + i] : 1.0f) * t_[(size_t)r * D_ + i];
  }

  ThreadPool *pool_;
  bool rope_swap_hw_;
  int D_, H_, hd_, C_, cap_, ffn_, ada_;
  int axes_lens_[3] = {0, 0, 0};
  float eps_, t_scale_;
  const float *x_w_, *x_b_, *f_w_, *f_b_, *fm_w_, *fm_b_, *t0_w_, *t0_b_, *t2_w_, *t2_b_, *cap_norm_, *cap_w_,
      *cap_b_, *x_pad_, *cap_pad_;
  std::vector<Block> noise_, context_, layers_;
  std::vector<int> freq_axis_;
  std::vector<double> freq_;
  std::vector<float> a_, q_, k_, v_, o_, t_, g1_, g3_;
};

// ---- what both devices share: spec, request checks, schedule -------------------------------

// zimage_spec: what the pipeline accepts (VAE scale from its block count, the transformer's
// position table, the text encoder's context).
mq_image_spec zimage_spec(const HParams &hp, int max_ctx) {
  mq_image_spec s{};  // pooled_hidden 0: no pooled embedding
  s.latent_channels = hp.i("transformer.in_channels");
  s.vae_scale = 1 << (hp.i("vae.n_blocks") - 1);
  s.size_multiple = s.vae_scale * kPatch;
  s.max_size = std::min(2048, hp.i("transformer.axes_lens.1") * s.size_multiple);
  s.max_prompt_tokens = max_ctx;
  s.max_steps = kMaxSteps;
  s.text_hidden = hp.i("transformer.cap_feat_dim");  // checked equal to the text encoder's hidden_size
  return s;
}

void check_ids(const char *what, const int32_t *ids, int n, int max_ctx, int vocab) {
  if (n <= 0 || !ids) throw Error(MQ_ERR_INVALID_ARGUMENT, std::string(what) + ": no tokens; the pipeline formats every prompt with its chat template");
  if (n > max_ctx)
    throw Error(MQ_ERR_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(n) + " tokens exceed the text encoder's context of " +
                                             std::to_string(max_ctx));
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error(MQ_ERR_INVALID_ARGUMENT, std::string(what) + ": token " + std::to_string(ids[i]) + " is outside the vocabulary");
}

// zimage_check validates r (errors name the field) and answers whether guidance runs (the
// zimage.drop_cfg fault turns it off).
bool zimage_check(const HParams &hp, int max_ctx, const mq_image_request &r) {
  const mq_image_spec sp = zimage_spec(hp, max_ctx);
  auto bad = [](const std::string &m) { throw Error(MQ_ERR_INVALID_ARGUMENT, m); };
  for (int v : {r.width, r.height})
    if (v <= 0 || v % sp.size_multiple != 0 || v > sp.max_size)
      bad("size: " + std::to_string(r.width) + "x" + std::to_string(r.height) + " is not on the grid: width and height must be multiples of " +
          std::to_string(sp.size_multiple) + " up to " + std::to_string(sp.max_size));
  if (r.steps < 1 || r.steps > sp.max_steps) bad("num_inference_steps: " + std::to_string(r.steps) + " is outside 1.." + std::to_string(sp.max_steps));
  if (!std::isfinite(r.guidance) || r.guidance < 0) bad("guidance_scale: must be a finite number >= 0");
  if (r.true_cfg != 0) bad("true_cfg_scale: this pipeline has no true CFG scale; guidance_scale is its classifier-free guidance");
  if (r.n_prompt_2 != 0 || r.n_negative_2 != 0) bad("prompt_2: this pipeline has one text encoder");
  const bool cfg = r.guidance > 0 && !fault("zimage.drop_cfg");
  const int vocab = hp.i("vocab_size");
  check_ids("prompt", r.prompt, r.n_prompt, max_ctx, vocab);
  if (cfg) check_ids("negative prompt", r.negative, r.n_negative, max_ctx, vocab);
  return cfg;
}

// zimage_schedule: the flow-match sigmas as ZImagePipeline asks for them (torch.linspace base
// sigmas). The zimage.scheduler_shift_ignored fault plants a misread scheduler config (shift 1).
std::vector<float> zimage_schedule(const HParams &hp, int N, int image_seq_len) {
  const float shift = fault("zimage.scheduler_shift_ignored") ? 1.0f : (float)hp.f("scheduler.shift");
  return diffusion::flow_match_sigmas(hp, N, image_seq_len, shift, diffusion::Linspace::TorchFloat32);
}

// ---- the pipeline ----------------------------------------------------------------------------

ModelArgs encoder_args(const ModelArgs &a, const HParams *te) {
  ModelArgs e = a;
  e.hp = te;
  e.max_batch = 1;
  e.n_slots = 1;
  return e;
}

class ZImage : public ImageBackend {
 public:
  explicit ZImage(const ModelArgs &a)
      : hp_(*a.hp), te_hp_(sub_hparams(*a.hp, "text_encoder.")), pool_(a.pool), max_ctx_(a.max_context),
        encoder_(encoder_args(a, &te_hp_), DecoderDims(te_hp_), encoder_options()),
        transformer_(*a.hp, *a.w, a.pool, fault("zimage.rope_swap_hw")), decoder_(*a.hp, *a.w, a.pool) {
    vocab_ = te_hp_.i("vocab_size");
    scaling_ = (float)hp_.f("vae.scaling_factor");
    shift_factor_ = (float)hp_.f("vae.shift_factor");
    // Planted faults of the catalog (qual/mutants): the VAE's input scaled the wrong way, its
    // shift factor dropped, the 8-bit pixels truncated instead of rounded.
    if (fault("zimage.vae_scaling_inverted")) scaling_ = 1.0f / scaling_;
    if (fault("zimage.vae_shift_dropped")) shift_factor_ = 0.0f;
    truncate_pixels_ = fault("zimage.pixels_truncated");
    if (transformer_.channels() != hp_.i("vae.latent_channels"))
      throw Error(MQ_ERR_LOAD, "config: transformer.in_channels " + std::to_string(transformer_.channels()) +
                                   " differs from vae.latent_channels " + std::to_string(hp_.i("vae.latent_channels")));
    if (hp_.i("transformer.cap_feat_dim") != encoder_.hidden())
      throw Error(MQ_ERR_LOAD, "config: transformer.cap_feat_dim " + std::to_string(hp_.i("transformer.cap_feat_dim")) +
                                   " differs from the text encoder's hidden_size " + std::to_string(encoder_.hidden()));
  }

  int vocab() const override { return vocab_; }

  mq_image_spec image_spec() const override { return zimage_spec(hp_, max_ctx_); }

  void generate(const mq_image_request &r, mq_image_output *out) override {
    const int64_t t0 = now_ns();
    const mq_image_spec sp = image_spec();
    const bool cfg = zimage_check(hp_, max_ctx_, r);
    const int C = sp.latent_channels, h = r.height / sp.vae_scale, w = r.width / sp.vae_scale;
    const size_t n = (size_t)C * h * w;
    if (r.decode_latents) {  // the VAE stage alone (component check)
      std::vector<float> z(r.decode_latents, r.decode_latents + n);
      decode_to(z, r, out);
      out->pipeline_ns = now_ns() - t0;
      return;
    }

    // 1. Text embeddings.
    std::vector<float> pe, ne;
    encode(r.prompt, r.n_prompt, pe);
    if (cfg) encode(r.negative, r.n_negative, ne);
    if (out->prompt_embeds) std::memcpy(out->prompt_embeds, pe.data(), sizeof(float) * pe.size());

    // 2. Latents.
    std::vector<float> lat(n), pos(n), neg(n);
    torch_randn(r.seed, lat.data(), (int64_t)n);
    if (out->latents) std::memcpy(out->latents, lat.data(), sizeof(float) * n);

    // 3. Scheduler and 4. denoising.
    std::vector<float> sigmas = zimage_schedule(hp_, r.steps, (h / kPatch) * (w / kPatch));
    const int E = encoder_.hidden();
    for (int i = 0; i < r.steps; i++) {
      const float timestep = sigmas[i] * 1000.0f;
      const float t = (1000.0f - timestep) / 1000.0f;
      transformer_.forward(lat.data(), h, w, t, pe.data(), (int)(pe.size() / E), pos.data());
      if (cfg) transformer_.forward(lat.data(), h, w, t, ne.data(), (int)(ne.size() / E), neg.data());
      if (i == 0 && out->first_velocity) {
        std::memcpy(out->first_velocity, pos.data(), sizeof(float) * n);
        if (cfg) std::memcpy(out->first_velocity + n, neg.data(), sizeof(float) * n);
      }
      if (cfg)
        for (size_t j = 0; j < n; j++) pos[j] = pos[j] + r.guidance * (pos[j] - neg[j]);
      const float dt = sigmas[i + 1] - sigmas[i];
      for (size_t j = 0; j < n; j++) lat[j] = lat[j] + dt * -pos[j];
      if (out->latents) std::memcpy(out->latents + (size_t)(i + 1) * n, lat.data(), sizeof(float) * n);
    }

    // 5. Decode.
    for (size_t j = 0; j < n; j++) lat[j] = lat[j] / scaling_ + shift_factor_;
    decode_to(lat, r, out);
    out->pipeline_ns = now_ns() - t0;
  }

 private:
  // decode_to runs the VAE decoder on z (its input: latents after scaling and shift) and
  // writes the [0, 1] image and its 8-bit pixels.
  void decode_to(std::vector<float> &z, const mq_image_request &r, mq_image_output *out) {
    const int vs = image_spec().vae_scale;
    std::vector<float> img;
    decoder_.decode(z.data(), r.height / vs, r.width / vs, img);
    diffusion::to_pixels(img, (size_t)r.width * r.height, out->image, out->rgb, truncate_pixels_);
  }

  static Qwen3Decoder::Options encoder_options() {
    Qwen3Decoder::Options o;
    o.prefix = "text_encoder.";
    o.fault_prefix = "zimage.text_encoder";
    return o;
  }

  // encode: hidden_states[-2] of the text encoder for ids, [n, E].
  void encode(const int32_t *ids, int n, std::vector<float> &h) {
    Batch b;
    b.n = 1;
    b.slot = {0};
    b.ntok = {n};
    b.pos = {0};
    b.off = {0};
    b.tokens.assign(ids, ids + n);
    h.resize((size_t)n * encoder_.hidden());
    encoder_.embed(ids, n, h.data());
    Qwen3Decoder::Pass p;
    p.batch = &b;
    p.last_layer = encoder_.layers() - 2;
    encoder_.forward(p, h.data());
  }

  HParams hp_, te_hp_;
  ThreadPool *pool_;
  int max_ctx_, vocab_ = 0;
  Qwen3Decoder encoder_;
  Transformer transformer_;
  diffusion::VAEDecoder decoder_;
  float scaling_ = 1, shift_factor_ = 0;
  bool truncate_pixels_ = false;
};

}  // namespace

// resolve_zimage reads model_index.json and the component configs (text_encoder through the
// Qwen3 family's own resolve) and refuses what this pipeline does not implement, naming the key.
void resolve_zimage(const Config &c, HParams &hp) {
  auto refuse = [](const std::string &key, const std::string &why) { throw Error(MQ_ERR_LOAD, "config " + key + ": " + why); };
  HParams te;
  resolve_qwen3(c.sub("text_encoder"), te);
  for (const auto &kv : te.numbers()) hp.set("text_encoder." + kv.first, kv.second);
  hp.set("vocab_size", te.f("vocab_size"));
  hp.set("max_positions", std::min(512.0, te.f("max_positions")));  // diffusers' max_sequence_length
  // The text encoder's prompt, as ZImagePipeline._encode_prompt formats it: one user turn through
  // the tokenizer's chat template with the generation prompt and enable_thinking=True. The Go side
  // (native.ImagePromptFor) applies what a family declares here, for the CLI and the server alike.
  hp.set_string("prompt.format", "chat_template");
  hp.set_string("prompt.chat_template_kwargs", "{\"enable_thinking\": true}");

  const Config t = c.sub("transformer");
  const int64_t dim = t.positive("dim"), heads = t.positive("n_heads");
  if (dim % heads != 0) refuse("transformer.dim", "not a multiple of n_heads");
  for (const char *k : {"all_patch_size", "all_f_patch_size"}) {
    std::vector<double> v = t.numbers(k);
    if (v.size() != 1 || v[0] != (std::string(k) == "all_patch_size" ? 2 : 1))
      refuse(std::string("transformer.") + k, "only patch size 2 with frame patch 1 is implemented");
  }
  if (!t.boolean("qk_norm", true)) refuse("transformer.qk_norm", "false is not implemented");
  if (t.has("siglip_feat_dim")) refuse("transformer.siglip_feat_dim", "the Omni (SigLIP) variant is not implemented");
  hp.set("transformer.dim", (double)dim);
  hp.set("transformer.n_heads", (double)heads);
  hp.set("transformer.n_layers", (double)t.positive("n_layers"));
  hp.set("transformer.n_refiner_layers", (double)t.integer("n_refiner_layers", 2));
  hp.set("transformer.in_channels", (double)t.positive("in_channels"));
  hp.set("transformer.cap_feat_dim", (double)t.positive("cap_feat_dim"));
  hp.set("transformer.norm_eps", t.number("norm_eps", 1e-5));
  hp.set("transformer.rope_theta", t.number("rope_theta", 256.0));
  hp.set("transformer.t_scale", t.number("t_scale", 1000.0));
  std::vector<double> ad = t.numbers("axes_dims"), al = t.numbers("axes_lens");
  if (ad.size() != 3 || al.size() != 3) refuse("transformer.axes_dims", "want 3 axes (frame, height, width)");
  for (int i = 0; i < 3; i++) {
    if ((int)ad[i] % 2 != 0) refuse("transformer.axes_dims", "every axis dim must be even");
    hp.set("transformer.axes_dims." + std::to_string(i), ad[i]);
    hp.set("transformer.axes_lens." + std::to_string(i), al[i]);
  }

  diffusion::resolve_autoencoder_kl(c.sub("vae"), hp);
  diffusion::resolve_flow_match(c.sub("scheduler"), hp);
}

std::unique_ptr<Backend> make_zimage(const ModelArgs &a) { return std::unique_ptr<Backend>(new ZImage(a)); }

namespace {

// ZImageCuda is the pipeline with device "cuda": this side validates the request, draws the
// seeded noise and computes the sigmas (the same functions as on CPU), and libmodelqual_cuda.so
// (native/models/zimage.cu, through the mqb_image_* symbols) runs the rest on the GPU.
class ZImageCuda : public ImageBackend {
 public:
  ZImageCuda(void *lib, const mq_engine_params &p, const HParams &hp, int max_context)
      : hp_(hp), max_ctx_(max_context), gpu_(lib, p, hp, "zimage", max_context) {}
  int vocab() const override { return hp_.i("vocab_size"); }
  std::string device() const override { return "cuda"; }
  mq_image_spec image_spec() const override { return zimage_spec(hp_, max_ctx_); }

  void generate(const mq_image_request &r, mq_image_output *out) override {
    const int64_t t0 = now_ns();
    const mq_image_spec sp = image_spec();
    const bool cfg = zimage_check(hp_, max_ctx_, r);
    if (r.decode_latents || out->prompt_embeds || out->first_velocity)
      throw Error(MQ_ERR_INVALID_ARGUMENT, "device cuda: the component outputs (decode_latents, prompt_embeds, first_velocity) are the CPU pipeline's");
    const int h = r.height / sp.vae_scale, w = r.width / sp.vae_scale;
    const size_t n = (size_t)sp.latent_channels * h * w;
    std::vector<float> noise(n);
    torch_randn(r.seed, noise.data(), (int64_t)n);
    if (out->latents) std::memcpy(out->latents, noise.data(), sizeof(float) * n);
    const std::vector<float> sigmas = zimage_schedule(hp_, r.steps, (h / kPatch) * (w / kPatch));
    mqb_image_args a;
    std::memset(&a, 0, sizeof(a));
    a.prompt = r.prompt, a.n_prompt = r.n_prompt;
    if (cfg) a.negative = r.negative, a.n_negative = r.n_negative;
    a.width = r.width, a.height = r.height, a.steps = r.steps, a.guidance = r.guidance;
    a.noise = noise.data(), a.sigmas = sigmas.data();
    a.rgb = out->rgb, a.image = out->image, a.latents = out->latents;
    gpu_.generate(a);
    out->pipeline_ns = now_ns() - t0;
  }

 private:
  HParams hp_;
  int max_ctx_;
  diffusion::CudaPipeline gpu_;
};

}  // namespace

// make_zimage_cuda: the pipeline on the GPU through the loaded CUDA library (cuda_backend.cc
// opens it and calls the family's cuda_image with it).
std::unique_ptr<Backend> make_zimage_cuda(void *lib, const mq_engine_params &p, const HParams &hp, int max_context) {
  return std::unique_ptr<Backend>(new ZImageCuda(lib, p, hp, max_context));
}

// layout_zimage: diffusers loads the text encoder as Qwen3Model, from a Qwen3Model checkpoint or
// from a Qwen3ForCausalLM one, whose "model." prefix transformers strips and whose lm_head it
// discards (loading a base model from a task model's state dict).
void layout_zimage(const HParams &, TensorLayout &l) {
  l.rename("text_encoder.model.", "text_encoder.");
  l.drop("text_encoder.lm_head.*");
}

MQ_REGISTER_FAMILY(Family{"zimage", "image", {"ZImagePipeline"}, resolve_zimage, make_zimage, 0, layout_zimage, make_zimage_cuda});

}  // namespace mq
