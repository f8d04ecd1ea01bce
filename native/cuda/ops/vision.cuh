// vision.cuh: a vision tower's kernels (LayerNorm into T, activations, learned positions
// interpolated, 2-D rotary, bidirectional attention over an image's patches) and the decoder hooks that
// put image rows into the residual and make per-token M-RoPE rows.
#pragma once
#include "device.cuh"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Kernels

// vis_ln_kernel: y[r, :] = LayerNorm(x[r, :]) * w + b into T (a product's input), one block a row.
template <typename T>
__global__ void vis_ln_kernel(const float *__restrict__ x, int C, const float *__restrict__ w,
                              const float *__restrict__ b, float eps, T *__restrict__ y) {
  pdl_wait();  // launched programmatically (launch): the previous kernel's output is read
  pdl_trigger();
  __shared__ float red[32];
  const float *xr = x + (size_t)blockIdx.x * C;
  float s = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  const float mean = block_sum(s, red) / (float)C;
  float v = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = xr[c] - mean;
    v += d * d;
  }
  const float rstd = rsqrtf(block_sum(v, red) / (float)C + eps);
  T *yr = y + (size_t)blockIdx.x * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = TT<T>::fromf((xr[c] - mean) * rstd * w[c] + b[c]);
}

// vis_act_kernel: y = act(x) into T: 0 identity, 1 gelu_pytorch_tanh, 2 exact (erf) GELU.
template <typename T>
__global__ void vis_act_kernel(const float *__restrict__ x, size_t n, int act, T *__restrict__ y) {
  pdl_wait();  // launched programmatically (launch): the previous kernel's output is read
  pdl_trigger();
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float v = x[i];
    if (act == 1) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    else if (act == 2) v = 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    y[i] = TT<T>::fromf(v);
  }
}

// vis_pos_kernel: x[i, c] += sum over the 4 corners q of pos[idx[i, q], c] * wt[i, q].
static __global__ void vis_pos_kernel(float *__restrict__ x, int C, const float *__restrict__ pos,
                               const int *__restrict__ idx, const float *__restrict__ wt) {
  pdl_wait();  // launched programmatically (launch): the previous kernel's output is read
  pdl_trigger();
  const int i = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = pos[(size_t)idx[i * 4] * C + c] * wt[i * 4];
    for (int q = 1; q < 4; ++q) s += pos[(size_t)idx[i * 4 + q] * C + c] * wt[i * 4 + q];
    x[(size_t)i * C + c] += s;
  }
}

// vis_rope_kernel: 2-D rotary (rotate_half over head_dim hd, half = hd/2 frequencies whose
// (cos, sin) per patch are cs[i, j]) of q and k of every head, in place in qkv [N, 3, heads, hd].
static __global__ void vis_rope_kernel(float *__restrict__ qkv, int heads, int hd, const float2 *__restrict__ cs) {
  pdl_wait();  // launched programmatically (launch): the previous kernel's output is read
  pdl_trigger();
  const int i = blockIdx.x, half = hd / 2, vh = heads * hd;
  for (int e = threadIdx.x; e < 2 * heads * half; e += blockDim.x) {
    const int which = e / (heads * half), h = (e / half) % heads, j = e % half;
    float *v = qkv + (size_t)i * 3 * vh + (size_t)which * vh + (size_t)h * hd;
    const float2 c = cs[(size_t)i * half + j];
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * c.x - x2 * c.y;
    v[j + half] = x2 * c.x + x1 * c.y;
  }
}

constexpr int VA_WARPS = 8;  // queries per block of vis_attn_kernel (a warp each)
constexpr int VA_TILE = 32;  // key positions per shared-memory tile

