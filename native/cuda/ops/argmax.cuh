// argmax.cuh: greedy argmax and Gumbel-max sampling over a logits row (packed keys, atomicMax).
#pragma once
#include "device.cuh"

namespace mqcuda {

// argkey packs a logit and its index so that an unsigned max picks the largest logit and, among
// equal logits, the lowest index (torch.argmax's first occurrence).
__device__ __forceinline__ unsigned long long argkey(float v, int idx) {
  unsigned int u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)idx);
}

// decode_key is the index argkey packed (the host reads the argmax, advance_kernel feeds it on).
__host__ __device__ __forceinline__ int decode_key(unsigned long long k) {
  return (int)(0xFFFFFFFFu - (unsigned int)(k & 0xFFFFFFFFull));
}

// Samp carries the per-row sampling of a step: inv_temp[r] > 0 draws row r's token from
// softmax(logits / T) with the Gumbel-max trick (key rkey[r], fresh per step); 0 is greedy.
struct Samp {
  const float *inv_temp;
  const unsigned long long *rkey;
};

// gumbel_score: logit/T plus a Gumbel(0,1) variate hashed from (key, idx) (splitmix64), so that
// the argmax over the vocabulary is an exact draw from softmax(logits/T). 24 bits of uniform
// resolution: the variate lies within +-17.3.
__device__ __forceinline__ float gumbel_score(float v, float invT, unsigned long long key, int idx) {
  unsigned long long z = key + (unsigned long long)(idx + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float w = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);  // uniform on (0, 1)
  const float e = -log1pf(-w);                                       // Exp(1)
  return v * invT - logf(e);
}

// score_key is the argmax key of logit v at idx for row r under s (greedy when not sampling).
__device__ __forceinline__ unsigned long long score_key(float v, int idx, int r, const Samp &s) {
  const float it = s.inv_temp ? s.inv_temp[r] : 0.f;
  return argkey(it > 0.f ? gumbel_score(v, it, s.rkey[r], idx) : v, idx);
}
// argmax_kernel: grid (chunks, rows); each block reduces a chunk of one logits row.
static __global__ void __launch_bounds__(256) argmax_kernel(const float *__restrict__ logits, int V,
                                                     unsigned long long *keys, Samp samp) {
  __shared__ unsigned long long wbest[8];
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.y;
  const int chunk = (V + gridDim.x - 1) / gridDim.x;
  const int a = blockIdx.x * chunk, b = min(V, a + chunk);
  unsigned long long best = 0ull;
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) {
    unsigned long long k = score_key(logits[(size_t)r * V + i], i, r, samp);
    best = k > best ? k : best;
  }
  best = warp_max_u64(best);
  if ((threadIdx.x & 31) == 0) wbest[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) best = wbest[w] > best ? wbest[w] : best;
    if (best) atomicMax(keys + r, best);
  }
}

}  // namespace mqcuda
