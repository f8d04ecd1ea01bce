// wgmma_flash.cu: Hopper attention kernels (wgmma from shared memory, after FlashAttention-3's
// schemes, step by step) for head dim 128, checked on the GPU against an fp32
// reference and timed against native/cuda/ops/flash_attn.cuh's mma.sync kernel (lab, not
// product). Why: at FLUX's 4,352 tokens x 24 heads that kernel runs at about 245 TFLOP/s where
// cuDNN's reaches about 600 (lab/cuda/results/gpu_2026-12-07d_h100), the largest part of the
// image pipelines' distance to 1.5x diffusers.
//
// Shape of the work: a block is two warpgroups (256 threads) over 128 query rows of one head,
// 64 rows each; key tiles of 64 rows; K and V^T tiles staged in shared memory by cp.async,
// double-buffered, in the 128-byte-swizzled K-major layout wgmma reads (rows of 64 bf16, 16-byte
// chunk c of row r at chunk c ^ (r & 7)). S = Q K^T: 8 wgmma m64n64k16 with both operands from
// shared memory; the online softmax in registers (the accumulator's per-warp layout is
// mma.sync's: rows g and g + 8 of the warp's 16, columns 8j + 2t, +1); O += P V: 4 wgmma
// m64n128k16 with P from registers and V^T (the values transposed by a small kernel first, so
// that both B operands are K-major) from shared memory. Non-causal; any L, Lk.
//
// flash3 adds FlashAttention-3's intra-warpgroup pipelining (the P V product of tile j - 1 runs
// while the softmax of tile j does) and a third stage; flash3<true> reads V in its own layout as
// wgmma's N-major B operand (no transpose). flash_ws adds FlashAttention-3's warp specialisation:
// a producer warpgroup with mbarriers and two consumer warpgroups taking turns at the tensor
// cores (the scheme native/cuda/ops/flash_wgmma.cuh took). "mma.sync" is flash_attn.cuh's kernel
// (built without MQB_SM90A).
//
// Run on an H100 (2026-12-07, lab/cuda/results/gpu_2026-12-07e_h100) and, with flash_ws, on an
// H200 (lab/cuda/results/gpu_2026-12-07f_h200): every variant within bounds of the fp32
// reference on all five shapes, with the same max|d| as the mma.sync kernel. At FLUX's shape on
// the H200: mma.sync 871 us (267 TFLOP/s), basic 796, flash3 783 (V^T 40 of it), flash3<true>
// 676, flash_ws 547 us (426 TFLOP/s, 1.59x).
//
// Build and run on the GPU host (wgmma needs the sm_90a target, named by -gencode):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -Inative/include -Inative/cuda \
//     lab/cuda/probe/wgmma_flash.cu native/cuda/blas_pick.cc -lcublas -lcublasLt -lcuda -o /tmp/wgf && /tmp/wgf
#include "../../../native/cuda/ops/flash_attn.cuh"

#include <cmath>

#include "probe.cuh"  // CK, and the includes the probes share

using bf16 = __nv_bfloat16;

