// models/flux.cc: the FLUX.1 text-to-image pipeline (dev and schnell) in fp32, as diffusers'
// FluxPipeline runs it (owner: flux family).
//
// Sources, read and re-derived here (diffusers 58eb52c0803ea9af3abec60841c2a093bdf1f951,
// transformers 5.17):
//  1. text encoders (pipelines/flux/pipeline_flux.py encode_prompt): CLIPTextModel on CLIP's ids
//     padded to 77 (models/clip/modeling_clip.py: token + position embeddings, pre-LayerNorm
//     layers with causal self-attention and quick_gelu/gelu MLPs, the final LayerNorm; the pooled
//     output is the row of the first <|endoftext|> (argmax of the ids when their maximum is
//     49407, else the first eos_token_id)), and T5EncoderModel on T5's ids padded to
//     max_sequence_length (models/t5/modeling_t5.py: shared embedding, pre-RMS-norm blocks,
//     unscaled attention plus bidirectional relative position buckets from the first block's
//     table, the gated-GELU (gelu_new) feed-forward of v1.1, the final RMS norm). Neither gets an
//     attention mask: padding tokens take part, as in the pipeline. The ids are declared by
//     resolve_flux (prompt.*, prompt_2.*) and made in Go (native.ImagePrompt).
//  2. latents: torch.randn(1, C, H/8, W/8) of a CPU generator seeded with seed, packed into 2x2
//     patches [(H/16)*(W/16), 4C] (_pack_latents: feature c*4 + ph*2 + pw); image ids (0, y, x),
//     text ids zeros.
//  3. scheduler: FlowMatchEulerDiscreteScheduler with sigmas numpy.linspace(1, 1/N, N) and mu =
//     calculate_shift(image_seq_len) when use_dynamic_shifting (dev), else the fixed shift
//     (schnell: 1); latents += (sigma_next - sigma) * v.
//  4. transformer (models/transformers/transformer_flux.py): the pipeline passes timestep/1000,
//     the model multiplies by 1000 again (and guidance by 1000: torch.full of guidance_scale,
//     dev only); temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))] +
//     text_embedder(pooled CLIP); x_embedder on the packed latents, context_embedder on T5's
//     embeddings; double-stream blocks (AdaLayerNormZero on both streams, joint attention over
//     [text, image] with per-head RMS q/k norms and rotary positions, to_out / to_add_out,
//     gated residuals, LayerNorm + modulation + GELU-tanh feed-forwards), single-stream blocks
//     over [text, image] (AdaLayerNormZeroSingle, attention and a GELU-tanh MLP in parallel,
//     proj_out of their concatenation, gated residual), norm_out (AdaLayerNormContinuous: scale
//     then shift) and proj_out on the image tokens. Rotary: FluxPosEmbed, theta 10000, per axis
//     of axes_dims_rope the angles pos * theta^(-2k/d) in float64, cos/sin repeated pairwise.
//     True CFG (true_cfg_scale > 1 with a negative prompt): v = neg + s * (pos - neg).
//  5. VAE: latents unpacked, z / scaling_factor + shift_factor, the shared AutoencoderKL decoder
//     (diffusion.h), image = clamp(x/2 + 1/2, 0, 1), 8-bit by round-half-even of 255*x.
//
// Faults (MODELQUAL_FAULTS): flux.swap_text_image_ids builds the rotary table from [image ids,
// text ids] against the [text, image] token order; flux.drop_pooled zeroes CLIP's pooled
// output. They prove the parity gates bite.
#include <algorithm>
#include <cmath>
#include <cstring>


#include "diffusion.h"
#include "mq_backend.h"
#include "runtime.h"

namespace mq {
namespace {

using diffusion::full_attention;
using diffusion::silu;

constexpr int kFreqDim = 256;  // Timesteps(num_channels=256)
constexpr int kMaxSteps = 200;
constexpr int kCLIPLegacyEOS = 49407;  // transformers' CLIPTextTransformer pooling special case

inline float gelu_tanh(float x) {  // F.gelu(approximate="tanh") and transformers' gelu_new
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }
inline float quick_gelu(float x) { return x / (1.0f + std::exp(-1.702f * x)); }

// ln_plain: LayerNorm without affine parameters over rows of x [T, D] (eps), into y.
void ln_plain(const float *x, int T, int D, float eps, float *y) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * D;
    float *yt = y + (size_t)t * D;
    double mean = 0, var = 0;
    for (int i = 0; i < D; i++) mean += xt[i];
    mean /= D;
    for (int i = 0; i < D; i++) var += (xt[i] - mean) * (xt[i] - mean);
    const float inv = (float)(1.0 / std::sqrt(var / D + eps)), m = (float)mean;
    for (int i = 0; i < D; i++) yt[i] = (xt[i] - m) * inv;
  }
}

// modulate: y = LayerNorm(x) * (1 + scale) + shift, row by row.
void modulate(const float *x, int T, int D, const float *shift, const float *scale, float *y) {
  ln_plain(x, T, D, 1e-6f, y);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < D; i++) y[(size_t)t * D + i] = y[(size_t)t * D + i] * (1.0f + scale[i]) + shift[i];
}

// ---- CLIPTextModel ---------------------------------------------------------------------------

