// flash_wgmma.cuh: the image pipelines' attention for head dim 128 on Hopper (sm_90a), with the
// warpgroup matrix instructions (wgmma), after FlashAttention-3's warp specialisation and
// intra-warpgroup pipelining. flash_attn.cuh's flash_attention_batched sends non-causal
// head-dim-128 work here when the library was built for sm_90a (MQB_SM90A, CMakeLists.txt) and the
// device is compute 9.0; the mma.sync kernel serves everything else (other head dims, causal,
// other GPUs, the CPU emulation, which has no wgmma).
//
// Why: mma.sync feeds the tensor cores from registers a warp at a time; wgmma reads both operands
// of the score product from shared memory for a whole warpgroup and runs asynchronously, so the
// softmax can run while the tensor cores work. On an H200 (lab/cuda/results/gpu_2026-12-07f_h200)
// this kernel runs FLUX.1's 4,352 tokens x 24 heads at 546 us a call (426 TFLOP/s) where the
// mma.sync kernel takes 872 us (267), and Z-Image's 1024^2 CFG pair at 1,143 us against 1,904;
// the same outputs within the fp32 reference's bounds (lab/cuda/flash_check.sh checks it).
//
// How: a block is three warpgroups (384 threads) over 128 query rows of one head, after
// FlashAttention-3's warp specialisation. Warpgroup 0 is the producer: it copies key and value
// tiles of 64 rows into NS stages of shared memory with cp.async (two tiles in flight), and
// announces each on the stage's "full" mbarrier once the copies have landed and are fenced for
// the async proxy wgmma reads through; it refills a stage after both consumers have arrived on its
// "empty" mbarrier. Warpgroups 1 and 2 are the consumers, 64 query rows each, and take turns at
// the tensor cores (named barriers 1 and 2): one issues its products only after the other has
// issued its own, so one consumer's softmax runs while the other's products do. Every tile of Q,
// K and V is stored as two 64-column halves, each row 128 bytes with 16-byte chunk c of row r at
// chunk c ^ (r & 7) (the 128-byte swizzle wgmma reads). A consumer's tile j: issue S_j = Q K_j^T
// (8 wgmma m64n64k16, both operands K-major from shared memory) and O += P_{j-1} V_{j-1} (4 wgmma
// m64n128k16, P from registers as mma.sync's A fragment, V N-major: the values' own rows, no
// transpose), wait for S_j only, run the online softmax (exp2 domain, fp32) while the P V product
// is still running, then wait for it, release tile j - 1's stage and rescale O by the softmax's
// correction. The accumulators' per-warp layout is mma.sync's (rows g and g + 8 of the warp's 16,
// columns 8c + 2t, +1), so two score chunks rounded to bf16 are P's A fragment.
#pragma once
#if !defined(MQB_HOST_TEST)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tile.cuh"  // sk::mbar_*, sk::pack2