namespace wg {

// D (64 x 64, fp32) (+)= A (64 x 16, shared-memory descriptor) B^T (B 64 x 16, descriptor), both K-major.
__device__ __forceinline__ void wgmma_ss_n64(float *d, uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 128, fp32) += A (64 x 16 bf16 in registers, mma.sync's A fragment per warp) B (descriptor;
// TB = 0: B stored K-major, as B^T rows; TB = 1: N-major, as the values' own rows).
template <int TB>
__device__ __forceinline__ void wgmma_rs_n128(float *d, const uint32_t a[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
}

// desc: a shared-memory matrix descriptor of a 128-byte-swizzled K-major operand whose 8-row
// groups are 1024 bytes apart, starting at p (within a 1024-byte-aligned atom column).
__device__ __forceinline__ uint64_t desc(const void *p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
// desc_mn: the same for an N-major operand (B = V, 64-element rows along N): 8-row groups along K
// 1024 bytes apart (stride offset), the two 64-element halves of N mn_half bytes apart (leading offset).
__device__ __forceinline__ uint64_t desc_mn(const void *p, int mn_half) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(mn_half >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// cp16: 16 bytes global -> shared, asynchronously; !ok: zeros (src-size 0; src must still be a
// valid address: callers clamp it to a row that exists).
__device__ __forceinline__ void cp16(void *dst, const void *src, bool ok) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  const int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
}
// keep: the compiler may not move these accumulator registers across the wgmma fences
template <int N>
__device__ __forceinline__ void keep(float *x) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// swz: the byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t *>(&v);
}

constexpr int BM = 128, BN = 64, D = 128, NT = 256;
constexpr int QB = 2 * BM * 128;           // Q: two 64-column halves of BM rows
constexpr int KB = 2 * BN * 128;           // K tile: two halves of BN rows
constexpr int VB = D * 128;                // V^T tile: D rows of BN (64) keys
constexpr int SMEM = QB + 2 * (KB + VB) + 1024;

// softmax_tile: mask keys past Lk (key k0 + 8c + 2t (+1)), then the online softmax of the warp's rows
// g (s[4c], s[4c+1]) and g + 8 (s[4c+2], s[4c+3]) in the exp2 domain: s becomes P (relative to the
// new running max), lrow the running sums, corr what the output rows must be scaled by.
__device__ __forceinline__ void softmax_tile(float *s, float *mrow, float *lrow, float *corr, int k0, int Lk, int t,
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
// pack_p: P's score chunks 2kk, 2kk + 1 as bf16 are the A fragment of keys 16kk .. 16kk + 15.
__device__ __forceinline__ void pack_p(const float *s, uint32_t pa[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int e = 0; e < 4; e++) pa[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}
// store_o: the warp's rows row0 (+8) of the output, finished by 1 / sum.
__device__ __forceinline__ void store_o(const float *acc, const float *lrow, bf16 *o, int ldo, int row0, int L, int h,
                                        int t) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = row0 + 8 * r;
    if (row >= L) continue;
    const float inv = 1.f / l;
    bf16 *dst = o + (size_t)row * ldo + h * D;
#pragma unroll
    for (int c = 0; c < 16; c++)
      *reinterpret_cast<uint32_t *>(dst + 8 * c + 2 * t) = pack_bf16(acc[4 * c + 2 * r] * inv, acc[4 * c + 2 * r + 1] * inv);
  }
}

// vt_k: v [Lk rows, stride ld] head h's 128 columns -> vt [H][128][Lkp] (keys contiguous; keys
// past Lk zero).
__global__ void vt_k(const bf16 *v, int ld, int Lk, int Lkp, bf16 *vt) {
  __shared__ bf16 t[32][33];
  const int h = blockIdx.z, k0 = blockIdx.x * 32, d0 = blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int k = k0 + i;
    t[i][threadIdx.x] = k < Lk ? v[(size_t)k * ld + h * D + d0 + threadIdx.x] : __float2bfloat16(0.f);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) vt[((size_t)h * D + d0 + i) * Lkp + k0 + threadIdx.x] = t[threadIdx.x][i];
}

// smem_base: the block's dynamic shared memory, rounded up to the 1024 bytes a swizzle atom needs.
__device__ __forceinline__ uint8_t *smem_base() {
  extern __shared__ uint8_t wg_smem[];
  return (uint8_t *)(((uintptr_t)wg_smem + 1023) & ~(uintptr_t)1023);
}
// stage_q: query rows q0 .. q0 + BM - 1 of head h (zeros past L) into two swizzled 64-column halves.
__device__ __forceinline__ void stage_q(uint8_t *qs, const bf16 *q, int ldq, int q0, int L, int h) {
  for (int i = threadIdx.x; i < BM * 16; i += NT) {
    const int r = i >> 4, c = i & 15, half = c >> 3;
    cp16(qs + half * BM * 128 + swz(r, c & 7), q + (size_t)min(q0 + r, L - 1) * ldq + h * D + c * 8, q0 + r < L);
  }
}

// flash: grid (ceil(L / 128), H), 256 threads, SMEM bytes. q rows stride ldq, o rows stride ldo
// (head h at column h * 128); k rows stride ldk (KV head h / rep); vt from vt_k.
__global__ void __launch_bounds__(NT) flash(const bf16 *__restrict__ q, int ldq, const bf16 *__restrict__ k, int ldk,
                                            const bf16 *__restrict__ vt, int Lkp, bf16 *__restrict__ o, int ldo, int L,
                                            int Lk, int rep, float sl2) {
  uint8_t *qs = smem_base(), *stage0 = qs + QB;
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y, kh = h / rep, q0 = blockIdx.x * BM;
  const bf16 *kb = k + (size_t)kh * D;
  const bf16 *vb = vt + (size_t)kh * D * Lkp;
  stage_q(qs, q, ldq, q0, L, h);
  auto stage = [&](int j) {
    uint8_t *ks = stage0 + (j & 1) * (KB + VB), *vs = ks + KB;
    const int k0 = j * BN;
    for (int i = tid; i < BN * 16; i += NT) {
      const int r = i >> 4, c = i & 15, half = c >> 3;
      cp16(ks + half * BN * 128 + swz(r, c & 7), kb + (size_t)min(k0 + r, Lk - 1) * ldk + c * 8, k0 + r < Lk);
    }
    for (int i = tid; i < D * 8; i += NT) {
      const int r = i >> 3, c = i & 7;
      cp16(vs + swz(r, c), vb + (size_t)r * Lkp + k0 + c * 8, true);
    }
  };
  const int ntiles = (Lk + BN - 1) / BN;
  stage(0);
  cp_commit();
  float acc[64], s[32], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; i++) acc[i] = 0.f;
  const uint8_t *qw = qs + wgi * 64 * 128;  // this warpgroup's 64 rows in each half
  for (int j = 0; j < ntiles; j++) {
    if (j + 1 < ntiles) stage(j + 1);
    cp_commit();
    cp_wait<1>();
    proxy_fence();
    __syncthreads();
    const uint8_t *ks = stage0 + (j & 1) * (KB + VB), *vs = ks + KB;
    // S = Q K^T over 8 k16 steps of the 128 dims
    keep<32>(s);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      const int half = kk >> 2, off = (kk & 3) * 32;
      wgmma_ss_n64(s, desc(qw + half * BM * 128 + off), desc(ks + half * BN * 128 + off), kk > 0);
    }
    wg_commit();
    wg_wait0();
    keep<32>(s);
    float corr[2];
    softmax_tile(s, mrow, lrow, corr, j * BN, Lk, t, sl2);
#pragma unroll
    for (int c = 0; c < 16; c++)
#pragma unroll
      for (int r = 0; r < 2; r++) acc[4 * c + 2 * r] *= corr[r], acc[4 * c + 2 * r + 1] *= corr[r];
    // O += P V: P's score chunks 2kk, 2kk+1 are the A fragment of keys 16kk..16kk+15
    uint32_t pa[4][4];
    pack_p(s, pa);
    keep<64>(acc);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_rs_n128<0>(acc, pa[kk], desc(vs + kk * 32));
    wg_commit();
    wg_wait0();
    keep<64>(acc);
    __syncthreads();  // every warpgroup is done with this stage before tile j + 2 lands in it
  }
  store_o(acc, lrow, o, ldo, q0 + wgi * 64 + w * 16 + g, L, h, t);
}


