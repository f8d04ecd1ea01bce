// zimage.cu: the Z-Image text-to-image pipeline on CUDA (owner: zimage family), the device side
// of `--device cuda` for task "image" (ABI: mqb_image_* in include/mq_backend.h).
//
// The same pipeline as models/zimage.cc (read that file for what each stage computes and why);
// this file only decides how it runs on the GPU, on the pieces it shares with models/flux.cu
// (diffusion_cuda.cuh's Pipeline: weights, products, attention, the VAE decoder):
//  - weights are uploaded once at open: every matrix in bf16 (the bundle's stored precision; an
//    fp32 bundle is rounded to bf16), q/k/v and the SwiGLU pair concatenated so one GEMM makes
//    them; norm scales, biases and pad tokens in fp32;
//  - every product is a cuBLAS GEMM with bf16 inputs and fp32 accumulation; the residual streams,
//    norms, RoPE, softmax, GroupNorm and the scheduler stay in fp32 (diffusers' bf16 run keeps
//    everything in bf16: ours is the more precise of the two, so the parity gap is diffusers');
//  - attention (the DiT's joint attention, the text encoder's causal GQA attention, the VAE's
//    single-head mid-block attention) is batched GEMM -> fp32 softmax -> batched GEMM, per head
//    (a grouped-query head group shares its K/V through a zero batch stride);
//  - the VAE's 3x3 convolutions are im2col (bf16, channels-last) + one GEMM, 1x1 ones a GEMM;
//  - biases are added in the products' epilogues (Pipeline::product), and a block's attention
//    residual (RMSNorm, gate) runs with the feed-forward's RMSNorm and scale in one kernel;
//  - a step's transformer forward (both CFG branches) is one CUDA graph (Pipeline::step_graph),
//    its model time read from a device buffer;
//  - the host draws nothing: the runtime hands over the initial noise (torch_randn, as on CPU)
//    and the scheduler's sigmas (computed by the same function the CPU pipeline uses), so both
//    devices start from identical numbers; CFG and the Euler step run on the GPU.
//
// Thread safety: one model is driven by one thread at a time (the engine's worker).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "mq_backend.h"

#include "../cuda/model.cuh"
#include "diffusion_cuda.cuh"
#include "qwen3.cuh"

namespace mqzimage {

using namespace mqcuda::img;

// ---- the model --------------------------------------------------------------------------------

struct DitBlock {
  Lin qkv, o, w13, w2, mod;
  float *nq, *nk, *an1, *an2, *fn1, *fn2;
};

class Model : public Pipeline {
 public:
  Model(const mqb_model_params *p) : Pipeline(p, "zimage cuda") {
    max_ctx_ = p->max_context;
    load();
    opened();
  }

  void generate(const mqb_image_args *a);

 private:
  void load();
  void open_text_encoder();

  void encode(const int32_t *ids, int n, float *out);
  void dit_block(const DitBlock &b, float *x, int L, const float *cs, const float *sn, const float *mod,
                 const std::vector<std::pair<int, int>> &segs);
  void dit_forward(const float *lat, int h, int w, const float *t, int nb, const float *const *capf, const int *ncap,
                   float *const *out);
  void rope_tables(int Lx, int nb, const int *Lc, int wt, int nimg);

