// models/diffusion.h: building blocks diffusers' text-to-image pipelines share, for the image
// families' model files to call (never to copy): the AutoencoderKL decoder, the
// FlowMatchEulerDiscreteScheduler's sigmas (with dynamic shifting), full (non-causal)
// attention, and the pixel conversion of diffusers' image processor. The seeded noise is
// torch_randn (runtime.h, models/torch_randn.cc). Nothing here names a family.
#ifndef MODELQUAL_MODELS_DIFFUSION_H
#define MODELQUAL_MODELS_DIFFUSION_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mq_backend.h"
#include "runtime.h"

namespace mq {
namespace diffusion {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// full_attention: q, k, v [L, H*hd] (non-causal, scale 1/sqrt(hd)), out [L, H*hd].
void full_attention(ThreadPool *pool, const float *q, const float *k, const float *v, int L, int H, int hd, float *out);

// resolve_autoencoder_kl reads the pipeline's vae/ config into hp's "vae.*" keys, refusing
// what VAEDecoder does not implement (the error names the key).
void resolve_autoencoder_kl(const Config &vae, HParams &hp);

// resolve_flow_match reads the pipeline's scheduler/ config into hp's "scheduler.*" keys,
// refusing FlowMatchEulerDiscreteScheduler settings flow_match_sigmas does not implement.
void resolve_flow_match(const Config &scheduler, HParams &hp);

// Linspace is how a pipeline makes its base sigmas linspace(1, 1/N, N) before the scheduler
// rounds them to float32: torch.linspace in float32 (Z-Image's retrieve_timesteps) or
// numpy.linspace in float64 (FluxPipeline).
enum class Linspace { TorchFloat32, NumpyFloat64 };

// flow_match_sigmas: FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=linspace(1, 1/N, N),
// mu) in float32, with the final 0. With scheduler.use_dynamic_shifting, mu is the pipeline's
// calculate_shift(image_seq_len) over the scheduler config's base/max shift and sequence
// lengths and the sigmas are time-shifted exponentially; otherwise they are shifted by shift
// (the caller passes scheduler.shift, or a planted misreading of it).
std::vector<float> flow_match_sigmas(const HParams &hp, int N, int image_seq_len, float shift, Linspace ls);

// to_pixels turns the VAE's [-1, 1] output img [H*W*3] into diffusers' image: clamp(x/2 + 1/2,
// 0, 1) into image (when not NULL) and 8-bit rgb by numpy's round (half to even) of 255*x, or
// by truncation when truncate (a planted defect).
void to_pixels(const std::vector<float> &img, size_t px, float *image, uint8_t *rgb, bool truncate);

// ---- the AutoencoderKL decoder (activations channels-last: [H*W, C]) -----------------------

// VAEDecoder is AutoencoderKL's decoder (UpDecoderBlock2D), reading hp's "vae.*" keys and the
// "vae.decoder.*" (and vae.post_quant_conv) tensors.
struct Conv {
  const float *w = nullptr, *b = nullptr;
  int out = 0, in = 0, k = 0;
};

struct Norm {
  const float *g, *b;
};

struct Resnet {
  Norm n1, n2;
  Conv c1, c2, shortcut;
};

class VAEDecoder {
 public:
  VAEDecoder(const HParams &hp, const Weights &w, ThreadPool *pool) : pool_(pool) {
    const int nb = hp.i("vae.n_blocks");
    for (int i = 0; i < nb; i++) ch_.push_back(hp.i("vae.block_out_channels." + std::to_string(i)));
    groups_ = hp.i("vae.norm_num_groups");
    latent_ = hp.i("vae.latent_channels");
    const int layers = hp.i("vae.layers_per_block");
    attention_ = hp.b("vae.mid_block_add_attention");
    const std::string d = "vae.decoder.";
    const int last = ch_.back();
    if (hp.b("vae.use_post_quant_conv")) post_quant_ = conv(w, "vae.post_quant_conv", latent_, latent_, 1);
    conv_in_ = conv(w, d + "conv_in", last, latent_, 3);
    mid_[0] = resnet(w, d + "mid_block.resnets.0.", last, last);
    mid_[1] = resnet(w, d + "mid_block.resnets.1.", last, last);
    if (attention_) {
      const std::string a = d + "mid_block.attentions.0.";
      attn_norm_ = norm(w, a + "group_norm", last);
      for (int i = 0; i < 4; i++) {
        const char *n[4] = {"to_q", "to_k", "to_v", "to_out.0"};
        attn_w_[i] = w.get(a + n[i] + ".weight", {last, last});
        attn_b_[i] = w.get(a + n[i] + ".bias", {last});
      }
    }
    int prev = last;
    for (int i = 0; i < nb; i++) {
      const int c = ch_[nb - 1 - i];
      Up u;
      for (int j = 0; j < layers + 1; j++)
        u.res.push_back(resnet(w, d + "up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".", j == 0 ? prev : c, c));
      if (i < nb - 1) u.up = conv(w, d + "up_blocks." + std::to_string(i) + ".upsamplers.0.conv", c, c, 3);
      up_.push_back(u);
      prev = c;
    }
    norm_out_ = norm(w, d + "conv_norm_out", ch_[0]);
    conv_out_ = conv(w, d + "conv_out", 3, ch_[0], 3);
    w.ignore_prefix("vae.encoder.");  // the encoder serves image-to-image, not this pipeline
    if (w.has("vae.quant_conv.weight")) w.ignore_prefix("vae.quant_conv.");
  }

  int scale() const { return 1 << (int)(ch_.size() - 1); }

  // decode: z [C, h, w] (already scaled and shifted) -> out [H*W, 3] (the VAE's [-1, 1] output).
  void decode(const float *z, int h, int w, std::vector<float> &out) {
    std::vector<float> x((size_t)h * w * latent_);
    for (int c = 0; c < latent_; c++)
      for (int p = 0; p < h * w; p++) x[(size_t)p * latent_ + c] = z[(size_t)c * h * w + p];
    if (post_quant_.w) x = conv2d(post_quant_, x, h, w);
    x = conv2d(conv_in_, x, h, w);
    x = run_resnet(mid_[0], x, h, w);
    if (attention_) attend(x, h, w);
    x = run_resnet(mid_[1], x, h, w);
    for (const Up &u : up_) {
      for (const Resnet &r : u.res) x = run_resnet(r, x, h, w);
      if (u.up.w) {
        x = upsample(x, h, w, u.up.in);
        h *= 2, w *= 2;
        x = conv2d(u.up, x, h, w);
      }
    }
    group_norm(x, h * w, ch_[0], norm_out_, true);
    out = conv2d(conv_out_, x, h, w);
  }

 private:
  struct Up {
    std::vector<Resnet> res;
    Conv up;
  };

  static Conv conv(const Weights &w, const std::string &p, int out, int in, int k) {
    Conv c;
    c.w = w.get(p + ".weight", {out, in, k, k});
    c.b = w.get(p + ".bias", {out});
    c.out = out, c.in = in, c.k = k;
    return c;
  }
  static Norm norm(const Weights &w, const std::string &p, int c) { return Norm{w.get(p + ".weight", {c}), w.get(p + ".bias", {c})}; }
  static Resnet resnet(const Weights &w, const std::string &p, int in, int out) {
    Resnet r;
    r.n1 = norm(w, p + "norm1", in);
    r.c1 = conv(w, p + "conv1", out, in, 3);
    r.n2 = norm(w, p + "norm2", out);
    r.c2 = conv(w, p + "conv2", out, out, 3);
    if (in != out) r.shortcut = conv(w, p + "conv_shortcut", out, in, 1);
    return r;
  }

  // conv2d: x [h*w, in] -> [h*w, out], stride 1, zero padding k/2, as im2col rows (column
  // order in, ky, kx: the weight's [out, in, k, k] layout) through linear, in pixel chunks.
  std::vector<float> conv2d(const Conv &c, const std::vector<float> &x, int h, int w) {
    std::vector<float> y((size_t)h * w * c.out);
    const int K = c.in * c.k * c.k, r = c.k / 2;
    const int chunk = std::max(1, std::min(h * w, (1 << 22) / std::max(1, K)));
    std::vector<float> col((size_t)chunk * K);
    for (int p0 = 0; p0 < h * w; p0 += chunk) {
      const int np = std::min(chunk, h * w - p0);
      if (c.k == 1) {
        linear(pool_, &x[(size_t)p0 * c.in], np, c.in, c.w, c.out, c.b, &y[(size_t)p0 * c.out]);
        continue;
      }
      pool_->run([&](int ti, int nt) {
        for (int p = ti; p < np; p += nt) {
          const int py = (p0 + p) / w, px = (p0 + p) % w;
          float *row = &col[(size_t)p * K];
          for (int i = 0; i < c.in; i++)
            for (int ky = 0; ky < c.k; ky++)
              for (int kx = 0; kx < c.k; kx++) {
                const int yy = py + ky - r, xx = px + kx - r;
                row[(i * c.k + ky) * c.k + kx] = (yy < 0 || yy >= h || xx < 0 || xx >= w) ? 0.0f : x[((size_t)yy * w + xx) * c.in + i];
              }
        }
      });
      linear(pool_, col.data(), np, K, c.w, c.out, c.b, &y[(size_t)p0 * c.out]);
    }
    return y;
  }

  // group_norm in place over x [n, C] (eps 1e-6), then SiLU when act.
  void group_norm(std::vector<float> &x, int n, int C, const Norm &g, bool act) const {
    const int per = C / groups_;
    for (int gi = 0; gi < groups_; gi++) {
      double s = 0, ss = 0;
      for (int p = 0; p < n; p++)
        for (int c = gi * per; c < (gi + 1) * per; c++) {
          const double v = x[(size_t)p * C + c];
          s += v, ss += v * v;
        }
      const double cnt = (double)n * per, mean = s / cnt, var = std::max(0.0, ss / cnt - mean * mean);
      const float inv = (float)(1.0 / std::sqrt(var + 1e-6)), m = (float)mean;
      for (int p = 0; p < n; p++)
        for (int c = gi * per; c < (gi + 1) * per; c++) {
          float &v = x[(size_t)p * C + c];
          v = (v - m) * inv * g.g[c] + g.b[c];
          if (act) v = silu(v);
        }
    }
  }

  std::vector<float> run_resnet(const Resnet &r, const std::vector<float> &x, int h, int w) {
    std::vector<float> t = x;
    group_norm(t, h * w, r.c1.in, r.n1, true);
    t = conv2d(r.c1, t, h, w);
    group_norm(t, h * w, r.c1.out, r.n2, true);
    t = conv2d(r.c2, t, h, w);
    std::vector<float> s = r.shortcut.w ? conv2d(r.shortcut, x, h, w) : x;
    for (size_t i = 0; i < t.size(); i++) t[i] += s[i];
    return t;
  }

  // attend: the mid block's single-head self-attention with a residual connection.
  void attend(std::vector<float> &x, int h, int w) {
    const int C = ch_.back(), L = h * w;
    std::vector<float> n = x, q((size_t)L * C), k((size_t)L * C), v((size_t)L * C), o((size_t)L * C), y((size_t)L * C);
    group_norm(n, L, C, attn_norm_, false);
    linear(pool_, n.data(), L, C, attn_w_[0], C, attn_b_[0], q.data());
    linear(pool_, n.data(), L, C, attn_w_[1], C, attn_b_[1], k.data());
    linear(pool_, n.data(), L, C, attn_w_[2], C, attn_b_[2], v.data());
    full_attention(pool_, q.data(), k.data(), v.data(), L, 1, C, o.data());
    linear(pool_, o.data(), L, C, attn_w_[3], C, attn_b_[3], y.data());
    for (size_t i = 0; i < x.size(); i++) x[i] += y[i];
  }

  static std::vector<float> upsample(const std::vector<float> &x, int h, int w, int C) {
    std::vector<float> y((size_t)4 * h * w * C);
    for (int yy = 0; yy < 2 * h; yy++)
      for (int xx = 0; xx < 2 * w; xx++)
        std::memcpy(&y[((size_t)yy * 2 * w + xx) * C], &x[((size_t)(yy / 2) * w + xx / 2) * C], sizeof(float) * C);
    return y;
  }

  ThreadPool *pool_;
  std::vector<int> ch_;
  int groups_, latent_;
  bool attention_;
  Conv post_quant_, conv_in_, conv_out_;
  Resnet mid_[2];
  Norm attn_norm_{nullptr, nullptr}, norm_out_{nullptr, nullptr};
  const float *attn_w_[4] = {nullptr, nullptr, nullptr, nullptr}, *attn_b_[4] = {nullptr, nullptr, nullptr, nullptr};
  std::vector<Up> up_;
};

// CudaPipeline is the host side the image families share on device "cuda": it opens the family's
// GPU pipeline in libmodelqual_cuda.so (mqb_image_open, registered by native/models/<f>.cu) with
// the bundle's tensors and numeric hyper-parameters, bf16, one image at a time, and runs one
// request's mqb_image_args through it (the family's CPU side validates the request, draws the
// seeded noise and computes the sigmas, so both devices start from the same numbers).
class CudaPipeline {
 public:
  CudaPipeline(void *lib, const mq_engine_params &p, const HParams &hp, const char *family, int max_context);
  ~CudaPipeline();
  CudaPipeline(const CudaPipeline &) = delete;
  CudaPipeline &operator=(const CudaPipeline &) = delete;
  void generate(const mqb_image_args &a);

 private:
  int (*open_)(const mqb_model_params *, mqb_image **, char *, size_t) = nullptr;
  int (*generate_)(mqb_image *, const mqb_image_args *, char *, size_t) = nullptr;
  void (*close_)(mqb_image *) = nullptr;
  mqb_image *m_ = nullptr;
};

}  // namespace diffusion
}  // namespace mq

#endif