// flash3: flash with the score product of tile j overlapping the softmax's wait on the P V product
// of tile j - 1 (FlashAttention-3's intra-warpgroup pipelining) and three K/V stages: per tile,
// issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, wait for S_j only, run the softmax while
// the P V product is still in the tensor cores, then wait for it and rescale O. Tile j + 1 is
// copied while tile j is worked on. Same arguments and grid as flash; SMEM3 bytes.
constexpr int NS = 3;
constexpr int SMEM3 = QB + NS * (KB + VB) + 1024;
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// VN: V is read in its own layout (rows of keys, stride ldk like K) as an N-major B operand, no
// V^T (vt, Lkp unused); else from vt_k's V^T.
template <bool VN>
__global__ void __launch_bounds__(NT) flash3(const bf16 *__restrict__ q, int ldq, const bf16 *__restrict__ k,
                                             const bf16 *__restrict__ v, int ldk, const bf16 *__restrict__ vt, int Lkp,
                                             bf16 *__restrict__ o, int ldo, int L, int Lk, int rep, float sl2) {
  uint8_t *qs = smem_base(), *stage0 = qs + QB;
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y, kh = h / rep, q0 = blockIdx.x * BM;
  const bf16 *kb = k + (size_t)kh * D;
  const bf16 *vb = VN ? v + (size_t)kh * D : vt + (size_t)kh * D * Lkp;
  stage_q(qs, q, ldq, q0, L, h);
  auto buf = [&](int j) { return stage0 + (j % NS) * (KB + VB); };
  auto stage = [&](int j) {
    uint8_t *ks = buf(j), *vs = ks + KB;
    const int k0 = j * BN;
    for (int i = tid; i < BN * 16; i += NT) {
      const int r = i >> 4, c = i & 15, half = c >> 3;
      cp16(ks + half * BN * 128 + swz(r, c & 7), kb + (size_t)min(k0 + r, Lk - 1) * ldk + c * 8, k0 + r < Lk);
      if (VN) cp16(vs + half * BN * 128 + swz(r, c & 7), vb + (size_t)min(k0 + r, Lk - 1) * ldk + c * 8, k0 + r < Lk);
    }
    if (!VN)
      for (int i = tid; i < D * 8; i += NT) {
        const int r = i >> 3, c = i & 7;
        cp16(vs + swz(r, c), vb + (size_t)r * Lkp + k0 + c * 8, true);
      }
  };
  const uint8_t *qw = qs + wgi * 64 * 128;
  auto issue_s = [&](float *s, const uint8_t *ks) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      const int half = kk >> 2, off = (kk & 3) * 32;
      wgmma_ss_n64(s, desc(qw + half * BM * 128 + off), desc(ks + half * BN * 128 + off), kk > 0);
    }
    wg_commit();
  };
  auto issue_pv = [&](float *acc, uint32_t pa[4][4], const uint8_t *vs) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      if (VN)
        wgmma_rs_n128<1>(acc, pa[kk], desc_mn(vs + kk * 2048, BN * 128));
      else
        wgmma_rs_n128<0>(acc, pa[kk], desc(vs + kk * 32));
    }
    wg_commit();
  };
  const int ntiles = (Lk + BN - 1) / BN;
  float acc[64], s[32], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, corr[2];
  uint32_t pa[4][4];
