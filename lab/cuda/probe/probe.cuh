// probe.cuh: what the standalone probes (mk_probe.cu, df_probe.cu, graph_probe.cu, chain_floor.cu, lt_autotune.cu) share:
// the CUDA error check, timing (of calls and of graph replays), a launch with programmatic dependent
// launch, graph instantiation, and
// the PTX they build persistent kernels from (mbarriers, bulk copies into shared memory, gpu-scope
// acquire/release). The probes stay standalone programs: one nvcc command each, no library.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

// median_ms: the median of reps device-event timings of f(false), each after an untimed f(true)
// (setup), the first warm of them dropped; sorted, if given, gets the kept timings in order.
template <typename F>
float median_ms(int reps, int warm, const F &f, std::vector<float> *sorted = nullptr) {
  static cudaEvent_t a, b;
  if (!a) {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  std::vector<float> ts;
  for (int r = 0; r < reps + warm; ++r) {
    f(true);
    CK(cudaEventRecord(a));
    f(false);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= warm) ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  if (sorted) *sorted = ts;
  return ts[ts.size() / 2];
}
// copy_gbs: the device-to-device copy rate of 1 GiB in GB/s, bytes read + written: the ceiling the
// probes' and the bench's bandwidth bound divide by.
inline double copy_gbs(int reps, int warm) {
  const size_t n = (size_t)1 << 30;
  char *src, *dst;
  CK(cudaMalloc(&src, n));
  CK(cudaMalloc(&dst, n));
  const float ms = median_ms(reps, warm, [&](bool setup) {
    if (!setup) CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
  });
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return 2.0 * n / (ms * 1e-3) / 1e9;
}

// launch_pdl launches k<<<grid, block, 0, s>>>(args...), with programmatic dependent launch
// (programmatic stream serialization) when pdl, as the backend launches its kernels.
template <typename... P, typename... A>
void launch_pdl(cudaStream_t s, dim3 grid, dim3 block, bool pdl, void (*k)(P...), A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, args...));
}

// graph_instantiate: cudaGraphInstantiate in CUDA 12's form, or CUDA 11's (a compile check with
// nvcc 11.8).
inline cudaError_t graph_instantiate(cudaGraphExec_t *ex, cudaGraph_t g) {
#if CUDART_VERSION < 12000
  return cudaGraphInstantiate(ex, g, nullptr, nullptr, 0);
#else
  return cudaGraphInstantiate(ex, g, 0);
#endif
}

// replay_us: GPU us per replay of the chain that capture() launches on s, captured once as a
// graph: the median of 7 timings of 20 back-to-back replays, after `warm` untimed replays;
// sorted, if given, gets the 7 in order.
template <typename C>
double replay_us(cudaStream_t s, const C &capture, int warm = 10, std::vector<double> *sorted = nullptr) {
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  capture();
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ex;
  CK(graph_instantiate(&ex, g));
  for (int w = 0; w < warm; ++w) CK(cudaGraphLaunch(ex, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> v;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    for (int k = 0; k < 20; ++k) CK(cudaGraphLaunch(ex, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(1000.0 * ms / 20);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ex));
  CK(cudaGraphDestroy(g));
  std::sort(v.begin(), v.end());
  if (sorted) *sorted = v;
  return v[v.size() / 2];
}

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
