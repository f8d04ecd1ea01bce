// image_elementwise.cuh: a diffusion pipeline's element-wise kernels: SwiGLU, bias, add, copy,
// casts, embedding rows, timestep frequencies, adaLN modulation, (un)patchify, the guided Euler
// step, the VAE's input scaling and the pixels out.
#pragma once
#include "image_device.cuh"

namespace mqcuda {
namespace img {

// swiglu_k: y[r, i] = silu(g[r, i]) * g[r, F + i] for g [rows, 2F], to bf16.
template <typename T>
static __global__ void swiglu_k(const T *g, int F, size_t n, bf16 *y) {
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x) {
    const unsigned r = (unsigned)x / (unsigned)F, i = (unsigned)x - r * (unsigned)F;  // n < 2^32 (checked by the caller)
    y[x] = __float2bfloat16(silu_d(tof(g[(size_t)r * 2 * F + i])) * tof(g[(size_t)r * 2 * F + F + i]));
  }
}

static __global__ void bias_k(float *y, const float *b, int N, size_t n) {
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x) y[x] += b[(unsigned)x % (unsigned)N];
}

static __global__ void add_k(float *y, const float *a, size_t n) {
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x) y[x] += a[x];
}

static __global__ void copy_k(float *y, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = x[i];
}

static __global__ void to_bf16_k(const float *x, bf16 *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = __float2bfloat16(x[i]);
}

static __global__ void silu_bf16_k(const float *x, bf16 *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = __float2bfloat16(silu_d(x[i]));
}

// fill_rows_k: rows [from, to) of x [., D] = row vector v (the pad tokens).
static __global__ void fill_rows_k(float *x, int D, const float *v) {
  for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)blockIdx.x * D + i] = v[i];
}

// tfreq_k: the timestep's sinusoidal embedding [cos | sin] (freq 256), as the CPU pipeline.
static __global__ void tfreq_k(float tt, int half, bf16 *out) {
  const float neg_log = (float)(-9.210340371976184);  // -log(10000) as the CPU's (float)(-std::log(10000.0))
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float f = expf(neg_log * (float)i / (float)half);
    const float a = tt * f;
    out[i] = __float2bfloat16(cosf(a));
    out[half + i] = __float2bfloat16(sinf(a));
  }
}

// mod_k: per block the adaLN outputs [4D] -> 1 + scale_msa, tanh(gate_msa), 1 + scale_mlp,
// tanh(gate_mlp); n blocks' vectors back to back.
static __global__ void mod_k(float *m, int D, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int part = (i / D) % 4;
    m[i] = (part == 0 || part == 2) ? 1.0f + m[i] : tanhf(m[i]);
  }
}

// patchify_k: latents [C, h, w] -> 2x2 patches [nimg, 4C], feature (ph*2 + pw)*C + c, bf16.
static __global__ void patchify_k(const float *lat, int C, int h, int w, bf16 *out) {
  const int wt = w / 2, P = 4 * C;
  const int n = (h / 2) * wt * P;
  for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < n; x += gridDim.x * blockDim.x) {
    const int tok = x / P, f = x % P, c = f % C, pp = f / C, ph = pp / 2, pw = pp % 2;
    const int y0 = tok / wt, x0 = tok % wt;
    out[x] = __float2bfloat16(lat[((size_t)c * h + (y0 * 2 + ph)) * w + (x0 * 2 + pw)]);
  }
}

static __global__ void unpatchify_k(const float *po, int C, int h, int w, float *out) {
  const int wt = w / 2, P = 4 * C;
  const int n = (h / 2) * wt * P;
  for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < n; x += gridDim.x * blockDim.x) {
    const int tok = x / P, f = x % P, c = f % C, pp = f / C, ph = pp / 2, pw = pp % 2;
    const int y0 = tok / wt, x0 = tok % wt;
    out[((size_t)c * h + (y0 * 2 + ph)) * w + (x0 * 2 + pw)] = po[x];
  }
}

// step_k: v = pos + g*(pos - neg) (cfg), lat += dt * -v (the flow-match Euler step).
static __global__ void step_k(float *lat, const float *pos, const float *neg, float g, float dt, int n, bool cfg) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float v = cfg ? pos[i] + g * (pos[i] - neg[i]) : pos[i];
    lat[i] = lat[i] + dt * -v;
  }
}

// vae_in_k: z [C, h, w] / scaling + shift -> channels-last [h*w, C].
static __global__ void vae_in_k(const float *z, int C, int hw, float scaling, float shift, float *x) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < C * hw; i += gridDim.x * blockDim.x) {
    const int c = i / hw, p = i % hw;
    x[(size_t)p * C + c] = z[i] / scaling + shift;
  }
}

// pixels_k: the VAE's [-1, 1] output -> clamp(x/2 + 1/2, 0, 1) floats and 8-bit (half to even).
static __global__ void pixels_k(const float *x, size_t n, float *img, unsigned char *rgb) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = fminf(1.0f, fmaxf(0.0f, x[i] * 0.5f + 0.5f));
    img[i] = v;
    rgb[i] = (unsigned char)rintf(v * 255.0f);
  }
}

}  // namespace img
}  // namespace mqcuda
