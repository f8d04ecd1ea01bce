// tile.cuh: out[B, N] (+)= X[B, K] W[N, K]^T for 1..32 rows in bf16/fp16 (fp32 accumulation),
// the layers' decode products (by default up to 16 rows: see the measurements below). Included
// by backend.cu (also in the CPU emulation, which computes the mma fragments in emu_test.cc);
// the host side is tile_cfg / tile_linear / tile_fused there. The mma.sync
// fragment helpers here serve prefill_attn.cuh too.
//
// Why not cuBLAS: its products of a batch-32 step take 0.797 ms for 1.19 GB of weights (NOTES.md,
// LM head included), about 1.5 TB/s of the H200's 4.2: a product of 4-13 MB is over
// before its kernels reach full speed.
//
// Shape of the work: a block is 8 warps; warp w owns a 16-row tile (w / KS of the block's RT
// tiles) and a K slice of Kw columns (w % KS); all 8 share the block's K range of Kc = KS * Kw
// columns, staged once in shared memory. A warp loads its whole weight slice (Kw <= 384: up to
// 24 16-byte vectors per lane) into registers before it waits for the previous kernel
// (programmatic dependent launch): weights never depend on it, so the stream starts while that
// kernel drains. The block's KS slices are added in slice order through shared memory; when K is
// split over Z blocks (grid.y), each writes its partial tile to a workspace and the block that
// finishes last for a row block adds the Z partials in split order. Every sum has a fixed order,
// so the same inputs give the same bits whatever the timing.
//
// Measured on the H200 (lab/cuda/NOTES.md, Qwen3-0.6B shape): decode at batch 8 5,945-6,031
// tok/s against 5,502-5,549 through cuBLAS; at batch 16 9,472-9,758 against 10,491-10,579; at
// batch 32 13,564-14,465 (11,953 with the worst forced shape) against 19,012-19,274. In isolation
// (Nsight Compute, batch 32) a product takes 11-23 us against cuBLAS's 7.3-8.8. Halving its
// instructions (weights loaded word by word into the mma quads, no register moves) left
// the time unchanged: what limits it is each block's load latency (one 8-warp block per SM, all
// of a warp's loads issued then waited for, no pipeline), where cuBLAS runs TMA pipelines.
// Those figures are of a kernel holding a warp's whole weight slice in registers (the "skinny"
// kernel of lab/cuda/NOTES.md); tile_kernel (below), making the RMSNorm of its input and the
// SwiGLU of gate/up itself (TileFuse), beat it at 5-8 rows by 17 % and the fused GEMV at 1-4, so
// it takes every batch up to 16.
#pragma once
#include "prep.cuh"

namespace mqcuda {

namespace sk {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int GMAX = 12;       // 32-column groups a warp holds in registers (Kw <= 384)
constexpr int KC_MAX = 3072;   // a block's K range, bounded by its shared memory (214 KB at 32 rows)
constexpr int ZU = 4;          // K splits whose partials a lane loads at once when it adds them
constexpr int MAXB = 32;
constexpr int XPAD = 32;  // elements of padding per staged row: conflict-free 16-byte reads

template <typename T>
__device__ __forceinline__ void mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1);

// pack2: two floats rounded to T (round to nearest), a in the low half: an mma.sync operand
// register made from fp32 values (prefill_attn.cuh's P).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const T x = TT<T>::fromf(a), y = TT<T>::fromf(b);
  uint16_t ux, uy;
  memcpy(&ux, &x, 2);
  memcpy(&uy, &y, 2);
  return (uint32_t)ux | ((uint32_t)uy << 16);
}
#ifdef MQB_HOST_TEST
// The CPU emulation (host_test/emu_test.cc) computes mma.sync m16n8k16 from the warp's fragments
// as the PTX ISA lays them out, so the tile products run there too.
void mma_emu(float c[4], const uint32_t a[4], const uint32_t b[2], bool bf16);
template <>
inline void mma<__nv_bfloat16>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  mma_emu(c, a, b, true);
}
template <>
inline void mma<__half>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  mma_emu(c, a, b, false);
}
#else
// The bf16 and fp16 forms differ only in the PTX type of A and B.
#define SK_MMA(TY, PTX)                                                                                   \
  template <>                                                                                           \
  __device__ __forceinline__ void mma<TY>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, \
                                          uint32_t b0, uint32_t b1) {                                   \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX                                   \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                           \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                       \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                               \
  }
SK_MMA(__nv_bfloat16, "bf16")
SK_MMA(__half, "f16")
#undef SK_MMA
#endif

