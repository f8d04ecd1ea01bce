// image_norm.cuh: a diffusion pipeline's norms: RMSNorm (to fp32 and/or bf16, gated residual
// add), the final adaLN LayerNorm, and GroupNorm (statistics in fp64, then apply with SiLU).
#pragma once
#include "image_device.cuh"

namespace mqcuda {
namespace img {

// rms_k: y = x * rsqrt(mean(x^2) + eps) * w [* scale] per row of D; to fp32 yf and/or bf16 yb.
static __global__ void rms_k(const float *x, int D, const float *w, const float *scale, float eps, float *yf, bf16 *yb) {
  __shared__ float sh[32];
  const float *xr = x + (size_t)blockIdx.x * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  const float inv = 1.0f / sqrtf(ss / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = w[i] * (xr[i] * inv);
    if (scale) v *= scale[i];
    if (yf) yf[(size_t)blockIdx.x * D + i] = v;
    if (yb) yb[(size_t)blockIdx.x * D + i] = __float2bfloat16(v);
  }
}

// rms_gate_add_k: x += gate * rmsnorm(t) * w per row (gate NULL: 1), the DiT blocks' residual.
static __global__ void rms_gate_add_k(float *x, const float *t, int D, const float *w, const float *gate, float eps) {
  __shared__ float sh[32];
  const float *tr = t + (size_t)blockIdx.x * D;
  float *xr = x + (size_t)blockIdx.x * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += tr[i] * tr[i];
  ss = block_sum(ss, sh);
  const float inv = 1.0f / sqrtf(ss / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) xr[i] += (gate ? gate[i] : 1.0f) * (w[i] * (tr[i] * inv));
}

// rms_gate_add_rms_k: rms_gate_add_k (x += gate * rmsnorm(t) * w) then rms_k of the new x
// (times w2 [and scale2]) to bf16 y, per row in one pass: the same arithmetic as the two kernels.
static __global__ void rms_gate_add_rms_k(float *x, const float *t, int D, const float *w, const float *gate, float eps,
                                          const float *w2, const float *scale2, bf16 *y) {
  __shared__ float sh[32];
  const float *tr = t + (size_t)blockIdx.x * D;
  float *xr = x + (size_t)blockIdx.x * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += tr[i] * tr[i];
  ss = block_sum(ss, sh);
  const float inv = 1.0f / sqrtf(ss / D + eps);
  float s2 = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    xr[i] += (gate ? gate[i] : 1.0f) * (w[i] * (tr[i] * inv));
    s2 += xr[i] * xr[i];
  }
  s2 = block_sum(s2, sh);
  const float inv2 = 1.0f / sqrtf(s2 / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = w2[i] * (xr[i] * inv2);
    if (scale2) v *= scale2[i];
    y[(size_t)blockIdx.x * D + i] = __float2bfloat16(v);
  }
}

// ln_scale_k: the final layer's LayerNorm (no affine, eps 1e-6) times (1 + sc), to bf16.
static __global__ void ln_scale_k(const float *x, int D, const float *sc, bf16 *y) {
  __shared__ float sh[32];
  const float *xr = x + (size_t)blockIdx.x * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, sh) / D;
  float v = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = 1.0f / sqrtf(block_sum(v, sh) / D + 1e-6f);
  for (int i = threadIdx.x; i < D; i += blockDim.x) y[(size_t)blockIdx.x * D + i] = __float2bfloat16((xr[i] - mean) * inv * (1.0f + sc[i]));
}

// gn_stats_k: per group and block, partial sums of x and x^2 over [n, C] (groups of C/G
// channels) to part[(g * gridDim.x + block) * 2]; gn_sum_k adds them in a fixed order, so the
// statistics (and the pixels) are the same on every run.
static __global__ void gn_stats_k(const float *x, int n, int C, int G, double *part) {
  __shared__ float sh[32];
  const int g = blockIdx.y, per = C / G;
  const size_t cnt = (size_t)n * per;
  float s = 0.f, ss = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < cnt; i += (size_t)gridDim.x * blockDim.x) {
    const float v = x[(size_t)((unsigned)i / (unsigned)per) * C + g * per + (unsigned)i % (unsigned)per];
    s += v, ss += v * v;
  }
  s = block_sum(s, sh);
  ss = block_sum(ss, sh);
  if (threadIdx.x == 0) {
    part[((size_t)g * gridDim.x + blockIdx.x) * 2] = (double)s;
    part[((size_t)g * gridDim.x + blockIdx.x) * 2 + 1] = (double)ss;
  }
}

// gn_sum_k: the partial sums in a fixed order, in double (E[x^2] - mean^2 cancels), to each
// group's mean and 1/sqrt(var + 1e-6) as floats: gn_apply_k's per-element work is then float only.
static __global__ void gn_sum_k(const double *part, int chunks, int G, double cnt, float2 *stats) {
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    double s = 0, ss = 0;
    for (int c = 0; c < chunks; c++) s += part[((size_t)g * chunks + c) * 2], ss += part[((size_t)g * chunks + c) * 2 + 1];
    const double mean = s / cnt, var = fmax(0.0, ss / cnt - mean * mean);
    stats[g] = make_float2((float)mean, (float)(1.0 / sqrt(var + 1e-6)));
  }
}

// gn_apply_k: (x - mean) * rstd * gamma + beta [then SiLU], in place or to y, VEC channels a
// thread (C % VEC == 0).
template <int VEC>
static __global__ void gn_apply_k(const float *x, size_t n, int C, int G, const float2 *stats, const float *gamma,
                                  const float *beta, bool act, float *y) {
  const int per = C / G;
  for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
    float v[VEC];
    if constexpr (VEC == 4) {
      const float4 t = *reinterpret_cast<const float4 *>(x + i);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
      v[0] = x[i];
    }
    const int c0 = (int)((unsigned)i % (unsigned)C);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const int c = c0 + j;
      const float2 st = stats[c / per];
      v[j] = (v[j] - st.x) * st.y * gamma[c] + beta[c];
      if (act) v[j] = silu_d(v[j]);
    }
    if constexpr (VEC == 4) {
      *reinterpret_cast<float4 *>(y + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      y[i] = v[0];
    }
  }
}

}  // namespace img
}  // namespace mqcuda
