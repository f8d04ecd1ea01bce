// prep.cuh: the norms and activations that make a product's input row (RMSNorm, LayerNorm,
// SwiGLU, gelu_new, copy) and the bias add.
#pragma once
#include "device.cuh"

namespace mqcuda {

enum PrepMode { PREP_PLAIN = 0, PREP_RMS = 1, PREP_LN = 2, PREP_SWIGLU = 3, PREP_GELU = 4 };

// PrepArgs describes how the input row b of a linear layer is made:
//   PLAIN : srcT[r*ld + k]                       (already in T)
//   RMS   : src[r*ld + k] * rstd * w[k]          (RMSNorm)
//   LN    : (src - mean) * rstd * w[k] + bb[k]   (LayerNorm)
//   SWIGLU: silu(src[r*ld + k]) * src[r*ld + K + k]
//   GELU  : gelu_new(src[r*ld + k])
// with r = rows ? rows[b] : b.
template <typename T>
struct PrepArgs {
  int mode;
  const float *src;
  const T *srcT;
  int ld;
  const int *rows;
  const float *w;
  const float *bb;
  float eps;
};

// swiglu: silu(g) * u, qwen3's MLP activation (prep, the tile kernel's epilogue).
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.f + expf(-g)) * u; }

__device__ __forceinline__ float gelu_new(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// prep_elem is element k of source row r in the element-wise modes (PLAIN, SWIGLU, GELU).
// M >= 0 is a.mode known at compile time (prep_kernel's instances); -1 reads a.mode (the fused GEMV).
template <typename T, int M = -1>
__device__ __forceinline__ T prep_elem(const PrepArgs<T> &a, int r, int K, int k) {
  const int mode = M >= 0 ? M : a.mode;
  if (mode == PREP_PLAIN) return a.srcT[(size_t)r * a.ld + k];
  const float *x = a.src + (size_t)r * a.ld;
  if (mode == PREP_SWIGLU) {
    return TT<T>::fromf(swiglu(x[k], x[K + k]));
  }
  return TT<T>::fromf(gelu_new(x[k]));  // PREP_GELU
}

// PREP_REGS: values per thread that prep_row holds in registers, so rows of up to
// PREP_REGS * blockDim.x values (3,072 with 256 threads) take one round trip to memory (16 made
// the fused GEMV at 2-4 rows spill under its 64-register bound).
constexpr int PREP_REGS = 12;

// prep_row writes input row b (PrepArgs) into dst, K values, with the whole block. Every value a
// thread handles is loaded before any is stored (but LayerNorm's bias, read as it is stored:
// gpt2 only, and a third register array would spill): a loop that loads, converts and stores one
// value at a time waits a full memory round trip per iteration (the store to dst may alias the
// next load, so the compiler keeps them in order), which Nsight Compute showed as 17 us for the
// 3,072-wide SwiGLU row of a batch-1 down projection. The arithmetic and the order of
// every sum are those of the one-at-a-time loop (prep_row_long), so the results are the same bits.
template <typename T, int M = -1>
__device__ void prep_row_long(const PrepArgs<T> &a, int b, int K, T *dst, float *red);

// WP: wpre holds the norm's weights w[tid + j * nt], loaded already (prep_kernel, before its
// wait); rows too long for the registers (prep_row_long) load their own.
template <typename T, int M = -1, bool WP = false>
__device__ void prep_row(const PrepArgs<T> &a, int b, int K, T *dst, float *red, const float *wpre = nullptr) {
  const int tid = threadIdx.x, nt = blockDim.x, mode = M >= 0 ? M : a.mode;
  if (K > PREP_REGS * nt) {
    prep_row_long<T, M>(a, b, K, dst, red);
    return;
  }
  const int r = a.rows ? a.rows[b] : b;
  if (mode == PREP_PLAIN) {
    const T *x = a.srcT + (size_t)r * a.ld;
    T v[PREP_REGS];
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) v[j] = x[tid + j * nt];
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) dst[tid + j * nt] = v[j];
    return;
  }
  const float *x = a.src + (size_t)r * a.ld;
  float v[PREP_REGS], w[PREP_REGS];
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j) {
    const int k = tid + j * nt;
    v[j] = k < K ? x[k] : 0.f;
    // SwiGLU's up half, or the norm weight (it does not depend on the row: loaded alongside)
    if (k < K)
      w[j] = mode == PREP_SWIGLU ? x[K + k] : (mode == PREP_RMS || mode == PREP_LN) ? (WP ? wpre[j] : a.w[k]) : 0.f;
  }
  if (mode == PREP_SWIGLU || mode == PREP_GELU) {
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j) {
      const int k = tid + j * nt;
      if (k < K)
        dst[k] = TT<T>::fromf(mode == PREP_SWIGLU ? swiglu(v[j], w[j]) : gelu_new(v[j]));
    }
    return;
  }
  if (mode == PREP_RMS) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) ss += v[j] * v[j];
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)K + a.eps);
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) dst[tid + j * nt] = TT<T>::fromf(v[j] * rstd * w[j]);
    return;
  }
  // PREP_LN
  float sm = 0.f;
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j)
    if (tid + j * nt < K) sm += v[j];
  const float mean = block_sum(sm, red) / (float)K;
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j)
    if (tid + j * nt < K) {
      const float d = v[j] - mean;
      var += d * d;
    }
  const float rstd = rsqrtf(block_sum(var, red) / (float)K + a.eps);
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j) {
    const int k = tid + j * nt;
    if (k < K) dst[k] = TT<T>::fromf((v[j] - mean) * rstd * w[j] + a.bb[k]);
  }
}

