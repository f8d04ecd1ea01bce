// models/diffusion.cc: the shared diffusion building blocks of diffusion.h (attention, the
// AutoencoderKL and FlowMatchEulerDiscreteScheduler configs, the sigmas, the pixel conversion).
// Sources: diffusers at 58eb52c0 (schedulers/scheduling_flow_match_euler_discrete.py,
// models/autoencoders/autoencoder_kl.py, image_processor.py).
#include "diffusion.h"

#include <dlfcn.h>

namespace mq {
namespace diffusion {

namespace {
[[noreturn]] void refuse(const std::string &key, const std::string &why) { throw Error(MQ_ERR_LOAD, "config " + key + ": " + why); }
}  // namespace

void full_attention(ThreadPool *pool, const float *q, const float *k, const float *v, int L, int H, int hd, float *out) {
  const float scale = 1.0f / std::sqrt((float)hd);
  const int D = H * hd;
  pool->run([&](int ti, int nt) {
    std::vector<float> s(L);
    for (int job = ti; job < L * H; job += nt) {
      const int i = job / H, h = job % H;
      const float *qi = q + (size_t)i * D + h * hd;
      float mx = -INFINITY;
      for (int j = 0; j < L; j++) {
        s[j] = dot(qi, k + (size_t)j * D + h * hd, hd) * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < L; j++) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = (float)(1.0 / sum);
      float *o = out + (size_t)i * D + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int j = 0; j < L; j++) axpy(s[j] * inv, v + (size_t)j * D + h * hd, o, hd);
    }
  });
}

void resolve_autoencoder_kl(const Config &v, HParams &hp) {
  if (v.string("_class_name", "AutoencoderKL") != "AutoencoderKL") refuse("vae._class_name", "only AutoencoderKL is implemented");
  std::vector<double> ch = v.numbers("block_out_channels");
  const int64_t groups = v.integer("norm_num_groups", 32);
  hp.set("vae.n_blocks", (double)ch.size());
  for (size_t i = 0; i < ch.size(); i++) {
    if ((int64_t)ch[i] % groups != 0) refuse("vae.block_out_channels", "not a multiple of norm_num_groups");
    hp.set("vae.block_out_channels." + std::to_string(i), ch[i]);
  }
  for (const std::string &u : v.strings("up_block_types"))
    if (u != "UpDecoderBlock2D") refuse("vae.up_block_types", "\"" + u + "\" is not implemented; only UpDecoderBlock2D");
  if (v.string("act_fn", "silu") != "silu") refuse("vae.act_fn", "only silu is implemented");
  if (v.integer("out_channels", 3) != 3) refuse("vae.out_channels", "want 3 (RGB)");
  if (v.has("latents_mean") || v.has("latents_std")) refuse("vae.latents_mean", "per-channel latent statistics are not implemented");
  hp.set("vae.norm_num_groups", (double)groups);
  hp.set("vae.latent_channels", (double)v.positive("latent_channels"));
  hp.set("vae.layers_per_block", (double)v.integer("layers_per_block", 1));
  hp.set("vae.mid_block_add_attention", v.boolean("mid_block_add_attention", true));
  hp.set("vae.use_post_quant_conv", v.boolean("use_post_quant_conv", true));
  hp.set("vae.scaling_factor", v.number("scaling_factor", 0.18215));
  hp.set("vae.shift_factor", v.has("shift_factor") ? v.number("shift_factor") : 0.0);

}

void resolve_flow_match(const Config &s, HParams &hp) {
  if (s.string("_class_name", "") != "FlowMatchEulerDiscreteScheduler")
    refuse("scheduler._class_name", "\"" + s.string("_class_name", "") + "\" is not implemented; only FlowMatchEulerDiscreteScheduler");
  for (const char *k : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas", "stochastic_sampling"})
    if (s.boolean(k, false)) refuse(std::string("scheduler.") + k, "true is not implemented");
  if (s.has("shift_terminal")) refuse("scheduler.shift_terminal", "is not implemented");
  if (s.string("time_shift_type", "exponential") != "exponential") refuse("scheduler.time_shift_type", "only exponential is implemented");
  if (s.number("num_train_timesteps", 1000) != 1000) refuse("scheduler.num_train_timesteps", "only 1000 is implemented");
  hp.set("scheduler.shift", s.number("shift", 1.0));
  hp.set("scheduler.use_dynamic_shifting", s.boolean("use_dynamic_shifting", false));
  hp.set("scheduler.base_shift", s.number("base_shift", 0.5));
  hp.set("scheduler.max_shift", s.number("max_shift", 1.15));
  hp.set("scheduler.base_image_seq_len", s.number("base_image_seq_len", 256));
  hp.set("scheduler.max_image_seq_len", s.number("max_image_seq_len", 4096));
}

std::vector<float> flow_match_sigmas(const HParams &hp, int N, int image_seq_len, float shift, Linspace ls) {
  std::vector<float> s(N);
  if (ls == Linspace::NumpyFloat64) {  // numpy.linspace: start + i*step, the last exactly stop
    const double start = 1.0, stop = 1.0 / N, step = N > 1 ? (stop - start) / (N - 1) : 0.0;
    for (int i = 0; i < N; i++) s[i] = (float)(i == N - 1 && N > 1 ? stop : start + (double)i * step);
  } else {
    const float start = 1.0f, end = (float)(1.0 / N);
    if (N == 1) {
      s[0] = start;
    } else {  // torch.linspace: start + step*i for the first half, end - step*(N-1-i) after
      const float step = (end - start) / (float)(N - 1);
      for (int i = 0; i < N; i++) s[i] = i < N / 2 ? start + step * (float)i : end - step * (float)(N - 1 - i);
    }
  }
  if (hp.b("scheduler.use_dynamic_shifting")) {
    // calculate_shift in Python floats; the time shift in float32 (numpy keeps the float32
    // array's type against a Python float).
    const double m = (hp.f("scheduler.max_shift") - hp.f("scheduler.base_shift")) /
                     (hp.f("scheduler.max_image_seq_len") - hp.f("scheduler.base_image_seq_len"));
    const double b = hp.f("scheduler.base_shift") - m * hp.f("scheduler.base_image_seq_len");
    const float e = (float)std::exp(image_seq_len * m + b);
    for (float &x : s) x = e / (e + (1.0f / x - 1.0f));
  } else {
    for (float &x : s) x = shift * x / (1.0f + (shift - 1.0f) * x);
  }
  s.push_back(0.0f);
  return s;
}

void to_pixels(const std::vector<float> &img, size_t px, float *image, uint8_t *rgb, bool truncate) {
  for (size_t p = 0; p < px * 3; p++) {
    const float v = std::min(1.0f, std::max(0.0f, img[p] * 0.5f + 0.5f));
    if (image) image[p] = v;
    rgb[p] = (uint8_t)(truncate ? v * 255.0f : std::nearbyint(v * 255.0f));  // numpy's round: half to even
  }
}

namespace {
template <typename F>
void cuda_sym(void *lib, F &f, const char *name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) throw Error(MQ_ERR_LOAD, std::string("device cuda: libmodelqual_cuda.so lacks symbol ") + name + "; rebuild it with make cuda");
}
}  // namespace

CudaPipeline::CudaPipeline(void *lib, const mq_engine_params &p, const HParams &hp, const char *family, int max_context) {
  cuda_sym(lib, open_, "mqb_image_open");
  cuda_sym(lib, generate_, "mqb_image_generate");
  cuda_sym(lib, close_, "mqb_image_close");
  std::vector<mqb_tensor> ts(p.n_tensors);
  for (int i = 0; i < p.n_tensors; i++) {
    ts[i].name = p.tensors[i].name;
    ts[i].data = p.tensors[i].data;
    ts[i].dtype = p.tensors[i].dtype;
    std::memcpy(ts[i].shape, p.tensors[i].shape, sizeof(ts[i].shape));
    ts[i].ndim = p.tensors[i].ndim;
  }
  std::vector<mqb_hparam> hps;
  for (const auto &kv : hp.numbers()) hps.push_back(mqb_hparam{kv.first.c_str(), kv.second, nullptr});
  mqb_model_params mp;
  std::memset(&mp, 0, sizeof(mp));
  mp.abi_version = MQB_ABI_VERSION;
  mp.family = family;
  mp.hparams = hps.data();
  mp.n_hparams = (int32_t)hps.size();
  mp.precision = "bf16";
  mp.max_batch = 1;
  mp.max_context = max_context;
  mp.device_index = p.device_index;
  mp.tensors = ts.data();
  mp.n_tensors = (int32_t)ts.size();
  char err[1024] = {0};
  if (open_(&mp, &m_, err, sizeof(err)) != 0 || !m_) throw Error(MQ_ERR_LOAD, std::string("device cuda: ") + err);
}

CudaPipeline::~CudaPipeline() {
  if (m_) close_(m_);
}

void CudaPipeline::generate(const mqb_image_args &a) {
  char err[1024] = {0};
  if (generate_(m_, &a, err, sizeof(err)) != 0) throw Error(MQ_ERR_BACKEND, std::string("device cuda: ") + err);
}

}  // namespace diffusion
}  // namespace mq