// vis_attn_kernel: full (bidirectional) attention of the N patches of one image, grid
// (ceil(N / VA_WARPS), heads): each warp one query, online softmax over tiles of VA_TILE keys
// staged in shared memory (K rows padded by one float against bank conflicts); lane j scores
// key j of the tile, then every lane accumulates its hd/32 output values. out [N, heads*hd] fp32.
template <int HDMAX>
__global__ void __launch_bounds__(VA_WARPS * 32) vis_attn_kernel(const float *__restrict__ qkv, int N, int heads,
                                                                 int hd, float scale, float *__restrict__ out) {
  pdl_wait();
  pdl_trigger();
  __shared__ float ks[VA_TILE][HDMAX + 1];
  __shared__ float vs[VA_TILE][HDMAX];
  __shared__ float qs[VA_WARPS][HDMAX];
  __shared__ float ps[VA_WARPS][VA_TILE];
  constexpr int NV = HDMAX / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = blockIdx.y, vh = heads * hd;
  const int i = blockIdx.x * VA_WARPS + warp;
  const bool live = i < N;
  for (int d = lane; d < hd; d += 32) qs[warp][d] = live ? qkv[(size_t)i * 3 * vh + (size_t)h * hd + d] * scale : 0.f;
  float m = -INFINITY, l = 0.f, o[NV];
#pragma unroll
  for (int n = 0; n < NV; ++n) o[n] = 0.f;
  for (int j0 = 0; j0 < N; j0 += VA_TILE) {
    __syncthreads();
    for (int e = threadIdx.x; e < VA_TILE * hd; e += blockDim.x) {
      const int j = e / hd, d = e % hd;
      const bool in = j0 + j < N;
      const float *row = qkv + (size_t)(j0 + j) * 3 * vh + (size_t)h * hd + d;
      ks[j][d] = in ? row[vh] : 0.f;
      vs[j][d] = in ? row[2 * vh] : 0.f;
    }
    __syncthreads();
    float s = -INFINITY;
    if (j0 + lane < N) {
      s = 0.f;
      for (int d = 0; d < hd; ++d) s = fmaf(qs[warp][d], ks[lane][d], s);
    }
    const float mt = warp_max(s), mn = fmaxf(m, mt);
    const float p = s == -INFINITY ? 0.f : expf(s - mn), corr = m == -INFINITY ? 0.f : expf(m - mn);
    l = l * corr + warp_sum(p);
    m = mn;
#pragma unroll
    for (int n = 0; n < NV; ++n) o[n] *= corr;
    ps[warp][lane] = p;
    __syncwarp();
    const int cnt = min(VA_TILE, N - j0);
    for (int j = 0; j < cnt; ++j) {
      const float pj = ps[warp][j];
#pragma unroll
      for (int n = 0; n < NV; ++n)
        if (lane + 32 * n < hd) o[n] = fmaf(pj, vs[j][lane + 32 * n], o[n]);
    }
    __syncwarp();
  }
  if (live)
#pragma unroll
    for (int n = 0; n < NV; ++n)
      if (lane + 32 * n < hd) out[(size_t)i * vh + (size_t)h * hd + lane + 32 * n] = o[n] / l;
}

// img_rows_kernel: the image tokens' rows of the residual: src[t] (NULL: a text token) is the
// merged image embedding the token takes; with level >= 0 DeepStack feature `level` (stride[t]
// floats further per level) is added instead.
static __global__ void img_rows_kernel(float *__restrict__ res, int H, const float *const *__restrict__ src,
                                const int *__restrict__ stride, int level) {
  pdl_wait();
  pdl_trigger();
  const float *s = src[blockIdx.x];
  if (!s) return;
  float *r = res + (size_t)blockIdx.x * H;
  if (level < 0) {
    for (int c = threadIdx.x; c < H; c += blockDim.x) r[c] = s[c];
  } else {
    const float *f = s + (size_t)(level + 1) * stride[blockIdx.x];
    for (int c = threadIdx.x; c < H; c += blockDim.x) r[c] += f[c];
  }
}

// mrope_rows_kernel: for every token t whose rotary row rrow[t] is its own (>= max_ctx), that row
// of tab: frequency j takes position axis a(j) of pos3[t] (interleaved M-RoPE, as transformers'
// apply_interleaved_mrope: axis 1 where j % 3 == 1 and j < 3 s1, axis 2 where j % 3 == 2 and
// j < 3 s2, else axis 0), copied from that position's row (the same fp32 cos/sin bits).
static __global__ void mrope_rows_kernel(float2 *__restrict__ tab, int half, int max_ctx, const int *__restrict__ rrow,
                                  const int *__restrict__ pos3, int s1, int s2) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, row = rrow[t];
  if (row < max_ctx) return;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const int a = (j % 3 == 1 && j < 3 * s1) ? 1 : (j % 3 == 2 && j < 3 * s2) ? 2 : 0;
    tab[(size_t)row * half + j] = tab[(size_t)pos3[t * 3 + a] * half + j];
  }
}

}  // namespace mqcuda