// prep_row_long: prep_row for rows longer than PREP_REGS values per thread, one value at a time.
template <typename T, int M>
__device__ void prep_row_long(const PrepArgs<T> &a, int b, int K, T *dst, float *red) {
  const int r = a.rows ? a.rows[b] : b;
  const int tid = threadIdx.x, nt = blockDim.x, mode = M >= 0 ? M : a.mode;
  if (mode != PREP_RMS && mode != PREP_LN) {
    for (int k = tid; k < K; k += nt) dst[k] = prep_elem<T, M>(a, r, K, k);
    return;
  }
  const float *x = a.src + (size_t)r * a.ld;
  if (mode == PREP_RMS) {
    float ss = 0.f;
    for (int k = tid; k < K; k += nt) ss += x[k] * x[k];
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)K + a.eps);
    for (int k = tid; k < K; k += nt) dst[k] = TT<T>::fromf(x[k] * rstd * a.w[k]);
  } else {  // PREP_LN
    float s = 0.f;
    for (int k = tid; k < K; k += nt) s += x[k];
    const float mean = block_sum(s, red) / (float)K;
    float v = 0.f;
    for (int k = tid; k < K; k += nt) {
      float d = x[k] - mean;
      v += d * d;
    }
    const float rstd = rsqrtf(block_sum(v, red) / (float)K + a.eps);
    for (int k = tid; k < K; k += nt) dst[k] = TT<T>::fromf((x[k] - mean) * rstd * a.w[k] + a.bb[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels
// whose K, stride and base are multiples of 4 floats and no a.rows (linear checks). Each thread
// loads its next two groups of every source before it stores either: a grid-stride loop of
// single values waits a round trip per value (the stores may alias the next loads, as in
// prep_row), far from the copy rate on a 2,048-token chunk's SwiGLU (50 MB read): on the H200
// 32 prompts of 128 tokens spent 2.04 ms in the preps instead of 2.82, the call 14.4 instead of
// 15.1 (lab/cuda/NOTES.md). The same arithmetic per value as prep_elem, so the same bits.
template <typename T, int M>
__device__ void prep_vec4(const PrepArgs<T> &a, int B, int K, T *out) {
  struct __align__(8) T4 {
    T v[4];
  };
  const int K4 = K / 4;
  const size_t total = (size_t)B * K4, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += 2 * stride) {
    float4 g[2], u[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t j = i + h * stride;
      if (j < total) {
        const int b = (int)(j / K4), k = (int)(j - (size_t)b * K4) * 4;
        const float *x = a.src + (size_t)b * a.ld + k;
        g[h] = *reinterpret_cast<const float4 *>(x);
        if (M == PREP_SWIGLU) u[h] = *reinterpret_cast<const float4 *>(x + K);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t j = i + h * stride;
      if (j < total) {
        const float gv[4] = {g[h].x, g[h].y, g[h].z, g[h].w};
        const float uv[4] = {u[h].x, u[h].y, u[h].z, u[h].w};
        T4 o;
#pragma unroll
        for (int e = 0; e < 4; ++e) o.v[e] = TT<T>::fromf(M == PREP_SWIGLU ? swiglu(gv[e], uv[e]) : gelu_new(gv[e]));
        reinterpret_cast<T4 *>(out)[j] = o;
      }
    }
  }
}

// prep_kernel makes the T input rows [B, K] of a cuBLAS product (decode batches above gemv_max_b,
// prefill). Norms: a block per row (prep_row); element-wise modes: the grid strides over all B*K
// values, so a few rows of the 3072-wide SwiGLU still spread over many SMs.
// One instance per mode M (the launch's a.mode): one instance with every mode's code was 47 KB of
// instructions, fetched cold at each of a batch-32 layer's three preps (lab/cuda/NOTES.md).
// PRE (pre_params): a norm's weights are loaded before the wait (they do not depend on the
// previous kernel), for rows that fit prep_row's registers. V4 (prep_vec): the element-wise
// modes through prep_vec4.
template <typename T, int M, bool PRE = false, bool V4 = false>
__global__ void __launch_bounds__(256) prep_kernel(PrepArgs<T> a, int B, int K, T *__restrict__ out) {
  __shared__ float red[32];
  const int mode = M >= 0 ? M : a.mode;  // M = -1: the mode read from a
  const bool norm = mode == PREP_RMS || mode == PREP_LN;
  float wpre[PREP_REGS];
  if (PRE && norm) {
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j) {
      const int k = threadIdx.x + j * blockDim.x;
      wpre[j] = k < K ? a.w[k] : 0.f;
    }
  }
  pdl_wait();
  pdl_trigger();
  if (norm) {
    prep_row<T, M, PRE>(a, blockIdx.x, K, out + (size_t)blockIdx.x * K, red, wpre);
    return;
  }
  if constexpr (V4 && (M == PREP_SWIGLU || M == PREP_GELU)) {
    prep_vec4<T, M>(a, B, K, out);
    return;
  }
  const size_t total = (size_t)B * K;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const int b = (int)(i / K), k = (int)(i - (size_t)b * K);
    out[i] = prep_elem<T, M>(a, a.rows ? a.rows[b] : b, K, k);
  }
}

static __global__ void __launch_bounds__(256) add_bias_kernel(float *__restrict__ y, const float *__restrict__ bias, int N,
                                                       int total) {
  pdl_wait();
  pdl_trigger();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) y[i] += bias[i % N];
}

}  // namespace mqcuda