// mma2 multiplies the 16x32 weight block held as two rows' 16-byte vectors (wa: row g, wb: row
// g+8, k = 8t..8t+7 of a 32-k group) with the matching 8 k of the batch octet's row g (xv).
template <typename T>
__device__ __forceinline__ void mma2(float c[4], const uint4 &wa, const uint4 &wb, const uint4 &xv) {
  mma<T>(c, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
  mma<T>(c, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
}

// Shape is what both kernels' launch shapes have: RT row tiles of 16 x KS K slices per block
// (RT * KS = 8 warps), Z blocks along K (Z = 0: no shape).
struct Shape {
  int RT = 0, KS = 0, Z = 0;
  int row_blocks(int N) const { return (N / 16 + RT - 1) / RT; }  // grid.x
  int blocks(int N) const { return row_blocks(N) * Z; }
};

// stage16 copies 16 bytes from global memory (written by an earlier kernel: through L2) into
// shared memory without holding them in registers (cp.async), so a block's whole input range is
// in flight at once; stage_wait waits for this thread's copies.
__device__ __forceinline__ void stage16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__)
  const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
  *reinterpret_cast<uint4 *>(dst) = ldcg4(src);
#endif
}
__device__ __forceinline__ void stage_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// add_slices adds the KS K slices of each row tile in slice order: slices 1..KS-1 park their sums
// in red (shared memory, WARPS * 32 * NB float4), slice 0 adds them. Every thread calls it.
template <int NB>
__device__ __forceinline__ void add_slices(float (&acc)[NB][4], float *red, int warp, int lane, int ks, int KS) {
  if (KS == 1) return;
  float *mine = red + ((size_t)warp * 32 + lane) * NB * 4;
  if (ks != 0) {
#pragma unroll
    for (int o = 0; o < NB; ++o)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[o * 4 + e] = acc[o][e];
  }
  __syncthreads();
  if (ks == 0)
    for (int q = 1; q < KS; ++q) {
      const float *p = red + ((size_t)(warp + q) * 32 + lane) * NB * 4;
#pragma unroll
      for (int o = 0; o < NB; ++o)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[o][e] += p[o * 4 + e];
    }
}

