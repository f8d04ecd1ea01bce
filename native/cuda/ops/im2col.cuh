// im2col.cuh: 3x3 convolution rows (channels-last, bf16, zero padding) for one GEMM, and the
// nearest-neighbour 2x upsampling.
#pragma once
#include "image_device.cuh"

namespace mqcuda {
namespace img {

// im2col_k: x [h*w, Cin] fp32 -> col [h*w, Cin*9] bf16, column (c*3 + ky)*3 + kx, zero padding 1.
static __global__ void im2col_k(const float *x, int h, int w, int Cin, bf16 *col) {
  const size_t K = (size_t)Cin * 9, n = (size_t)h * w * K;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const unsigned p = (unsigned)i / (unsigned)K;
    const int kk = (int)((unsigned)i - p * (unsigned)K), c = kk / 9, ky = (kk % 9) / 3, kx = kk % 3;
    const int yy = (int)(p / (unsigned)w) + ky - 1, xx = (int)(p % (unsigned)w) + kx - 1;
    col[i] = __float2bfloat16((yy < 0 || yy >= h || xx < 0 || xx >= w) ? 0.f : x[((size_t)yy * w + xx) * Cin + c]);
  }
}

// up2_k: nearest 2x upsample of [h*w, C] to [2h*2w, C].
static __global__ void up2_k(const float *x, int h, int w, int C, float *y) {
  const size_t n = (size_t)4 * h * w * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const unsigned p = (unsigned)i / (unsigned)C;
    const int c = (int)((unsigned)i - p * (unsigned)C), yy = (int)(p / (unsigned)(2 * w)), xx = (int)(p % (unsigned)(2 * w));
    y[i] = x[((size_t)(yy / 2) * w + xx / 2) * C + c];
  }
}

}  // namespace img
}  // namespace mqcuda
