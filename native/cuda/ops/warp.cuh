// warp.cuh: sums and maxima over the 32 lanes of a warp (butterfly shuffles: every lane gets the
// result), shared by backend.cu (included inside its namespace, also in the CPU emulation, whose
// __shfl_xor_sync is emu_test.cc's) and the standalone probes (probe/df_probe.cu), so that a
// probe's reductions are the backend's. No includes: the includer brings the CUDA headers.
#pragma once

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