// sum_splits sets acc to the sum of Z parked partials, load(q, o) being split q's float4 o, added
// in split order (ZU splits' loads in flight at a time): split_total's two ways of finishing a K
// split differ only in where the partials are read.
template <int NB, typename L>
__device__ __forceinline__ void sum_splits(float (&acc)[NB][4], int Z, const L &load) {
  float s[NB][4] = {};
  for (int q0 = 0; q0 < Z; q0 += ZU) {
    float4 p[ZU][NB];
#pragma unroll
    for (int u = 0; u < ZU; ++u)
#pragma unroll
      for (int o = 0; o < NB; ++o)
        if (q0 + u < Z) p[u][o] = load(q0 + u, o);
#pragma unroll
    for (int u = 0; u < ZU; ++u)
      if (q0 + u < Z)
#pragma unroll
        for (int o = 0; o < NB; ++o) {
          s[o][0] += p[u][o].x;
          s[o][1] += p[u][o].y;
          s[o][2] += p[u][o].z;
          s[o][3] += p[u][o].w;
        }
  }
#pragma unroll
  for (int o = 0; o < NB; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[o][e] = s[o][e];
}

// split_total finishes the K split: with the K range split over Z = gridDim.y blocks, each owner
// lane parks its NB float4 of split z at ws[((z * NT + tile) * 32 + lane) * NB + o]; the block
// that finishes last for its row block (blockIdx.x; counter cnt[blockIdx.x]) loads all Z of them
// (its lanes read what the same lanes wrote) and adds them in split order into acc, so the result
// does not depend on which block was last. Returns whether this block holds the totals (Z = 1: at
// once); the same for every thread of a block.
//
// park != NULL (the tile kernel launched with clusters (1, Z): tile_cluster): the Z blocks of a row
// block are one thread-block cluster, split z its block z, and split 0 adds the Z partials in
// split order (the same sums in the same order as through ws, so the same bits). No workspace,
// fence or counter. Two ways:
// - rt > 0 (tile_push): each split z > 0 writes its NB float4 into split 0's park (distributed
//   shared memory; slot z - 1 of rt * 32 * NB float4, at (lt, lane): lt the tile's place in its
//   block), so that one cluster barrier serves: after it no block touches another's memory. The
//   cluster's barrier was arrived at when the kernel began (cluster_arrive), so the wait before
//   the first remote store makes sure split 0 is running;
// - rt = 0: each owner lane parks its NB float4 in its own block's shared memory, split 0 reads
//   them through distributed shared memory between two cluster barriers (the second keeps every
//   block's shared memory alive until split 0 has read it).
template <int NB>
__device__ __forceinline__ bool split_total(float (&acc)[NB][4], bool owner, int tile, int lane, int N, float *ws,
                                            unsigned int *cnt, unsigned int &s_last, float *park = nullptr,
                                            int lt = 0, int rt = 0) {
  const int NT = N / 16, z = blockIdx.y, Z = gridDim.y;
  if (Z == 1) return true;
  if (park && rt) {
    cluster_wait();  // the arrival at the kernel's start: every block of the cluster is running
    float4 *pk = reinterpret_cast<float4 *>(park) + ((size_t)lt * 32 + lane) * NB;
    const size_t slot = (size_t)rt * 32 * NB;
    if (z > 0 && owner) {
      float4 *dst = dsmem(pk + (size_t)(z - 1) * slot, 0u);
#pragma unroll
      for (int o = 0; o < NB; ++o) dst[o] = make_float4(acc[o][0], acc[o][1], acc[o][2], acc[o][3]);
    }
    cluster_sync();
    if (z == 0 && owner)
      sum_splits<NB>(acc, Z, [&](int q, int o) {
        return q ? pk[(size_t)(q - 1) * slot + o] : make_float4(acc[o][0], acc[o][1], acc[o][2], acc[o][3]);
      });
    return z == 0;
  }
  if (park) {
    float4 *pk = reinterpret_cast<float4 *>(park) + ((size_t)lt * 32 + lane) * NB;
    if (owner)
#pragma unroll
      for (int o = 0; o < NB; ++o) pk[o] = make_float4(acc[o][0], acc[o][1], acc[o][2], acc[o][3]);
    cluster_sync();
    if (z == 0 && owner) sum_splits<NB>(acc, Z, [&](int q, int o) { return *dsmem(pk + o, (unsigned)q); });
    cluster_sync();
    return z == 0;
  }
  float4 *wsv = reinterpret_cast<float4 *>(ws);
  if (owner)
#pragma unroll
    for (int o = 0; o < NB; ++o)
      __stcg(wsv + ((size_t)(z * NT + tile) * 32 + lane) * NB + o,
             make_float4(acc[o][0], acc[o][1], acc[o][2], acc[o][3]));
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(cnt + blockIdx.x, 1u) == (unsigned int)(Z - 1) ? 1u : 0u;
  __syncthreads();
  if (!s_last) return false;
  __threadfence();
  if (owner)
    sum_splits<NB>(acc, Z, [&](int q, int o) { return __ldcg(wsv + ((size_t)(q * NT + tile) * 32 + lane) * NB + o); });
  if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;  // ready for the next product
  return true;
}

// tile_each calls f(o, e, r, b) for each element acc[o][e] of this lane's 16-row tile whose
// input row b is below B: tile row r = g (+8 for e >= 2), b = o * 8 + 2t (+1 for odd e), where
// lane = 4g + t.
template <int NB, typename F>
__device__ __forceinline__ void tile_each(int lane, int B, const F &f) {
#pragma unroll
  for (int o = 0; o < NB; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = (lane >> 2) + (e >= 2 ? 8 : 0), b = o * 8 + (lane & 3) * 2 + (e & 1);
      if (b < B) f(o, e, r, b);
    }
}

// store stores (or adds, accumulate) the owner warps' 16-row tiles of out [B, N]. Accumulating,
// a lane loads all its old values before it stores any: a loop that loads, adds and stores one
// element at a time waits a round trip through L2 per element (the compiler cannot tell that the
// stores do not alias the next loads), 16 of them at 32 rows: 3.4-3.5 us of o_proj's and down's
// 8.8-10.1 on the H200 (lab/cuda/NOTES.md).
template <int NB>
__device__ __forceinline__ void store(const float (&acc)[NB][4], bool owner, int tile, int lane, int N, int B,
                                      float *out, int accumulate) {
  if (!owner) return;
  float old[NB][4] = {};
  if (accumulate)
    tile_each<NB>(lane, B, [&](int o, int e, int r, int b) { old[o][e] = out[(size_t)b * N + tile * 16 + r]; });
  tile_each<NB>(lane, B, [&](int o, int e, int r, int b) {
    out[(size_t)b * N + tile * 16 + r] = accumulate ? old[o][e] + acc[o][e] : acc[o][e];
  });
}

// finish adds the K split's partials (split_total) and stores the totals (store).
template <int NB>
__device__ __forceinline__ void finish(float (&acc)[NB][4], bool owner, int tile, int lane, int N, int B, float *out,
                                       int accumulate, float *ws, unsigned int *cnt, unsigned int &s_last) {
  if (split_total<NB>(acc, owner, tile, lane, N, ws, cnt, s_last)) store<NB>(acc, owner, tile, lane, N, B, out, accumulate);
}

// ---------------------------------------------------------------------------------------------
// tile_kernel: the same product for 9..32 rows with the weights streamed through a pipeline.
//
// Why this kernel: the skinny kernel held a warp's whole weight slice in registers, so a block
// covers at most 128 x 384 weights and stages its 32 input rows for every such slice; at 32 rows
// its L2 traffic was 2-4x the weight bytes and each block waited for all its loads at once
// (lab/cuda/NOTES.md). Here a block owns RT row tiles of 16 (RT * KS = 8 warps) over a K range
// of Kr columns, stages its input rows once for that range (cp.async), and streams the weights in
// 16 KB chunks (KS boxes of 16 RT rows x 64 columns) through TSTAGES shared-memory buffers, so
// three chunks are in flight while one is multiplied. The copy engine (TMA, a tensor map per
// weight matrix: backend.cu's tile_map) moves each box with one instruction of one thread and
// reports its bytes on the buffer's mbarrier. The first three chunks are asked for before
// griddepcontrol.wait: weights never depend on the previous kernel. Warp w multiplies row tile
// w / KS over box w % KS of every chunk; slices and K splits are added in a fixed order as in
// the skinny kernel did (add_slices, finish).
//
// Fragments come from shared memory through ldmatrix (one instruction per 16 x 16 operand tile,
// already in mma.sync's register order). Rows of a box are 128 bytes and the staged input's a
// multiple of that; the 16-byte piece p of row r sits at p ^ (r & 7) (tswz: the copy engine's
// 128-byte swizzle, which the input's staging copies), so the eight rows an ldmatrix phase reads
// at the same piece hit eight different bank groups.
//
// Measured on the H200 (lab/cuda/NOTES.md; Qwen3-0.6B shape, decode): batch 16 11,819 tok/s
// against 10,962 through cuBLAS in the same run, batch 32 17,778 against 20,399; hence
// backend.cu's tile_max_b of 16. In isolation (Nsight Compute, cold caches) the qkv product takes
// 11.7 us at ~1,900 instructions per warp and 6.7 cycles per issued instruction with 8 warps per
// SM. The versions before: 16-byte cp.async copies (12.8-18 us; issue-bound by the
// copies' index arithmetic), and one bulk copy per 128-512-byte row (2-4x slower: too small a
// unit for the copy engine). With the RMSNorm and SwiGLU fused (TileFuse) a qwen3
// layer at 9-16 rows is five kernels instead of eight: batch 12 9,516 tok/s against 8,907, batch
// 16 11,867 against 11,188 (unfused, same build). Of the 82 us per step saved at batch 16 the
// traced kernel span shows about a quarter; the rest is, by a cross-run estimate, the graph's
// launch (84 fewer kernel nodes; the step starts on the GPU only when cudaGraphLaunch returns,
// 0.7-1.0 us per node; lab/cuda/NOTES.md). At 24 and 32 rows it is 8 % slower
// than cuBLAS with the prep kernels, hence backend.cu's fuse_max_b of 16. Run 58: at 1-8 rows,
// fused, it beats the skinny kernel (batch 8 7,478 tok/s against 6,363) and the fused GEMV (batch
// 4 3,804 against 1,836; batch 1 937 against 895), so the layers' products of every batch up to
// 16 run here.
constexpr int TSTAGES = 4;          // weight chunks in shared memory (3 in flight while 1 is used)
constexpr int TCHUNK = 128 * 64;    // elements of a chunk: 16 * RT rows x 64 * KS columns
constexpr int TKR_MAX = 1024;       // most columns of a block's K range (its staged input: 64 KB at 32 rows)
constexpr size_t SMEM_SM = 227u << 10;  // shared memory the blocks on one sm_90 SM can have together
static_assert((size_t)TSTAGES * TCHUNK * 2 >= (size_t)WARPS * 32 * MAXB * sizeof(float),
              "add_slices reuses the chunk buffers");

// TCfg is one launch shape of tile_kernel: each of the Z blocks along K covers Kr = K / Z columns
// (a multiple of the chunk's 64 * KS).
struct TCfg : Shape {
  int Kr = 0;
};

// RMS_KMAX: the longest row TileFuse::xr may have (a lane holds 32 of its values per row).
constexpr int RMS_KMAX = 1024;

// tile_smem_bytes: 1 KB to align the chunk buffers, the buffers, the staged input, the norm's
// weights (TileFuse::xr).
__host__ __device__ inline size_t tile_smem_bytes(int NB, int Kr) {
  return 1024 + (size_t)TSTAGES * TCHUNK * 2 + (size_t)NB * 8 * Kr * 2 + RMS_KMAX * sizeof(float);
}

// tile_park_bytes: the park that follows tile_smem_bytes in a cluster's split 0 where the K
// splits push their partials (split_total with rt: tile_push): Z - 1 slots of RT tiles' lanes.
__host__ __device__ inline size_t tile_park_bytes(int NB, int RT, int Z) {
  return (size_t)(Z - 1) * RT * 32 * NB * sizeof(float4);
}

__device__ __forceinline__ int tswz(int r, int p) { return p ^ (r & 7); }

#ifdef MQB_HOST_TEST
void ldsm_emu(uint32_t r[4], const void *p, bool trans);  // host_test/emu_test.cc
#endif
// ldsm4 is ldmatrix .x4: lane 8m + i gives the address of row i of 8 x 8 matrix m (16 bytes); lane
// 4g + t gets word t of row g of matrix m in r[m]. ldsm4<true> is .trans, each matrix transposed:
// lane 4g + t gets elements (2t, g) and (2t + 1, g), so a row-major [k][n] tile becomes mma.sync's
// B operand (prefill_attn.cuh's V).
template <bool TRANS = false>
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#elif defined(MQB_HOST_TEST)
  ldsm_emu(r, p, TRANS);
#endif
}