namespace mqcuda {
namespace img {
namespace fw {

typedef __nv_bfloat16 bf16;

constexpr int BM = 128, BN = 64, D = 128, NT = 384, NS = 4;
constexpr int QB = 2 * BM * 128;  // Q: two 64-column halves of BM rows of 128 bytes
constexpr int KB = 2 * BN * 128;  // a K (or V) tile: two halves of BN rows
constexpr int SMEM = QB + NS * 2 * KB + 1024;  // + the 1024-byte alignment of the swizzle atoms

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma_s: D (64 x 64, fp32) (+)= A (64 x 16) B^T (B 64 x 16), both K-major in shared memory.
__device__ __forceinline__ void wgmma_s(float *d, uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,"
      "%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
// wgmma_pv: D (64 x 128, fp32) += A (64 x 16, registers) B (16 x 128, N-major in shared memory).
__device__ __forceinline__ void wgmma_pv(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,"
      "%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, "
      "p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// desc: the shared-memory matrix descriptor of a 128-byte-swizzled operand at p (in a
// 1024-byte-aligned atom): 8-row groups 1024 bytes apart (stride offset); lead: the leading
// offset, the distance between the two 64-element halves of an N-major operand (ignored K-major).
__device__ __forceinline__ uint64_t desc(const void *p, uint32_t lead) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lead >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keep: the compiler must not move reads or writes of these accumulators across this point (the
// asynchronous wgmma writes them behind its back until the wait before).
template <int N>
__device__ __forceinline__ void keep(float *x) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
// cp16: 16 bytes global -> shared, asynchronously; zeros where !ok (src must still be mapped).
__device__ __forceinline__ void cp16(uint8_t *dst, const bf16 *src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
// swz: the byte offset of 16-byte chunk c (of 16) of row r in a tile of N rows stored as two
// swizzled 64-column halves.
template <int N>
__device__ __forceinline__ int swz(int r, int c) {
  return (c >> 3) * N * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}
// softmax: keys past Lk masked (key k0 + 8c + 2t (+1)), then the online softmax of the warp's rows
// g (s[4c], s[4c + 1]) and g + 8 (s[4c + 2], s[4c + 3]): s becomes P, lrow the running sums,
// corr what the output rows are scaled by.
__device__ __forceinline__ void softmax(float *s, float *mrow, float *lrow, float *corr, int k0, int Lk, int t,
                                        float sl2) {
  if (k0 + BN > Lk) {
#pragma unroll
    for (int c = 0; c < 8; c++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (k0 + 8 * c + 2 * t + (e & 1) >= Lk) s[4 * c + e] = -INFINITY;
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float mx = mrow[r];
#pragma unroll
    for (int c = 0; c < 8; c++) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float ms = mx == -INFINITY ? 0.f : mx * sl2;
    corr[r] = exp2f(fmaf(mrow[r], sl2, -ms));
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < 8; c++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float p = exp2f(fmaf(s[4 * c + 2 * r + e], sl2, -ms));
        s[4 * c + 2 * r + e] = p;
        sum += p;
      }
    lrow[r] = lrow[r] * corr[r] + sum;
    mrow[r] = mx;
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// flash_k: grid (ceil(L / BM), H, batch), NT threads, SMEM bytes of dynamic shared memory.
// Layout as flash_attention's with hd = 128; item b of the batch at q + b sq, k + b skv,
// v + b skv, o + b so. sl2 = scale * log2(e). A template (of the head dim, 128 only) so that every
// translation unit including this header shares one definition, as the mma.sync kernel's.
template <int HD>
__global__ void __launch_bounds__(NT, 1)
    flash_k(const bf16 *__restrict__ q, int ldq, const bf16 *__restrict__ k, const bf16 *__restrict__ v, int ldkv,
            bf16 *__restrict__ o, int ldo, int L, int Lk, int rep, float sl2, long long sq, long long skv, long long so) {
  static_assert(HD == D, "flash_k: head dim 128 only");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t fw_smem[];
  __shared__ __align__(8) unsigned long long full[NS], empty[NS];  // the stages' mbarriers
  uint8_t *const qs = (uint8_t *)(((uintptr_t)fw_smem + 1023) & ~(uintptr_t)1023), *const st0 = qs + QB;
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y, kh = h / rep, q0 = blockIdx.x * BM, ntiles = (Lk + BN - 1) / BN;
  q += blockIdx.z * sq + (size_t)q0 * ldq + (size_t)h * D;
  auto kbuf = [&](int j) { return st0 + (j % NS) * 2 * KB; };
  if (tid == 0) {
    for (int i = 0; i < NS; i++) sk::mbar_init(&full[i], 128), sk::mbar_init(&empty[i], 256);
  }
  for (int i = tid; i < BM * 16; i += NT) {
    const int r = i >> 4, c = i & 15;
    cp16(qs + swz<BM>(r, c), q + (size_t)min(r, L - q0 - 1) * ldq + c * 8, r < L - q0);
  }
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (wgi == 0) {  // the producer: tile j's K and V rows (zeros past Lk) into stage j % NS
    k += blockIdx.z * skv + (size_t)kh * D;
    v += blockIdx.z * skv + (size_t)kh * D;
    for (int j = 0; j < ntiles; j++) {
      if (j >= NS) sk::mbar_wait(&empty[j % NS], (j / NS - 1) & 1);
      uint8_t *const ks = kbuf(j);
      for (int i = tid; i < BN * 16; i += 128) {
        const int r = i >> 4, c = i & 15, kr = j * BN + r;
        const size_t at = (size_t)min(kr, Lk - 1) * ldkv + c * 8;
        cp16(ks + swz<BN>(r, c), k + at, kr < Lk);
        cp16(ks + KB + swz<BN>(r, c), v + at, kr < Lk);
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      if (j > 0) {  // tile j - 1 has landed: fenced for wgmma's proxy, then announced
        asm volatile("cp.async.wait_group 1;\nfence.proxy.async.shared::cta;\n" ::: "memory");
        sk::mbar_arrive(&full[(j - 1) % NS]);
      }
    }
    asm volatile("cp.async.wait_group 0;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    sk::mbar_arrive(&full[(ntiles - 1) % NS]);
    return;
  }
  const int c = wgi - 1;  // consumer c: the block's query rows 64c .. 64c + 63
  const uint8_t *const qw = qs + c * 64 * 128;
  auto issue_s = [&](float *s, const uint8_t *ks) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
      wgmma_s(s, desc(qw + (kk >> 2) * BM * 128 + (kk & 3) * 32, 0), desc(ks + (kk >> 2) * BN * 128 + (kk & 3) * 32, 0),
              kk > 0);
    wg_commit();
  };
  auto issue_pv = [&](float *acc, const uint32_t (*pa)[4], const uint8_t *vs) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_pv(acc, pa[kk], desc(vs + kk * 2048, BN * 128));  // keys 16kk ..
    wg_commit();
  };
  // pack: P's score chunks 2kk, 2kk + 1 in bf16 are the A fragment of keys 16kk .. 16kk + 15
  auto pack = [](const float *s, uint32_t (*pa)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
      for (int e = 0; e < 4; e++) pa[kk][e] = sk::pack2<bf16>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  };
  // turn: wait until the other consumer has issued its products; pass: let it issue its next
  auto turn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + c) : "memory"); };
  auto pass = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - c) : "memory"); };
  float acc[64], s[32], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, corr[2];
  uint32_t pa[4][4];
#pragma unroll
  for (int i = 0; i < 64; i++) acc[i] = 0.f;
  if (c == 1) pass();  // consumer 0 issues first
  sk::mbar_wait(&full[0], 0);
  turn();
  keep<32>(s);
  wg_fence();
  issue_s(s, kbuf(0));
  pass();
  wg_wait<0>();
  keep<32>(s);
  softmax(s, mrow, lrow, corr, 0, Lk, t, sl2);
  pack(s, pa);
  for (int j = 1; j < ntiles; j++) {
    sk::mbar_wait(&full[j % NS], (j / NS) & 1);
    turn();
    keep<32>(s);
    keep<64>(acc);
    wg_fence();
    issue_s(s, kbuf(j));
    issue_pv(acc, pa, kbuf(j - 1) + KB);
    pass();
    wg_wait<1>();
    keep<32>(s);
    softmax(s, mrow, lrow, corr, j * BN, Lk, t, sl2);
    wg_wait<0>();
    keep<64>(acc);
    sk::mbar_arrive(&empty[(j - 1) % NS]);  // tile j - 1 is read: the producer may refill its stage
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
      for (int r = 0; r < 2; r++) acc[4 * i + 2 * r] *= corr[r], acc[4 * i + 2 * r + 1] *= corr[r];
    pack(s, pa);
  }
  turn();
  keep<64>(acc);
  wg_fence();
  issue_pv(acc, pa, kbuf(ntiles - 1) + KB);
  if (c == 0) pass();  // consumer 1 has one turn left; consumer 0 has none
  wg_wait<0>();
  keep<64>(acc);
  o += blockIdx.z * so;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = q0 + c * 64 + w * 16 + g + 8 * r;
    if (row >= L) continue;
    const float inv = 1.f / l;
    bf16 *dst = o + (size_t)row * ldo + (size_t)h * D + 2 * t;
#pragma unroll
    for (int i = 0; i < 16; i++)
      *reinterpret_cast<uint32_t *>(dst + 8 * i) = sk::pack2<bf16>(acc[4 * i + 2 * r] * inv, acc[4 * i + 2 * r + 1] * inv);
  }
#endif
}

// usable: whether this build and the current device run flash_k (read once per process).
inline bool usable() {
#if defined(MQB_SM90A)
  static const bool ok = [] {
    int d = 0, ma = 0, mi = 0;
    return cudaGetDevice(&d) == cudaSuccess &&
           cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess &&
           cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, d) == cudaSuccess && ma == 9 && mi == 0 &&
           cudaFuncSetAttribute(flash_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) == cudaSuccess;
  }();
  return ok;
#else
  return false;
#endif
}

// launch: flash_k's grid on st; false (nothing launched) where usable() is not.
inline bool launch(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo, int L, int Lk,
                   int H, int rep, float scale, cudaStream_t st, int batch, long long sq, long long skv, long long so) {
  if (!usable()) return false;
  flash_k<D><<<dim3((unsigned)((L + BM - 1) / BM), (unsigned)H, (unsigned)batch), NT, SMEM, st>>>(
      q, ldq, k, v, ldkv, o, ldo, L, Lk, rep, scale * 1.4426950408889634f, sq, skv, so);
  return cudaPeekAtLastError() == cudaSuccess;
}

}  // namespace fw
}  // namespace img
}  // namespace mqcuda
#endif  // !MQB_HOST_TEST
