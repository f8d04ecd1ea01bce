// zimage.cu: the Z-Image text-to-image pipeline on CUDA (owner: zimage family), the device side
// of `--device cuda` for task "image" (ABI: mqb_image_* in include/mq_backend.h).
//
// The same pipeline as models/zimage.cc (read that file for what each stage computes and why);
// this file only decides how it runs on the GPU:
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
#include "../cuda/ops/im2col.cuh"
#include "../cuda/ops/image_attention.cuh"
#include "../cuda/ops/image_elementwise.cuh"
#include "../cuda/ops/image_norm.cuh"
#include "qwen3.cuh"

namespace mqzimage {

struct Fail : std::runtime_error {
  explicit Fail(const std::string &m) : std::runtime_error(m) {}
};

void ck(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw Fail(std::string("zimage cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void cb(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Fail(std::string("zimage cuda: cuBLAS ") + what + " failed with status " + std::to_string((int)s));
}

using namespace mqcuda::img;

// ---- the model --------------------------------------------------------------------------------

struct Lin {  // y = x W^T (+ b): W [N, K] bf16
  bf16 *w = nullptr;
  float *b = nullptr;
  int N = 0, K = 0;
};

struct DitBlock {
  Lin qkv, o, w13, w2, mod;
  float *nq, *nk, *an1, *an2, *fn1, *fn2;
};

struct Conv {
  Lin l;  // [out, in*k*k]
  int in = 0, out = 0, k = 0;
};
struct GNorm {
  float *g = nullptr, *b = nullptr;
};
struct Resnet {
  GNorm n1, n2;
  Conv c1, c2, sc;
};

class Model {
 public:
  Model(const mqb_model_params *p) {
    for (int i = 0; i < p->n_hparams; i++) hp_[p->hparams[i].key] = p->hparams[i].value;
    for (int i = 0; i < p->n_tensors; i++) t_[p->tensors[i].name] = &p->tensors[i];
    max_ctx_ = p->max_context;
    p_ = p;
    ck(cudaSetDevice(p->device_index), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking), "cudaStreamCreate");
    cb(cublasCreate(&blas_), "create");
    cb(cublasSetStream(blas_, st_), "set stream");
    load();
    p_ = nullptr;
    ck(cudaStreamSynchronize(st_), "upload");
  }
  ~Model() {
    for (void *q : allocs_) cudaFree(q);
    for (auto &kv : scratch_) cudaFree(kv.second.first);
    if (blas_) cublasDestroy(blas_);
    if (st_) cudaStreamDestroy(st_);
  }

  void generate(const mqb_image_args *a);

 private:
  // ---- hyper-parameters and weights ----
  double hv(const std::string &k) const {
    auto it = hp_.find(k);
    if (it == hp_.end()) throw Fail("zimage cuda: hyper-parameter " + k + " missing; rebuild the bundle");
    return it->second;
  }
  int hi(const std::string &k) const { return (int)hv(k); }

  const mqb_tensor *tensor(const std::string &name, int64_t numel) const {
    auto it = t_.find(name);
    if (it == t_.end()) throw Fail("zimage cuda: tensor " + name + " missing from the bundle");
    int64_t n = 1;
    for (int i = 0; i < it->second->ndim; i++) n *= it->second->shape[i];
    if (n != numel) throw Fail("zimage cuda: tensor " + name + " has " + std::to_string(n) + " elements, want " + std::to_string(numel));
    return it->second;
  }
  static float elem(const mqb_tensor *t, int64_t i) {
    if (t->dtype == MQB_DTYPE_F32) return ((const float *)t->data)[i];
    const uint16_t b = ((const uint16_t *)t->data)[i];
    uint32_t u;
    if (t->dtype == MQB_DTYPE_BF16) {
      u = (uint32_t)b << 16;
    } else {  // IEEE half
      const uint32_t s = (uint32_t)(b & 0x8000) << 16, e = (b >> 10) & 0x1f, m = b & 0x3ff;
      if (e == 0) {
        float f = std::ldexp((float)m, -24);
        return s ? -f : f;
      }
      u = s | (e == 31 ? (0xffu << 23) | (m << 13) : ((e + 112) << 23) | (m << 13));
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t to_bf16_bits(float f) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
  }
  template <typename T>
  T *dalloc(size_t n) {
    void *q = nullptr;
    ck(cudaMalloc(&q, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc (weights)");
    allocs_.push_back(q);
    return (T *)q;
  }
  // f32: a vector tensor (norm scale, bias, pad token) to fp32 on the device.
  float *f32(const std::string &name, int64_t numel) {
    const mqb_tensor *t = tensor(name, numel);
    std::vector<float> h(numel);
    for (int64_t i = 0; i < numel; i++) h[i] = elem(t, i);
    float *d = dalloc<float>(numel);
    ck(cudaMemcpy(d, h.data(), sizeof(float) * numel, cudaMemcpyHostToDevice), "upload");
    return d;
  }
  // mat: the row-concatenation of matrices [n_i, K] to one bf16 [sum n_i, K] on the device.
  Lin mat(const std::vector<std::string> &names, const std::vector<int> &rows, int K, const std::vector<std::string> &biases = {}) {
    Lin l;
    l.K = K;
    for (int r : rows) l.N += r;
    std::vector<uint16_t> h((size_t)l.N * K);
    size_t off = 0;
    for (size_t i = 0; i < names.size(); i++) {
      const int64_t n = (int64_t)rows[i] * K;
      const mqb_tensor *t = tensor(names[i], n);
      if (t->dtype == MQB_DTYPE_BF16) {
        std::memcpy(&h[off], t->data, 2 * n);
      } else {
        for (int64_t j = 0; j < n; j++) h[off + j] = to_bf16_bits(elem(t, j));
      }
      off += n;
    }
    l.w = dalloc<bf16>(h.size());
    ck(cudaMemcpy(l.w, h.data(), 2 * h.size(), cudaMemcpyHostToDevice), "upload");
    if (!biases.empty()) {
      std::vector<float> b;
      for (size_t i = 0; i < biases.size(); i++) {
        const mqb_tensor *t = tensor(biases[i], rows[i]);
        for (int j = 0; j < rows[i]; j++) b.push_back(elem(t, j));
      }
      l.b = dalloc<float>(b.size());
      ck(cudaMemcpy(l.b, b.data(), 4 * b.size(), cudaMemcpyHostToDevice), "upload");
    }
    return l;
  }
  Lin mat1(const std::string &name, int N, int K, bool bias) {
    return mat({name + ".weight"}, {N}, K, bias ? std::vector<std::string>{name + ".bias"} : std::vector<std::string>{});
  }
  Conv conv(const std::string &p, int out, int in, int k) {
    Conv c;
    c.l = mat1(p, out, in * k * k, true);
    c.in = in, c.out = out, c.k = k;
    return c;
  }
  GNorm gnorm(const std::string &p, int c) { return GNorm{f32(p + ".weight", c), f32(p + ".bias", c)}; }
  Resnet resnet(const std::string &p, int in, int out) {
    Resnet r;
    r.n1 = gnorm(p + "norm1", in);
    r.c1 = conv(p + "conv1", out, in, 3);
    r.n2 = gnorm(p + "norm2", out);
    r.c2 = conv(p + "conv2", out, out, 3);
    if (in != out) r.sc = conv(p + "conv_shortcut", out, in, 1);
    return r;
  }

  void load();
  void open_text_encoder();

  // ---- scratch: named device buffers grown on demand ----
  template <typename T>
  T *buf(const std::string &name, size_t n) {
    auto &e = scratch_[name];
    if (e.second < n * sizeof(T)) {
      if (e.first) {
        ck(cudaStreamSynchronize(st_), "sync");
        cudaFree(e.first);
        e.first = nullptr;
      }
      ck(cudaMalloc(&e.first, n * sizeof(T)), ("cudaMalloc scratch " + name).c_str());
      e.second = n * sizeof(T);
    }
    return (T *)e.first;
  }

  // ---- products ----
  // gemm: row-major C[M, N] (ldc) = A[M, K] (lda) x B^T (B [N, K], ldb; transB) or x B (B [K, N]),
  // bf16 inputs, fp32 accumulation, C in fp32 or bf16; batched over `batch` with strides.
  void gemm(const bf16 *A, int lda, long long sA, const bf16 *B, int ldb, long long sB, bool transB, void *C, bool cbf16, int ldc,
            long long sC, int M, int N, int K, int batch = 1) {
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t ct = cbf16 ? CUDA_R_16BF : CUDA_R_32F;
    cb(cublasGemmStridedBatchedEx(blas_, transB ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, ldb, sB, A,
                                  CUDA_R_16BF, lda, sA, &zero, C, ct, ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "gemm");
  }
  // linear: y [M, N] fp32 = x [M, K] bf16 W^T + b.
  void linear(const bf16 *x, int M, const Lin &l, float *y) {
    gemm(x, l.K, 0, l.w, l.K, 0, true, y, false, l.N, 0, M, l.N, l.K);
    if (l.b) KL(bias_k, grid((size_t)M * l.N), 256, 0, st_)(y, l.b, l.N, (size_t)M * l.N);
  }
  // grid: blocks for n elements; the element-wise kernels divide indices in 32 bits.
  static int grid(size_t n) {
    if (n >= (1ull << 32)) throw Fail("zimage cuda: a tensor of " + std::to_string(n) + " elements exceeds the kernels' 32-bit indexing");
    return (int)std::min<size_t>((n + 255) / 256, 65535);
  }

  // attention: q [L, H*hd], k and v [Lk, Hkv*hd] (bf16) -> o [L, H*hd] bf16; scale 1/sqrt(hd).
  void attention(const bf16 *q, const bf16 *k, const bf16 *v, int L, int Lk, int H, int Hkv, int hd, bool causal, bf16 *o) {
    const int rep = H / Hkv;
    float *S = buf<float>("att_s", (size_t)H * L * Lk);
    bf16 *P = buf<bf16>("att_p", (size_t)H * L * Lk);
    for (int g = 0; g < Hkv; g++)  // the rep query heads of KV head g share its K (stride 0)
      gemm(q + (size_t)g * rep * hd, H * hd, hd, k + (size_t)g * hd, Hkv * hd, 0, true, S + (size_t)g * rep * L * Lk, false, Lk,
           (long long)L * Lk, L, Lk, hd, rep);
    KL(softmax_k, H * L, 256, 0, st_)(S, Lk, 1.0f / sqrtf((float)hd), L, causal, P);
    for (int g = 0; g < Hkv; g++)
      gemm(P + (size_t)g * rep * L * Lk, Lk, (long long)L * Lk, v + (size_t)g * hd, Hkv * hd, 0, false, o + (size_t)g * rep * hd, true,
           H * hd, hd, L, hd, Lk, rep);
  }

  void encode(const int32_t *ids, int n, float *out);
  void dit_block(const DitBlock &b, float *x, int L, const float *cs, const float *sn, const float *mod,
                 const std::vector<std::pair<int, int>> &segs);
  void dit_forward(const float *lat, int h, int w, float t, int nb, const float *const *capf, const int *ncap,
                   float *const *out);
  void rope_tables(int Lx, int nb, const int *Lc, int wt, int nimg);
  void conv2d(const Conv &c, const float *x, int h, int w, float *y);
  void group_norm(const float *x, int n, int C, const GNorm &g, bool act, float *y);
  void run_resnet(const Resnet &r, float *&x, int h, int w);
  void decode(const float *z, int h, int w, float *out);

  std::map<std::string, double> hp_;
  std::map<std::string, const mqb_tensor *> t_;
  std::vector<void *> allocs_;
  std::map<std::string, std::pair<void *, size_t>> scratch_;
  cudaStream_t st_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  int max_ctx_ = 0;
  const mqb_model_params *p_ = nullptr;  // the open's parameters, while load() runs
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
  // vae
  std::vector<int> ch_;
  int groups_, latent_;
  bool attn_;
  float scaling_, shift_factor_;
  Conv post_quant_, conv_in_, conv_out_;
  Resnet mid_[2];
  GNorm attn_norm_, norm_out_;
  Lin attn_qkv_, attn_o_;
  struct Up {
    std::vector<Resnet> res;
    Conv up;
  };
  std::vector<Up> up_;
  float last_t_ = NAN;  // the t of the modulation vectors in "mods" and "t_sc"
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

  // VAE decoder.
  const int nb = hi("vae.n_blocks");
  for (int i = 0; i < nb; i++) ch_.push_back(hi("vae.block_out_channels." + std::to_string(i)));
  groups_ = hi("vae.norm_num_groups"), latent_ = hi("vae.latent_channels");
  const int layers = hi("vae.layers_per_block");
  attn_ = hv("vae.mid_block_add_attention") != 0;
  scaling_ = (float)hv("vae.scaling_factor"), shift_factor_ = (float)hv("vae.shift_factor");
  const std::string d = "vae.decoder.";
  const int last = ch_.back();
  if (hv("vae.use_post_quant_conv") != 0) post_quant_ = conv("vae.post_quant_conv", latent_, latent_, 1);
  conv_in_ = conv(d + "conv_in", last, latent_, 3);
  mid_[0] = resnet(d + "mid_block.resnets.0.", last, last);
  mid_[1] = resnet(d + "mid_block.resnets.1.", last, last);
  if (attn_) {
    const std::string a = d + "mid_block.attentions.0.";
    attn_norm_ = gnorm(a + "group_norm", last);
    attn_qkv_ = mat({a + "to_q.weight", a + "to_k.weight", a + "to_v.weight"}, {last, last, last}, last,
                    {a + "to_q.bias", a + "to_k.bias", a + "to_v.bias"});
    attn_o_ = mat1(a + "to_out.0", last, last, true);
  }
  int prev = last;
  for (int i = 0; i < nb; i++) {
    const int c = ch_[nb - 1 - i];
    Up u;
    for (int j = 0; j < layers + 1; j++)
      u.res.push_back(resnet(d + "up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j) + ".", j == 0 ? prev : c, c));
    if (i < nb - 1) u.up = conv(d + "up_blocks." + std::to_string(i) + ".upsamplers.0.conv", c, c, 3);
    up_.push_back(u);
    prev = c;
  }
  norm_out_ = gnorm(d + "conv_norm_out", ch_[0]);
  conv_out_ = conv(d + "conv_out", 3, ch_[0], 3);
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
  KL(qk_k, dim3(L, 3 * H_), 64, 0, st_)(qkv, 3 * D_, H_, H_, hd_, b.nq, b.nk, 1e-5f, cs, sn, false, true, q, k, v);
  for (const auto &sg : segs) {
    const size_t o0 = (size_t)sg.first * D_;
    attention(q + o0, k + o0, v + o0, sg.second, sg.second, H_, H_, hd_, false, o + o0);
  }
  linear(o, L, b.o, t);
  KL(rms_gate_add_k, L, 256, 0, st_)(x, t, D_, b.an2, mod ? mod + D_ : nullptr, eps_);
  KL(rms_k, L, 256, 0, st_)(x, D_, b.fn1, mod ? mod + 2 * D_ : nullptr, eps_, nullptr, a);
  gemm(a, D_, 0, b.w13.w, D_, 0, true, g, true, 2 * ffn_, 0, L, 2 * ffn_, D_);
  KL(swiglu_k, grid((size_t)L * ffn_), 256, 0, st_)(g, ffn_, (size_t)L * ffn_, u);
  linear(u, L, b.w2, t);
  KL(rms_gate_add_k, L, 256, 0, st_)(x, t, D_, b.fn2, mod ? mod + 3 * D_ : nullptr, eps_);
}

// dit_forward: the velocities out[b] [C, h, w] for latents lat [C, h, w] at model time t, one
// per caption capf[b] [ncap[b], cap] (nb 1, or 2 for a CFG pair: both sequences' rows stacked,
// so every product runs once over the pair). Device pointers.
void Model::dit_forward(const float *lat, int h, int w, float t, int nb, const float *const *capf, const int *ncap,
                        float *const *out) {
  // adaLN input and every block's modulation: the same for both branches of a CFG pair.
  float *sc = buf<float>("t_sc", D_);
  const int nmod = (int)(noise_.size() + layers_.size());
  float *mods = buf<float>("mods", (size_t)nmod * 4 * D_);
  if (t != last_t_) {
    bf16 *fq = buf<bf16>("t_freq", 256);
    float *mid = buf<float>("t_mid", 1024), *adaln = buf<float>("t_ada", ada_);
    bf16 *midb = buf<bf16>("t_midb", 1024), *adab = buf<bf16>("t_adab", ada_);
    KL(tfreq_k, 1, 128, 0, st_)(t * t_scale_, 128, fq);
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
    last_t_ = t;
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

// conv2d: x [h*w, in] fp32 -> y [h*w, out] fp32; 3x3 through im2col, 1x1 a plain product.
void Model::conv2d(const Conv &c, const float *x, int h, int w, float *y) {
  const size_t n = (size_t)h * w;
  bf16 *col = buf<bf16>("col", n * c.in * c.k * c.k);
  if (c.k == 1)
    KL(to_bf16_k, grid(n * c.in), 256, 0, st_)(x, col, n * c.in);
  else
    KL(im2col_k, grid(n * c.in * 9), 256, 0, st_)(x, h, w, c.in, col);
  linear(col, (int)n, c.l, y);
}

void Model::group_norm(const float *x, int n, int C, const GNorm &g, bool act, float *y) {
  const size_t per = (size_t)n * (C / groups_);
  const int chunks = (int)std::min<size_t>(64, (per + 4095) / 4096);
  (void)chunks;  // (the host-only syntax check drops launch configurations)
  double *part = buf<double>("gn_part", (size_t)2 * groups_ * chunks), *stats = buf<double>("gn", 2 * groups_);
  KL(gn_stats_k, dim3(chunks, groups_), 256, 0, st_)(x, n, C, groups_, part);
  KL(gn_sum_k, 1, 64, 0, st_)(part, chunks, groups_, stats);
  KL(gn_apply_k, grid((size_t)n * C), 256, 0, st_)(x, (size_t)n * C, C, groups_, stats, g.g, g.b, act, y);
}

// run_resnet: x -> GN, SiLU, conv1, GN, SiLU, conv2, + shortcut(x); x is replaced by the result.
void Model::run_resnet(const Resnet &r, float *&x, int h, int w) {
  const int n = h * w;
  float *t = buf<float>("r_t", (size_t)n * std::max(r.c1.in, r.c1.out));
  float *t2 = buf<float>("r_t2", (size_t)n * r.c1.out);
  group_norm(x, n, r.c1.in, r.n1, true, t);
  conv2d(r.c1, t, h, w, t2);
  group_norm(t2, n, r.c1.out, r.n2, true, t2);
  float *y = buf<float>(x == buf<float>("v_a", 0) ? "v_b" : "v_a", (size_t)n * r.c1.out);
  conv2d(r.c2, t2, h, w, y);
  if (r.sc.k) {
    conv2d(r.sc, x, h, w, t);
    KL(add_k, grid((size_t)n * r.c1.out), 256, 0, st_)(y, t, (size_t)n * r.c1.out);
  } else {
    KL(add_k, grid((size_t)n * r.c1.out), 256, 0, st_)(y, x, (size_t)n * r.c1.out);
  }
  x = y;
}

// decode: z [C, h, w] (raw latents) -> out [H*W, 3] (the VAE's [-1, 1] output), device.
void Model::decode(const float *z, int h, int w, float *out) {
  const int H = h << (ch_.size() - 1), W = w << (ch_.size() - 1);
  const size_t big = (size_t)H * W * std::max(ch_[0], ch_.size() > 1 ? ch_[1] : ch_[0]);
  size_t most = 0;  // the largest activation: reserve both ping-pong buffers once
  for (size_t i = 0; i < ch_.size(); i++) most = std::max(most, ((size_t)h << i) * ((size_t)w << i) * ch_[ch_.size() - 1 - i] * 2);
  most = std::max(most, big);
  buf<float>("v_a", most);
  buf<float>("v_b", most);
  float *x = buf<float>("v_a", most);
  float *zi = buf<float>("v_zin", (size_t)h * w * latent_);
  KL(vae_in_k, grid((size_t)h * w * latent_), 256, 0, st_)(z, latent_, h * w, scaling_, shift_factor_, zi);
  float *cur = zi;
  float *pq = buf<float>("v_pq", (size_t)h * w * latent_);
  if (post_quant_.k) {
    conv2d(post_quant_, zi, h, w, pq);
    cur = pq;
  }
  conv2d(conv_in_, cur, h, w, x);
  run_resnet(mid_[0], x, h, w);
  if (attn_) {
    const int C = ch_.back(), L = h * w;
    float *nrm = buf<float>("a_n", (size_t)L * C);
    bf16 *nb = buf<bf16>("a_nb", (size_t)L * C);
    float *qkv = buf<float>("a_qkv", (size_t)L * 3 * C);
    bf16 *q = buf<bf16>("a_q", (size_t)L * C), *k = buf<bf16>("a_k", (size_t)L * C), *v = buf<bf16>("a_v", (size_t)L * C);
    bf16 *o = buf<bf16>("a_o", (size_t)L * C);
    float *y = buf<float>("a_y", (size_t)L * C);
    group_norm(x, L, C, attn_norm_, false, nrm);
    KL(to_bf16_k, grid((size_t)L * C), 256, 0, st_)(nrm, nb, (size_t)L * C);
    linear(nb, L, attn_qkv_, qkv);
    KL(split3_k, grid((size_t)L * 3 * C), 256, 0, st_)(qkv, C, (size_t)L * 3 * C, q, k, v);
    attention(q, k, v, L, L, 1, 1, C, false, o);
    linear(o, L, attn_o_, y);
    KL(add_k, grid((size_t)L * C), 256, 0, st_)(x, y, (size_t)L * C);
  }
  run_resnet(mid_[1], x, h, w);
  for (const Up &u : up_) {
    for (const Resnet &r : u.res) run_resnet(r, x, h, w);
    if (u.up.k) {
      float *other = x == buf<float>("v_a", 0) ? buf<float>("v_b", 0) : buf<float>("v_a", 0);
      KL(up2_k, grid((size_t)4 * h * w * u.up.in), 256, 0, st_)(x, h, w, u.up.in, other);
      h *= 2, w *= 2;
      conv2d(u.up, other, h, w, x);
    }
  }
  float *t = buf<float>("r_t", (size_t)h * w * ch_[0]);
  group_norm(x, h * w, ch_[0], norm_out_, true, t);
  conv2d(conv_out_, t, h, w, out);
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
  // 3-4. Denoising.
  for (int i = 0; i < a->steps; i++) {
    const float timestep = a->sigmas[i] * 1000.0f;
    const float t = (1000.0f - timestep) / 1000.0f;
    const float *capf[2] = {pe, ne};
    const int ncap[2] = {a->n_prompt, a->n_negative};
    float *const outs[2] = {pos, neg};
    dit_forward(lat, h, w, t, cfg ? 2 : 1, capf, ncap, outs);
    KL(step_k, grid(n), 256, 0, st_)(lat, pos, neg, a->guidance, a->sigmas[i + 1] - a->sigmas[i], n, cfg);
    if (a->latents) ck(cudaMemcpyAsync(a->latents + (size_t)(i + 1) * n, lat, 4 * (size_t)n, cudaMemcpyDeviceToHost, st_), "latents");
  }
  // 5. Decode.
  const size_t px = (size_t)a->width * a->height * 3;
  float *img = buf<float>("img", px), *imgf = buf<float>("imgf", px);
  unsigned char *rgb = buf<unsigned char>("rgb", px);
  decode(lat, h, w, img);
  KL(pixels_k, grid(px), 256, 0, st_)(img, px, imgf, rgb);
  ck(cudaMemcpyAsync(a->rgb, rgb, px, cudaMemcpyDeviceToHost, st_), "pixels");
  if (a->image) ck(cudaMemcpyAsync(a->image, imgf, 4 * px, cudaMemcpyDeviceToHost, st_), "image");
  ck(cudaStreamSynchronize(st_), "generate");
  ck(cudaGetLastError(), "kernels");
}

// The pipeline's registration: the core's mqb_image_* entry points open it by family name.
void *image_open(const mqb_model_params *p) { return new Model(p); }
void image_generate(void *m, const mqb_image_args *a) { static_cast<Model *>(m)->generate(a); }
void image_close(void *m) { delete static_cast<Model *>(m); }

MQB_REGISTER_FAMILY([] {
  mqcuda::CudaFamily f{"zimage"};
  f.image_open = image_open;
  f.image_generate = image_generate;
  f.image_close = image_close;
  return f;
}());

}  // namespace mqzimage