#pragma unroll
  for (int i = 0; i < 64; i++) acc[i] = 0.f;
  stage(0);
  cp_commit();
  cp_wait<0>();
  proxy_fence();
  __syncthreads();
  if (ntiles > 1) stage(1);
  cp_commit();
  keep<32>(s);
  wg_fence();
  issue_s(s, buf(0));
  wg_wait0();
  keep<32>(s);
  softmax_tile(s, mrow, lrow, corr, 0, Lk, t, sl2);
  pack_p(s, pa);
  for (int j = 1; j < ntiles; j++) {
    cp_wait<0>();  // tile j is in; the barrier also means every warpgroup is done with tile j - 2's stage
    proxy_fence();
    __syncthreads();
    if (j + 1 < ntiles) stage(j + 1);
    cp_commit();
    keep<32>(s);
    keep<64>(acc);
    wg_fence();
    issue_s(s, buf(j));
    issue_pv(acc, pa, buf(j - 1) + KB);
    wg_wait1();
    keep<32>(s);
    softmax_tile(s, mrow, lrow, corr, j * BN, Lk, t, sl2);
    wg_wait0();
    keep<64>(acc);
#pragma unroll
    for (int c = 0; c < 16; c++)
#pragma unroll
      for (int r = 0; r < 2; r++) acc[4 * c + 2 * r] *= corr[r], acc[4 * c + 2 * r + 1] *= corr[r];
    pack_p(s, pa);
  }
  keep<64>(acc);
  wg_fence();
  issue_pv(acc, pa, buf(ntiles - 1) + KB);
  wg_wait0();
  keep<64>(acc);
  store_o(acc, lrow, o, ldo, q0 + wgi * 64 + w * 16 + g, L, h, t);
}


