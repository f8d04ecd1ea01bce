// image_attention.cuh: a pipeline's attention pieces around cuBLAS's batched products: per-head
// q/k RMSNorm and RoPE (rotate_half or interleaved pairs), the fp32 softmax to bf16, q|k|v split.
#pragma once
#include "image_device.cuh"

namespace mqcuda {
namespace img {

// qk_k: one (row, head) of a fused q|k|v row [ld] per block: per-head RMSNorm of q and k, RoPE,
// to bf16 q [rows, H*hd], k and v [rows, Hkv*hd]. neox: rotate_half pairs (i, i+hd/2) (Qwen3);
// else consecutive pairs (2i, 2i+1) (Z-Image's complex RoPE). cs/sn [rows, hd/2] per row.
template <typename T>
static __global__ void qk_k(const T *qkv, int ld, int H, int Hkv, int hd, const float *nq, const float *nk, float eps,
                     const float *cs, const float *sn, bool neox, bool norm_q, bf16 *q, bf16 *k, bf16 *v) {
  __shared__ float sh[32];
  __shared__ float buf[512];
  const int r = blockIdx.x, h = blockIdx.y;  // h < H: q head; H <= h < H+Hkv: k head; then v
  const int half = hd / 2;
  const T *src;
  const float *nw = nullptr;
  bf16 *dst;
  if (h < H) {
    src = qkv + (size_t)r * ld + h * hd, dst = q + (size_t)r * H * hd + h * hd, nw = norm_q ? nq : nullptr;
  } else if (h < H + Hkv) {
    src = qkv + (size_t)r * ld + H * hd + (h - H) * hd, dst = k + (size_t)r * Hkv * hd + (h - H) * hd, nw = nk;
  } else {
    src = qkv + (size_t)r * ld + (H + Hkv) * hd + (h - H - Hkv) * hd;
    dst = v + (size_t)r * Hkv * hd + (h - H - Hkv) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = __float2bfloat16(tof(src[i]));
    return;
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += tof(src[i]) * tof(src[i]);
  ss = block_sum(ss, sh);
  const float inv = 1.0f / sqrtf(ss / hd + eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = nw ? nw[i] * (tof(src[i]) * inv) : tof(src[i]);
  __syncthreads();
  const float *c = cs + (size_t)r * half, *s = sn + (size_t)r * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    if (neox) {
      const float x1 = buf[i], x2 = buf[i + half];
      dst[i] = __float2bfloat16(x1 * c[i] - x2 * s[i]);
      dst[i + half] = __float2bfloat16(x2 * c[i] + x1 * s[i]);
    } else {
      const float a = buf[2 * i], b = buf[2 * i + 1];
      dst[2 * i] = __float2bfloat16(a * c[i] - b * s[i]);
      dst[2 * i + 1] = __float2bfloat16(a * s[i] + b * c[i]);
    }
  }
}

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