class CLIPText {
 public:
  CLIPText(const HParams &hp, const Weights &w, ThreadPool *pool) : pool_(pool) {
    D_ = hp.i("clip.hidden_size");
    H_ = hp.i("clip.num_heads");
    I_ = hp.i("clip.intermediate_size");
    maxpos_ = hp.i("clip.max_positions");
    vocab_ = hp.i("clip.vocab_size");
    eos_ = hp.i("clip.eos_token_id");
    eps_ = (float)hp.f("clip.layer_norm_eps");
    quick_ = hp.b("clip.quick_gelu");
    const std::string p = "text_encoder.text_model.";
    tok_ = w.get(p + "embeddings.token_embedding.weight", {vocab_, D_});
    pos_ = w.get(p + "embeddings.position_embedding.weight", {maxpos_, D_});
    for (int l = 0; l < hp.i("clip.num_layers"); l++) {
      const std::string q = p + "encoder.layers." + std::to_string(l) + ".";
      Layer L;
      const char *names[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
      for (int i = 0; i < 4; i++) {
        L.w[i] = w.get(q + "self_attn." + names[i] + ".weight", {D_, D_});
        L.b[i] = w.get(q + "self_attn." + names[i] + ".bias", {D_});
      }
      L.ln1g = w.get(q + "layer_norm1.weight", {D_}), L.ln1b = w.get(q + "layer_norm1.bias", {D_});
      L.ln2g = w.get(q + "layer_norm2.weight", {D_}), L.ln2b = w.get(q + "layer_norm2.bias", {D_});
      L.fc1 = w.get(q + "mlp.fc1.weight", {I_, D_}), L.fc1b = w.get(q + "mlp.fc1.bias", {I_});
      L.fc2 = w.get(q + "mlp.fc2.weight", {D_, I_}), L.fc2b = w.get(q + "mlp.fc2.bias", {D_});
      layers_.push_back(L);
    }
    fg_ = w.get(p + "final_layer_norm.weight", {D_});
    fb_ = w.get(p + "final_layer_norm.bias", {D_});
  }
  int hidden() const { return D_; }
  int max_positions() const { return maxpos_; }
  int vocab() const { return vocab_; }

  // pooled writes pooler_output [D] for ids [n].
  void pooled(const int32_t *ids, int n, float *out) {
    const int D = D_, hd = D_ / H_;
    std::vector<float> x((size_t)n * D), a((size_t)n * D), q((size_t)n * D), k((size_t)n * D), v((size_t)n * D), o((size_t)n * D),
        m((size_t)n * I_);
    for (int t = 0; t < n; t++)
      for (int i = 0; i < D; i++) x[(size_t)t * D + i] = tok_[(size_t)ids[t] * D + i] + pos_[(size_t)t * D + i];
    const float scale = 1.0f / std::sqrt((float)hd);
    for (const Layer &L : layers_) {
      layer_norm(x.data(), n, D, L.ln1g, L.ln1b, eps_, a.data());
      linear(pool_, a.data(), n, D, L.w[0], D, L.b[0], q.data());
      linear(pool_, a.data(), n, D, L.w[1], D, L.b[1], k.data());
      linear(pool_, a.data(), n, D, L.w[2], D, L.b[2], v.data());
      pool_->run([&](int ti, int nt) {  // causal attention
        std::vector<float> s(n);
        for (int job = ti; job < n * H_; job += nt) {
          const int i = job / H_, h = job % H_;
          const float *qi = &q[(size_t)i * D + h * hd];
          float mx = -INFINITY;
          for (int j = 0; j <= i; j++) {
            s[j] = dot(qi, &k[(size_t)j * D + h * hd], hd) * scale;
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (int j = 0; j <= i; j++) sum += (s[j] = std::exp(s[j] - mx));
          const float inv = (float)(1.0 / sum);
          float *oi = &o[(size_t)i * D + h * hd];
          std::fill(oi, oi + hd, 0.0f);
          for (int j = 0; j <= i; j++) axpy(s[j] * inv, &v[(size_t)j * D + h * hd], oi, hd);
        }
      });
      linear(pool_, o.data(), n, D, L.w[3], D, L.b[3], a.data());
      for (size_t i = 0; i < x.size(); i++) x[i] += a[i];
      layer_norm(x.data(), n, D, L.ln2g, L.ln2b, eps_, a.data());
      linear(pool_, a.data(), n, D, L.fc1, I_, L.fc1b, m.data());
      for (float &f : m) f = quick_ ? quick_gelu(f) : gelu_erf(f);
      linear(pool_, m.data(), n, I_, L.fc2, D, L.fc2b, a.data());
      for (size_t i = 0; i < x.size(); i++) x[i] += a[i];
    }
    // The pooled row: CLIPTextTransformer's choice (see the top of this file).
    int row = 0;
    const int32_t mx = *std::max_element(ids, ids + n);
    if (mx == kCLIPLegacyEOS) {
      row = (int)(std::max_element(ids, ids + n) - ids);
    } else {
      for (int t = 0; t < n; t++)
        if (ids[t] == eos_) {
          row = t;
          break;
        }
    }
    layer_norm(&x[(size_t)row * D], 1, D, fg_, fb_, eps_, out);
  }

 private:
  struct Layer {
    const float *w[4], *b[4], *ln1g, *ln1b, *ln2g, *ln2b, *fc1, *fc1b, *fc2, *fc2b;
  };
  ThreadPool *pool_;
  int D_, H_, I_, maxpos_, vocab_, eos_;
  float eps_;
  bool quick_;
  const float *tok_, *pos_, *fg_, *fb_;
  std::vector<Layer> layers_;
};

// ---- T5EncoderModel (v1.1) -------------------------------------------------------------------

class T5Encoder {
 public:
  T5Encoder(const HParams &hp, const Weights &w, ThreadPool *pool) : pool_(pool) {
    D_ = hp.i("t5.d_model");
    H_ = hp.i("t5.num_heads");
    kv_ = hp.i("t5.d_kv");
    ff_ = hp.i("t5.d_ff");
    vocab_ = hp.i("t5.vocab_size");
    buckets_ = hp.i("t5.num_buckets");
    maxdist_ = hp.i("t5.max_distance");
    eps_ = (float)hp.f("t5.layer_norm_eps");
    const std::string p = "text_encoder_2.";
    const int inner = H_ * kv_;
    emb_ = w.get(p + "shared.weight", {vocab_, D_});
    for (int l = 0; l < hp.i("t5.num_layers"); l++) {
      const std::string b = p + "encoder.block." + std::to_string(l) + ".layer.";
      Block B;
      B.q = w.get(b + "0.SelfAttention.q.weight", {inner, D_});
      B.k = w.get(b + "0.SelfAttention.k.weight", {inner, D_});
      B.v = w.get(b + "0.SelfAttention.v.weight", {inner, D_});
      B.o = w.get(b + "0.SelfAttention.o.weight", {D_, inner});
      B.ln0 = w.get(b + "0.layer_norm.weight", {D_});
      B.wi0 = w.get(b + "1.DenseReluDense.wi_0.weight", {ff_, D_});
      B.wi1 = w.get(b + "1.DenseReluDense.wi_1.weight", {ff_, D_});
      B.wo = w.get(b + "1.DenseReluDense.wo.weight", {D_, ff_});
      B.ln1 = w.get(b + "1.layer_norm.weight", {D_});
      if (l == 0) rel_ = w.get(b + "0.SelfAttention.relative_attention_bias.weight", {buckets_, H_});
      blocks_.push_back(B);
    }
    final_ = w.get(p + "encoder.final_layer_norm.weight", {D_});
  }
  int hidden() const { return D_; }
  int vocab() const { return vocab_; }

  // encode writes last_hidden_state [n, d_model] for ids [n].
  void encode(const int32_t *ids, int n, float *out) {
    const int D = D_, inner = H_ * kv_;
    std::vector<float> x((size_t)n * D), a((size_t)n * D), q((size_t)n * inner), k((size_t)n * inner), v((size_t)n * inner),
        o((size_t)n * inner), g0((size_t)n * ff_), g1((size_t)n * ff_);
    for (int t = 0; t < n; t++) std::memcpy(&x[(size_t)t * D], emb_ + (size_t)ids[t] * D, sizeof(float) * D);
    // Position bias by relative distance j - i (bidirectional buckets), per head.
    std::vector<float> bias((size_t)(2 * n - 1) * H_);
    for (int d = -(n - 1); d <= n - 1; d++)
      for (int h = 0; h < H_; h++) bias[(size_t)(d + n - 1) * H_ + h] = rel_[(size_t)bucket(d) * H_ + h];
    for (const Block &B : blocks_) {
      t5_norm(x.data(), n, B.ln0, a.data());
      linear(pool_, a.data(), n, D, B.q, inner, nullptr, q.data());
      linear(pool_, a.data(), n, D, B.k, inner, nullptr, k.data());
      linear(pool_, a.data(), n, D, B.v, inner, nullptr, v.data());
      const int hd = kv_;
      pool_->run([&](int ti, int nt) {
        std::vector<float> s(n);
        for (int job = ti; job < n * H_; job += nt) {
          const int i = job / H_, h = job % H_;
          const float *qi = &q[(size_t)i * inner + h * hd];
          float mx = -INFINITY;
          for (int j = 0; j < n; j++) {  // T5 does not scale the scores
            s[j] = dot(qi, &k[(size_t)j * inner + h * hd], hd) + bias[(size_t)(j - i + n - 1) * H_ + h];
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (int j = 0; j < n; j++) sum += (s[j] = std::exp(s[j] - mx));
          const float inv = (float)(1.0 / sum);
          float *oi = &o[(size_t)i * inner + h * hd];
          std::fill(oi, oi + hd, 0.0f);
          for (int j = 0; j < n; j++) axpy(s[j] * inv, &v[(size_t)j * inner + h * hd], oi, hd);
        }
      });
      linear(pool_, o.data(), n, inner, B.o, D, nullptr, a.data());
      for (size_t i = 0; i < x.size(); i++) x[i] += a[i];
      t5_norm(x.data(), n, B.ln1, a.data());
      linear(pool_, a.data(), n, D, B.wi0, ff_, nullptr, g0.data());
      linear(pool_, a.data(), n, D, B.wi1, ff_, nullptr, g1.data());
      for (size_t i = 0; i < g0.size(); i++) g0[i] = gelu_tanh(g0[i]) * g1[i];
      linear(pool_, g0.data(), n, ff_, B.wo, D, nullptr, a.data());
      for (size_t i = 0; i < x.size(); i++) x[i] += a[i];
    }
    t5_norm(x.data(), n, final_, out);
  }

 private:
  struct Block {
    const float *q, *k, *v, *o, *ln0, *wi0, *wi1, *wo, *ln1;
  };

  // bucket: T5Attention._relative_position_bucket(memory - query, bidirectional=True), with the
  // logarithmic part in float32 as torch computes it.
  int bucket(int rel) const {
    const int nb = buckets_ / 2, max_exact = nb / 2;
    int b = rel > 0 ? nb : 0;
    const int r = std::abs(rel);
    if (r < max_exact) return b + r;
    const float lf = std::log((float)r / (float)max_exact) / (float)std::log((double)maxdist_ / max_exact) * (float)(nb - max_exact);
    const int large = std::min(max_exact + (int)lf, nb - 1);
    return b + large;
  }

  // t5_norm: T5LayerNorm (RMS, no mean, no bias), rows of x into y.
  void t5_norm(const float *x, int T, const float *g, float *y) const { rms_norm(x, T, D_, g, eps_, y); }

  ThreadPool *pool_;
  int D_, H_, kv_, ff_, vocab_, buckets_, maxdist_;
  float eps_;
  const float *emb_, *rel_ = nullptr, *final_;
  std::vector<Block> blocks_;
};

// ---- FluxTransformer2DModel -----------------------------------------------------------------

struct Lin {
  const float *w = nullptr, *b = nullptr;
  int out = 0, in = 0;
};

class FluxTransformer {
 public:
  FluxTransformer(const HParams &hp, const Weights &w, ThreadPool *pool, bool swap_ids) : pool_(pool), swap_ids_(swap_ids) {
    H_ = hp.i("transformer.num_heads");
    hd_ = hp.i("transformer.head_dim");
    D_ = H_ * hd_;
    C_ = hp.i("transformer.in_channels");
    joint_ = hp.i("transformer.joint_attention_dim");
    pooled_ = hp.i("transformer.pooled_projection_dim");
    guidance_ = hp.b("transformer.guidance_embeds");
    const std::string t = "transformer.";
    x_emb_ = lin(w, t + "x_embedder", D_, C_);
    ctx_emb_ = lin(w, t + "context_embedder", D_, joint_);
    t1_ = lin(w, t + "time_text_embed.timestep_embedder.linear_1", D_, kFreqDim);
    t2_ = lin(w, t + "time_text_embed.timestep_embedder.linear_2", D_, D_);
    if (guidance_) {
      g1_ = lin(w, t + "time_text_embed.guidance_embedder.linear_1", D_, kFreqDim);
      g2_ = lin(w, t + "time_text_embed.guidance_embedder.linear_2", D_, D_);
    }
    p1_ = lin(w, t + "time_text_embed.text_embedder.linear_1", D_, pooled_);
    p2_ = lin(w, t + "time_text_embed.text_embedder.linear_2", D_, D_);
    for (int i = 0; i < hp.i("transformer.num_layers"); i++) {
      const std::string p = t + "transformer_blocks." + std::to_string(i) + ".";
      Double b;
      b.norm1 = lin(w, p + "norm1.linear", 6 * D_, D_);
      b.norm1c = lin(w, p + "norm1_context.linear", 6 * D_, D_);
      b.q = lin(w, p + "attn.to_q", D_, D_), b.k = lin(w, p + "attn.to_k", D_, D_), b.v = lin(w, p + "attn.to_v", D_, D_);
      b.cq = lin(w, p + "attn.add_q_proj", D_, D_), b.ck = lin(w, p + "attn.add_k_proj", D_, D_), b.cv = lin(w, p + "attn.add_v_proj", D_, D_);
      b.out = lin(w, p + "attn.to_out.0", D_, D_), b.cout = lin(w, p + "attn.to_add_out", D_, D_);
      b.nq = w.get(p + "attn.norm_q.weight", {hd_}), b.nk = w.get(p + "attn.norm_k.weight", {hd_});
      b.ncq = w.get(p + "attn.norm_added_q.weight", {hd_}), b.nck = w.get(p + "attn.norm_added_k.weight", {hd_});
      b.ff1 = lin(w, p + "ff.net.0.proj", 4 * D_, D_), b.ff2 = lin(w, p + "ff.net.2", D_, 4 * D_);
      b.cff1 = lin(w, p + "ff_context.net.0.proj", 4 * D_, D_), b.cff2 = lin(w, p + "ff_context.net.2", D_, 4 * D_);
      double_.push_back(b);
    }
    for (int i = 0; i < hp.i("transformer.num_single_layers"); i++) {
      const std::string p = t + "single_transformer_blocks." + std::to_string(i) + ".";
      Single b;
      b.norm = lin(w, p + "norm.linear", 3 * D_, D_);
      b.mlp = lin(w, p + "proj_mlp", 4 * D_, D_);
      b.out = lin(w, p + "proj_out", D_, 5 * D_);
      b.q = lin(w, p + "attn.to_q", D_, D_), b.k = lin(w, p + "attn.to_k", D_, D_), b.v = lin(w, p + "attn.to_v", D_, D_);
      b.nq = w.get(p + "attn.norm_q.weight", {hd_}), b.nk = w.get(p + "attn.norm_k.weight", {hd_});
      single_.push_back(b);
    }
    norm_out_ = lin(w, t + "norm_out.linear", 2 * D_, D_);
    proj_out_ = lin(w, t + "proj_out", C_, D_);
    for (int a = 0; a < 3; a++) axes_[a] = hp.i("transformer.axes_dims_rope." + std::to_string(a));
  }

  int channels() const { return C_; }

  // forward: the velocity out [N, C] for packed latents img [N, C] (image ids img_ids [N, 3]),
  // T5 embeddings txt [T, joint], CLIP's pooled [pooled]; t is the pipeline's timestep / 1000
  // and g the guidance scale (dev), both multiplied by 1000 here as the model does.
  void forward(const float *img, int N, const int *img_ids, const float *txt, int T, const float *pooled, float t, float g,
               float *out) {
    const int D = D_, L = T + N;
    // Conditioning.
    std::vector<float> temb(D), tmp(D), h1(D), proj(kFreqDim);
    time_proj(t * 1000.0f, proj.data());
    run(t1_, proj.data(), 1, h1.data());
    for (float &x : h1) x = silu(x);
    run(t2_, h1.data(), 1, temb.data());
    if (guidance_) {
      time_proj(g * 1000.0f, proj.data());
      run(g1_, proj.data(), 1, h1.data());
      for (float &x : h1) x = silu(x);
      run(g2_, h1.data(), 1, tmp.data());
      for (int i = 0; i < D; i++) temb[i] += tmp[i];
    }
    run(p1_, pooled, 1, h1.data());
    for (float &x : h1) x = silu(x);
    run(p2_, h1.data(), 1, tmp.data());
    for (int i = 0; i < D; i++) temb[i] += tmp[i];
    std::vector<float> stemb(D);
    for (int i = 0; i < D; i++) stemb[i] = silu(temb[i]);

    // Streams: seq = [text (T rows), image (N rows)].
    std::vector<float> seq((size_t)L * D);
    float *cs = seq.data(), *xs = seq.data() + (size_t)T * D;
    run(ctx_emb_, txt, T, cs);
    run(x_emb_, img, N, xs);

    // Rotary table over [text ids (zeros), image ids] (the fault: [image ids, text ids]).
    std::vector<int> ids((size_t)L * 3, 0);
    const size_t img_row = swap_ids_ ? 0 : (size_t)T;
    for (int r = 0; r < N; r++)
      for (int a = 0; a < 3; a++) ids[(img_row + r) * 3 + a] = img_ids[(size_t)r * 3 + a];
    rope_tables(ids, L);

    std::vector<float> mod(6 * D), cmod(6 * D), a((size_t)L * D), q((size_t)L * D), k((size_t)L * D), v((size_t)L * D),
        o((size_t)L * D), t2((size_t)L * D), m((size_t)L * 4 * D);
    for (const Double &b : double_) {
      run(b.norm1, stemb.data(), 1, mod.data());
      run(b.norm1c, stemb.data(), 1, cmod.data());
      // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
      float *nc = a.data(), *nx = a.data() + (size_t)T * D;
      modulate(xs, N, D, &mod[0], &mod[D], nx);
      modulate(cs, T, D, &cmod[0], &cmod[D], nc);
      run(b.cq, nc, T, q.data()), run(b.ck, nc, T, k.data()), run(b.cv, nc, T, v.data());
      run(b.q, nx, N, q.data() + (size_t)T * D), run(b.k, nx, N, k.data() + (size_t)T * D), run(b.v, nx, N, v.data() + (size_t)T * D);
      qk_norm_rope(q.data(), k.data(), 0, T, b.ncq, b.nck);
      qk_norm_rope(q.data(), k.data(), T, L, b.nq, b.nk);
      full_attention(pool_, q.data(), k.data(), v.data(), L, H_, hd_, o.data());
      run(b.cout, o.data(), T, t2.data());
      run(b.out, o.data() + (size_t)T * D, N, t2.data() + (size_t)T * D);
      // Image stream.
      for (int r = 0; r < N; r++)
        for (int i = 0; i < D; i++) xs[(size_t)r * D + i] += mod[2 * D + i] * t2[(size_t)(T + r) * D + i];
      modulate(xs, N, D, &mod[3 * D], &mod[4 * D], nx);
      ffn(b.ff1, b.ff2, nx, N, m.data(), t2.data() + (size_t)T * D);
      for (int r = 0; r < N; r++)
        for (int i = 0; i < D; i++) xs[(size_t)r * D + i] += mod[5 * D + i] * t2[(size_t)(T + r) * D + i];
      // Text stream.
      for (int r = 0; r < T; r++)
        for (int i = 0; i < D; i++) cs[(size_t)r * D + i] += cmod[2 * D + i] * t2[(size_t)r * D + i];
      modulate(cs, T, D, &cmod[3 * D], &cmod[4 * D], nc);
      ffn(b.cff1, b.cff2, nc, T, m.data(), t2.data());
      for (int r = 0; r < T; r++)
        for (int i = 0; i < D; i++) cs[(size_t)r * D + i] += cmod[5 * D + i] * t2[(size_t)r * D + i];
    }
    std::vector<float> cat((size_t)L * 5 * D), smod(3 * D);
    for (const Single &b : single_) {
      run(b.norm, stemb.data(), 1, smod.data());  // shift, scale, gate
      modulate(seq.data(), L, D, &smod[0], &smod[D], a.data());
      run(b.mlp, a.data(), L, m.data());
      run(b.q, a.data(), L, q.data()), run(b.k, a.data(), L, k.data()), run(b.v, a.data(), L, v.data());
      qk_norm_rope(q.data(), k.data(), 0, L, b.nq, b.nk);
      full_attention(pool_, q.data(), k.data(), v.data(), L, H_, hd_, o.data());
      for (int r = 0; r < L; r++) {
        std::memcpy(&cat[(size_t)r * 5 * D], &o[(size_t)r * D], sizeof(float) * D);
        for (int i = 0; i < 4 * D; i++) cat[(size_t)r * 5 * D + D + i] = gelu_tanh(m[(size_t)r * 4 * D + i]);
      }
      run(b.out, cat.data(), L, t2.data());
      for (int r = 0; r < L; r++)
        for (int i = 0; i < D; i++) seq[(size_t)r * D + i] += smod[2 * D + i] * t2[(size_t)r * D + i];
    }
    // norm_out (AdaLayerNormContinuous: scale, then shift) and proj_out on the image rows.
    std::vector<float> emb(2 * D);
    run(norm_out_, stemb.data(), 1, emb.data());
    modulate(xs, N, D, &emb[D], &emb[0], a.data());
    run(proj_out_, a.data(), N, out);
  }

 private:
  struct Double {
    Lin norm1, norm1c, q, k, v, cq, ck, cv, out, cout, ff1, ff2, cff1, cff2;
    const float *nq, *nk, *ncq, *nck;
  };
  struct Single {
    Lin norm, mlp, out, q, k, v;
    const float *nq, *nk;
  };

  static Lin lin(const Weights &w, const std::string &p, int out, int in) {
    Lin l;
    l.w = w.get(p + ".weight", {out, in});
    l.b = w.get(p + ".bias", {out});
    l.out = out, l.in = in;
    return l;
  }
  void run(const Lin &l, const float *x, int T, float *y) const { linear(pool_, x, T, l.in, l.w, l.out, l.b, y); }

  void ffn(const Lin &l1, const Lin &l2, const float *x, int T, float *mid, float *y) const {
    run(l1, x, T, mid);
    for (size_t i = 0; i < (size_t)T * l1.out; i++) mid[i] = gelu_tanh(mid[i]);
    run(l2, mid, T, y);
  }

  // time_proj: Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) in float32: [cos, sin]
  // of t * exp(-ln(10000) * i / 128).
  static void time_proj(float t, float *out) {
    const int half = kFreqDim / 2;
    const float neg_log = (float)(-std::log(10000.0));
    for (int i = 0; i < half; i++) {
      const float f = std::exp(neg_log * (float)i / (float)half);
      const float arg = t * f;
      out[i] = std::cos(arg);
      out[half + i] = std::sin(arg);
    }
  }

  // rope_tables: FluxPosEmbed's cos and sin per row and frequency (one per pair of dims): for
  // axis a of dim d, frequency k < d/2 is 10000^(-2k/d) in float64, the angle pos * freq in
  // float64, its cos and sin rounded to float32.
  void rope_tables(const std::vector<int> &ids, int L) {
    const int nf = hd_ / 2;
    cos_.resize((size_t)L * nf);
    sin_.resize((size_t)L * nf);
    for (int r = 0; r < L; r++) {
      int f = 0;
      for (int a = 0; a < 3; a++)
        for (int k = 0; k < axes_[a] / 2; k++, f++) {
          const double freq = 1.0 / std::pow(10000.0, (double)(2 * k) / (double)axes_[a]);
          const double ang = (double)(float)ids[(size_t)r * 3 + a] * freq;
          cos_[(size_t)r * nf + f] = (float)std::cos(ang);
          sin_[(size_t)r * nf + f] = (float)std::sin(ang);
        }
    }
  }

  // qk_norm_rope: per-head RMSNorm (eps 1e-6) of q and k rows [r0, r1), then the rotation of
  // consecutive pairs by the rows' angles.
  void qk_norm_rope(float *q, float *k, int r0, int r1, const float *nq, const float *nk) const {
    const int nf = hd_ / 2, D = D_;
    for (int r = r0; r < r1; r++)
      for (int h = 0; h < H_; h++) {
        float *qh = q + (size_t)r * D + h * hd_, *kh = k + (size_t)r * D + h * hd_;
        rms_norm(qh, 1, hd_, nq, 1e-6f, qh);
        rms_norm(kh, 1, hd_, nk, 1e-6f, kh);
        const float *c = &cos_[(size_t)r * nf], *s = &sin_[(size_t)r * nf];
        for (float *x : {qh, kh})
          for (int f = 0; f < nf; f++) {
            const float a = x[2 * f], b = x[2 * f + 1];
            x[2 * f] = a * c[f] - b * s[f];
            x[2 * f + 1] = b * c[f] + a * s[f];
          }
      }
  }

  ThreadPool *pool_;
  bool swap_ids_;
  int H_, hd_, D_, C_, joint_, pooled_;
  bool guidance_;
  int axes_[3] = {0, 0, 0};
  Lin x_emb_, ctx_emb_, t1_, t2_, g1_, g2_, p1_, p2_, norm_out_, proj_out_;
  std::vector<Double> double_;
  std::vector<Single> single_;
  std::vector<float> cos_, sin_;
};

// ---- the pipeline ----------------------------------------------------------------------------

// flux_spec: what the pipeline accepts. Sizes are multiples of the VAE's scale times the 2x2
// packing, as FluxPipeline requires for its latents to pack.
mq_image_spec flux_spec(const HParams &hp) {
  mq_image_spec s{};
  s.latent_channels = hp.i("vae.latent_channels");
  s.vae_scale = 1 << (hp.i("vae.n_blocks") - 1);
  s.size_multiple = s.vae_scale * 2;
  s.max_size = 2048;
  s.max_prompt_tokens = hp.i("prompt_2.max_length");
  s.max_steps = kMaxSteps;
  s.text_hidden = hp.i("t5.d_model");
  s.pooled_hidden = hp.i("clip.hidden_size");
  return s;
}

void check_ids(const std::string &what, const int32_t *ids, int n, int max_n, int vocab) {
  if (n <= 0 || !ids) throw Error(MQ_ERR_INVALID_ARGUMENT, what + ": no tokens; the pipeline pads every prompt to its encoder's length");
  if (n > max_n)
    throw Error(MQ_ERR_INVALID_ARGUMENT, what + ": " + std::to_string(n) + " tokens exceed the encoder's " + std::to_string(max_n));
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error(MQ_ERR_INVALID_ARGUMENT, what + ": token " + std::to_string(ids[i]) + " is outside the vocabulary");
}

// flux_check validates r (errors name the field; the prompts' ids unless r only decodes) and
// answers whether true CFG runs. The CPU pipeline and the CUDA one (FluxCuda) share it.
bool flux_check(const HParams &hp, const mq_image_request &r) {
  const mq_image_spec sp = flux_spec(hp);
  auto bad = [](const std::string &m) { throw Error(MQ_ERR_INVALID_ARGUMENT, m); };
  for (int v : {r.width, r.height})
    if (v <= 0 || v % sp.size_multiple != 0 || v > sp.max_size)
      bad("size: " + std::to_string(r.width) + "x" + std::to_string(r.height) + " is not on the grid: width and height must be multiples of " +
          std::to_string(sp.size_multiple) + " up to " + std::to_string(sp.max_size));
  if (r.steps < 1 || r.steps > sp.max_steps) bad("num_inference_steps: " + std::to_string(r.steps) + " is outside 1.." + std::to_string(sp.max_steps));
  const bool dev = hp.b("transformer.guidance_embeds");
  if (!std::isfinite(r.guidance) || r.guidance < 0) bad("guidance_scale: must be a finite number >= 0");
  if (!dev && r.guidance != 0)
    bad("guidance_scale: this checkpoint has no guidance embedding (FLUX.1 schnell); send 0 or leave it out");
  if (!std::isfinite(r.true_cfg) || r.true_cfg < 0) bad("true_cfg_scale: must be a finite number >= 0");
  const bool cfg = r.true_cfg > 1 && (r.n_negative > 0 || r.n_negative_2 > 0);
  if (r.decode_latents) return cfg;
  const int maxT = hp.i("prompt_2.max_length"), clip_pos = hp.i("clip.max_positions");
  check_ids("prompt", r.prompt, r.n_prompt, clip_pos, hp.i("clip.vocab_size"));
  check_ids("prompt_2", r.prompt_2, r.n_prompt_2, maxT, hp.i("t5.vocab_size"));
  if (cfg) {
    check_ids("negative_prompt", r.negative, r.n_negative, clip_pos, hp.i("clip.vocab_size"));
    check_ids("negative_prompt_2", r.negative_2, r.n_negative_2, maxT, hp.i("t5.vocab_size"));
  }
  return cfg;
}

class Flux : public ImageBackend {
 public:
  explicit Flux(const ModelArgs &a)
      : hp_(*a.hp), pool_(a.pool), clip_(*a.hp, *a.w, a.pool), t5_(*a.hp, *a.w, a.pool),
        transformer_(*a.hp, *a.w, a.pool, fault("flux.swap_text_image_ids")), decoder_(*a.hp, *a.w, a.pool) {
    scaling_ = (float)hp_.f("vae.scaling_factor");
    shift_factor_ = (float)hp_.f("vae.shift_factor");
    drop_pooled_ = fault("flux.drop_pooled");
    if (transformer_.channels() != 4 * hp_.i("vae.latent_channels"))
      throw Error(MQ_ERR_LOAD, "config: transformer.in_channels " + std::to_string(transformer_.channels()) + " is not 4 x vae.latent_channels " +
                                   std::to_string(hp_.i("vae.latent_channels")) + " (2x2 packing)");
  }

  int vocab() const override { return clip_.vocab(); }
  mq_image_spec image_spec() const override { return flux_spec(hp_); }

  void generate(const mq_image_request &r, mq_image_output *out) override {
    const int64_t t0 = now_ns();
    const mq_image_spec sp = image_spec();
    const bool cfg = flux_check(hp_, r);
    const int C = sp.latent_channels, h = r.height / sp.vae_scale, w = r.width / sp.vae_scale;
    const size_t n = (size_t)C * h * w;
    if (r.decode_latents) {  // the VAE stage alone (component check)
      std::vector<float> z(r.decode_latents, r.decode_latents + n);
      decode_to(z, r, out);
      out->pipeline_ns = now_ns() - t0;
      return;
    }

    // 1. Text embeddings.
    const int E = t5_.hidden(), P = clip_.hidden();
    std::vector<float> pooled(P), npooled(P), pe((size_t)r.n_prompt_2 * E), ne;
    clip_.pooled(r.prompt, r.n_prompt, pooled.data());
    t5_.encode(r.prompt_2, r.n_prompt_2, pe.data());
    if (cfg) {
      clip_.pooled(r.negative, r.n_negative, npooled.data());
      ne.resize((size_t)r.n_negative_2 * E);
      t5_.encode(r.negative_2, r.n_negative_2, ne.data());
    }
    if (drop_pooled_) std::fill(pooled.begin(), pooled.end(), 0.0f), std::fill(npooled.begin(), npooled.end(), 0.0f);
    if (out->prompt_embeds) std::memcpy(out->prompt_embeds, pe.data(), sizeof(float) * pe.size());
    if (out->pooled_embeds) std::memcpy(out->pooled_embeds, pooled.data(), sizeof(float) * P);

    // 2. Latents, packed, and the image ids.
    std::vector<float> lat(n);
    torch_randn(r.seed, lat.data(), (int64_t)n);
    if (out->latents) std::memcpy(out->latents, lat.data(), sizeof(float) * n);
    const int hp2 = h / 2, wp2 = w / 2, N = hp2 * wp2, F = 4 * C;
    std::vector<float> packed((size_t)N * F), pos((size_t)N * F), neg((size_t)N * F), unp(n);
    pack(lat.data(), C, h, w, packed.data());
    std::vector<int> img_ids((size_t)N * 3, 0);
    for (int y = 0; y < hp2; y++)
      for (int x = 0; x < wp2; x++) img_ids[(size_t)(y * wp2 + x) * 3 + 1] = y, img_ids[(size_t)(y * wp2 + x) * 3 + 2] = x;

    // 3. Scheduler and 4. denoising.
    const std::vector<float> sigmas =
        diffusion::flow_match_sigmas(hp_, r.steps, N, (float)hp_.f("scheduler.shift"), diffusion::Linspace::NumpyFloat64);
    for (int i = 0; i < r.steps; i++) {
      const float timestep = sigmas[i] * 1000.0f;
      const float t = timestep / 1000.0f;
      transformer_.forward(packed.data(), N, img_ids.data(), pe.data(), r.n_prompt_2, pooled.data(), t, r.guidance, pos.data());
      if (cfg) transformer_.forward(packed.data(), N, img_ids.data(), ne.data(), r.n_negative_2, npooled.data(), t, r.guidance, neg.data());
      if (i == 0 && out->first_velocity) {
        unpack(pos.data(), C, h, w, out->first_velocity);
        if (cfg) unpack(neg.data(), C, h, w, out->first_velocity + n);
      }
      if (cfg)
        for (size_t j = 0; j < pos.size(); j++) pos[j] = neg[j] + r.true_cfg * (pos[j] - neg[j]);
      const float dt = sigmas[i + 1] - sigmas[i];
      for (size_t j = 0; j < pos.size(); j++) packed[j] = packed[j] + dt * pos[j];
      if (out->latents) unpack(packed.data(), C, h, w, out->latents + (size_t)(i + 1) * n);
    }

    // 5. Decode.
    unpack(packed.data(), C, h, w, unp.data());
    for (size_t j = 0; j < n; j++) unp[j] = unp[j] / scaling_ + shift_factor_;
    decode_to(unp, r, out);
    out->pipeline_ns = now_ns() - t0;
  }

 private:
  // pack: latents [C, h, w] -> [(h/2)*(w/2), 4C], feature c*4 + ph*2 + pw (_pack_latents).
  static void pack(const float *lat, int C, int h, int w, float *out) {
    const int wp = w / 2;
    for (int y = 0; y < h / 2; y++)
      for (int x = 0; x < wp; x++)
        for (int c = 0; c < C; c++)
          for (int ph = 0; ph < 2; ph++)
            for (int pw = 0; pw < 2; pw++)
              out[(size_t)(y * wp + x) * 4 * C + c * 4 + ph * 2 + pw] = lat[((size_t)c * h + 2 * y + ph) * w + 2 * x + pw];
  }
  static void unpack(const float *p, int C, int h, int w, float *lat) {
    const int wp = w / 2;
    for (int y = 0; y < h / 2; y++)
      for (int x = 0; x < wp; x++)
        for (int c = 0; c < C; c++)
          for (int ph = 0; ph < 2; ph++)
            for (int pw = 0; pw < 2; pw++)
              lat[((size_t)c * h + 2 * y + ph) * w + 2 * x + pw] = p[(size_t)(y * wp + x) * 4 * C + c * 4 + ph * 2 + pw];
  }

  void decode_to(std::vector<float> &z, const mq_image_request &r, mq_image_output *out) {
    const int vs = image_spec().vae_scale;
    std::vector<float> img;
    decoder_.decode(z.data(), r.height / vs, r.width / vs, img);
    diffusion::to_pixels(img, (size_t)r.width * r.height, out->image, out->rgb, false);
  }

  HParams hp_;
  ThreadPool *pool_;
  CLIPText clip_;
  T5Encoder t5_;
  FluxTransformer transformer_;
  diffusion::VAEDecoder decoder_;
  float scaling_ = 1, shift_factor_ = 0;
  bool drop_pooled_ = false;
};

// FluxCuda is the pipeline with device "cuda": this side validates the request (flux_check),
// draws the seeded noise and computes the sigmas with the CPU pipeline's functions, so both
// devices start from the same numbers; libmodelqual_cuda.so (native/models/flux.cu, through the
// mqb_image_* symbols) runs the encoders, the denoising loop and the VAE on the GPU.
class FluxCuda : public ImageBackend {
 public:
  FluxCuda(void *lib, const mq_engine_params &p, const HParams &hp) : hp_(hp), gpu_(lib, p, hp, "flux", hp.i("prompt_2.max_length")) {}
  int vocab() const override { return hp_.i("clip.vocab_size"); }
  std::string device() const override { return "cuda"; }
  mq_image_spec image_spec() const override { return flux_spec(hp_); }

  void generate(const mq_image_request &r, mq_image_output *out) override {
    const int64_t t0 = now_ns();
    const mq_image_spec sp = image_spec();
    const bool cfg = flux_check(hp_, r);
    if (r.decode_latents || out->prompt_embeds || out->pooled_embeds || out->first_velocity)
      throw Error(MQ_ERR_INVALID_ARGUMENT,
                  "device cuda: the component outputs (decode_latents, prompt_embeds, pooled_embeds, first_velocity) are the CPU pipeline's");
    const int h = r.height / sp.vae_scale, w = r.width / sp.vae_scale;
    const size_t n = (size_t)sp.latent_channels * h * w;
    // FluxPipeline draws its latents in the text encoder's dtype: a bf16 pipeline's noise for a
    // seed is torch's bf16 stream, not the fp32 one (models/torch_randn.cc).
    std::vector<float> noise(n);
    torch_randn_bf16(r.seed, noise.data(), (int64_t)n);
    if (out->latents) std::memcpy(out->latents, noise.data(), sizeof(float) * n);
    const std::vector<float> sigmas = diffusion::flow_match_sigmas(hp_, r.steps, (h / 2) * (w / 2), (float)hp_.f("scheduler.shift"),
                                                                   diffusion::Linspace::NumpyFloat64);
    mqb_image_args a;
    std::memset(&a, 0, sizeof(a));
    a.prompt = r.prompt, a.n_prompt = r.n_prompt;
    a.prompt_2 = r.prompt_2, a.n_prompt_2 = r.n_prompt_2;
    if (cfg) a.negative = r.negative, a.n_negative = r.n_negative, a.negative_2 = r.negative_2, a.n_negative_2 = r.n_negative_2;
    a.true_cfg = r.true_cfg;
    a.width = r.width, a.height = r.height, a.steps = r.steps, a.guidance = r.guidance;
    a.noise = noise.data(), a.sigmas = sigmas.data();
    a.rgb = out->rgb, a.image = out->image, a.latents = out->latents;
    gpu_.generate(a);
    out->pipeline_ns = now_ns() - t0;
  }

 private:
  HParams hp_;
  diffusion::CudaPipeline gpu_;
};

}  // namespace

// resolve_flux reads model_index.json's components (text_encoder: CLIPTextModel, text_encoder_2:
// T5EncoderModel, transformer, vae, scheduler) into canonical keys and refuses what this pipeline
// does not implement, naming the key. It declares the prompt rule the Go side applies: CLIP's ids
// padded (and truncated) to its 77 positions, T5's to max_sequence_length (512 for dev, the
// pipeline's default; 256 for schnell, a checkpoint without the guidance embedding, as its model
// card runs it), from tokenizer/ and tokenizer_2/.
void resolve_flux(const Config &c, HParams &hp) {
  auto refuse = [](const std::string &key, const std::string &why) { throw Error(MQ_ERR_LOAD, "config " + key + ": " + why); };
  const Config e = c.sub("text_encoder");
  const std::string act = e.string("hidden_act", "quick_gelu");
  if (act != "quick_gelu" && act != "gelu") refuse("text_encoder.hidden_act", "\"" + act + "\" is not implemented; only quick_gelu and gelu");
  const int64_t ch = e.positive("hidden_size"), cheads = e.positive("num_attention_heads");
  if (ch % cheads != 0) refuse("text_encoder.hidden_size", "not a multiple of num_attention_heads");
  hp.set("clip.hidden_size", (double)ch);
  hp.set("clip.num_heads", (double)cheads);
  hp.set("clip.num_layers", (double)e.positive("num_hidden_layers"));
  hp.set("clip.intermediate_size", (double)e.positive("intermediate_size"));
  hp.set("clip.max_positions", (double)e.integer("max_position_embeddings", 77));
  hp.set("clip.vocab_size", (double)e.positive("vocab_size"));
  hp.set("clip.eos_token_id", (double)e.integer("eos_token_id", 2));
  hp.set("clip.layer_norm_eps", e.number("layer_norm_eps", 1e-5));
  hp.set("clip.quick_gelu", act == "quick_gelu");

  const Config t = c.sub("text_encoder_2");
  const std::string ffp = t.string("feed_forward_proj", "relu");
  if (ffp != "gated-gelu") refuse("text_encoder_2.feed_forward_proj", "\"" + ffp + "\" is not implemented; only gated-gelu (T5 v1.1, as FLUX.1 uses)");
  if (t.has("dense_act_fn") && t.string("dense_act_fn") != "gelu_new")
    refuse("text_encoder_2.dense_act_fn", "\"" + t.string("dense_act_fn") + "\" is not implemented; only gelu_new");
  hp.set("t5.d_model", (double)t.positive("d_model"));
  hp.set("t5.d_kv", (double)t.positive("d_kv"));
  hp.set("t5.num_heads", (double)t.positive("num_heads"));
  hp.set("t5.d_ff", (double)t.positive("d_ff"));
  hp.set("t5.num_layers", (double)t.positive("num_layers"));
  hp.set("t5.vocab_size", (double)t.positive("vocab_size"));
  hp.set("t5.num_buckets", (double)t.integer("relative_attention_num_buckets", 32));
  hp.set("t5.max_distance", (double)t.integer("relative_attention_max_distance", 128));
  hp.set("t5.layer_norm_eps", t.number("layer_norm_epsilon", 1e-6));

  const Config x = c.sub("transformer");
  if (x.integer("patch_size", 1) != 1) refuse("transformer.patch_size", "only 1 is implemented (the pipeline packs 2x2 itself)");
  const int64_t in = x.integer("in_channels", 64);
  if (x.has("out_channels") && x.integer("out_channels") != in) refuse("transformer.out_channels", "must equal in_channels");
  const int64_t heads = x.integer("num_attention_heads", 24), hd = x.integer("attention_head_dim", 128);
  hp.set("transformer.num_heads", (double)heads);
  hp.set("transformer.head_dim", (double)hd);
  hp.set("transformer.in_channels", (double)in);
  hp.set("transformer.num_layers", (double)x.integer("num_layers", 19));
  hp.set("transformer.num_single_layers", (double)x.integer("num_single_layers", 38));
  hp.set("transformer.joint_attention_dim", (double)x.integer("joint_attention_dim", 4096));
  hp.set("transformer.pooled_projection_dim", (double)x.integer("pooled_projection_dim", 768));
  const bool guidance = x.boolean("guidance_embeds", false);
  hp.set("transformer.guidance_embeds", guidance);
  std::vector<double> axes = x.has("axes_dims_rope") ? x.numbers("axes_dims_rope") : std::vector<double>{16, 56, 56};
  if (axes.size() != 3) refuse("transformer.axes_dims_rope", "want 3 axes");
  double sum = 0;
  for (int i = 0; i < 3; i++) {
    if ((int64_t)axes[i] % 2 != 0) refuse("transformer.axes_dims_rope", "every axis dim must be even");
    hp.set("transformer.axes_dims_rope." + std::to_string(i), axes[i]);
    sum += axes[i];
  }
  if ((int64_t)sum != hd) refuse("transformer.axes_dims_rope", "the axes sum to " + std::to_string((int64_t)sum) + ", not attention_head_dim " + std::to_string(hd));
  if (hp.i("transformer.joint_attention_dim") != hp.i("t5.d_model"))
    refuse("transformer.joint_attention_dim", "differs from text_encoder_2.d_model " + std::to_string(hp.i("t5.d_model")));
  if (hp.i("transformer.pooled_projection_dim") != hp.i("clip.hidden_size"))
    refuse("transformer.pooled_projection_dim", "differs from text_encoder.hidden_size " + std::to_string(hp.i("clip.hidden_size")));

  diffusion::resolve_autoencoder_kl(c.sub("vae"), hp);
  diffusion::resolve_flow_match(c.sub("scheduler"), hp);

  const int max_seq = guidance ? 512 : 256;
  hp.set("vocab_size", hp.f("clip.vocab_size"));
  hp.set("max_positions", max_seq);
  hp.set_string("prompt.format", "plain");
  hp.set("prompt.max_length", hp.f("clip.max_positions"));
  hp.set_string("prompt_2.format", "plain");
  hp.set_string("prompt_2.tokenizer", "tokenizer_2");
  hp.set("prompt_2.max_length", max_seq);
  // The request's controls: dev's guidance_scale feeds its guidance embedding (required);
  // schnell has none (0 or absent); true_cfg_scale with a negative prompt is real CFG.
  hp.set_string("controls.guidance_scale", guidance ? "required" : "zero");
  hp.set("controls.true_cfg_scale", 1);
}

std::unique_ptr<Backend> make_flux(const ModelArgs &a) { return std::unique_ptr<Backend>(new Flux(a)); }

// make_flux_cuda: the pipeline on the GPU through the loaded CUDA library (FluxCuda).
std::unique_ptr<Backend> make_flux_cuda(void *lib, const mq_engine_params &p, const HParams &hp, int) {
  return std::unique_ptr<Backend>(new FluxCuda(lib, p, hp));
}

// layout_flux: the names transformers accepts for the encoders: CLIPTextModel's tensors with or
// without the "text_model." prefix (and without CLIPTextModelWithProjection's head or an old
// checkpoint's position_ids buffer); T5EncoderModel's embedding as shared or as the tied
// encoder.embed_tokens, without a T5ForConditionalGeneration's decoder and head.
void layout_flux(const HParams &, TensorLayout &l) {
  l.rename("text_encoder.", "text_encoder.text_model.");
  l.drop("text_encoder.text_projection.*");
  l.drop("text_encoder.text_model.embeddings.position_ids");
  l.rename("text_encoder_2.encoder.embed_tokens.", "text_encoder_2.shared.");
  l.drop("text_encoder_2.decoder.*");
  l.drop("text_encoder_2.lm_head.*");
}

MQ_REGISTER_FAMILY(Family{"flux", "image", {"FluxPipeline"}, resolve_flux, make_flux, 0, layout_flux, make_flux_cuda});

}  // namespace mq