// flash_ws: flash3<true>'s work with FlashAttention-3's warp specialisation. Warpgroup 0 is the
// producer: it copies K and V tiles into NSW stages (cp.async, two tiles in flight; each tile's
// "full" mbarrier arrives once its copies have landed and are fenced for the async proxy) and
// refills a stage when both consumers have arrived on its "empty" mbarrier. Warpgroups 1 and 2
// are the consumers, 64 query rows each, and take turns at the tensor cores (pingpong): a
// consumer issues its S = Q K^T and P V products only after the other has issued its own (named
// barriers 1 and 2), so one warpgroup's softmax runs while the other's products do. No
// __syncthreads in the loop, so the two consumers need not move in lockstep.
constexpr int NTW = 384;
template <int NSW>
constexpr int smem_ws() { return QB + NSW * 2 * KB + 1024; }
__device__ __forceinline__ uint32_t sptr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(uint64_t *b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sptr(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sptr(b)) : "memory");
}
// mb_wait: until the mbarrier's phase of this parity has completed.
__device__ __forceinline__ void mb_wait(uint64_t *b, int parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(sptr(b)), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

template <int NSW>
__global__ void __launch_bounds__(NTW, 1) flash_ws(const bf16 *__restrict__ q, int ldq, const bf16 *__restrict__ k,
                                                   const bf16 *__restrict__ v, int ldk, bf16 *__restrict__ o, int ldo,
                                                   int L, int Lk, int rep, float sl2) {
  static_assert(NSW >= 3, "flash_ws: the producer holds one finished tile back, so two stages would deadlock");
  __shared__ __align__(8) uint64_t full[NSW], empty[NSW];
  uint8_t *qs = smem_base(), *stage0 = qs + QB;
  const int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y, kh = h / rep, q0 = blockIdx.x * BM, ntiles = (Lk + BN - 1) / BN;
  auto buf = [&](int j) { return stage0 + (j % NSW) * 2 * KB; };
  if (tid == 0) {
    for (int i = 0; i < NSW; i++) mb_init(&full[i], 128), mb_init(&empty[i], 256);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int i = tid; i < BM * 16; i += NTW) {
    const int r = i >> 4, c = i & 15, half = c >> 3;
    cp16(qs + half * BM * 128 + swz(r, c & 7), q + (size_t)min(q0 + r, L - 1) * ldq + h * D + c * 8, q0 + r < L);
  }
  cp_commit();
  cp_wait<0>();
  proxy_fence();
  __syncthreads();
  if (wgi == 0) {
    const bf16 *kb = k + (size_t)kh * D, *vb = v + (size_t)kh * D;
    for (int j = 0; j < ntiles; j++) {
      if (j >= NSW) mb_wait(&empty[j % NSW], (j / NSW - 1) & 1);
      uint8_t *ks = buf(j), *vs = ks + KB;
      for (int i = tid; i < BN * 16; i += 128) {
        const int r = i >> 4, c = i & 15, half = c >> 3, kr = j * BN + r;
        const size_t at = (size_t)min(kr, Lk - 1) * ldk + c * 8;
        cp16(ks + half * BN * 128 + swz(r, c & 7), kb + at, kr < Lk);
        cp16(vs + half * BN * 128 + swz(r, c & 7), vb + at, kr < Lk);
      }
      cp_commit();
      if (j > 0) {
        cp_wait<1>();
        proxy_fence();
        mb_arrive(&full[(j - 1) % NSW]);
      }
    }
    cp_wait<0>();
    proxy_fence();
    mb_arrive(&full[(ntiles - 1) % NSW]);
    return;
  }
  const int c = wgi - 1;  // consumer 0 or 1: rows 64c .. 64c + 63 of the block's
  const uint8_t *qw = qs + c * 64 * 128;
  auto issue_s = [&](float *s, const uint8_t *ks) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      const int half = kk >> 2, off = (kk & 3) * 32;
      wgmma_ss_n64(s, desc(qw + half * BM * 128 + off), desc(ks + half * BN * 128 + off), kk > 0);
    }
    wg_commit();
  };
  auto issue_pv = [&](float *acc, uint32_t pa[4][4], const uint8_t *vs) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_rs_n128<1>(acc, pa[kk], desc_mn(vs + kk * 2048, BN * 128));
    wg_commit();
  };
  // turn / pass: wait for this consumer's turn at the tensor cores; hand the turn to the other
  auto turn = [&] { bar_sync(1 + c); };
  auto pass = [&] { bar_arrive(2 - c); };
  float acc[64], s[32], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, corr[2];
  uint32_t pa[4][4];
#pragma unroll
  for (int i = 0; i < 64; i++) acc[i] = 0.f;
  if (c == 1) bar_arrive(1);  // consumer 0 goes first
  mb_wait(&full[0], 0);
  turn();
  keep<32>(s);
  wg_fence();
  issue_s(s, buf(0));
  pass();
  wg_wait0();
  keep<32>(s);
  softmax_tile(s, mrow, lrow, corr, 0, Lk, t, sl2);
  pack_p(s, pa);
  for (int j = 1; j < ntiles; j++) {
    mb_wait(&full[j % NSW], (j / NSW) & 1);
    turn();
    keep<32>(s);
    keep<64>(acc);
    wg_fence();
    issue_s(s, buf(j));
    issue_pv(acc, pa, buf(j - 1) + KB);
    pass();
    wg_wait1();
    keep<32>(s);
    softmax_tile(s, mrow, lrow, corr, j * BN, Lk, t, sl2);
    wg_wait0();
    keep<64>(acc);
    mb_arrive(&empty[(j - 1) % NSW]);
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
      for (int r = 0; r < 2; r++) acc[4 * i + 2 * r] *= corr[r], acc[4 * i + 2 * r + 1] *= corr[r];
    pack_p(s, pa);
  }
  turn();
  keep<64>(acc);
  wg_fence();
  issue_pv(acc, pa, buf(ntiles - 1) + KB);
  if (c == 0) pass();  // consumer 1's last turn needs it; consumer 0 has none after this one
  wg_wait0();
  keep<64>(acc);
  store_o(acc, lrow, o, ldo, q0 + c * 64 + w * 16 + g, L, h, t);
}

}  // namespace wg

