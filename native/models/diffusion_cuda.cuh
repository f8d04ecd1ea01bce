// diffusion_cuda.cuh: what the text-to-image pipelines on CUDA (models/<family>.cu) share, as
// models/diffusion.{h,cc} is what their CPU pipelines share: the base class
// Pipeline with
//  - the open's bookkeeping: hyper-parameters, the bundle's tensors by name, one stream and one
//    cuBLAS handle, weights uploaded once (every matrix in bf16, the bundle's stored precision;
//    an fp32 bundle is rounded to bf16; norm scales, biases and tables in fp32), named scratch
//    buffers grown on demand;
//  - the products: gemm (cuBLAS, bf16 inputs, fp32 accumulation, fp32 or bf16 out, batched with
//    strides), product (x W^T with its bias, or GELU-tanh of it, fused into the GEMM as a cuBLASLt
//    epilogue, to fp32 or bf16 rows of any stride), linear (x W^T + b to fp32), and attention,
//    the one function both pipelines' attentions go through (the DiTs' joint attention, a causal
//    GQA text encoder through the shared decoder aside, a pooled text encoder's causal attention,
//    the VAE's single-head mid-block attention): the
//    fused tensor-core kernel of ops/flash_attn.cuh for head dims up to 128; the VAE's 512-wide
//    head as batched GEMM -> fp32 softmax -> batched GEMM;
//  - the AutoencoderKL decoder (diffusers' Decoder: conv_in, mid block resnets and single-head
//    attention, up blocks with nearest 2x upsampling, GroupNorm + SiLU, conv_out; 3x3
//    convolutions as im2col (bf16, channels-last, each tap's channels contiguous) + one GEMM, 1x1
//    ones a GEMM), from the vae.*
//    hyper-parameters both families resolve with diffusion::resolve_autoencoder_kl;
//  - step_graph: a denoising step's transformer forward captured once per shape as a CUDA graph
//    and replayed for every step (MQB_GRAPHS=0 runs it eagerly).
//
// Thread safety: one pipeline is driven by one thread at a time (the engine's worker).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "mq_backend.h"

#include "../cuda/common.cuh"
#include "../cuda/env.cuh"
#include "../cuda/ops/im2col.cuh"
#include "../cuda/ops/flash_attn.cuh"
#include "../cuda/ops/image_attention.cuh"
#include "../cuda/ops/image_elementwise.cuh"
#include "../cuda/ops/image_norm.cuh"

namespace mqcuda {
namespace img {

using mqcuda::Fail;

struct Lin {  // y = x W^T (+ b): W [N, K] bf16; b in fp32, and bh the same bias in bf16
  bf16 *w = nullptr;
  float *b = nullptr;
  bf16 *bh = nullptr;
  int N = 0, K = 0;
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

// Epi: what a product applies to x W^T before storing it: nothing, + b, or gelu_tanh(. + b)
// (cuBLASLt's GELU epilogue is the tanh approximation: only for layers that use that one).
enum class Epi { kNone, kBias, kGeluTanhBias };

class Pipeline {
 public:
  // name: the error messages' prefix ("<family> cuda"). The derived class loads its weights, then
  // calls opened().
  Pipeline(const mqb_model_params *p, const char *name) : name_(name) {
    for (int i = 0; i < p->n_hparams; i++) hp_[p->hparams[i].key] = p->hparams[i].value;
    for (int i = 0; i < p->n_tensors; i++) t_[p->tensors[i].name] = &p->tensors[i];
    p_ = p;
    ck(cudaSetDevice(p->device_index), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking), "cudaStreamCreate");
    cb(cublasCreate(&blas_), "create");
    cb(cublasSetStream(blas_, st_), "set stream");
    // One fixed workspace for cuBLAS and cuBLASLt (stream-ordered on st_), so neither allocates
    // inside a graph capture.
    ws_ = dalloc<char>(kWs);
    cb(cublasSetWorkspace(blas_, ws_, kWs), "set workspace");
    if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) lt_ = nullptr;  // products then run unfused
    graphs_ = mqcuda::knobs().graphs;
  }
  virtual ~Pipeline() {
    for (auto &kv : graph_) if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    for (auto &kv : plans_) {
      LtPlan &p = kv.second;
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.d) cublasLtMatrixLayoutDestroy(p.d);
      if (p.op) cublasLtMatmulDescDestroy(p.op);
    }
    if (lt_) cublasLtDestroy(lt_);
    for (void *q : allocs_) cudaFree(q);
    for (auto &kv : scratch_) cudaFree(kv.second.first);
    if (blas_) cublasDestroy(blas_);
    if (st_) cudaStreamDestroy(st_);
  }

