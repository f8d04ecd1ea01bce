// megakernel.cuh: the whole qwen3 decode step (up to mk::MAXB sequences, bf16 or fp16 weights) in
// one persistent launch. Included by backend.cu; device code only, the host side is mk_* there.
// Opt-in (built with cmake -DMQB_MEGAKERNEL=ON, run with MQB_MEGAKERNEL=1): correct on the H200,
// but not yet faster than the per-kernel path; NOTES.md ("Runs 2-4", "Runs 15-17") has the timing
// split, what was tried and what would make it pay.
//
// Why: a decode step of a small model is ~170 dependent kernels of a few microseconds each; at
// batch 1 the H200 streams the 1.2 GB of a Qwen3-0.6B-shaped model in ~0.3 ms, while launch, ramp
// and drain of 170 kernels cost ~1.1 ms (NOTES.md, run 1). Here one block per SM walks the phases
// of every layer and meets the other blocks at a grid barrier between phases (5 per layer):
//   P1 qkv    X = RMSNorm(res)*ln1 staged in shared memory; qkv = X Wqkv^T          (fp32 out)
//   P2 attn   per (sequence, KV head, position split): q/k RMSNorm, RoPE, K/V append,
//             attention; the last split to finish merges the partials                 (T out)
//   P3 o      res += attn Wo^T
//   P4 up     X = RMSNorm(res)*ln2 staged; act = silu(X Wg^T) * (X Wu^T)             (T out)
//   P5 down   res += act Wdown^T
// then the LM head over RMSNorm(res)*norm with the greedy argmax or a Gumbel-max draw fused in.
// Before it waits at a barrier, a block prefetches into L2 the weights it reads in the next
// phase, so the weight stream keeps going through the barrier.
//
// Matrix products use the tensor cores (mma.sync m16n8k16, fp32 accumulation): a warp owns a tile
// of 16 weight rows and a slice of K; the batch (padded to octets) is the n = 8 side. A lane loads
// 16 contiguous bytes of a weight row and the same 8 k of the input row; the k order inside one
// mma is a permutation shared by A and B, so no shuffling is needed. When a matrix has few tiles
// the warps of a block split K, and their partial sums are added in a fixed order (the result
// does not depend on timing: the same inputs give the same bits).
//
// Memory: activations written in this launch are read with ld.global.cg (L2), never through the
// non-coherent or L1 paths; weights are read with ld.global.nc.