// ref_k: one (row, head) per block: the fp32 attention of bf16 q, k, v (row-sampled reference).
__global__ void ref_k(const bf16 *q, const bf16 *k, const bf16 *v, int ld, int Lk, int rep, float scale, const int *rows, float *out) {
  extern __shared__ float sc[];
  const int r = rows[blockIdx.x], h = blockIdx.y, kh = h / rep;
  __shared__ float red[256];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
    float d = 0.f;
    for (int e = 0; e < 128; e++) d += __bfloat162float(q[(size_t)r * ld + h * 128 + e]) * __bfloat162float(k[(size_t)j * ld + kh * 128 + e]);
    sc[j] = d * scale;
    mx = fmaxf(mx, sc[j]);
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j < Lk; j += blockDim.x) sum += (sc[j] = expf(sc[j] - mx));
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  sum = red[0];
  for (int e = threadIdx.x; e < 128; e += blockDim.x) {
    float a = 0.f;
    for (int j = 0; j < Lk; j++) a += sc[j] * __bfloat162float(v[(size_t)j * ld + kh * 128 + e]);
    out[((size_t)blockIdx.x * gridDim.y + h) * 128 + e] = a / sum;
  }
}

__global__ void fill_k(bf16 *x, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t z = (uint32_t)i * 2654435761u ^ seed;
    z ^= z >> 15, z *= 2246822519u, z ^= z >> 13, z *= 3266489917u, z ^= z >> 16;
    x[i] = __float2bfloat16(amp * ((z & 0xffffff) / 8388608.f - 1.f));
  }
}

// maxdiff: max |x - ref| over the sampled rows.
static double maxdiff(const std::vector<bf16> &x, const std::vector<float> &hr, const std::vector<int> &rows, int H, int ld) {
  double m = 0;
  for (size_t i = 0; i < rows.size(); i++)
    for (int h = 0; h < H; h++)
      for (int e = 0; e < 128; e++) {
        const double d = fabs((double)__bfloat162float(x[(size_t)rows[i] * ld + h * 128 + e]) - hr[(i * H + h) * 128 + e]);
        m = d == d ? std::max(m, d) : INFINITY;
      }
  return m;
}

