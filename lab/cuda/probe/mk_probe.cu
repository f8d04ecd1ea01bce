// mk_probe.cu: what the building blocks of a persistent decode kernel cost on this GPU, measured
// before one is built (NOTES.md, "Runs 66-75"). Standalone, on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/mk_probe native/cuda/probe/mk_probe.cu && /tmp/mk_probe [reps]
// PROBE_SET=handoff|protocols|overlap picks one of the three sets below (default: all),
// PROBE_ONLY=text keeps the configurations whose name contains it.
//
// Why: a decode step of the Qwen3-0.6B shape is ~140 dependent stages (5 per layer) over 1.15 GB
// of weights. A persistent kernel reaches the bandwidth bound only if (a) a stage handoff between
// all SMs costs well under the ~5 us that the per-kernel path spends per kernel, and (b) a weight
// stream that never waits for activations (a producer warp per SM copying into a shared-memory
// ring through the copy engine) keeps DRAM busy while the consumers run that chain of handoffs.
// This program measures both, apart and together, with no matrix arithmetic (a stage only reads
// its chunks and sums the values it exchanged): an upper bound on what such a kernel can reach.
//   chain   S stages of: each CTA writes its 8 x B outputs, grid handoff, every CTA reads all G x 8
//           x B values (through L2) and reduces them across the block (what an RMSNorm or a matrix
//           product's input needs). Handoff modes: 0 atomicAdd + __threadfence, 1 red.release +
//           ld.acquire on one counter, 2 one flag per CTA on its own 128-byte line (every CTA
//           polls all flags, no atomics), 3 the flags packed, 4 cooperative groups' grid.sync(),
//           5 mode 2 with relaxed flags (no ordering of the data: a timing, not a protocol),
//           6 NCCL's LL protocol (each value travels with its stage number in one 16-byte store,
//           readers poll the values themselves: no flag, no fence), 7 mode 5's handoff without
//           the data (the flags' round trips alone).
//   stream  a producer warp copies this CTA's share of S x CPS chunks of CHUNK bytes into a ring
//           of NST buffers (cp.async.bulk, mbarrier completion), at most nif in flight (0: the
//           ring's worth); the consumer warps wait for each chunk, read it from shared memory and
//           free the buffer.
//   both    stage s consumes its CPS chunks, then runs the chain's handoff (or, with spin, busy-
//           waits spin ns with no memory traffic: the chain's time without its round trips).
// Prints one line per configuration: median us of REPS launches, us per stage, GB/s of the stream.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe.cuh"

namespace cg = cooperative_groups;

constexpr int CONS = 256;  // consumer threads (8 warps); the producer is warp 8
constexpr int PAD = 32;    // words per flag in mode 2 (one 128-byte line each)

struct P {
  int S, CPS, NST, CHUNK, B, mode, stream, chain, hint, nif, spin_ns;
  unsigned *cnt, *flags;
  float *buf;
  const char *W;
  unsigned long long *sink;
};