// TmaMap describes a weight matrix W [N, K] to the copy engine: a CUtensorMap with a box of
// `rows` x 64 columns and the 128-byte swizzle (backend.cu's tile_map makes it). In the CPU
// emulation it is the matrix itself, and tma_load copies with the same swizzle.
#if defined(MQB_HOST_TEST)
struct TmaMap {
  const void *base;
  int K, N, rows;
};
#else
using TmaMap = CUtensorMap;
#endif

// mbar_init: a barrier whose phases complete after count arrivals (and any expected bytes).
__device__ __forceinline__ void mbar_init(unsigned long long *b, unsigned count = 1) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  (void)count;
  *b = 0;
#endif
}
// mbar_arrive: the calling thread's arrival.
__device__ __forceinline__ void mbar_arrive(unsigned long long *b) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
#else
  (void)b;
#endif
}
// mbar_expect: the calling thread's arrival, and bytes more for the phase to wait for.
__device__ __forceinline__ void mbar_expect(unsigned long long *b, unsigned bytes) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
#else
  (void)b;
  (void)bytes;
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned long long *b, unsigned parity) {
#if defined(__CUDA_ARCH__)
  const unsigned a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}" ::"r"(a),
      "r"(parity)
      : "memory");
#else
  (void)b;
  (void)parity;