  int max_ctx_ = 0;
  // text encoder: the shared Qwen3 decoder (open_text_encoder), E_ its hidden size
  int E_ = 0;
  std::unique_ptr<mqb_model> te_;
  // transformer
  int D_, H_, hd_, C_, cap_, ffn_, ada_, axes_lens_[3];
  float eps_, t_scale_;
  Lin x_emb_, final_, final_mod_, t0_, t2_, cap_emb_;
  float *cap_norm_, *x_pad_, *cap_pad_;
  std::vector<DitBlock> noise_, context_, layers_;
  std::vector<int> freq_axis_;
  std::vector<double> freq_;
  float *cosv_ = nullptr, *sinv_ = nullptr;  // the current RoPE tables (rope_tables)
  std::map<std::tuple<int, int, int, int>, std::pair<float *, float *>> rope_cache_;
};

void Model::load() {
  open_text_encoder();
  E_ = te_->c.H;
  if (hi("transformer.dim") / hi("transformer.n_heads") > 512) throw Fail("zimage cuda: head_dim above 512 is not implemented");

  // Transformer.
  const std::string t = "transformer.";
  D_ = hi(t + "dim"), H_ = hi(t + "n_heads"), hd_ = D_ / H_, C_ = hi(t + "in_channels"), cap_ = hi(t + "cap_feat_dim");
  eps_ = (float)hv(t + "norm_eps"), t_scale_ = (float)hv(t + "t_scale");
  ffn_ = (int)((double)D_ / 3 * 8), ada_ = std::min(D_, 256);
  const int P = 4 * C_;
  x_emb_ = mat1(t + "all_x_embedder.2-1", D_, P, true);
  final_ = mat1(t + "all_final_layer.2-1.linear", P, D_, true);
  final_mod_ = mat1(t + "all_final_layer.2-1.adaLN_modulation.1", D_, ada_, true);
  t0_ = mat1(t + "t_embedder.mlp.0", 1024, 256, true);
  t2_ = mat1(t + "t_embedder.mlp.2", ada_, 1024, true);
  cap_norm_ = f32(t + "cap_embedder.0.weight", cap_);
  cap_emb_ = mat1(t + "cap_embedder.1", D_, cap_, true);
  x_pad_ = f32(t + "x_pad_token", D_);
  cap_pad_ = f32(t + "cap_pad_token", D_);
  auto block = [&](const std::string &p, bool modulated) {
    DitBlock b;
    b.qkv = mat({p + "attention.to_q.weight", p + "attention.to_k.weight", p + "attention.to_v.weight"}, {D_, D_, D_}, D_);
    b.o = mat1(p + "attention.to_out.0", D_, D_, false);
    b.w13 = mat({p + "feed_forward.w1.weight", p + "feed_forward.w3.weight"}, {ffn_, ffn_}, D_);
    b.w2 = mat1(p + "feed_forward.w2", D_, ffn_, false);
    b.nq = f32(p + "attention.norm_q.weight", hd_);
    b.nk = f32(p + "attention.norm_k.weight", hd_);
    b.an1 = f32(p + "attention_norm1.weight", D_);
    b.an2 = f32(p + "attention_norm2.weight", D_);
    b.fn1 = f32(p + "ffn_norm1.weight", D_);
    b.fn2 = f32(p + "ffn_norm2.weight", D_);
    if (modulated) b.mod = mat1(p + "adaLN_modulation.0", 4 * D_, ada_, true);
    return b;
  };
  const int R = hi(t + "n_refiner_layers"), N = hi(t + "n_layers");
  for (int i = 0; i < R; i++) noise_.push_back(block(t + "noise_refiner." + std::to_string(i) + ".", true));
  for (int i = 0; i < R; i++) context_.push_back(block(t + "context_refiner." + std::to_string(i) + ".", false));
  for (int i = 0; i < N; i++) layers_.push_back(block(t + "layers." + std::to_string(i) + ".", true));
  const double theta = hv(t + "rope_theta");
  int sum = 0;
  for (int a = 0; a < 3; a++) {
    const int d = hi(t + "axes_dims." + std::to_string(a));
    axes_lens_[a] = hi(t + "axes_lens." + std::to_string(a));
    for (int k = 0; k < d / 2; k++) {
      freq_axis_.push_back(a);
      freq_.push_back(1.0 / std::pow(theta, (double)(2 * k) / (double)d));
    }
    sum += d;
  }
  if (sum != hd_) throw Fail("zimage cuda: transformer axes_dims do not sum to the head dim");

  load_vae();
}

// encode: hidden_states[-2] of the text encoder for ids -> out [n, E] fp32 (device): the shared
// decoder holds layers 0..L-2 (open_text_encoder), so its last residual stream is that output.
void Model::encode(const int32_t *ids, int n, float *h) {
  ck(cudaStreamSynchronize(st_), "encode");  // h may still be read by the previous request
  mqcuda::hidden_states(*te_, ids, n, h);
}

// The text encoder's decoder hooks: Qwen3's (models/qwen3.cu) under the pipeline's tensor prefix,
// with the CPU pipeline's fault names (zimage.text_encoder.rope_theta_x10, .drop_q_norm).
const mqcuda::CudaFamily &text_encoder_family() {
  static const mqcuda::CudaFamily f = [] {
    mqcuda::CudaFamily t{"zimage.text_encoder"};
    t.configure = [](mqcuda::Cfg &c, const mqcuda::HParams &) { mqcuda::qwen3::configure(c, "zimage.text_encoder"); };
    t.load = [](mqb_model &m, const mqcuda::TensorMap &tm) {
      mqcuda::qwen3::load_decoder(m, tm, {"text_encoder.", "zimage.text_encoder"});
    };
    return t;
  }();
  return f;
}

// open_text_encoder opens the shared decoder over the bundle's text_encoder.* tensors and
// hyper-parameters, as the CPU pipeline does (models/zimage.cc): layers 0..L-2 only
// (transformers' hidden_states[-2] is layer L-2's output), bf16 as the pipeline's products, one
// slot of the pipeline's text length; no LM head (its table is the embeddings', never run).
void Model::open_text_encoder() {
  const std::string te = "text_encoder.";
  std::vector<std::string> keys;
  std::vector<mqb_hparam> hp;
  for (int i = 0; i < p_->n_hparams; i++) {
    const std::string k = p_->hparams[i].key ? p_->hparams[i].key : "";
    if (k.compare(0, te.size(), te) == 0) keys.push_back(k.substr(te.size()));
  }
  for (int i = 0, j = 0; i < p_->n_hparams; i++) {
    const std::string k = p_->hparams[i].key ? p_->hparams[i].key : "";
    if (k.compare(0, te.size(), te) != 0) continue;
    mqb_hparam h = p_->hparams[i];
    h.key = keys[j++].c_str();
    if (keys[j - 1] == "num_layers") h.value -= 1;
    if (keys[j - 1] == "tie_word_embeddings") h.value = 1;
    hp.push_back(h);
  }
  if (hv(te + "num_layers") < 2) throw Fail("zimage cuda: text_encoder num_layers must be at least 2 (hidden_states[-2])");
  mqb_model_params q = *p_;
  q.family = "zimage.text_encoder";
  q.hparams = hp.data();
  q.n_hparams = (int32_t)hp.size();
  q.precision = "bf16";
  q.max_batch = 1;
  te_.reset(new mqb_model());
  te_->dev = p_->device_index;
  mqcuda::open_decoder(*te_, text_encoder_family(), &q, false);
}

// rope_tables: cos and sin of float32(pos[axis] * freq) per row (as the CPU pipeline) for the
// stacked sequences of nb branches, each [Lx image rows, Lc[b] caption rows], in cosv_/sinv_;
// kept per shape, so a request shape costs one upload.
void Model::rope_tables(int Lx, int nb, const int *Lc, int wt, int nimg) {
  auto &e = rope_cache_[std::make_tuple(Lx, Lc[0], nb > 1 ? Lc[1] : -1, wt)];
  if (!e.first) {
    int R = 0;
    for (int b = 0; b < nb; b++) R += Lx + Lc[b];
    const int nf = hd_ / 2;
    std::vector<int> pos((size_t)R * 3, 0);
    int off = 0;
    for (int b = 0; b < nb; b++) {
      for (int r = 0; r < nimg; r++) {
        pos[(size_t)(off + r) * 3] = Lc[b] + 1;
        pos[(size_t)(off + r) * 3 + 1] = r / wt;
        pos[(size_t)(off + r) * 3 + 2] = r % wt;
      }
      for (int j = 0; j < Lc[b]; j++) pos[(size_t)(off + Lx + j) * 3] = 1 + j;
      off += Lx + Lc[b];
    }
    std::vector<float> c((size_t)R * nf), s((size_t)R * nf);
    for (int r = 0; r < R; r++)
      for (int k = 0; k < nf; k++) {
        const float ang = (float)((double)pos[(size_t)r * 3 + freq_axis_[k]] * freq_[k]);
        c[(size_t)r * nf + k] = std::cos(ang);
        s[(size_t)r * nf + k] = std::sin(ang);
      }
    e.first = dalloc<float>(c.size());
    e.second = dalloc<float>(s.size());
    ck(cudaMemcpy(e.first, c.data(), 4 * c.size(), cudaMemcpyHostToDevice), "rope");
    ck(cudaMemcpy(e.second, s.data(), 4 * s.size(), cudaMemcpyHostToDevice), "rope");
  }
  cosv_ = e.first, sinv_ = e.second;
}

// dit_block: one transformer block in place over x [L, D] (rows of several sequences stacked:
// every product runs once over all of them, attention within each segment {start, len});
// mod [4D] (NULL: unmodulated). The q|k|v and w1|w3 products are kept in bf16, as diffusers'
// bf16 run keeps them; norms, residuals and softmax stay fp32.
void Model::dit_block(const DitBlock &b, float *x, int L, const float *cs, const float *sn, const float *mod,
                      const std::vector<std::pair<int, int>> &segs) {
  bf16 *a = buf<bf16>("d_a", (size_t)L * D_);
  bf16 *qkv = buf<bf16>("d_qkv", (size_t)L * 3 * D_);
  bf16 *q = buf<bf16>("d_q", (size_t)L * D_), *k = buf<bf16>("d_k", (size_t)L * D_), *v = buf<bf16>("d_v", (size_t)L * D_);
  bf16 *o = buf<bf16>("d_o", (size_t)L * D_);
  float *t = buf<float>("d_t", (size_t)L * D_);
  bf16 *g = buf<bf16>("d_g", (size_t)L * 2 * ffn_);
  bf16 *u = buf<bf16>("d_u", (size_t)L * ffn_);
  KL(rms_k, L, 256, 0, st_)(x, D_, b.an1, mod ? mod : nullptr, eps_, nullptr, a);
  gemm(a, D_, 0, b.qkv.w, D_, 0, true, qkv, true, 3 * D_, 0, L, 3 * D_, D_);
  KL(qk_k, qk_blocks(L, H_, H_), 256, 0, st_)(qkv, L, 3 * D_, H_, H_, hd_, b.nq, b.nk, 1e-5f, cs, sn, q, k, v);
  for (const auto &sg : segs) {
    const size_t o0 = (size_t)sg.first * D_;
    attention(q + o0, D_, k + o0, v + o0, D_, o + o0, D_, sg.second, sg.second, H_, H_, hd_, 1.0f / sqrtf((float)hd_), false);
  }
  linear(o, L, b.o, t);
  KL(rms_gate_add_rms_k, L, 256, 0, st_)(x, t, D_, b.an2, mod ? mod + D_ : nullptr, eps_, b.fn1, mod ? mod + 2 * D_ : nullptr, a);
  gemm(a, D_, 0, b.w13.w, D_, 0, true, g, true, 2 * ffn_, 0, L, 2 * ffn_, D_);
  KL(swiglu_k, grid((size_t)L * ffn_), 256, 0, st_)(g, ffn_, (size_t)L * ffn_, u);
  linear(u, L, b.w2, t);
  KL(rms_gate_add_k, L, 256, 0, st_)(x, t, D_, b.fn2, mod ? mod + 3 * D_ : nullptr, eps_);
}

// dit_forward: the velocities out[b] [C, h, w] for latents lat [C, h, w] at model time *t (times
// t_scale, device: written before each step, so a captured step replays with the step's value),
// one per caption capf[b] [ncap[b], cap] (nb 1, or 2 for a CFG pair: both sequences' rows
// stacked, so every product runs once over the pair). Device pointers.
void Model::dit_forward(const float *lat, int h, int w, const float *t, int nb, const float *const *capf, const int *ncap,
                        float *const *out) {
  // adaLN input and every block's modulation: the same for both branches of a CFG pair.
  float *sc = buf<float>("t_sc", D_);
  const int nmod = (int)(noise_.size() + layers_.size());
  float *mods = buf<float>("mods", (size_t)nmod * 4 * D_);
  {
    bf16 *fq = buf<bf16>("t_freq", 256);
    float *mid = buf<float>("t_mid", 1024), *adaln = buf<float>("t_ada", ada_);
    bf16 *midb = buf<bf16>("t_midb", 1024), *adab = buf<bf16>("t_adab", ada_);
    KL(tfreq_k, 1, 128, 0, st_)(t, 128, fq);
    linear(fq, 1, t0_, mid);
    KL(silu_bf16_k, 4, 256, 0, st_)(mid, midb, 1024);
    linear(midb, 1, t2_, adaln);
    KL(to_bf16_k, 1, 256, 0, st_)(adaln, adab, ada_);
    for (size_t i = 0; i < noise_.size(); i++) linear(adab, 1, noise_[i].mod, mods + i * 4 * D_);
    for (size_t i = 0; i < layers_.size(); i++) linear(adab, 1, layers_[i].mod, mods + (noise_.size() + i) * 4 * D_);
    KL(mod_k, grid((size_t)nmod * 4 * D_), 256, 0, st_)(mods, D_, nmod * 4 * D_);
    // Final layer's scale: Linear(SiLU(adaln)).
    bf16 *sab = buf<bf16>("t_sa", ada_);
    KL(silu_bf16_k, 1, 256, 0, st_)(adaln, sab, ada_);
    linear(sab, 1, final_mod_, sc);
  }

  const int ht = h / 2, wt = w / 2, nimg = ht * wt, P = 4 * C_;
  auto up32 = [](int n) { return (n + 31) / 32 * 32; };
  const int Lx = up32(nimg);
  int Lc[2] = {0, 0}, off[2] = {0, 0}, R = 0;
  std::vector<std::pair<int, int>> segs;
  for (int b = 0; b < nb; b++) {
    Lc[b] = up32(ncap[b]);
    if (Lc[b] + 1 >= axes_lens_[0]) throw Fail("prompt: " + std::to_string(ncap[b]) + " tokens exceed the transformer's position table");
    off[b] = R;
    segs.push_back({R, Lx + Lc[b]});
    R += Lx + Lc[b];
  }
  if (ht > axes_lens_[1] || wt > axes_lens_[2]) throw Fail("size: the image is larger than the transformer's position table");
  rope_tables(Lx, nb, Lc, wt, nimg);
  const int nf = hd_ / 2;
  float *seq = buf<float>("seq", (size_t)R * D_);
  // Image tokens: embedded once; the noise refiner once when every branch gives the image rows
  // the same positions (equal padded caption lengths), else per branch.
  bf16 *patches = buf<bf16>("patches", (size_t)nimg * P);
  KL(patchify_k, grid((size_t)nimg * P), 256, 0, st_)(lat, C_, h, w, patches);
  linear(patches, nimg, x_emb_, seq);
  if (Lx > nimg) KL(fill_rows_k, Lx - nimg, 256, 0, st_)(seq + (size_t)nimg * D_, D_, x_pad_);
  for (int b = 0; b < nb; b++) {
    float *xs = seq + (size_t)off[b] * D_;
    const bool same = b > 0 && Lc[b] == Lc[0];
    if (same) {
      KL(copy_k, grid((size_t)Lx * D_), 256, 0, st_)(xs, seq, (size_t)Lx * D_);
    } else {
      if (b > 0) {
        linear(patches, nimg, x_emb_, xs);
        if (Lx > nimg) KL(fill_rows_k, Lx - nimg, 256, 0, st_)(xs + (size_t)nimg * D_, D_, x_pad_);
      }
      for (size_t i = 0; i < noise_.size(); i++)
        dit_block(noise_[i], xs, Lx, cosv_ + (size_t)off[b] * nf, sinv_ + (size_t)off[b] * nf, mods + i * 4 * D_, {{0, Lx}});
    }
    // Caption tokens: RMSNorm, Linear, padded with cap_pad_token, the context refiner.
    float *cs = xs + (size_t)Lx * D_;
    bf16 *cn = buf<bf16>("capn", (size_t)ncap[b] * cap_);
    KL(rms_k, ncap[b], 256, 0, st_)(capf[b], cap_, cap_norm_, nullptr, eps_, nullptr, cn);
    linear(cn, ncap[b], cap_emb_, cs);
    if (Lc[b] > ncap[b]) KL(fill_rows_k, Lc[b] - ncap[b], 256, 0, st_)(cs + (size_t)ncap[b] * D_, D_, cap_pad_);
    const size_t ro = (size_t)(off[b] + Lx) * nf;
    for (const DitBlock &blk : context_) dit_block(blk, cs, Lc[b], cosv_ + ro, sinv_ + ro, nullptr, {{0, Lc[b]}});
  }
  for (size_t i = 0; i < layers_.size(); i++) dit_block(layers_[i], seq, R, cosv_, sinv_, mods + (noise_.size() + i) * 4 * D_, segs);
  bf16 *xn = buf<bf16>("xn", (size_t)nimg * D_);
  float *po = buf<float>("po", (size_t)nimg * P);
  for (int b = 0; b < nb; b++) {
    KL(ln_scale_k, nimg, 256, 0, st_)(seq + (size_t)off[b] * D_, D_, sc, xn);
    linear(xn, nimg, final_, po);
    KL(unpatchify_k, grid((size_t)nimg * P), 256, 0, st_)(po, C_, h, w, out[b]);
  }
}

void Model::generate(const mqb_image_args *a) {
  const int s = 1 << (ch_.size() - 1), h = a->height / s, w = a->width / s, n = C_ * h * w;
  const bool cfg = a->negative != nullptr && a->n_negative > 0;
  // 1. Text embeddings.
  float *pe = buf<float>("pe", (size_t)a->n_prompt * E_);
  encode(a->prompt, a->n_prompt, pe);
  float *ne = nullptr;
  if (cfg) {
    ne = buf<float>("ne", (size_t)a->n_negative * E_);
    encode(a->negative, a->n_negative, ne);
  }
  // 2. Latents (the runtime's torch-identical noise).
  float *lat = buf<float>("lat", n), *pos = buf<float>("vpos", n), *neg = buf<float>("vneg", n);
  ck(cudaMemcpyAsync(lat, a->noise, 4 * (size_t)n, cudaMemcpyHostToDevice, st_), "noise");
  // 3-4. Denoising: every step's model time (times t_scale) uploaded once; before each step its
  // value is copied to the one slot the (graphed) forward reads.
  std::vector<float> ts(a->steps);
  for (int i = 0; i < a->steps; i++) {
    const float timestep = a->sigmas[i] * 1000.0f;
    const float t = (1000.0f - timestep) / 1000.0f;
    ts[i] = t * t_scale_;
  }
  float *tall = buf<float>("t_all", ts.size()), *tcur = buf<float>("t_cur", 1);
  ck(cudaMemcpyAsync(tall, ts.data(), 4 * ts.size(), cudaMemcpyHostToDevice, st_), "timesteps");
  const float *capf[2] = {pe, ne};
  const int ncap[2] = {a->n_prompt, cfg ? a->n_negative : 0};
  float *const outs[2] = {pos, neg};
  char key[160];
  snprintf(key, sizeof key, "%dx%d b%d c%d,%d %p %p %p %p %p %p", h, w, cfg ? 2 : 1, ncap[0], ncap[1], (void *)lat, (const void *)pe,
           (const void *)ne, (void *)pos, (void *)neg, (void *)tcur);
  for (int i = 0; i < a->steps; i++) {
    ck(cudaMemcpyAsync(tcur, tall + i, 4, cudaMemcpyDeviceToDevice, st_), "timestep");
    step_graph(key, [&] { dit_forward(lat, h, w, tcur, cfg ? 2 : 1, capf, ncap, outs); });
    KL(step_k, grid(n), 256, 0, st_)(lat, pos, neg, a->guidance, a->sigmas[i + 1] - a->sigmas[i], n, cfg);
    if (a->latents) ck(cudaMemcpyAsync(a->latents + (size_t)(i + 1) * n, lat, 4 * (size_t)n, cudaMemcpyDeviceToHost, st_), "latents");
  }
  // 5. Decode.
  float *img = buf<float>("img", (size_t)a->width * a->height * 3);
  decode(lat, h, w, img);
  pixels(img, a);
}

// The pipeline's registration: the core's mqb_image_* entry points open it by family name.
MQB_REGISTER_FAMILY(image_family<Model>("zimage"));

}  // namespace mqzimage