int main(int argc, char **argv) {
  struct Shape { const char *name; int L, H; } shapes[] = {
      {"flux 1024^2 (4352 tokens x 24 heads)", 4352, 24}, {"zimage 1024^2 (4128 x 30)", 4128, 30},
      {"zimage 512^2 (1056 x 30)", 1056, 30}, {"odd (1000 x 3)", 1000, 3}, {"short (77 x 2)", 77, 2}};
  int fails = 0;
  CK(cudaFuncSetAttribute(wg::flash, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM));
  CK(cudaFuncSetAttribute(wg::flash3<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM3));
  CK(cudaFuncSetAttribute(wg::flash3<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM3));
  CK(cudaFuncSetAttribute(wg::flash_ws<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::smem_ws<4>()));
  const cudaStream_t st = 0;  // median_ms records its events on the default stream
  for (const Shape &s : shapes) {
    const int L = s.L, H = s.H, ld = H * 128, Lkp = (L + wg::BN - 1) / wg::BN * wg::BN;
    const size_t n = (size_t)L * ld;
    bf16 *q, *k, *v, *vt, *o[5];
    CK(cudaMalloc(&q, 2 * n)); CK(cudaMalloc(&k, 2 * n)); CK(cudaMalloc(&v, 2 * n));
    for (auto &x : o) CK(cudaMalloc(&x, 2 * n));
    CK(cudaMalloc(&vt, 2 * (size_t)H * 128 * Lkp));
    fill_k<<<1024, 256>>>(q, n, 1, 2.f); fill_k<<<1024, 256>>>(k, n, 2, 2.f); fill_k<<<1024, 256>>>(v, n, 3, 1.f);
    const float scale = 1.f / sqrtf(128.f), sl2 = scale * 1.4426950408889634f;
    const dim3 grid((L + wg::BM - 1) / wg::BM, H);
    auto vt_only = [&] { wg::vt_k<<<dim3(Lkp / 32, 4, H), dim3(32, 8), 0, st>>>(v, ld, L, Lkp, vt); };
    auto basic = [&] { vt_only(); wg::flash<<<grid, wg::NT, wg::SMEM, st>>>(q, ld, k, ld, vt, Lkp, o[0], ld, L, L, 1, sl2); };
    auto piped = [&] {
      vt_only();
      wg::flash3<false><<<grid, wg::NT, wg::SMEM3, st>>>(q, ld, k, v, ld, vt, Lkp, o[1], ld, L, L, 1, sl2);
    };
    auto theirs = [&] { mqcuda::img::flash_attention(q, ld, k, v, ld, o[2], ld, L, L, H, H, 128, scale, false, st); };
    auto vn = [&] { wg::flash3<true><<<grid, wg::NT, wg::SMEM3, st>>>(q, ld, k, v, ld, nullptr, 0, o[3], ld, L, L, 1, sl2); };
    auto ws = [&] { wg::flash_ws<4><<<grid, wg::NTW, wg::smem_ws<4>(), st>>>(q, ld, k, v, ld, o[4], ld, L, L, 1, sl2); };
    basic(); piped(); theirs(); vn(); ws();
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<int> rows;
    for (int r = 0; r < L; r += 37) rows.push_back(r);
    rows.push_back(L - 1);
    int *drows; float *ref;
    CK(cudaMalloc(&drows, 4 * rows.size())); CK(cudaMalloc(&ref, 4 * rows.size() * H * 128));
    CK(cudaMemcpy(drows, rows.data(), 4 * rows.size(), cudaMemcpyHostToDevice));
    ref_k<<<dim3(rows.size(), H), 256, 4 * L>>>(q, k, v, ld, L, 1, scale, drows, ref);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<float> hr(rows.size() * H * 128);
    CK(cudaMemcpy(hr.data(), ref, 4 * hr.size(), cudaMemcpyDeviceToHost));
    double md[5];
    for (int i = 0; i < 5; i++) {
      std::vector<bf16> hx(n);
      CK(cudaMemcpy(hx.data(), o[i], 2 * n, cudaMemcpyDeviceToHost));
      md[i] = maxdiff(hx, hr, rows, H, ld);
    }
    auto time = [&](auto f) {
      return median_ms(5, 1, [&](bool setup) { if (!setup) for (int i = 0; i < 10; i++) f(); }) / 10;
    };
    const float tv = time(vt_only), tb = time(basic), tp = time(piped), tt = time(theirs), tn = time(vn), tw = time(ws);
    const double fl = 4.0 * L * (double)L * 128 * H / 1e9;
    const double bound = std::max(2 * md[2], 0.02);
    const bool okb = md[0] <= bound, okp = md[1] <= bound, okn = md[3] <= bound, okw = md[4] <= bound;
    fails += !okb + !okp + !okn + !okw;
    printf("WGF %-38s mma.sync %.1f us (%.0f TFLOP/s, max|d| %.3g) | wgmma %.1f us (%.0f, %.3g%s) | wgmma piped %.1f us (%.0f, %.3g%s) | V^T %.1f us of those | piped, V N-major %.1f us (%.0f, %.3g%s) | warp-specialised pingpong %.1f us (%.0f, %.3g%s) | best %.2fx\n",
           s.name, 1e3 * tt, fl / tt, md[2], 1e3 * tb, fl / tb, md[0], okb ? "" : " FAIL", 1e3 * tp, fl / tp, md[1],
           okp ? "" : " FAIL", 1e3 * tv, 1e3 * tn, fl / tn, md[3], okn ? "" : " FAIL", 1e3 * tw, fl / tw, md[4], okw ? "" : " FAIL",
           tt / std::min(std::min(std::min(tb, tp), tn), tw));
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(vt); for (auto x : o) cudaFree(x); cudaFree(drows); cudaFree(ref);
  }
  printf("WGF %s\n", fails ? "FAIL" : "all shapes within bounds");
  return fails ? 1 : 0;
}
