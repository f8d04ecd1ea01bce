// vit.cuh: the pieces of a ViT-style vision tower that the vision families' towers share
// (native/models/<family>.cu names its own tensors and order): products with an optional bias
// and activations into the compute type (moved from qwen3vl.cu), grow-only activation buffers,
// full attention within groups of patches (flash_attn.cuh's tensor-core kernel in bf16 towers),
// RMSNorm into the compute type and in place over strided rows (q/k norms), a residual add with
// an optional per-channel layer scale, and a Conv2d with kernel = stride (patch embedding) made a
// product by cutting the image into its patches' rows. fp32 everywhere but the products' inputs.
#pragma once
#include <type_traits>

#include "flash_attn.cuh"
#include "linear.cuh"
#include "vision.cuh"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Kernels

// vit_rms_kernel: y[r, :] = x[r, :] / sqrt(mean(x^2) + eps) * w into T, one block a row.
template <typename T>
__global__ void vit_rms_kernel(const float *__restrict__ x, int C, const float *__restrict__ w, float eps,
                               T *__restrict__ y) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const float *xr = x + (size_t)blockIdx.x * C;
  float s = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += xr[c] * xr[c];
  const float r = rsqrtf(block_sum(s, red) / (float)C + eps);
  T *yr = y + (size_t)blockIdx.x * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = TT<T>::fromf(xr[c] * r * w[c]);
}

// vit_rms_inplace_kernel: RMSNorm of C values at x + row * ld, in place, one block a row (a
// projection's q or k inside a fused qkv row).
static __global__ void vit_rms_inplace_kernel(float *__restrict__ x, int ld, int C, const float *__restrict__ w,
                                              float eps) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  float *xr = x + (size_t)blockIdx.x * ld;
  float s = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += xr[c] * xr[c];
  const float r = rsqrtf(block_sum(s, red) / (float)C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) xr[c] = xr[c] * r * w[c];
}

// vit_scale_add_kernel: x[i, c] += scale[c] * (y[i, c] + bias[c]) over total = rows * C values;
// scale NULL: 1, bias NULL: 0 (a residual branch with layer scale, InternViT's lambda_1/2).
static __global__ void vit_scale_add_kernel(float *__restrict__ x, const float *__restrict__ y,
                                            const float *__restrict__ bias, const float *__restrict__ scale, int C,
                                            size_t total) {
  pdl_wait();
  pdl_trigger();
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % C);
    const float v = y[i] + (bias ? bias[c] : 0.f);
    x[i] += scale ? scale[c] * v : v;
  }
}