#endif
}
// tma_load copies the box at column x, row y of tm's matrix (rows x 64 elements, rows past N
// zero) into dst (1024-byte aligned), piece p of box row r at p ^ (r & 7), counted on b. The
// emulation copies at once (the kernel's __syncthreads order it before use there).
template <typename T>
__device__ __forceinline__ void tma_load(T *dst, const TmaMap &tm, int x, int y, unsigned long long *b) {
#if defined(__CUDA_ARCH__)
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst), a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(d),
      "l"(reinterpret_cast<unsigned long long>(&tm)), "r"(x), "r"(y), "r"(a)
      : "memory");
#elif defined(MQB_HOST_TEST)
  (void)b;
  const T *src = static_cast<const T *>(tm.base);
  for (int r = 0; r < tm.rows; ++r)
    for (int p = 0; p < 8; ++p) {
      T *d = dst + r * 64 + (p ^ (r & 7)) * 8;
      if (y + r < tm.N) memcpy(d, src + (size_t)(y + r) * tm.K + x + p * 8, 16);
      else memset(d, 0, 16);
    }
#endif
}

// TileFuse: what tile_kernel does besides the product, so that a layer's RMSNorm and SwiGLU need
// no kernels of their own (each one a launch, a dependency and a round trip through L2 per
// layer: lab/cuda/NOTES.md's trace).
//   xr != NULL: the input rows are RMSNorm(xr[b, 0:K]) * nw made while they are staged (X unused,
//     K <= RMS_KMAX, a multiple of 4): each warp loads whole rows (a block with a K split too),
//     sums their squares and writes its K range as x * rstd * w in T, the arithmetic of prep_row.
//   act != NULL: W is [gate; up] (N = 2I) and the product's result is act[b, i] =
//     silu(gate_i) * up_i in T (out unused): block x reads rows 8 RT x .. 8 RT (x + 1) of each half,
//     so its first RT / 2 row tiles are gate rows and the last RT / 2 the matching up rows.
template <typename T>
struct TileFuse {
  const float *xr = nullptr;
  const float *nw = nullptr;
  float eps = 0.f;
  T *act = nullptr;
  int compact = 0;  // the RMSNorm staging's compact form (backend.cu's rms_compact_b): see tile_kernel
};

