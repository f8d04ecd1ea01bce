// skinny.cuh: out[B, N] (+)= X[B, K] W[N, K]^T for 5..32 rows in bf16/fp16 (fp32 accumulation),
// the decode products of batches the fused GEMV does not take (by default up to 8 rows: see the
// measurements below). Included by backend.cu (also in
// the CPU emulation, which computes the mma fragments in emu_test.cc); the host side is
// skinny_cfg / skinny_linear there. The mma.sync fragment helpers here serve megakernel.cuh too.
//
// Why not cuBLAS: its products of a batch-32 step take 0.797 ms for 1.19 GB of weights (NOTES.md,
// runs 18-20, LM head included), about 1.5 TB/s of the H200's 4.2: a product of 4-13 MB is over
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
// Measured on the H200 (NOTES.md, runs 39-45, Qwen3-0.6B shape): decode at batch 8 5,945-6,031
// tok/s against 5,502-5,549 through cuBLAS; at batch 16 9,472-9,758 against 10,491-10,579; at
// batch 32 13,564-14,465 (11,953 with the worst forced shape) against 19,012-19,274. In isolation
// (Nsight Compute, batch 32) a product takes 11-23 us against cuBLAS's 7.3-8.8. Halving its
// instructions (run 45: weights loaded word by word into the mma quads, no register moves) left
// the time unchanged: what limits it is each block's load latency (one 8-warp block per SM, all
// of a warp's loads issued then waited for, no pipeline), where cuBLAS runs TMA pipelines.
// Hence backend.cu's sk_max_b of 8.

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
#ifdef MQB_HOST_TEST
// The CPU emulation (host_test/emu_test.cc) computes mma.sync m16n8k16 from the warp's fragments
// as the PTX ISA lays them out, so the skinny products (skinny.cuh) run there too.
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

// Cfg is one launch shape: RT row tiles of 16 x KS slices of Kw columns per block (RT * KS = 8),
// Z blocks along K.
struct Cfg {
  int RT = 0, KS = 0, Kw = 0, Z = 0;
  int row_blocks(int N) const { return (N / 16 + RT - 1) / RT; }  // grid.x
  int blocks(int N) const { return row_blocks(N) * Z; }
};

// smem_bytes: the staged input (NB octets of rows, Kc columns plus padding) and the slice sums.
__host__ __device__ inline size_t smem_bytes(int NB, int Kc) {
  return (size_t)NB * 8 * (Kc + XPAD) * 2 + (size_t)WARPS * 32 * NB * 4 * sizeof(float);
}

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

template <typename T, int NB>
__global__ void __launch_bounds__(THREADS, 1)
    skinny_kernel(const T *__restrict__ W, int N, int K, const T *X, int B, float *out, int accumulate, int RT,
                  int KS, int Kw, float *ws, unsigned int *cnt) {
  DYN_SMEM(uint4, sk_raw);
  __shared__ unsigned int s_last;
  const int Kc = KS * Kw, ld = Kc + XPAD;
  T *xs = reinterpret_cast<T *>(sk_raw);
  float *red = reinterpret_cast<float *>(xs + (size_t)NB * 8 * ld);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int NT = N / 16, tile = blockIdx.x * RT + warp / KS, ks = warp % KS;
  const int z = blockIdx.y, Z = gridDim.y;
  const bool live = tile < NT;
  const int groups = Kw / 32;
  uint4 wa[GMAX], wb[GMAX];
  if (live) {
    const T *ra = W + (size_t)(tile * 16 + g) * K + z * Kc + ks * Kw + t * 8;
    const T *rb = ra + (size_t)8 * K;
#pragma unroll
    for (int j = 0; j < GMAX; ++j)
      if (j < groups) {
        wa[j] = __ldg(reinterpret_cast<const uint4 *>(ra + j * 32));
        wb[j] = __ldg(reinterpret_cast<const uint4 *>(rb + j * 32));
      }
  }
  pdl_wait();
  pdl_trigger();
  // The block's K range of every input row (rows B.. of the last octet are zero).
  const int nc = Kc / 8;
  for (int i = threadIdx.x; i < NB * 8 * nc; i += THREADS) {
    const int b = i / nc, c = i - b * nc;
    T *d = xs + (size_t)b * ld + c * 8;
    if (b < B) stage16(d, X + (size_t)b * K + z * Kc + c * 8);
    else *reinterpret_cast<uint4 *>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
  stage_wait();
  __syncthreads();
  float acc[NB][4];
#pragma unroll
  for (int o = 0; o < NB; ++o)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[o][e] = 0.f;
  if (live) {
#pragma unroll
    for (int j = 0; j < GMAX; ++j)
      if (j < groups) {
        const int k = ks * Kw + j * 32 + t * 8;
#pragma unroll
        for (int o = 0; o < NB; ++o)
          mma2<T>(acc[o], wa[j], wb[j], *reinterpret_cast<const uint4 *>(xs + (size_t)(o * 8 + g) * ld + k));
      }
  }
  if (KS > 1) {  // slices 1..KS-1 of a tile park their sums, slice 0 adds them in slice order
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
  const bool owner = live && ks == 0;
  // Element e of octet o of this lane: row tile*16 + g (+8 for e >= 2), input row o*8 + 2t (+1 for odd e).
  auto put = [&](int o, int e, float v) {
    const int row = tile * 16 + g + (e >= 2 ? 8 : 0), b = o * 8 + t * 2 + (e & 1);
    if (b >= B) return;
    float *p = out + (size_t)b * N + row;
    *p = accumulate ? *p + v : v;
  };
  if (Z == 1) {
    if (owner)
#pragma unroll
      for (int o = 0; o < NB; ++o)
#pragma unroll
        for (int e = 0; e < 4; ++e) put(o, e, acc[o][e]);
    return;
  }
  // K split over Z blocks: each owner lane parks its NB float4 of split z at
  // ws[((z * NT + tile) * 32 + lane) * NB + o]; the block that finishes last for the row block
  // loads all Z of them at once (its lanes read what the same lanes wrote) and adds them in split order.
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
  if (!s_last) return;
  __threadfence();
  if (owner) {
    float s[NB][4];
#pragma unroll
    for (int o = 0; o < NB; ++o)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[o][e] = 0.f;
    for (int q0 = 0; q0 < Z; q0 += ZU) {
      float4 p[ZU][NB];
#pragma unroll
      for (int u = 0; u < ZU; ++u)
#pragma unroll
        for (int o = 0; o < NB; ++o)
          if (q0 + u < Z) p[u][o] = __ldcg(wsv + ((size_t)((q0 + u) * NT + tile) * 32 + lane) * NB + o);
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
      for (int e = 0; e < 4; ++e) put(o, e, s[o][e]);
  }
  if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;  // ready for the next product
}

}  // namespace sk