__device__ __forceinline__ uint4 ld_volatile4(const uint4 *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile4(uint4 *p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, 256;" ::: "memory"); }  // consumers only

// handoff: every CTA's writes before it are visible to every CTA after it (generation gen >= 1).
__device__ __forceinline__ void handoff(const P &p, unsigned gen) {
  const int G = gridDim.x, tid = threadIdx.x;
  if (p.mode == 4) {  // cooperative groups: every thread of the grid, the producer warp too (see kernel)
    cg::this_grid().sync();
    return;
  }
  cbar();
  if (p.mode <= 1) {
    if (tid == 0) {
      if (p.mode == 0) {
        __threadfence();
        atomicAdd(p.cnt, 1u);
      } else {
        red_release_add(p.cnt, 1u);
      }
      while (ld_acquire(p.cnt) < gen * (unsigned)G) {
      }
    }
  } else if (p.mode == 5 || p.mode == 7) {  // timing only: no ordering of the data (wrong in general)
    if (tid == 0) st_relaxed(p.flags + (size_t)blockIdx.x * PAD, gen);
    for (int c = tid; c < G; c += CONS)
      while (ld_relaxed(p.flags + (size_t)c * PAD) < gen) {
      }
  } else {
    const int pad = p.mode == 2 ? PAD : 1;
    if (tid == 0) st_release(p.flags + (size_t)blockIdx.x * pad, gen);
    for (int c = tid; c < G; c += CONS)
      while (ld_acquire(p.flags + (size_t)c * pad) < gen) {
      }
  }
  cbar();
}

__global__ void __launch_bounds__(CONS + 32, 1) probe_kernel(const P p) {
  extern __shared__ __align__(1024) unsigned char ring[];
  __shared__ unsigned long long full[16], empty[16];
  __shared__ float red[CONS / 32];
  const int tid = threadIdx.x, G = gridDim.x, bid = blockIdx.x;
  if (tid == 0) {
    for (int i = 0; i < p.NST; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, CONS / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int total = p.S * p.CPS;
  if (tid >= CONS) {  // the producer warp
    if (p.mode == 4) {  // grid.sync needs every thread: the producer takes part in each stage
      if (p.chain)  // one grid.sync per stage, as the consumers' handoff()
        for (int s = 0; s < p.S; ++s) cg::this_grid().sync();
      return;
    }
    if (!p.stream || tid != CONS) return;
    unsigned long long pol = 0;
    if (p.hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    for (int k = 0; k < total; ++k) {
      const int slot = k % p.NST, round = k / p.NST;
      if (k >= p.NST) mbar_wait(empty + slot, (unsigned)(round - 1) & 1u);
      if (p.nif && k >= p.nif) {  // at most nif chunks in flight: chunk k - nif has landed
        const int q = k - p.nif;
        mbar_wait(full + q % p.NST, (unsigned)(q / p.NST) & 1u);
      }
      mbar_expect(full + slot, (unsigned)p.CHUNK);
      const char *src = p.W + (((size_t)(k / p.CPS) * G + bid) * p.CPS + (k % p.CPS)) * (size_t)p.CHUNK;
      bulk_copy(ring + (size_t)slot * p.CHUNK, src, (unsigned)p.CHUNK, full + slot, p.hint, pol);
    }
    return;
  }
  const int lane = tid & 31, warp = tid >> 5;
  unsigned long long acc = 0;
  float carry = (float)bid;
  const int nout = G * 8 * p.B;  // values every CTA reads per stage
  for (int s = 0; s < p.S; ++s) {
    if (p.stream) {
      for (int j = 0; j < p.CPS; ++j) {
        const int k = s * p.CPS + j, slot = k % p.NST, round = k / p.NST;
        mbar_wait(full + slot, (unsigned)round & 1u);
        const uint4 *c = reinterpret_cast<const uint4 *>(ring + (size_t)slot * p.CHUNK);
        for (int i = tid; i < p.CHUNK / 16; i += CONS) {
          const uint4 v = c[i];
          acc += v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);
      }
    }
    if (p.spin_ns) {  // the chain's time without its memory traffic
      if (tid == 0) {
        unsigned long long t0, t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        } while (t1 - t0 < (unsigned long long)p.spin_ns);
      }
      cbar();
      continue;
    }
    if (!p.chain) continue;
    if (p.mode == 7) {  // the handoff alone (relaxed flags), no data
      handoff(p, (unsigned)s + 1u);
      continue;
    }
    float *cur = p.buf + (size_t)(s & 1) * nout;
    float sum = 0.f;
    if (p.mode == 6) {
      // LL: every value travels with its stage's generation in one 16-byte store (two pairs), and
      // readers poll the values themselves: no flag, no fence (NCCL's LL protocol).
      uint4 *ll = reinterpret_cast<uint4 *>(p.buf) + (size_t)(s & 1) * (nout / 2);
      const unsigned gen = (unsigned)s + 1u;
      if (tid < 4 * p.B)
        st_volatile4(ll + (size_t)bid * 4 * p.B + tid,
                     make_uint4(__float_as_uint(carry + 2.f * tid), gen, __float_as_uint(carry + 2.f * tid + 1.f), gen));
      for (int i = tid; i < nout / 2; i += CONS) {
        uint4 v;
        do {
          v = ld_volatile4(ll + i);
        } while (v.y != gen || v.w != gen);
        sum += __uint_as_float(v.x) + __uint_as_float(v.z);
      }
    } else {
      if (tid < 8 * p.B) cur[(size_t)bid * 8 * p.B + tid] = carry + (float)tid;
      handoff(p, (unsigned)s + 1u);
      for (int i = tid * 4; i < nout; i += CONS * 4) {
        const float4 v = __ldcg(reinterpret_cast<const float4 *>(cur + i));
        sum += v.x + v.y + v.z + v.w;
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red[warp] = sum;
    cbar();
    float t = 0.f;
    for (int w = 0; w < CONS / 32; ++w) t += red[w];
    carry = t * 1e-9f;
    cbar();
  }
  if (tid == 0) atomicAdd(p.sink, acc + (unsigned long long)(carry != 12345.f));
}

int main(int argc, char **argv) {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, dev));
  const int G = pr.multiProcessorCount;
  const int reps = argc > 1 ? atoi(argv[1]) : 7;
  printf("PROBE %s, %d SMs, L2 %d MB, smem/block optin %zu KB\n", pr.name, G, pr.l2CacheSize >> 20,
         pr.sharedMemPerBlockOptin >> 10);
  const size_t wbytes = (size_t)1264 << 20;  // the largest stream (140 x 132 x 64 KB = 1.21 GB) fits
  const size_t bufbytes = (size_t)2 * G * 8 * 32 * 8;  // two stages of G x 8 x 32 values (LL: with their stage)
  char *W;
  CK(cudaMalloc(&W, wbytes));
  CK(cudaMemset(W, 0x3c, wbytes));
  // The device-to-device copy bandwidth (bytes read + written), the bench's ceiling.
  printf("PROBE d2d copy %.0f GB/s (1 GiB, median of %d)\n", copy_gbs(reps, 2), reps);
  unsigned *cnt, *flags;
  float *buf;
  unsigned long long *sink;
  CK(cudaMalloc(&cnt, 4096));
  CK(cudaMalloc(&flags, (size_t)G * PAD * 4));
  CK(cudaMalloc(&buf, bufbytes));
  CK(cudaMalloc(&sink, 8));
  const size_t smem = (size_t)200 << 10;
  CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, probe_kernel, CONS + 32, smem));
  if (occ < 1) {
    fprintf(stderr, "probe_kernel does not fit an SM\n");
    return 1;
  }
  struct C {
    const char *name;
    int S, CPS, NST, CHUNK, B, mode, stream, chain, hint, nif = 0, spin_ns = 0;
  };
  std::vector<C> cs;
  const int S = 140;  // one decode step's stages; its weights: 140 x 132 CTAs x 2 x 32 KB = 1.21 GB
  const char *only = getenv("PROBE_ONLY"), *set = getenv("PROBE_SET");
  auto in_set = [&](const char *name) { return !set || !strcmp(set, name); };
  if (in_set("handoff")) {  // run 66: the handoff modes, the stream, both together
    for (int mode = 0; mode <= 4; ++mode) cs.push_back({"chain B=1", 2000, 0, 0, 0, 1, mode, 0, 1, 0});
    for (int mode = 1; mode <= 3; ++mode) cs.push_back({"chain B=32", 2000, 0, 0, 0, 32, mode, 0, 1, 0});
    cs.push_back({"stream 6x32K", S, 2, 6, 32 << 10, 1, 1, 1, 0, 0});
    cs.push_back({"stream 6x32K hint", S, 2, 6, 32 << 10, 1, 1, 1, 0, 1});
    cs.push_back({"stream 12x16K", S, 4, 12, 16 << 10, 1, 1, 1, 0, 0});
    cs.push_back({"stream 3x64K", S, 1, 3, 64 << 10, 1, 1, 1, 0, 0});
    cs.push_back({"stream 4x32K", S, 2, 4, 32 << 10, 1, 1, 1, 0, 0});
    for (int mode = 1; mode <= 3; ++mode) cs.push_back({"both B=1 6x32K", S, 2, 6, 32 << 10, 1, mode, 1, 1, 0});
    cs.push_back({"both B=1 12x16K", S, 4, 12, 16 << 10, 1, 2, 1, 1, 0});
    cs.push_back({"both B=1 6x32K hint", S, 2, 6, 32 << 10, 1, 2, 1, 1, 1});
    cs.push_back({"both B=32 6x32K", S, 2, 6, 32 << 10, 32, 2, 1, 1, 0});
  }
  if (in_set("protocols")) {  // run 67: fenced, relaxed and LL handoffs, alone and beside the stream
    for (int mode : {1, 2, 5, 6}) {
      cs.push_back({"chain B=1", S, 0, 0, 0, 1, mode, 0, 1, 0});
      cs.push_back({"chain B=32", S, 0, 0, 0, 32, mode, 0, 1, 0});
      cs.push_back({"both B=1 6x32K", S, 2, 6, 32 << 10, 1, mode, 1, 1, 0});
      cs.push_back({"both B=32 6x32K", S, 2, 6, 32 << 10, 32, mode, 1, 1, 0});
    }
  }
  if (in_set("overlap")) {  // run 68: what keeps the chain and the stream from overlapping
    cs.push_back({"chain B=1", S, 0, 0, 0, 1, 2, 0, 1, 0});
    cs.push_back({"both B=1 6x32K", S, 2, 6, 32 << 10, 1, 2, 1, 1, 0});
    cs.push_back({"chain flags only", S, 0, 0, 0, 1, 7, 0, 1, 0});
    cs.push_back({"both flags only", S, 2, 6, 32 << 10, 1, 7, 1, 1, 0});
    for (int ns : {1000, 1800, 3000}) cs.push_back({"both spin", S, 2, 6, 32 << 10, 1, 2, 1, 0, 0, 0, ns});
    for (int nif : {1, 2, 3, 4}) cs.push_back({"stream nif 32K", S, 2, 6, 32 << 10, 1, 2, 1, 0, 0, nif});
    for (int nif : {2, 3, 4}) cs.push_back({"both nif 32K", S, 2, 6, 32 << 10, 1, 2, 1, 1, 0, nif});
    for (int nif : {2, 4, 6, 8}) cs.push_back({"both nif 16K", S, 4, 12, 16 << 10, 1, 2, 1, 1, 0, nif});
    cs.push_back({"stream 6x32K", S, 2, 6, 32 << 10, 1, 1, 1, 0, 0});
  }
  if (only) cs.erase(std::remove_if(cs.begin(), cs.end(), [&](const C &c) { return !strstr(c.name, only); }), cs.end());
  for (const C &c : cs) {
    P p{c.S, c.CPS, c.NST, c.CHUNK, c.B, c.mode, c.stream, c.chain, c.hint, c.nif, c.spin_ns, cnt, flags, buf, W, sink};
    if ((size_t)c.S * G * c.CPS * c.CHUNK > wbytes || (c.mode == 4 && c.stream)) {
      fprintf(stderr, "%s: stream larger than the buffer, or grid.sync with a stream (no producer then)\n", c.name);
      return 1;
    }
    const double us = 1e3 * median_ms(reps, 1, [&](bool setup) {
      if (setup) {
        CK(cudaMemset(cnt, 0, 4096));
        CK(cudaMemset(flags, 0, (size_t)G * PAD * 4));
        CK(cudaMemset(buf, 0, bufbytes));
        return;
      }
      void *args[] = {&p};
      CK(cudaLaunchCooperativeKernel((void *)probe_kernel, dim3(G), dim3(CONS + 32), args, smem, 0));
    });
    const double bytes = (double)c.S * G * c.CPS * c.CHUNK;
    printf("PROBE %-18s nif %d spin %4d mode %d S %4d: %9.1f us, %6.2f us/stage%s", c.name, c.nif, c.spin_ns,
           c.mode, c.S, us, us / c.S, c.stream ? "" : "\n");
    if (c.stream) printf(", stream %.0f GB/s (%.2f GB)\n", bytes / (us * 1e-6) / 1e9, bytes / 1e9);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