// put_normed stores x * rstd * w, rounded to T, as elements k..k+3 (k % 4 == 0) of staged row b
// (Kr elements, swizzled as tswz): both forms of the tile kernel's RMSNorm staging.
template <typename T>
__device__ __forceinline__ void put_normed(T *xs, int b, int Kr, int k, const float4 &x, float rstd, const float4 &w) {
  uint2 pk;
  T *pt = reinterpret_cast<T *>(&pk);
  pt[0] = TT<T>::fromf(x.x * rstd * w.x);
  pt[1] = TT<T>::fromf(x.y * rstd * w.y);
  pt[2] = TT<T>::fromf(x.z * rstd * w.z);
  pt[3] = TT<T>::fromf(x.w * rstd * w.w);
  *reinterpret_cast<uint2 *>(xs + (size_t)b * Kr + tswz(b, k / 8) * 8 + (k & 7)) = pk;
}

// XCH: float offset, in the chunk buffers, of the SwiGLU epilogue's exchange (past add_slices');
// PARK: of split_total's parked partials in a cluster's K split (past the exchange).
constexpr int XCH = WARPS * 32 * (MAXB / 8) * 4;
constexpr int PARK = XCH + (WARPS / 2) * 32 * (MAXB / 8) * 4;
static_assert((size_t)(PARK + WARPS * 32 * (MAXB / 8) * 4) * sizeof(float) <= (size_t)TSTAGES * TCHUNK * 2,
              "the SwiGLU exchange and the parked partials fit the chunk buffers");

