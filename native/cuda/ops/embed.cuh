// embed.cuh: token (and learned position) embedding into the fp32 residual.
#pragma once
#include "device.cuh"

namespace mqcuda {

template <typename T>
__global__ void __launch_bounds__(256) embed_kernel(const int *__restrict__ tok, const int *__restrict__ pos,
                                                    const T *__restrict__ wte, const float *__restrict__ wpe,
                                                    float *__restrict__ res, int H,
                                                    unsigned long long *keys, int R) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  if (keys && t == 0)  // argmax keys of this step start at 0 (below every packed logit)
    for (int i = threadIdx.x; i < R; i += blockDim.x) keys[i] = 0ull;
  const T *e = wte + (size_t)tok[t] * H;
  const float *pe = wpe ? wpe + (size_t)pos[t] * H : nullptr;
  float *o = res + (size_t)t * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = TT<T>::tof(e[i]) + (pe ? pe[i] : 0.f);
}

// prep_vec4 is prep_kernel's element-wise mode M (SWIGLU or GELU) 4 values at a time, for rows

}  // namespace mqcuda
