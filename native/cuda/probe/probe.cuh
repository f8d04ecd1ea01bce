// probe.cuh: what the standalone probes (mk_probe.cu, df_probe.cu) share: the CUDA error check and
// the PTX they build persistent kernels from (mbarriers, bulk copies into shared memory, gpu-scope
// acquire/release). The probes stay standalone programs: one nvcc command each, no library.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

// ld_acquire / ld_relaxed, st_release / st_relaxed: gpu-scope 32-bit loads and stores that differ
// only in their ordering (relaxed: mk_probe's timing-only modes).
#define PROBE_LD(NAME, SEM)                                                               \
  __device__ __forceinline__ unsigned NAME(const unsigned *p) {                           \
    unsigned v;                                                                           \
    asm volatile("ld." SEM ".gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");   \
    return v;                                                                             \
  }
#define PROBE_ST(NAME, SEM)                                                               \
  __device__ __forceinline__ void NAME(unsigned *p, unsigned v) {                         \
    asm volatile("st." SEM ".gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");      \
  }
PROBE_LD(ld_acquire, "acquire")
PROBE_LD(ld_relaxed, "relaxed")
PROBE_ST(st_release, "release")
PROBE_ST(st_relaxed, "relaxed")
#undef PROBE_LD
#undef PROBE_ST
__device__ __forceinline__ void red_release_add(unsigned *p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long *b, unsigned n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned long long *b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long *b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}" ::"r"(
          sa(b)),
      "r"(parity)
      : "memory");
}
// bulk_copy: bytes from global into this block's shared memory, completing on mbarrier b (with
// hint, under L2 cache policy pol).
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, unsigned long long *b,
                                          bool hint = false, unsigned long long pol = 0) {
  if (hint)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            sa(dst)),
        "l"(src), "r"(bytes), "r"(sa(b)), "l"(pol)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     sa(dst)),
                 "l"(src), "r"(bytes), "r"(sa(b))
                 : "memory");
}