template <typename T, int NB>
__global__ void __launch_bounds__(THREADS, 1)
    tile_kernel(const __grid_constant__ TmaMap tm, int N, int K, const T *X, int B, float *out, int accumulate, int RT,
                int KS, int Kr, int pre, int cluster, float *ws, unsigned int *cnt, const TileFuse<T> f) {
  DYN_SMEM(uint4, tk_raw);
  __shared__ unsigned int s_last;
  __shared__ unsigned long long bar[TSTAGES];  // one per chunk buffer
  // The chunk buffers start at the first 1024-byte boundary (the swizzle's period).
  T *chunks = reinterpret_cast<T *>((reinterpret_cast<uintptr_t>(tk_raw) + 1023) & ~(uintptr_t)1023);
  T *xs = chunks + (size_t)TSTAGES * TCHUNK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int KC = 64 * KS, rows = 16 * RT;  // a chunk: KS sub-tiles of rows x 64 (one per K slice)
  const int lt = warp / KS, ks = warp % KS, tile = blockIdx.x * RT + lt;
  const int row0 = blockIdx.x * rows, k0 = blockIdx.y * Kr, nch = Kr / KC;
  const bool live = tile < N / 16;
  // The debug timeline: start, past the wait, input staged (3), chunks multiplied (4), K splits
  // summed (5), end.
  if (cluster == 2) cluster_arrive();  // split_total's pushed sum waits for it
  // y0: the first weight row the block reads. With act its rows are two boxes of rows / 2: gate
  // rows from y0 = row0 / 2, up rows from N / 2 + y0.
  const int y0 = f.act ? row0 / 2 : row0;
  if (threadIdx.x == 0)
    for (int i = 0; i < TSTAGES; ++i) mbar_init(bar + i);
  __syncthreads();
  // issue (thread 0) asks the copy engine for chunk c: KS boxes of rows x 64 into buffer c % TSTAGES.
  auto issue = [&](int c) {
    if (threadIdx.x != 0 || c >= nch) return;
    unsigned long long *b = bar + c % TSTAGES;
    mbar_expect(b, (unsigned)(KS * rows * 64 * sizeof(T)));
    T *dst = chunks + (size_t)(c % TSTAGES) * TCHUNK;
    for (int q = 0; q < KS; ++q) {
      tma_load(dst + q * rows * 64, tm, k0 + c * KC + q * 64, y0, b);
      if (f.act) tma_load(dst + q * rows * 64 + rows / 2 * 64, tm, k0 + c * KC + q * 64, N / 2 + y0, b);
    }
  };
  // The first pre (1..TSTAGES) chunks are asked for before the wait (backend.cu's tile_pre: 3;
  // all four made the decode steps slower), the rest up to chunk c + TSTAGES - 1 once chunk c - 1's
  // buffer is free (next: the first chunk not yet asked for; the same in every thread).
  int next = 0;
  for (; next < pre; ++next) issue(next);
  float *nws = reinterpret_cast<float *>(xs + (size_t)NB * 8 * Kr);  // the norm's weights (TileFuse::xr)
  if (f.xr)
    for (int i = threadIdx.x * 4; i < K; i += THREADS * 4) stage16(nws + i, f.nw + i);
  pdl_wait();
  pdl_trigger();
  // The block's K range of every input row (rows B.. of the last octet are zero), warp by row and
  // lane by piece.
  const int xp = Kr / 8;
  if (!f.xr) {
    for (int b = warp; b < NB * 8; b += WARPS) {
      T *d = xs + (size_t)b * Kr;
      const T *src = X + (size_t)b * K + k0;
      for (int p = lane; p < xp; p += 32) {
        if (b < B) stage16(d + tswz(b, p) * 8, src + p * 8);
        else *reinterpret_cast<uint4 *>(d + tswz(b, p) * 8) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  } else if (f.compact) {
    // RMSNorm while staging, compact (backend.cu's rms_compact_b: one or two rows): thread t
    // holds 16-byte piece t of each row (K <= 4 THREADS), four rows at a time, their sums of
    // squares added across the block through shared memory (lane sums, then the warps' in warp
    // order: not the form below's order, so its last bits may differ). At batch 1 the form below
    // leaves one warp all the work; on the H200 this took 1.3 us a layer instead of 2.0, and
    // from 8 rows on its round trip per four rows made it slower (lab/cuda/NOTES.md).
    __shared__ float s_ss[4][WARPS];
    const int q4 = K / 4, t = threadIdx.x;
    for (int b = B + warp; b < NB * 8; b += WARPS)  // rows B.. of the last octet: zeros
      for (int p = lane; p < xp; p += 32) *reinterpret_cast<uint4 *>(xs + (size_t)b * Kr + tswz(b, p) * 8) = make_uint4(0u, 0u, 0u, 0u);
    stage_wait();  // the norm's weights (asked for before the wait)
    __syncthreads();
    const float4 w = t < q4 ? *reinterpret_cast<const float4 *>(nws + 4 * t) : make_float4(0.f, 0.f, 0.f, 0.f);
    const int k = 4 * t - k0;  // in the block's range [0, Kr)?
    for (int r0 = 0; r0 < B; r0 += 4) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        v[u] = t < q4 && r0 + u < B ? __ldcg(reinterpret_cast<const float4 *>(f.xr + (size_t)(r0 + u) * K) + t)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float ss = warp_sum(v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w);
        if (lane == 0) s_ss[u][warp] = ss;
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float tot = 0.f;
#pragma unroll
        for (int q = 0; q < WARPS; ++q) tot += s_ss[u][q];
        const float rstd = rsqrtf(tot / (float)K + f.eps);
        const int b = r0 + u;
        if (b < B && t < q4 && k >= 0 && k < Kr) {
          put_normed(xs, b, Kr, k, v[u], rstd, w);
        }
      }
      __syncthreads();  // s_ss is read before the next rows' sums
    }
  } else {
    // RMSNorm while staging: lane holds k = 4 lane + 128 j of a row (K <= RMS_KMAX, K % 4 == 0),
    // two rows per warp at a time, every load of both rows in flight at once (a loop that loads
    // as it goes waits a round trip per step: it lost 5 us per product so); the norm's
    // weights were copied to shared memory before the wait, so that the rows have the registers.
    // Rows B.. load as zeros, which normalize to zeros.
    const int nj = (K + 127) / 128;
    stage_wait();  // the norm's weights (asked for before the wait)
    __syncthreads();
    for (int b0 = warp; b0 < NB * 8; b0 += 2 * WARPS) {
      float4 v[2][RMS_KMAX / 128];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < RMS_KMAX / 128; ++j) {
          const int b = b0 + r * WARPS;
          v[r][j] = lane * 4 + 128 * j < K && b < B
                        ? __ldcg(reinterpret_cast<const float4 *>(f.xr + (size_t)b * K + lane * 4 + 128 * j))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int b = b0 + r * WARPS;
        if (b >= NB * 8) break;
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < RMS_KMAX / 128; ++j)
          ss += v[r][j].x * v[r][j].x + v[r][j].y * v[r][j].y + v[r][j].z * v[r][j].z + v[r][j].w * v[r][j].w;
        const float rstd = rsqrtf(warp_sum(ss) / (float)K + f.eps);
#pragma unroll
        for (int j = 0; j < RMS_KMAX / 128; ++j) {
          const int k = lane * 4 + 128 * j - k0;  // in the block's range [0, Kr)?
          if (j >= nj || k < 0 || k >= Kr) continue;  // (k < Kr: also k + k0 < K)
          put_normed(xs, b, Kr, k, v[r][j], rstd, *reinterpret_cast<const float4 *>(nws + lane * 4 + 128 * j));
        }
      }
    }
  }
  stage_wait();
  float acc[NB][4] = {};
  // This lane's ldmatrix rows: for the weights, row r = (m & 1) * 8 + i of its tile in its slice's
  // sub-tile, piece 2 st + (m >> 1) for k step st (matrices m = 0..3: a0..a3 of mma.sync); for the
  // input, row i of each octet and piece ks*8 + 2(2h + (m >> 1)) + (m & 1) of the chunk's columns
  // for k steps 2h, 2h + 1 (b0, b1 of both). Chunk c adds c * KC to the input's offsets (c * KC / 8
  // is a multiple of 8, so the swizzle is unchanged).
  const int m = lane >> 3, i8 = lane & 7;
  int aoff[4], boff[2];
