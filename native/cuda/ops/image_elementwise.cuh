// image_elementwise.cuh: a diffusion pipeline's element-wise kernels: SwiGLU, bias, a product's
// epilogue when cuBLASLt has none, add, copy,
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

// epilogue_k: y[r, i] (row stride ldy, fp32 or bf16) = t[r, i] (row stride ldt) + b[i], then
// GELU-tanh when gelu: what a cuBLASLt bias or GELU-bias epilogue computes, for products it
// cannot fuse (t may be y: in place).
static __global__ void epilogue_k(const float *t, int ldt, const float *b, int N, bool gelu, void *y, bool ybf16, int ldy, size_t n) {
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x) {
    const unsigned r = (unsigned)x / (unsigned)N, i = (unsigned)x - r * (unsigned)N;
    float v = t[(size_t)r * ldt + i] + b[i];
    if (gelu) v = gelu_tanh_d(v);
    if (ybf16) ((bf16 *)y)[(size_t)r * ldy + i] = __float2bfloat16(v);
    else ((float *)y)[(size_t)r * ldy + i] = v;
  }
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

// tfreq_k: the timestep's sinusoidal embedding [cos | sin] (freq 256) of *t (device: a graphed
// step reads the step's value from a buffer written before each replay), as the CPU pipeline.
static __global__ void tfreq_k(const float *t, int half, bf16 *out) {
  const float tt = *t;
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