 protected:
  void opened() {
    p_ = nullptr;
    ck(cudaStreamSynchronize(st_), "upload");
  }
  void ck(cudaError_t e, const char *what) const {
    if (e != cudaSuccess) throw Fail(name_ + ": " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
  void cb(cublasStatus_t s, const char *what) const {
    if (s != CUBLAS_STATUS_SUCCESS) throw Fail(name_ + ": cuBLAS " + what + " failed with status " + std::to_string((int)s));
  }

  // ---- hyper-parameters and weights ----
  bool has(const std::string &k) const { return hp_.count(k) != 0; }
  double hv(const std::string &k) const {
    auto it = hp_.find(k);
    if (it == hp_.end()) throw Fail(name_ + ": hyper-parameter " + k + " missing; rebuild the bundle");
    return it->second;
  }
  int hi(const std::string &k) const { return (int)hv(k); }

  const mqb_tensor *tensor(const std::string &name, int64_t numel) const {
    auto it = t_.find(name);
    if (it == t_.end()) throw Fail(name_ + ": tensor " + name + " missing from the bundle");
    int64_t n = 1;
    for (int i = 0; i < it->second->ndim; i++) n *= it->second->shape[i];
    if (n != numel) throw Fail(name_ + ": tensor " + name + " has " + std::to_string(n) + " elements, want " + std::to_string(numel));
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
  // bf16_bits: element i of t as bf16 bits (a bf16 tensor's own; others rounded).
  static uint16_t bf16_bits(const mqb_tensor *t, int64_t i) {
    return t->dtype == MQB_DTYPE_BF16 ? ((const uint16_t *)t->data)[i] : to_bf16_bits(elem(t, i));
  }
  template <typename T>
  T *dalloc(size_t n) {
    void *q = nullptr;
    ck(cudaMalloc(&q, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc (weights)");
    allocs_.push_back(q);
    return (T *)q;
  }
  // f32: a vector tensor (norm scale, bias, pad token, table) to fp32 on the device.
  float *f32(const std::string &name, int64_t numel) {
    const mqb_tensor *t = tensor(name, numel);
    std::vector<float> h(numel);
    for (int64_t i = 0; i < numel; i++) h[i] = elem(t, i);
    float *d = dalloc<float>(numel);
    ck(cudaMemcpy(d, h.data(), sizeof(float) * numel, cudaMemcpyHostToDevice), "upload");
    return d;
  }
  // mat: the row-concatenation of matrices [n_i, K] to one bf16 [sum n_i, K] on the device (and
  // of their biases, when named, to fp32).
  Lin mat(const std::vector<std::string> &names, const std::vector<int> &rows, int K, const std::vector<std::string> &biases = {}) {
    int N = 0;
    for (int r : rows) N += r;
    std::vector<uint16_t> h((size_t)N * K);
    size_t off = 0;
    for (size_t i = 0; i < names.size(); i++) {
      const int64_t n = (int64_t)rows[i] * K;
      const mqb_tensor *t = tensor(names[i], n);
      if (t->dtype == MQB_DTYPE_BF16) {
        std::memcpy(&h[off], t->data, 2 * n);
      } else {
        for (int64_t j = 0; j < n; j++) h[off + j] = bf16_bits(t, j);
      }
      off += n;
    }
    return upload(h, rows, K, biases);
  }
  // upload: host bf16 rows [sum rows, K] (and the named biases, in fp32 and bf16) to the device.
  Lin upload(const std::vector<uint16_t> &h, const std::vector<int> &rows, int K, const std::vector<std::string> &biases) {
    Lin l;
    l.K = K;
    for (int r : rows) l.N += r;
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
      // cuBLASLt adds a bias to a bf16 output only in bf16 (product): exact for a bf16
      // checkpoint's biases, and diffusers' bf16 pipelines add theirs in bf16 too.
      std::vector<uint16_t> bh(b.size());
      for (size_t i = 0; i < b.size(); i++) bh[i] = to_bf16_bits(b[i]);
      l.bh = dalloc<bf16>(bh.size());
      ck(cudaMemcpy(l.bh, bh.data(), 2 * bh.size(), cudaMemcpyHostToDevice), "upload");
    }
    return l;
  }
  Lin mat1(const std::string &name, int N, int K, bool bias) {
    return mat({name + ".weight"}, {N}, K, bias ? std::vector<std::string>{name + ".bias"} : std::vector<std::string>{});
  }
  // conv: a k x k convolution's weight [out, in, k, k] as a matrix [out, k*k*in] whose columns
  // are ordered (ky, kx, c), im2col_k's order, and its bias.
  Conv conv(const std::string &p, int out, int in, int k) {
    Conv c;
    const int kk = k * k, K = in * kk;
    const mqb_tensor *t = tensor(p + ".weight", (int64_t)out * K);
    std::vector<uint16_t> h((size_t)out * K);
    for (int o = 0; o < out; o++)
      for (int ci = 0; ci < in; ci++)
        for (int tap = 0; tap < kk; tap++) {
          const int64_t src = ((int64_t)o * in + ci) * kk + tap;
          h[(size_t)o * K + (size_t)tap * in + ci] = bf16_bits(t, src);
        }
    c.l = upload(h, {out}, K, {p + ".bias"});
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

  // ---- scratch: named device buffers grown on demand ----
  // A buffer that moves invalidates the captured graphs that use it (step_graph checks the
  // addresses each graph was captured with); one cannot grow inside a capture (step_graph then
  // runs eagerly).
  template <typename T>
  T *buf(const std::string &name, size_t n) {
    auto &e = scratch_[name];
    if (e.second < n * sizeof(T)) {
      if (capturing_) throw Fail(name_ + ": scratch " + name + " grows inside a graph capture");
      if (e.first) {
        ck(cudaStreamSynchronize(st_), "sync");
        cudaFree(e.first);
        e.first = nullptr;
      }
      ck(cudaMalloc(&e.first, n * sizeof(T)), ("cudaMalloc scratch " + name).c_str());
      e.second = n * sizeof(T);
    }
    if (capturing_) captured_.push_back(&e);
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
  void linear(const bf16 *x, int M, const Lin &l, float *y) { product(x, l.K, M, l, y, false, l.N, l.b ? Epi::kBias : Epi::kNone); }
  // product: y [M, N] (row stride ldy; fp32, or bf16 when ybf16) = epi(x [M, K] (row stride ldx)
  // W^T), fp32 accumulation; an epilogue is applied in fp32 before the one rounding to y's type.
  // With an epilogue, one cuBLASLt call (its heuristic's first kernel for the shape and the
  // pointers' alignments); where cuBLASLt offers none, cuBLAS and epilogue_k (said once).
  void product(const bf16 *x, int ldx, int M, const Lin &l, void *y, bool ybf16, int ldy, Epi epi) {
    if (epi != Epi::kNone && !l.b) throw Fail(name_ + ": a bias epilogue on a layer without a bias");
    if (epi == Epi::kNone) {
      gemm(x, ldx, 0, l.w, l.K, 0, true, y, ybf16, ldy, 0, M, l.N, l.K);
      return;
    }
    if (const LtPlan *p = lt_plan(M, l.N, l.K, ldx, ldy, ybf16, epi, x, y)) {
      const float one = 1.f, zero = 0.f;
      const void *bias = ybf16 ? (const void *)l.bh : (const void *)l.b;
      cb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "bias pointer");
      cb(cublasLtMatmul(lt_, p->op, &one, l.w, p->a, x, p->b, &zero, y, p->d, y, p->d, &p->algo, ws_, kWs, st_), "matmul");
      return;
    }
    float *t = ybf16 ? buf<float>("epi_t", (size_t)M * l.N) : (float *)y;
    const int ldt = ybf16 ? l.N : ldy;
    gemm(x, ldx, 0, l.w, l.K, 0, true, t, false, ldt, 0, M, l.N, l.K);
    KL(epilogue_k, grid((size_t)M * l.N), 256, 0, st_)(t, ldt, l.b, l.N, epi == Epi::kGeluTanhBias, y, ybf16, ldy, (size_t)M * l.N);
  }
  // grid: blocks for n elements; the element-wise kernels divide indices in 32 bits.
  int grid(size_t n) const {
    if (n >= (1ull << 32)) throw Fail(name_ + ": a tensor of " + std::to_string(n) + " elements exceeds the kernels' 32-bit indexing");
    return (int)std::min<size_t>((n + 255) / 256, 65535);
  }

  // attention: o = softmax(q k^T * scale [causal]) v per head, q rows [L] of H heads (row stride
  // ldq), k and v rows [Lk] of Hkv heads (row stride ldkv; query head h reads KV head
  // h / (H / Hkv)), o rows [L] of H heads (row stride ldo); bf16 in and out, fp32 scores. causal
  // masks key j > query i (L == Lk). Every pipeline's attention goes through here: the fused
  // kernel (flash_attn.cuh: no score matrix in memory) for head dims up to 128, else (the VAE's
  // single 512-wide head) cuBLAS products around a materialised fp32 score matrix.
  void attention(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo, int L, int Lk, int H, int Hkv,
                 int hd, float scale, bool causal) {
    if (flash_attention(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, Hkv, hd, scale, causal, st_)) return;
    const int rep = H / Hkv;
    float *S = buf<float>("att_s", (size_t)H * L * Lk);
    bf16 *P = buf<bf16>("att_p", (size_t)H * L * Lk);
    for (int g = 0; g < Hkv; g++)  // the rep query heads of KV head g share its K (stride 0)
      gemm(q + (size_t)g * rep * hd, ldq, hd, k + (size_t)g * hd, ldkv, 0, true, S + (size_t)g * rep * L * Lk, false, Lk,
           (long long)L * Lk, L, Lk, hd, rep);
    KL(softmax_k, H * L, 256, 0, st_)(S, Lk, scale, L, causal, P);
    for (int g = 0; g < Hkv; g++)
      gemm(P + (size_t)g * rep * L * Lk, Lk, (long long)L * Lk, v + (size_t)g * hd, ldkv, 0, false, o + (size_t)g * rep * hd, true, ldo,
           hd, L, hd, Lk, rep);
  }

  // ---- a denoising step as a CUDA graph ----
  // step_graph runs body (launches on st_ only; no host syncs, no allocations) through the graph
  // kept under key, which must name everything body bakes in (shapes, buffers; per-step numbers
  // live in device buffers the caller writes before the call): eagerly the first time (scratch
  // grows, cuBLASLt plans are made, tables are uploaded), captured and replayed from the second
  // on, recaptured when a scratch buffer it uses has moved since. One it does not use may grow:
  // the VAE's buffers, first allocated after the first image's denoising steps, leave the steps'
  // graph alone (when any growth invalidated every graph, the second image captured and
  // instantiated the steps' graph again). A capture that fails turns graphs off for this
  // pipeline, said once on stderr, and the step runs eagerly.
  void step_graph(const std::string &key, const std::function<void()> &body) {
    if (!graphs_) return body();
    StepGraph &g = graph_[key];
    if (g.exec && std::any_of(g.uses.begin(), g.uses.end(), [](const auto &u) { return u.first->first != u.second; })) {
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
    }
    if (!g.exec && !g.warmed) {
      body();
      g.warmed = true;
      return;
    }
    if (!g.exec) {
      std::string why;
      ck(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      captured_.clear();
      capturing_ = true;
      try {
        body();
      } catch (const std::exception &e) {
        why = e.what();
      }
      capturing_ = false;
      cudaGraph_t cg = nullptr;
      cudaError_t e = cudaStreamEndCapture(st_, &cg);
      if (e != cudaSuccess && why.empty()) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
      if (why.empty()) {
#if defined(CUDART_VERSION) && CUDART_VERSION < 12000  // CUDA 11's signature (compile checks with nvcc 11.8)
        e = cudaGraphInstantiate(&g.exec, cg, nullptr, nullptr, 0);
#else
        e = cudaGraphInstantiate(&g.exec, cg, 0);
#endif
        if (e != cudaSuccess) why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e), g.exec = nullptr;
      }
      if (cg) cudaGraphDestroy(cg);
      if (!why.empty()) {
        (void)cudaGetLastError();
        fprintf(stderr, "%s: CUDA graphs off, denoising steps run eagerly: %s\n", name_.c_str(), why.c_str());
        for (auto &kv : graph_) if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
        graph_.clear();
        graphs_ = false;
        return body();
      }
      g.uses.clear();
      for (const auto *e : captured_) g.uses.push_back({e, e->first});
    }
    ck(cudaGraphLaunch(g.exec, st_), "cudaGraphLaunch");
  }

  // ---- the AutoencoderKL decoder ----
  void load_vae() {
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
  // vae_scale: pixels per latent cell.
  int vae_scale() const { return 1 << (ch_.size() - 1); }

  // conv2d: x [h*w, in] fp32 -> y [h*w, out] fp32; 3x3 through im2col, 1x1 a plain product.
  void conv2d(const Conv &c, const float *x, int h, int w, float *y) {
    const size_t n = (size_t)h * w;
    bf16 *col = buf<bf16>("col", n * c.in * c.k * c.k);
    if (c.k == 1)
      KL(to_bf16_k, grid(n * c.in), 256, 0, st_)(x, col, n * c.in);
    else if (c.in % 4 == 0)
      KL(im2col_k<4>, grid(n * c.in * 9 / 4), 256, 0, st_)(x, h, w, c.in, col);
    else
      KL(im2col_k<1>, grid(n * c.in * 9), 256, 0, st_)(x, h, w, c.in, col);
    linear(col, (int)n, c.l, y);
  }

  void group_norm(const float *x, int n, int C, const GNorm &g, bool act, float *y) {
    const size_t per = (size_t)n * (C / groups_);
    const int chunks = (int)std::min<size_t>(64, (per + 4095) / 4096);
    (void)chunks;  // (the host-only syntax check drops launch configurations)
    double *part = buf<double>("gn_part", (size_t)2 * groups_ * chunks);
    float2 *stats = buf<float2>("gn", groups_);
    KL(gn_stats_k, dim3(chunks, groups_), 256, 0, st_)(x, n, C, groups_, part);
    KL(gn_sum_k, 1, 64, 0, st_)(part, chunks, groups_, (double)per, stats);
    if (C % 4 == 0)
      KL(gn_apply_k<4>, grid((size_t)n * C / 4), 256, 0, st_)(x, (size_t)n * C, C, groups_, stats, g.g, g.b, act, y);
    else
      KL(gn_apply_k<1>, grid((size_t)n * C), 256, 0, st_)(x, (size_t)n * C, C, groups_, stats, g.g, g.b, act, y);
  }

  // run_resnet: x -> GN, SiLU, conv1, GN, SiLU, conv2, + shortcut(x); x is replaced by the result.
  void run_resnet(const Resnet &r, float *&x, int h, int w) {
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

  // decode: z [C, h, w] (raw latents: scaled and shifted here) -> out [H*W, 3] (the VAE's
  // [-1, 1] output), device.
  void decode(const float *z, int h, int w, float *out) {
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
      attention(q, C, k, v, C, o, C, L, L, 1, 1, C, 1.0f / sqrtf((float)C), false);
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

  // pixels: the VAE's output img [H*W, 3] -> a->rgb (and a->image), copied out; then waits for
  // the stream.
  void pixels(const float *img, const mqb_image_args *a) {
    const size_t px = (size_t)a->width * a->height * 3;
    float *imgf = buf<float>("imgf", px);
    unsigned char *rgb = buf<unsigned char>("rgb", px);
    KL(pixels_k, grid(px), 256, 0, st_)(img, px, imgf, rgb);
    ck(cudaMemcpyAsync(a->rgb, rgb, px, cudaMemcpyDeviceToHost, st_), "pixels");
    if (a->image) ck(cudaMemcpyAsync(a->image, imgf, 4 * px, cudaMemcpyDeviceToHost, st_), "image");
    ck(cudaStreamSynchronize(st_), "generate");
    ck(cudaGetLastError(), "kernels");
  }

  // LtPlan: a cuBLASLt product with an epilogue, made once per shape, output type, epilogue and
  // the alignments of x and y (the heuristic's kernels may need them); ok false: none offered.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  static int align_of(const void *p) {
    const uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 2 && u % a) a /= 2;
    return a;
  }
  const LtPlan *lt_plan(int M, int N, int K, int ldx, int ldy, bool ybf16, Epi epi, const void *x, const void *y) {
    if (!lt_) return nullptr;
    const int ax = align_of(x), ay = align_of(y);
    const auto key = std::make_tuple(M, N, K, ldx, ldy, (int)ybf16 * 4 + (int)epi, ax * 1024 + ay);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.ok ? &it->second : nullptr;
    LtPlan &p = plans_[key];
    // The bias in the output's type: cuBLASLt 13.1 offers no bf16-output epilogue with an fp32
    // bias, for any of the image pipelines' shapes (lab/cuda/probe/lt_epilogue.cu on an H100).
    const int32_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N, bt = ybf16 ? CUDA_R_16BF : CUDA_R_32F;
    const uint32_t ep = epi == Epi::kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    const uint64_t ws = kWs;
    const uint32_t aw = 256, axu = ax, ayu = ay;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t r{};
    int n = 0;
    // Column-major, as cuBLASLt reads it: y^T [N, M] = W [K, N]^T x^T [K, M], bias per row of y^T.
    p.ok = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, ldx) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&p.d, ybf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, ldy) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &axu, sizeof axu) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ayu, sizeof ayu) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ayu, sizeof ayu) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.d, p.d, pref, 1, &r, &n) == CUBLAS_STATUS_SUCCESS && n > 0 &&
           r.state == CUBLAS_STATUS_SUCCESS;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    p.algo = r.algo;
    if (!p.ok && !lt_said_) {
      lt_said_ = true;
      fprintf(stderr, "%s: cuBLASLt offers no %s epilogue for %d x %d x %d (%s out); such products run on cuBLAS and a separate kernel\n",
              name_.c_str(), epi == Epi::kBias ? "bias" : "GELU-bias", M, N, K, ybf16 ? "bf16" : "fp32");
    }
    return p.ok ? &p : nullptr;
  }
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    // the scratch buffers the captured steps use, each with the address it had then
    std::vector<std::pair<const std::pair<void *, size_t> *, void *>> uses;
    bool warmed = false;
  };
  static constexpr size_t kWs = 32u << 20;

  std::string name_;
  std::map<std::string, double> hp_;
  std::map<std::string, const mqb_tensor *> t_;
  std::vector<void *> allocs_;
  std::map<std::string, std::pair<void *, size_t>> scratch_;
  cudaStream_t st_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  char *ws_ = nullptr;
  std::map<std::tuple<int, int, int, int, int, int, int>, LtPlan> plans_;
  bool lt_said_ = false;
  bool graphs_ = true, capturing_ = false;
  std::vector<const std::pair<void *, size_t> *> captured_;  // scratch entries buf gave a capture
  std::map<std::string, StepGraph> graph_;
  const mqb_model_params *p_ = nullptr;  // the open's parameters, until opened()

  // vae
  std::vector<int> ch_;
  int groups_ = 0, latent_ = 0;
  bool attn_ = false;
  float scaling_ = 1, shift_factor_ = 0;
  Conv post_quant_, conv_in_, conv_out_;
  Resnet mid_[2];
  GNorm attn_norm_, norm_out_;
  Lin attn_qkv_, attn_o_;
  struct Up {
    std::vector<Resnet> res;
    Conv up;
  };
  std::vector<Up> up_;
};

// image_family: the registration of a pipeline class M (built from the open's parameters, with
// generate(const mqb_image_args *)) under its family name, for the core's mqb_image_* entry
// points: MQB_REGISTER_FAMILY(image_family<Model>("<family>")) in the family's .cu.
template <class M>
CudaFamily image_family(const char *name) {
  CudaFamily f{name};
  f.image_open = [](const mqb_model_params *p) -> void * { return new M(p); };
  f.image_generate = [](void *m, const mqb_image_args *a) { static_cast<M *>(m)->generate(a); };
  f.image_close = [](void *m) { delete static_cast<M *>(m); };
  return f;
}

}  // namespace img
}  // namespace mqcuda
