// image_device.cuh: helpers of the text-to-image pipelines' kernels (ops/image_*.cuh, im2col.cuh):
// bf16, block reductions over blocks of multiples of 32 threads, and KL, the launch spelling the
// host-only syntax check compiles.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#ifdef MQB_HOST_TEST
// Declarations the shared stub headers lack (check_syntax.sh compiles this file host-only).
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const void *, const void *, cudaDataType_t, int, long long, const void *,
                                          cudaDataType_t, int, long long, const void *, void *, cudaDataType_t, int,
                                          long long, int, cublasComputeType_t, cublasGemmAlgo_t);
float __shfl_xor_sync(unsigned, float, int, int);
#include <utility>
namespace mqcuda {
namespace img {
// EmuLaunch: a launch on the CPU emulation of the CUDA runtime (native/cuda/host_test/emu_cuda.h
// defines emu_launch). The kernels here loop over their elements with blockDim strides, so the
// emulation runs every block with 32 threads (one warp) whatever the launch asks: the same
// results, an eighth of the emulated threads.
template <typename F>
struct EmuLaunch {
  dim3 g;
  F f;
  template <typename... A>
  void operator()(A... a) const {
    const F k = f;
    emu_launch(g, dim3(32), [=]() { k(a...); });
  }
};
template <typename F>
EmuLaunch<F> emu_kl(dim3 g, F f) { return EmuLaunch<F>{g, f}; }
}  // namespace img
}  // namespace mqcuda
#define KL(k, g, b, s, st) ::mqcuda::img::emu_kl(dim3(g), [](auto... a_) { k(a_...); })
#else
#define KL(k, g, b, s, st) k<<<(g), (b), (s), (st)>>>
#endif



namespace mqcuda {
namespace img {

typedef __nv_bfloat16 bf16;

// Blocks are multiples of 32 threads; block_sum reduces over the whole block.

static __device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, 32);
  return v;
}

static __device__ float block_sum(float v, float *sh) {
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; i++) t += sh[i];
  return t;
}

static __device__ float block_max(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 32));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < nw; i++) t = fmaxf(t, sh[i]);
  return t;
}

static __device__ float silu_d(float x) { return x / (1.0f + expf(-x)); }
// gelu_tanh_d: GELU's tanh approximation, as torch's approximate="tanh" and cuBLASLt's epilogue.
static __device__ float gelu_tanh_d(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(bf16 x) { return __bfloat162float(x); }

}  // namespace img
}  // namespace mqcuda