namespace mk {

constexpr int THREADS = 256;  // 8 warps, up to 255 registers each: no spills
constexpr int WARPS = THREADS / 32;
constexpr int MAXB = 32;       // sequences per launch (4 octets)
using sk::XPAD;               // elements of padding per staged row: conflict-free 16-byte reads
constexpr int PREFETCH_MAX = 64 * 1024;  // bytes of next-phase weights a block prefetches

struct LayerW {
  const void *wqkv, *wo, *wup, *wdown;  // T [out, in]; wup is gate rows then up rows
  const float *ln1, *ln2, *qn, *kn;     // qn may be NULL (fault qwen3.drop_q_norm)
  void *kc, *vc;                        // T [slots, maxctx, nkv, D]
  float qscale;
};

struct Args {
  int L, H, nh, nkv, D, I, V, maxctx, B;
  float eps;
  const int *tok, *pos, *slot;
  const void *emb, *lm;
  const float *normf, *inv_freq;
  const LayerW *layers;
  float *res, *qkv;
  void *attn, *act;
  float *logits;                   // [B, V]; NULL: not written
  unsigned long long *keys;        // [B] argmax / sample keys (argkey packing)
  const float *inv_temp;           // [B]; 0 = greedy
  const unsigned long long *rkey;  // [B] per-step random key of each sequence
  unsigned int *bar;               // grid barrier counter, zeroed before the launch
  float *part_acc, *part_ml;       // attention partials [B*nkv*ATT_SPLIT_MAX][G*D] and [..][G][2]
  unsigned int *att_cnt;           // [B*nkv] splits done; zero between launches
  int dbg;                         // benchmark only: bit 0 skips attention, bit 1 the layers' matrix products
};

// The mma.sync fragments (mma, mma2) live in skinny.cuh, shared with the skinny products.
using sk::mma;
using sk::mma2;

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int *p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// grid_barrier: every block of the (co-resident) grid arrives, then waits for all; writes before
// it are visible to every block after it. target counts arrivals since the launch.
__device__ __forceinline__ void grid_barrier(unsigned int *bar, unsigned int &target) {
  __syncthreads();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    while (ld_acquire(bar) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ float4 ldcg4f(const float *p) { return __ldcg(reinterpret_cast<const float4 *>(p)); }

using sk::pack2;

// Work split of one matrix product over the grid: NT tiles of 16 rows, S warps per tile (a power
// of two dividing K/32), TPB = WARPS/S tiles per block per round.
struct Split {
  int NT, S, TPB, groups;  // groups: 32-k groups per warp slice
  __device__ Split(int N, int K) {
    NT = N / 16;
    const int kg = K / 32;
    S = WARPS;
    while (S > 1 && ((long)NT * S > (long)WARPS * gridDim.x || kg % S != 0)) S >>= 1;
    TPB = WARPS / S;
    groups = kg / S;
  }
};

// prefetch_phase asks L2 for the first-round weight rows this block will read in a product of
// N x K (W2 != NULL: the same rows of the paired second matrix too), at most PREFETCH_MAX bytes.
template <typename T>
__device__ void prefetch_phase(const T *W, const T *W2, int N, int K) {
  const Split sp(N, K);
  const size_t rowb = (size_t)K * sizeof(T);
  const int tile0 = blockIdx.x * sp.TPB;
  if (tile0 >= sp.NT) return;
  const int nt = min(sp.TPB, sp.NT - tile0);
  size_t bytes = (size_t)nt * 16 * rowb;
  if (bytes > PREFETCH_MAX) bytes = PREFETCH_MAX;
  const char *base = reinterpret_cast<const char *>(W + (size_t)tile0 * 16 * K);
  const char *base2 = W2 ? reinterpret_cast<const char *>(W2 + (size_t)tile0 * 16 * K) : nullptr;
  for (size_t off = (size_t)threadIdx.x * 128; off < bytes; off += (size_t)THREADS * 128) {
    prefetch_l2(base + off);
    if (base2) prefetch_l2(base2 + off);
  }
}

// stage_norm writes RMSNorm(src rows)*w into shared memory as T, NB*8 rows of ld = K + XPAD
// (rows >= B are zero). rstd needs MAXB floats of shared memory.
template <typename T, int NB>
__device__ void stage_norm(const float *src, const float *w, int B, int K, float eps, T *xs, float *rstd) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int b = warp; b < B; b += WARPS) {
    const float *x = src + (size_t)b * K;
    float ss = 0.f;
    for (int k = lane * 4; k < K; k += 128) {
      const float4 v = ldcg4f(x + k);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = warp_sum(ss);
    if (lane == 0) rstd[b] = rsqrtf(ss / (float)K + eps);
  }
  __syncthreads();
  const int ld = K + XPAD, nc = K / 8;
  for (int i = threadIdx.x; i < NB * 8 * nc; i += THREADS) {
    const int b = i / nc, c = i - b * nc;
    uint4 o = make_uint4(0u, 0u, 0u, 0u);
    if (b < B) {
      const float *x = src + (size_t)b * K + c * 8;
      const float4 v0 = ldcg4f(x), v1 = ldcg4f(x + 4);
      const float4 w0 = __ldg(reinterpret_cast<const float4 *>(w + c * 8));
      const float4 w1 = __ldg(reinterpret_cast<const float4 *>(w + c * 8 + 4));
      const float r = rstd[b];
      o.x = pack2<T>(v0.x * r * w0.x, v0.y * r * w0.y);
      o.y = pack2<T>(v0.z * r * w0.z, v0.w * r * w0.w);
      o.z = pack2<T>(v1.x * r * w1.x, v1.y * r * w1.y);
      o.w = pack2<T>(v1.z * r * w1.z, v1.w * r * w1.w);
    }
    *reinterpret_cast<uint4 *>(xs + (size_t)b * ld + c * 8) = o;
  }
  __syncthreads();
}

// Input rows of a product: staged in shared memory, or read from an activation in global memory.
template <typename T>
struct XShared {
  const T *xs;
  int ld;
  __device__ uint4 get(int b, int k) const { return *reinterpret_cast<const uint4 *>(xs + (size_t)b * ld + k); }
};
template <typename T>
struct XGlobal {
  const T *x;
  int ld, B;
  __device__ uint4 get(int b, int k) const {
    return b < B ? ldcg4(x + (size_t)b * ld + k) : make_uint4(0u, 0u, 0u, 0u);
  }
};

// gemm runs one product: for every tile of 16 rows of W (and, when W2 != NULL, the same rows of
// W2 with a second accumulator), acc = W_tile X^T over all K, then epi(row, b, acc, acc2) for
// every row of the tile and b < B. red: WARPS*32*NB*8 floats of shared memory (S > 1 only).
// PAIR says W2 is used (a template argument so the unpaired products keep half the registers).
template <typename T, int NB, int U, bool PAIR, typename X, typename Epi>
__device__ void gemm(const T *W, const T *W2, int N, int K, const X &x, int B, float *red, Epi &epi, bool skip) {
  const Split sp(N, K);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (skip) {
    epi.finish();
    return;
  }
  const int s = warp % sp.S;
  constexpr bool pair = PAIR;
  for (int base = blockIdx.x * sp.TPB; base < sp.NT; base += gridDim.x * sp.TPB) {
    const int tile = base + warp / sp.S;
    float acc[NB][4], acc2[NB][4];
#pragma unroll
    for (int o = 0; o < NB; ++o)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[o][e] = acc2[o][e] = 0.f;
    if (tile < sp.NT) {
      const size_t ra = (size_t)(tile * 16 + g) * K, rb = ra + (size_t)8 * K;
      const int g0 = s * sp.groups;
      for (int j = 0; j < sp.groups; j += U) {
        uint4 wa[U], wb[U], wa2[U], wb2[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (j + u < sp.groups) {
            const int k = (g0 + j + u) * 32 + t * 8;
            wa[u] = __ldg(reinterpret_cast<const uint4 *>(W + ra + k));
            wb[u] = __ldg(reinterpret_cast<const uint4 *>(W + rb + k));
            if (pair) {
              wa2[u] = __ldg(reinterpret_cast<const uint4 *>(W2 + ra + k));
              wb2[u] = __ldg(reinterpret_cast<const uint4 *>(W2 + rb + k));
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (j + u < sp.groups) {
            const int k = (g0 + j + u) * 32 + t * 8;
#pragma unroll
            for (int o = 0; o < NB; ++o) {
              const uint4 xv = x.get(o * 8 + g, k);
              mma2<T>(acc[o], wa[u], wb[u], xv);
              if (pair) mma2<T>(acc2[o], wa2[u], wb2[u], xv);
            }
          }
        }
      }
    }
    if (sp.S > 1) {
      // Partial sums of the K slices: slices 1..S-1 park theirs, slice 0 adds them in order.
      const int per = NB * 8;
      float *mine = red + ((size_t)warp * 32 + lane) * per;
      if (s != 0) {
#pragma unroll
        for (int o = 0; o < NB; ++o)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            mine[o * 4 + e] = acc[o][e];
            mine[NB * 4 + o * 4 + e] = acc2[o][e];
          }
      }
      __syncthreads();
      if (s == 0) {
        for (int q = 1; q < sp.S; ++q) {
          const float *p = red + ((size_t)(warp + q) * 32 + lane) * per;
#pragma unroll
          for (int o = 0; o < NB; ++o)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              acc[o][e] += p[o * 4 + e];
              acc2[o][e] += p[NB * 4 + o * 4 + e];
            }
        }
      }
      __syncthreads();
    }
    if (s == 0 && tile < sp.NT) {
#pragma unroll
      for (int o = 0; o < NB; ++o)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = tile * 16 + g + (e >= 2 ? 8 : 0);
          const int b = o * 8 + t * 2 + (e & 1);
          if (b < B) epi(row, b, acc[o][e], acc2[o][e]);
        }
    }
  }
  epi.finish();
}

struct EpiStore {  // out[b, row] = v (fp32)
  float *out;
  int N;
  __device__ void operator()(int row, int b, float v, float) const { __stcg(out + (size_t)b * N + row, v); }
  __device__ void finish() const {}
};
struct EpiResidual {  // res[b, row] += v; each element has one owner, so the update is plain
  float *res;
  int N;
  __device__ void operator()(int row, int b, float v, float) const {
    float *p = res + (size_t)b * N + row;
    __stcg(p, __ldcg(p) + v);
  }
  __device__ void finish() const {}
};
template <typename T>
struct EpiSwiGLU {  // act[b, row] = silu(gate) * up, in T
  T *act;
  int N;
  __device__ void operator()(int row, int b, float gt, float up) const {
    act[(size_t)b * N + row] = TT<T>::fromf(swiglu(gt, up));
  }
  __device__ void finish() const {}
};

// EpiHead: the LM head's epilogue: logits out (optional) and the best key per sequence.
template <int NB>
struct EpiHead {
  float *logits;
  int V, B;
  const float *inv_temp;
  const unsigned long long *rkey;
  unsigned long long *keys;
  unsigned long long best[NB][2];
  __device__ void init() {
#pragma unroll
    for (int o = 0; o < NB; ++o) best[o][0] = best[o][1] = 0ull;
  }
  __device__ void operator()(int row, int b, float v, float) {
    if (logits) __stcs(logits + (size_t)b * V + row, v);
    const unsigned long long k = score_key(v, row, b, Samp{inv_temp, rkey});
    const int o = b >> 3, c = b & 1;
#pragma unroll
    for (int q = 0; q < NB; ++q)
      if (q == o) {
        if (c == 0) best[q][0] = k > best[q][0] ? k : best[q][0];
        else best[q][1] = k > best[q][1] ? k : best[q][1];
      }
  }
  __device__ void finish() {
    const int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
    for (int o = 0; o < NB; ++o)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        unsigned long long k = best[o][c];
#pragma unroll
        for (int m = 4; m < 32; m <<= 1) {  // lanes with the same t hold the same sequence
          const unsigned long long w = __shfl_xor_sync(0xffffffffu, k, m);
          k = w > k ? w : k;
        }
        const int b = o * 8 + t * 2 + c;
        if (lane < 4 && b < B && k) atomicMax(keys + b, k);
      }
  }
};

