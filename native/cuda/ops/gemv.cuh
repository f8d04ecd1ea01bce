// gemv.cuh: the small-batch matrix-vector product with the input's prep fused in front and the
// bias, residual add and argmax behind.
#pragma once
#include "prep.cuh"
#include "argmax.cuh"

namespace mqcuda {

// gemv_kernel: out[b, n] (+)= sum_k W[n, k] * x_b[k] + bias[n] for B <= 4 rows, x_b made by
// prep_row into shared memory. Each warp owns whole output rows (grid-stride); every lane loads
// 16-byte vectors, U of them in flight. With keys != NULL it also reduces the greedy argmax.
template <typename T, int B>
__global__ void __launch_bounds__(256, 4) gemv_kernel(PrepArgs<T> a, int K, const T *__restrict__ W, int N,
                                                   const float *__restrict__ bias, float *out, int accumulate,
                                                   unsigned long long *keys, Samp samp) {
  constexpr int CH = TT<T>::CH;
  constexpr int U = 4;
  DYN_SMEM(uint4, gsm_raw);
  T *xs = reinterpret_cast<T *>(gsm_raw);
  __shared__ float red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nch = K / CH;
  const int gw = blockIdx.x * 8 + warp, nw = gridDim.x * 8;
  if (gw < N) {  // weights do not depend on earlier kernels: start pulling them into L2 now
    const char *wr = reinterpret_cast<const char *>(W + (size_t)gw * K);
    const int bytes = K * (int)sizeof(T);
    for (int off = lane * 128; off < bytes; off += 32 * 128) prefetch_l2(wr + off);
  }
  pdl_wait();
  pdl_trigger();
  for (int b = 0; b < B; ++b) prep_row<T>(a, b, K, xs + (size_t)b * K, red);
  __syncthreads();
  unsigned long long best[B];
#pragma unroll
  for (int b = 0; b < B; ++b) best[b] = 0ull;
  for (int row = gw; row < N; row += nw) {
    const uint4 *wr = reinterpret_cast<const uint4 *>(W + (size_t)row * K);
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = 0.f;
    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
      uint4 wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * 32;
        if (c < nch) wv[u] = __ldg(wr + c);
        else wv[u] = make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * 32;
        if (c < nch) {
          float wf[CH];
          TT<T>::unpack(wv[u], wf);
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const uint4 xv = reinterpret_cast<const uint4 *>(xs + (size_t)b * K)[c];
            float xf[CH];
            TT<T>::unpack(xv, xf);
#pragma unroll
            for (int e = 0; e < CH; ++e) acc[b] = fmaf(wf[e], xf[e], acc[b]);
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = warp_sum(acc[b]);
    if (lane == 0) {
      const float bv = bias ? bias[row] : 0.f;
#pragma unroll
      for (int b = 0; b < B; ++b) {
        float *o = out + (size_t)b * N + row;
        float v = acc[b] + bv;
        if (accumulate) v += *o;
        *o = v;
        if (keys) {
          unsigned long long k = score_key(v, row, b, samp);
          best[b] = k > best[b] ? k : best[b];
        }
      }
    }
  }
  if (keys && lane == 0) {
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (best[b]) atomicMax(keys + b, best[b]);
  }
}

}  // namespace mqcuda