// vit_patches_kernel: the rows of a Conv2d with kernel = stride = p over images px [n, 3, S, S]
// (S = side * p), one block a patch: row (img, py, pxi) holds the patch's pixels channels first,
// (c, ky, kx), as the Conv2d weight [out, 3, p, p] flattens, into T.
template <typename T>
__global__ void vit_patches_kernel(const float *__restrict__ px, int side, int p, T *__restrict__ out) {
  pdl_wait();
  pdl_trigger();
  const int patch = blockIdx.x, per = side * side, img = patch / per, py = (patch % per) / side, pxi = patch % side;
  const int S = side * p, K = 3 * p * p;
  const float *base = px + (size_t)img * 3 * S * S;
  T *o = out + (size_t)patch * K;
  for (int e = threadIdx.x; e < K; e += blockDim.x) {
    const int c = e / (p * p), ky = (e / p) % p, kx = e % p;
    o[e] = TT<T>::fromf(base[((size_t)c * S + py * p + ky) * S + pxi * p + kx]);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side

// VitBuffers: a tower's activation buffers by index, grown to the largest image seen and never
// shrunk (the tower runs on the model's stream, one image at a time).
struct VitBuffers {
  std::pair<void *, size_t> b[8] = {};
  void *get(int i, size_t bytes) {
    auto &x = b[i];
    if (x.second < bytes) {
      if (x.first) ck(cudaFree(x.first), "cudaFree");
      x.first = nullptr;
      ck(cudaMalloc(&x.first, bytes), fmt("cudaMalloc of %zu bytes (vision)", bytes).c_str());
      x.second = bytes;
    }
    return x.first;
  }
  VitBuffers() = default;
  VitBuffers(const VitBuffers &) = delete;
  VitBuffers &operator=(const VitBuffers &) = delete;
  ~VitBuffers() {
    for (auto &x : b)
      if (x.first) cudaFree(x.first);
  }
};

// TowerTimes: per KV slot, the time its images spent in the vision tower and projector
// (mqb_vision_ns): an event recorded on the model's stream before the encode (before its host
// preparation too, so an idle stream counts that as the CPU backend's wall clock does) and one
// after the projector. Nothing waits for them when they are recorded; elapsed() reads them when
// the runtime asks, at the sequence's end, long after the prefill step that ran the tower
// synchronised the stream. Callers hold the family's lock.
struct TowerTimes {
  struct Slot {
    cudaEvent_t a = nullptr, b = nullptr;
    bool timed = false;
  };
  std::vector<Slot> s;
  void resize(int slots) { s.resize(slots); }
  void begin(mqb_model &m, int slot) {
    Slot &x = s[slot];
    if (!x.a) ck(cudaEventCreate(&x.a), "cudaEventCreate (vision time)");
    if (!x.b) ck(cudaEventCreate(&x.b), "cudaEventCreate (vision time)");
    ck(cudaEventRecord(x.a, m.stream), "cudaEventRecord (vision time)");
  }
  void end(mqb_model &m, int slot) {
    ck(cudaEventRecord(s[slot].b, m.stream), "cudaEventRecord (vision time)");
    s[slot].timed = true;
  }
  void clear(int slot) { s[slot].timed = false; }
  // elapsed: ns between the slot's events; 0 when not timed, or when the second has not
  // completed (an encode still running: the call returns cudaErrorNotReady, not sticky).
  int64_t elapsed(int slot) const {
    const Slot &x = s[slot];
    if (!x.timed) return 0;
    float ms = 0.f;
    if (cudaEventElapsedTime(&ms, x.a, x.b) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return (int64_t)((double)ms * 1e6);
  }
  TowerTimes() = default;
  TowerTimes(const TowerTimes &) = delete;
  TowerTimes &operator=(const TowerTimes &) = delete;
  ~TowerTimes() {
    for (auto &x : s) {
      if (x.a) cudaEventDestroy(x.a);
      if (x.b) cudaEventDestroy(x.b);
    }
  }
};

// vis_linear: out[B, N] (+)= X[B, K] W^T + bias (cuBLAS through gemm; X and W in T; bias may
// be NULL).
template <typename T>
void vis_linear(mqb_model &m, const char *role, const void *X, int B, int K, const void *W, int N, const float *bias,
                float *out, bool acc) {
  gemm<T>(m, role, static_cast<const T *>(W), static_cast<const T *>(X), B, K, N, out, acc);
  if (!bias) return;
  const int total = B * N;
  launch(m, add_bias_kernel, dim3(std::min((total + 255) / 256, m.sms * 8)), dim3(256), 0, out, bias, N, total);
}

// vis_act: y = act(x) into T (vis_act_kernel: 0 identity, 1 gelu_pytorch_tanh, 2 exact GELU).
template <typename T>
void vis_act(mqb_model &m, const float *x, size_t n, int act, T *y) {
  launch(m, vis_act_kernel<T>, dim3((unsigned)std::min<size_t>((n + 255) / 256, (size_t)m.sms * 16)), dim3(256), 0, x,
         n, act, y);
}

// vit_attention: full (bidirectional) attention within each of G groups of Np rows (a tower's
// fixed-size tiles, or one group of all patches for a native-resolution tower) of qkv
// [G * Np, 3, heads, hd] (fp32, rows as the fused projection makes them) into
// y [G * Np, heads * hd] in T, scale applied to the scores.
// bf16 towers: the rows rounded to bf16 into scratch (G * Np * 3 * heads * hd elements), then
// img::flash_attention_batched (tensor cores, fp32 accumulation; the groups in one launch)
// straight into y: InternViT-300M's 1025 patches x 16 heads of 64 take 0.037 ms on an H100, 14x
// the materialised cuBLAS path (lab/cuda/flash_results.md), where vis_attn_kernel scored on the
// CUDA cores in fp32. fp32 and fp16 towers, a NULL scratch, or a shape the kernel refuses:
// vis_attn_kernel (fp32) into att [G * Np, heads * hd], then into y.
template <typename T>
void vit_attention(mqb_model &m, const float *qkv, int G, int Np, int heads, int hd, float scale, __nv_bfloat16 *scratch,
                   float *att, T *y) {
  const int vh = heads * hd;
  const size_t rows = (size_t)G * Np;
  bool bf = false;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) bf = scratch != nullptr;
  if (bf) {
    vis_act<__nv_bfloat16>(m, qkv, rows * 3 * vh, 0, scratch);
    if (img::flash_attention_batched(scratch, 3 * vh, scratch + vh, scratch + 2 * vh, 3 * vh,
                                     reinterpret_cast<__nv_bfloat16 *>(y), vh, Np, Np, heads, heads, hd, scale, false,
                                     m.stream, G, (long long)Np * 3 * vh, (long long)Np * 3 * vh, (long long)Np * vh))
      return;  // every group in one launch
  }
  const dim3 agrid((Np + VA_WARPS - 1) / VA_WARPS, heads);
  for (int t = 0; t < G; ++t) {
    const size_t r0 = (size_t)t * Np;
    if (bf) {
      const __nv_bfloat16 *q = scratch + r0 * 3 * vh;
      if (img::flash_attention(q, 3 * vh, q + vh, q + 2 * vh, 3 * vh, reinterpret_cast<__nv_bfloat16 *>(y + r0 * vh), vh,
                               Np, Np, heads, heads, hd, scale, false, m.stream))
        continue;
    }
    const float *q = qkv + r0 * 3 * vh;
    if (hd <= 64) launch(m, vis_attn_kernel<64>, agrid, dim3(VA_WARPS * 32), 0, q, Np, heads, hd, scale, att + r0 * vh);
    else launch(m, vis_attn_kernel<128>, agrid, dim3(VA_WARPS * 32), 0, q, Np, heads, hd, scale, att + r0 * vh);
    vis_act<T>(m, att + r0 * vh, (size_t)Np * vh, 0, y + r0 * vh);
  }
}

// vit_scale_add: x += scale * (y + bias) over rows x C (scale, bias may be NULL).
inline void vit_scale_add(mqb_model &m, float *x, const float *y, const float *bias, const float *scale, int C,
                          size_t rows) {
  const size_t n = rows * (size_t)C;
  launch(m, vit_scale_add_kernel, dim3((unsigned)std::min<size_t>((n + 255) / 256, (size_t)m.sms * 16)), dim3(256), 0,
         x, y, bias, scale, C, n);
}

}  // namespace mqcuda