#pragma unroll
  for (int st = 0; st < 4; ++st) aoff[st] = (ks * rows + lt * 16 + (m & 1) * 8 + i8) * 64 + tswz(i8, 2 * st + (m >> 1)) * 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) boff[h] = i8 * Kr + tswz(i8, ks * 8 + 2 * (2 * h + (m >> 1)) + (m & 1)) * 8;
  for (int c = 0; c < nch; ++c) {
    mbar_wait(bar + c % TSTAGES, (unsigned)(c / TSTAGES) & 1u);
    __syncthreads();  // the input is staged, and every warp is done with chunk c - 1, whose buffer issue refills
    for (; next <= c + TSTAGES - 1; ++next) issue(next);
    if (live) {
      const T *wr = chunks + (size_t)(c % TSTAGES) * TCHUNK;
      const T *xr = xs + c * KC;
      uint32_t a[4][4];
#pragma unroll
      for (int st = 0; st < 4; ++st) ldsm4(a[st], wr + aoff[st]);
#pragma unroll
      for (int o = 0; o < NB; ++o)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t b[4];
          ldsm4(b, xr + (size_t)o * 8 * Kr + boff[h]);
          mma<T>(acc[o], a[2 * h][0], a[2 * h][1], a[2 * h][2], a[2 * h][3], b[0], b[1]);
          mma<T>(acc[o], a[2 * h + 1][0], a[2 * h + 1][1], a[2 * h + 1][2], a[2 * h + 1][3], b[2], b[3]);
        }
    }
  }
  __syncthreads();  // the chunk buffers become add_slices' scratch
  float *scratch = reinterpret_cast<float *>(chunks);
  add_slices<NB>(acc, scratch, warp, lane, ks, KS);
  const bool owner = live && ks == 0;
  // split_total's partials for the cluster's sum: pushed into the park past the norm's weights
  // (cluster 2: tile_push), or left in the chunk buffers for split 0 to read (1).
  float *park = cluster == 2 ? nws + RMS_KMAX : cluster ? scratch + PARK : nullptr;
  const bool total = split_total<NB>(acc, owner, tile, lane, N, ws, cnt, s_last, park, lt, cluster == 2 ? RT : 0);
  if (!total) return;
  if (!f.act) {
    store<NB>(acc, owner, tile, lane, N, B, out, accumulate);
    return;
  }
  // SwiGLU: the up tiles (lt >= RT / 2) park their totals, the gate tiles combine them with theirs.
  const int pair = RT / 2, I = N / 2;
  float *xch = scratch + XCH + ((size_t)(lt % pair) * 32 + lane) * NB * 4;
  if (owner && lt >= pair)
#pragma unroll
    for (int o = 0; o < NB; ++o)
#pragma unroll
      for (int e = 0; e < 4; ++e) xch[o * 4 + e] = acc[o][e];
  __syncthreads();
  if (!owner || lt >= pair) return;
  float up[NB][4];  // read before any store, as in store
#pragma unroll
  for (int o = 0; o < NB; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) up[o][e] = xch[o * 4 + e];
  tile_each<NB>(lane, B, [&](int o, int e, int r, int b) {
    f.act[(size_t)b * I + y0 + lt * 16 + r] = TT<T>::fromf(swiglu(acc[o][e], up[o][e]));
  });
}

}  // namespace sk

}  // namespace mqcuda