// smem_bytes: dynamic shared memory the kernel needs for these shapes.
__host__ __device__ inline size_t smem_bytes(int NB, int H, int G, int D) {
  const size_t stage = (size_t)NB * 8 * (H + XPAD) * 2 + MAXB * sizeof(float);
  const size_t red = (size_t)WARPS * 32 * NB * 8 * sizeof(float);
  const size_t att = attn_smem(G, D);
  return (stage + red > att ? stage + red : att) + 64;
}

template <typename T, int NB>
__global__ void __launch_bounds__(THREADS, 1) decode_kernel(const Args a) {
  extern __shared__ __align__(16) unsigned char mk_smem[];
  const int tid = threadIdx.x;
  const int H = a.H, D = a.D, nh = a.nh, nkv = a.nkv, G = nh / nkv, B = a.B;
  const int QKV = (nh + 2 * nkv) * D, AO = nh * D;
  T *xs = reinterpret_cast<T *>(mk_smem);
  float *rstd = reinterpret_cast<float *>(mk_smem + (size_t)NB * 8 * (H + XPAD) * 2);
  float *red = rstd + MAXB;
  unsigned int target = 0;

  // P0: embedding into the residual; the keys of this step start at 0.
  if (blockIdx.x == 0 && tid < B) a.keys[tid] = 0ull;
  for (int i = blockIdx.x * THREADS + tid; i < B * (H / 8); i += gridDim.x * THREADS) {
    const int b = i / (H / 8), c = i - b * (H / 8);
    float f[8];
    TT<T>::unpack(__ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.emb) + (size_t)a.tok[b] * H) + c),
                  f);
    float4 *o = reinterpret_cast<float4 *>(a.res + (size_t)b * H + c * 8);
    __stcg(o, make_float4(f[0], f[1], f[2], f[3]));
    __stcg(o + 1, make_float4(f[4], f[5], f[6], f[7]));
  }
  prefetch_phase<T>(static_cast<const T *>(a.layers[0].wqkv), nullptr, QKV, H);
  grid_barrier(a.bar, target);

  for (int l = 0; l < a.L; ++l) {
    const LayerW &ly = a.layers[l];
    const T *wqkv = static_cast<const T *>(ly.wqkv), *wo = static_cast<const T *>(ly.wo);
    const T *wup = static_cast<const T *>(ly.wup), *wdown = static_cast<const T *>(ly.wdown);
    // P1 qkv
    {
      stage_norm<T, NB>(a.res, ly.ln1, B, H, a.eps, xs, rstd);
      EpiStore epi{a.qkv, QKV};
      gemm<T, NB, 4, false>(wqkv, static_cast<const T *>(nullptr), QKV, H, XShared<T>{xs, H + XPAD}, B, red, epi, (a.dbg & 2) != 0);
      prefetch_phase<T>(wo, nullptr, H, AO);
      grid_barrier(a.bar, target);
    }
    // P2 attention per (sequence, KV head, position split): with few sequences the positions
    // are split so every SM works; the split that finishes last for a (sequence, KV head)
    // merges the partials (counter in a.att_cnt, reset by that block) and writes attn.
    if (!(a.dbg & 1)) {
      const DecAttn<T> da{a.qkv, a.pos, a.slot, nh, nkv, D, a.maxctx, ly.qn, ly.kn, a.inv_freq, a.eps, ly.qscale,
                          static_cast<T *>(ly.kc), static_cast<T *>(ly.vc), static_cast<T *>(a.attn),
                          a.part_acc, a.part_ml, a.att_cnt};
      const int items = B * nkv;
      const int Sa = max(1, min(ATT_SPLIT_MAX, (int)gridDim.x / items));
      float *asm_ = reinterpret_cast<float *>(mk_smem);
      for (int it = blockIdx.x; it < items * Sa; it += gridDim.x) {
        const int z = it % Sa, bk = it / Sa;
        switch (G) {  // mk_setup admits G in {1, 2, 4, 8}
          case 1: attn_item<T, 1>(da, bk / nkv, bk % nkv, Sa, z, asm_); break;
          case 2: attn_item<T, 2>(da, bk / nkv, bk % nkv, Sa, z, asm_); break;
          case 4: attn_item<T, 4>(da, bk / nkv, bk % nkv, Sa, z, asm_); break;
          default: attn_item<T, 8>(da, bk / nkv, bk % nkv, Sa, z, asm_); break;
        }
      }
    }
    prefetch_phase<T>(wup, wup + (size_t)a.I * H, a.I, H);
    grid_barrier(a.bar, target);
    // P3 o_proj into the residual
    {
      EpiResidual epi{a.res, H};
      gemm<T, NB, (NB > 2 ? 2 : 4), false>(wo, static_cast<const T *>(nullptr), H, AO,
                                    XGlobal<T>{static_cast<const T *>(a.attn), AO, B}, B, red, epi, (a.dbg & 2) != 0);
      grid_barrier(a.bar, target);
    }
    // P4 gate/up with SwiGLU
    {
      stage_norm<T, NB>(a.res, ly.ln2, B, H, a.eps, xs, rstd);
      EpiSwiGLU<T> epi{static_cast<T *>(a.act), a.I};
      gemm<T, NB, 2, true>(wup, wup + (size_t)a.I * H, a.I, H, XShared<T>{xs, H + XPAD}, B, red, epi, (a.dbg & 2) != 0);
      prefetch_phase<T>(wdown, nullptr, H, a.I);
      grid_barrier(a.bar, target);
    }
    // P5 down into the residual
    {
      EpiResidual epi{a.res, H};
      gemm<T, NB, (NB > 2 ? 2 : 4), false>(wdown, static_cast<const T *>(nullptr), H, a.I,
                                    XGlobal<T>{static_cast<const T *>(a.act), a.I, B}, B, red, epi, (a.dbg & 2) != 0);
      if (l + 1 < a.L) prefetch_phase<T>(static_cast<const T *>(a.layers[l + 1].wqkv), nullptr, QKV, H);
      else prefetch_phase<T>(static_cast<const T *>(a.lm), nullptr, a.V, H);
      grid_barrier(a.bar, target);
    }
  }
  // LM head with the argmax / Gumbel draw.
  stage_norm<T, NB>(a.res, a.normf, B, H, a.eps, xs, rstd);
  EpiHead<NB> epi{a.logits, a.V, B, a.inv_temp, a.rkey, a.keys};
  epi.init();
  gemm<T, NB, 8, false>(static_cast<const T *>(a.lm), static_cast<const T *>(nullptr), a.V, H, XShared<T>{xs, H + XPAD}, B,
                 red, epi, false);
}

