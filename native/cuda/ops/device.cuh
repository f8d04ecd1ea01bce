// device.cuh: device-side helpers every kernel uses: element types (TT), programmatic dependent
// launch, warp and block reductions, dynamic shared memory.
#pragma once
#include "../common.cuh"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Device helpers

template <typename T>
struct TT;
template <>
struct TT<float> {
  static constexpr int CH = 4;  // elements per 16-byte vector
  static __device__ __forceinline__ float tof(float x) { return x; }
  static __device__ __forceinline__ float fromf(float x) { return x; }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};
template <>
struct TT<__nv_bfloat16> {
  static constexpr int CH = 8;
  static __device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 fromf(float x) { return __float2bfloat16(x); }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 t = __bfloat1622float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};
template <>
struct TT<__half> {
  static constexpr int CH = 8;
  static __device__ __forceinline__ float tof(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half fromf(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 t = __half22float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void *p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

#include "warp.cuh"  // warp_sum, warp_max
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// block_sum: every thread of the block must call it; red holds 32 floats of shared memory.
static __device__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (lane < nw) ? red[lane] : 0.f;
  return warp_sum(t);
}


// Dynamic shared memory (extern __shared__), spelled through a macro so the host-only smoke test
// (stub headers, MQB_HOST_TEST) can compile the kernels as plain functions.
#ifdef MQB_HOST_TEST
#define DYN_SMEM(T, name) static T name[16384]
#else
#define DYN_SMEM(T, name) extern __shared__ T name[]
#endif

}  // namespace mqcuda
