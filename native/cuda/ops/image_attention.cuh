// image_attention.cuh: a pipeline's attention pieces around cuBLAS's batched products: per-head
// q/k RMSNorm and RoPE (interleaved pairs), the fp32 softmax to bf16, q|k|v split.
#pragma once
#include "image_device.cuh"

namespace mqcuda {
namespace img {

// ld2 and st2: elements 2i and 2i+1 of a bf16 row in one load or store (rows and heads start
// at even offsets, so the pairs are aligned).
__device__ __forceinline__ float2 ld2(const bf16 *p, int i) { return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162 *>(p)[i]); }
__device__ __forceinline__ void st2(bf16 *p, int i, float a, float b) {
  reinterpret_cast<__nv_bfloat162 *>(p)[i] = __nv_bfloat162{__float2bfloat16(a), __float2bfloat16(b)};
}

// qk_k: per-head RMSNorm of q and k (weights nq, nk; NULL: none) and RoPE on consecutive pairs
// (2i, 2i+1) (Z-Image's and FLUX's complex RoPE), from fused bf16 q|k|v rows [rows, ld] to bf16
// q [rows, H*hd], k and v [rows, Hkv*hd]. One warp per (row, head): units r * (H + 2 Hkv) + h,
// h < H a q head, then Hkv k heads, then Hkv v heads (copied), in grid-stride order over the
// block's warps; a lane holds whole pairs, so nothing goes through shared memory. A warp a unit,
// not a block: FLUX.1 at 1024² has 313k units of 128 elements, and with a 64-thread block each
// (two block-wide sums and a barrier per unit) a call took 152 us on an H100
// (lab/cuda/results/gpu_2026-12-07d_h100), about twice what its bytes need. cs/sn [rows, hd/2]
// per row; hd even.
static __global__ void qk_k(const bf16 *qkv, int rows, int ld, int H, int Hkv, int hd, const float *nq, const float *nk, float eps,
                            const float *cs, const float *sn, bf16 *q, bf16 *k, bf16 *v) {
  const int lane = threadIdx.x & 31, wb = threadIdx.x >> 5, nwb = blockDim.x >> 5, heads = H + 2 * Hkv, half = hd / 2;
  const size_t units = (size_t)rows * heads;
  for (size_t u = (size_t)blockIdx.x * nwb + wb; u < units; u += (size_t)gridDim.x * nwb) {
    const int r = (int)(u / heads), h = (int)(u % heads);
    const bf16 *src = qkv + (size_t)r * ld + (size_t)h * hd;  // q heads, k heads, v heads in order
    const float *nw;
    bf16 *dst;
    if (h < H) {
      dst = q + ((size_t)r * H + h) * hd, nw = nq;
    } else if (h < H + Hkv) {
      dst = k + ((size_t)r * Hkv + h - H) * hd, nw = nk;
    } else {
      dst = v + ((size_t)r * Hkv + h - H - Hkv) * hd;
      for (int i = lane; i < half; i += 32) reinterpret_cast<__nv_bfloat162 *>(dst)[i] = reinterpret_cast<const __nv_bfloat162 *>(src)[i];
      continue;
    }
    float ss = 0.f;
    for (int i = lane; i < half; i += 32) {
      const float2 x = ld2(src, i);
      ss += x.x * x.x + x.y * x.y;
    }
    const float inv = 1.0f / sqrtf(warp_sum(ss) / hd + eps);
    const float *c = cs + (size_t)r * half, *s = sn + (size_t)r * half;
    for (int i = lane; i < half; i += 32) {
      const float2 x = ld2(src, i);
      const float a = nw ? nw[2 * i] * (x.x * inv) : x.x, b = nw ? nw[2 * i + 1] * (x.y * inv) : x.y;
      st2(dst, i, a * c[i] - b * s[i], a * s[i] + b * c[i]);
    }
  }
}

// qk_blocks: qk_k's grid for rows of H + 2 Hkv heads in blocks of 256 threads (8 units a block).
inline unsigned qk_blocks(int rows, int H, int Hkv) { return (unsigned)(((size_t)rows * (H + 2 * Hkv) + 7) / 8); }

// softmax_k: one row of scores S [rows, n] per block: P = softmax(S * scale) in bf16; causal
// masks columns beyond the row's position (row % qlen, keys at the same positions).
static __global__ void softmax_k(const float *S, int n, float scale, int qlen, bool causal, bf16 *P) {
  __shared__ float sh[32];
  const float *s = S + (size_t)blockIdx.x * n;
  bf16 *p = P + (size_t)blockIdx.x * n;
  const int lim = causal ? (int)(blockIdx.x % qlen) + 1 : n;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, s[j] * scale);
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(s[j] * scale - mx);
  sum = block_sum(sum, sh);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < n; j += blockDim.x) p[j] = __float2bfloat16(j < lim ? expf(s[j] * scale - mx) * inv : 0.f);
}

// split3_k: rows q|k|v [rows, 3C] fp32 -> q, k, v [rows, C] bf16.
static __global__ void split3_k(const float *qkv, int C, size_t n, bf16 *q, bf16 *k, bf16 *v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / (3 * C);
    const int c = (int)(i % (3 * C)), part = c / C;
    bf16 *d = part == 0 ? q : part == 1 ? k : v;
    d[r * C + c % C] = __float2bfloat16(qkv[i]);
  }
}

}  // namespace img
}  // namespace mqcuda