#ifdef MQB_TC_PRODUCTS
// ---------------------------------------------------------------------------------------------
// The same products as standalone kernels, for the per-kernel decode path of qwen3 bf16/fp16 at
// up to MAXB sequences (built with MQB_TC_PRODUCTS, used with MQB_TC_MIN_B): each is one phase of
// decode_kernel, with its input prep fused in (RMSNorm staged in shared memory, SwiGLU in the
// gate/up epilogue), so a layer is five launches (qkv, attention, o, gate/up, down) instead of
// cuBLAS plus three prep kernels. Before it waits for the previous kernel (PDL), a block asks L2
// for its first weight rows. Slower than cuBLAS + prep on the H200 (NOTES.md, run 5).

enum LinMode { LIN_QKV = 0, LIN_O = 1, LIN_UP = 2, LIN_DOWN = 3, LIN_HEAD = 4 };

struct LinArgs {
  const void *W;        // T [N, K]; LIN_UP: gate rows then up rows, N = intermediate size
  int N, K, B;
  float eps;
  const float *src;     // QKV, UP, HEAD: fp32 rows [B, K] to RMSNorm (the residual)
  const float *nw;      // their norm weight
  const void *x;        // O, DOWN: T rows [B, K] (attention output, SwiGLU activation)
  float *out;           // QKV: fp32 [B, N]; O, DOWN: the residual [B, N] (added to)
  void *act;            // UP: T [B, N]
  float *logits;        // HEAD: fp32 [B, N]
  unsigned long long *keys;
  const float *inv_temp;
  const unsigned long long *rkey;
};

template <typename T, int NB, int MODE>
__global__ void __launch_bounds__(THREADS, 1) linear_kernel(const LinArgs a) {
  extern __shared__ __align__(16) unsigned char mk_smem[];
  constexpr bool staged = MODE == LIN_QKV || MODE == LIN_UP || MODE == LIN_HEAD;
  const T *W = static_cast<const T *>(a.W);
  const T *W2 = MODE == LIN_UP ? W + (size_t)a.N * a.K : nullptr;
  T *xs = reinterpret_cast<T *>(mk_smem);
  float *rstd = reinterpret_cast<float *>(mk_smem + (staged ? (size_t)NB * 8 * (a.K + XPAD) * 2 : 0));
  float *red = rstd + MAXB;
  prefetch_phase<T>(W, W2, a.N, a.K);
  pdl_wait();
  pdl_trigger();
  if constexpr (staged) stage_norm<T, NB>(a.src, a.nw, a.B, a.K, a.eps, xs, rstd);
  const XShared<T> xsh{xs, a.K + XPAD};
  const XGlobal<T> xg{static_cast<const T *>(a.x), a.K, a.B};
  if constexpr (MODE == LIN_QKV) {
    EpiStore epi{a.out, a.N};
    gemm<T, NB, 4, false>(W, W2, a.N, a.K, xsh, a.B, red, epi, false);
  } else if constexpr (MODE == LIN_UP) {
    EpiSwiGLU<T> epi{static_cast<T *>(a.act), a.N};
    gemm<T, NB, 2, true>(W, W2, a.N, a.K, xsh, a.B, red, epi, false);
  } else if constexpr (MODE == LIN_HEAD) {
    EpiHead<NB> epi{a.logits, a.N, a.B, a.inv_temp, a.rkey, a.keys};
    epi.init();
    gemm<T, NB, 8, false>(W, W2, a.N, a.K, xsh, a.B, red, epi, false);
  } else {  // LIN_O, LIN_DOWN
    EpiResidual epi{a.out, a.N};
    gemm<T, NB, (NB > 2 ? 2 : 4), false>(W, W2, a.N, a.K, xg, a.B, red, epi, false);
  }
}

#endif  // MQB_TC_PRODUCTS

}  // namespace mk
