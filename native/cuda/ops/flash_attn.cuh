// flash_attn.cuh: fused attention of the image pipelines and vision towers on the tensor cores,
// after FlashAttention-2: bf16 q/k/v in, fp32 accumulation, online softmax, no score matrix in
// memory. Included by vit.cuh (the vision towers) and callable from any pipeline with bf16 rows.
// Runs in the CPU emulation too (host_test/emu_test.cc emulates mma.sync and ldmatrix; its
// flash_products checks it against a double-precision reference).
//
// Why: the pipelines made S = Q K^T in fp32 through cuBLAS ([H, L, Lk] in global memory), a
// softmax to bf16 P, then P V: at 1056 tokens x 30 heads S alone is 134 MB written and read
// every layer, most of a denoising step (lab/cuda/flash_results.md). The vision
// towers' vis_attn_kernel scored on the CUDA cores in fp32, one warp a query.
//
// How: a block takes BQ = 16 * NW * MT consecutive query rows of one head (NW warps of MT m16
// tiles; query tiles in reverse order when causal, so the longest blocks start first). It walks
// the keys in tiles of BK (64) rows, K and V staged in shared memory by asynchronous 16-byte
// copies, double-buffered: tile j + 1 is in flight while tile j is used. Per tile: S = Q K^T
// (m16n8k16, fp32; q fragments from registers with MT = 1, from shared memory with MT = 2, where
// each K and V fragment then serves two m tiles), masks (keys past Lk; causal: key > query), the
// online softmax in the exp2 domain (running max and sum per row in fp32; the four lanes of a
// row's quad reduce by shuffles), then O += P V with P rounded to bf16 (two n8 score tiles are
// already an A fragment) and V through ldmatrix .trans. Rows are finished by 1 / sum. Head dims
// other than 64/80/96/128 run in the next larger one with zero columns (q.k and P V unchanged).
// Shared rows are D + 8 elements so ldmatrix's eight rows fall on different banks.
#pragma once
#include "decode_attn.cuh"  // tile.cuh uses its cluster helpers and attention.cuh's ldcg4
#include "flash_wgmma.cuh"  // head dim 128 on Hopper
#include "tile.cuh"

namespace mqcuda {
namespace img {

typedef __nv_bfloat16 bf16;

namespace fa {

// stage_rows copies rows 0 .. ROWS - 1 of src (row stride ld elements; columns 0 .. hd - 1) into
// shared rows of D + 8 elements with asynchronous copies; rows at or past n and columns at or
// past hd are zeros. Every thread of the block (NT of them) takes part.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void stage_rows(bf16 *dst, const bf16 *src, size_t ld, int n, int hd) {
  constexpr int RS = D + 8, CH = D / 8;
  for (int i = threadIdx.x; i < ROWS * CH; i += NT) {
    const int r = i / CH, c = (i % CH) * 8;
    if (r < n && c < hd)
      sk::stage16(dst + r * RS + c, src + (size_t)r * ld + c);
    else
      *reinterpret_cast<uint4 *>(dst + r * RS + c) = make_uint4(0u, 0u, 0u, 0u);
  }
}
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_but_one() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

// smem_bytes: two stages of K and V tiles; with MT = 1 the query rows are staged in the second
// stage first (they live in registers), with MT = 2 they keep a region of their own after them.
template <int D, int NW, int MT, int BK>
constexpr size_t smem_bytes() {
  return ((size_t)2 * 2 * BK + (MT == 1 ? 0 : NW * 16 * MT)) * (D + 8) * sizeof(bf16);
}

// flash_kernel: grid (ceil(L / BQ), H, batch), NW * 32 threads, smem_bytes<D, NW, MT, BK>() of dynamic
// shared memory, BK keys a K/V tile; each warp owns MT m16 tiles of query rows (BQ = 16 NW MT).
// With MT = 1 the
// warp's q fragments stay in registers; with MT = 2 they are read from shared memory at every
// K tile, and every K and V fragment read serves two m tiles (half the ldmatrix traffic per
// mma.sync, after FlashAttention-2's 128-row blocks of 4 warps). sl2 = scale * log2(e). See
// flash_attention for the layout.
template <int D, int NW, int MT, int BK>
__global__ void __launch_bounds__(NW * 32) flash_kernel(const bf16 *__restrict__ q, int ldq, const bf16 *__restrict__ k,
                                                        const bf16 *__restrict__ v, int ldkv, bf16 *__restrict__ o,
                                                        int ldo, int L, int Lk, int rep, int hd, float sl2, int causal,
                                                        long long sq, long long skv, long long so) {
  constexpr int NT = NW * 32, BQ = NW * 16 * MT, RS = D + 8;
  constexpr int DK = D / 16, DN = D / 8, NB = BK / 8;
  constexpr bool QREG = MT == 1;
  static_assert(!QREG || BQ <= 2 * BK, "the query rows are staged in one stage's K and V tiles");
  DYN_SMEM(uint4, smem_raw);
  bf16 *sm = reinterpret_cast<bf16 *>(smem_raw);
  // stage s: K tile at sm + s * 2 * BK * RS, V tile BK rows further.
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int h = blockIdx.y, kh = h / rep, q0 = qt * BQ;
  q += blockIdx.z * sq, k += blockIdx.z * skv, v += blockIdx.z * skv, o += blockIdx.z * so;  // the batch's item
  const bf16 *kb = k + (size_t)kh * hd, *vb = v + (size_t)kh * hd;
  const int kend = causal ? min(Lk, q0 + BQ) : Lk;  // keys any row of the block sees
  const int ntiles = (kend + BK - 1) / BK;
  bf16 *const qs = sm + (QREG ? 2 : 4) * BK * RS;
  stage_rows<D, BQ, NT>(qs, q + (size_t)q0 * ldq + (size_t)h * hd, (size_t)ldq, L - q0, hd);
  commit();
  stage_rows<D, BK, NT>(sm, kb, (size_t)ldkv, Lk, hd);
  stage_rows<D, BK, NT>(sm + BK * RS, vb, (size_t)ldkv, Lk, hd);
  commit();
  wait_but_one();
  __syncthreads();
  // The warp's rows: m tile mt holds wfirst + 16 mt + g (accumulator elements 0, 1) and + 8 (2, 3).
  const int wrow = w * 16 * MT, wfirst = q0 + wrow, wlast = wfirst + 16 * MT - 1;
  uint32_t qa[QREG ? DK : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int kk = 0; kk < DK; ++kk) sk::ldsm4(qa[kk], qs + (wrow + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
    __syncthreads();  // the second stage is K/V's from here
  }
  const bool active = wfirst < L;  // warp-uniform: the warp has rows
  float acc[MT][DN][4], mrow[MT][2], lrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    mrow[mt][0] = mrow[mt][1] = -INFINITY;
    lrow[mt][0] = lrow[mt][1] = 0.f;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dn][e] = 0.f;
  }
  float s[MT][NB][4];
  for (int j = 0; j < ntiles; ++j) {
    const int k0 = j * BK;
    if (j + 1 < ntiles) {
      bf16 *nx = sm + ((j + 1) & 1) * 2 * BK * RS;
      stage_rows<D, BK, NT>(nx, kb + (size_t)(k0 + BK) * ldkv, (size_t)ldkv, Lk - k0 - BK, hd);
      stage_rows<D, BK, NT>(nx + BK * RS, vb + (size_t)(k0 + BK) * ldkv, (size_t)ldkv, Lk - k0 - BK, hd);
    }
    commit();
    wait_but_one();  // tile j has landed (this thread's copies) ...
    __syncthreads();  // ... and every thread's
    const bf16 *ks = sm + (j & 1) * 2 * BK * RS, *vs = ks + BK * RS;
    if (active && !(causal && k0 > wlast)) {  // warp-uniform
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NB; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
      // S = Q K^T: lanes address K rows 16 np + 8 (lane >> 4) + (lane & 7) at k half
      // (lane >> 3) & 1, giving b0, b1 of n tiles 2 np and 2 np + 1.
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
        uint32_t qf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QREG) {
#pragma unroll
            for (int i = 0; i < 4; ++i) qf[mt][i] = qa[kk][i];
          } else {
            sk::ldsm4(qf[mt], qs + (wrow + mt * 16 + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
          }
        }
#pragma unroll
        for (int np = 0; np < NB / 2; ++np) {
          uint32_t b[4];
          sk::ldsm4(b, ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * RS + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            sk::mma<bf16>(s[mt][2 * np], qf[mt][0], qf[mt][1], qf[mt][2], qf[mt][3], b[0], b[1]);
            sk::mma<bf16>(s[mt][2 * np + 1], qf[mt][0], qf[mt][1], qf[mt][2], qf[mt][3], b[2], b[3]);
          }
        }
      }
      // Masks, where the tile reaches past Lk or past a row's position.
      if (k0 + BK > Lk || (causal && k0 + BK - 1 > wfirst)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NB; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = k0 + nt * 8 + 2 * t + (e & 1), row = wfirst + mt * 16 + g + (e >> 1) * 8;
              if (key >= Lk || (causal && key > row)) s[mt][nt][e] = -INFINITY;
            }
      }
      // The online softmax of each m tile's rows g (elements 0, 1) and g + 8 (2, 3), in the exp2
      // domain: running maxima of the raw scores, p = 2^(s sl2 - max sl2) by one FMA.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = mrow[mt][r];
#pragma unroll
          for (int nt = 0; nt < NB; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float ms = mx == -INFINITY ? 0.f : mx * sl2;  // a row with nothing unmasked yet stays at zero
          const float corr = exp2f(fmaf(mrow[mt][r], sl2, -ms));
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < NB; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float p = exp2f(fmaf(s[mt][nt][2 * r + e], sl2, -ms));
              s[mt][nt][2 * r + e] = p;
              sum += p;
            }
          lrow[mt][r] = lrow[mt][r] * corr + sum;
          mrow[mt][r] = mx;
#pragma unroll
          for (int dn = 0; dn < DN; ++dn) {
            acc[mt][dn][2 * r] *= corr;
            acc[mt][dn][2 * r + 1] *= corr;
          }
        }
      // O += P V: P's n tiles 2 kk and 2 kk + 1 are the A fragment of keys 16 kk..; lanes address
      // V rows 16 kk + 8 ((lane >> 3) & 1) + (lane & 7) at dim tile 2 dp + (lane >> 4).
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = sk::pack2<bf16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = sk::pack2<bf16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = sk::pack2<bf16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = sk::pack2<bf16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < DN / 2; ++dp) {
          uint32_t b[4];
          sk::ldsm4<true>(b, vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RS + (dp * 2 + (lane >> 4)) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            sk::mma<bf16>(acc[mt][2 * dp], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[0], b[1]);
            sk::mma<bf16>(acc[mt][2 * dp + 1], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before tile j + 2 is copied into it
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = lrow[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = wfirst + mt * 16 + g + 8 * r;
      if (row >= L) continue;
      bf16 *dst = o + (size_t)row * ldo + (size_t)h * hd;
      const float inv = 1.f / l;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn)
        if (dn * 8 < hd)
          *reinterpret_cast<uint32_t *>(dst + dn * 8 + 2 * t) =
              sk::pack2<bf16>(acc[mt][dn][2 * r] * inv, acc[mt][dn][2 * r + 1] * inv);
    }
}

// launch: one instantiation's grid on st (shared memory over 48 KB allowed once per process).
template <int D, int NW, int MT, int BK = 64>
bool launch(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo, int L, int Lk, int H,
            int rep, int hd, float scale, bool causal, cudaStream_t st, int batch, long long sq, long long skv,
            long long so) {
  constexpr size_t smem = smem_bytes<D, NW, MT, BK>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(flash_kernel<D, NW, MT, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (attr != cudaSuccess) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)((L + NW * 16 * MT - 1) / (NW * 16 * MT)), (unsigned)H, (unsigned)batch);
  cfg.blockDim = dim3(NW * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  const float sl2 = scale * 1.4426950408889634f;
  return cudaLaunchKernelEx(&cfg, flash_kernel<D, NW, MT, BK>, q, ldq, k, v, ldkv, o, ldo, L, Lk, rep, hd, sl2,
                            causal ? 1 : 0, sq, skv, so) == cudaSuccess;
}

// sm_count: the current device's multiprocessors (read once per process).
inline int sm_count() {
  static const int n = [] {
    int d = 0, v = 0;
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d) != cudaSuccess)
      v = 132;
    return v;
  }();
  return n;
}

}  // namespace fa

// flash_attention_batched: flash_attention (below) over batch independent items in one launch, item b's
// q, k, v and o at q + b * sq, k + b * skv, v + b * skv, o + b * so (elements; multiples of 8):
// a CFG pair's two sequences, a vision tower's tiles. One launch fills the GPU where each item's
// blocks alone would leave most of a wave idle (1056 tokens x 30 heads: 270 blocks of 128 rows on 132 SMs).
inline bool flash_attention_batched(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo,
                                    int L, int Lk, int H, int Hkv, int hd, float scale, bool causal, cudaStream_t st,
                                    int batch, long long sq, long long skv, long long so) {
  auto al = [](const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (L < 1 || Lk < 1 || H < 1 || Hkv < 1 || H % Hkv || hd < 8 || hd > 128 || hd % 8 || ldq % 8 || ldkv % 8 ||
      ldo % 8 || !al(q) || !al(k) || !al(v) || !al(o) || batch < 1 || batch > 65535 || sq % 8 || skv % 8 || so % 8)
    return false;
  const int rep = H / Hkv;
#if !defined(MQB_HOST_TEST)
  // Hopper, head dim 128, no mask: flash_wgmma.cuh (546 us a call at FLUX's 4,352 tokens x 24
  // heads where this file's kernel takes 872, H200: lab/cuda/results/gpu_2026-12-07f_h200).
  if (hd == 128 && !causal && fw::launch(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, scale, st, batch, sq, skv, so))
    return true;
#endif
  // Block shapes by lab/cuda/results/flash_check_2026-12-06_h100_run2.txt (H100): head dim 128
  // takes 128-row blocks (MT = 2: 290 TFLOP/s at 4128 tokens against 190) where they fill at
  // least 1.5 waves of two a multiprocessor; 1056 tokens x 30 heads (270 such blocks
  // on 132 SMs) ran faster as 64-row blocks (0.102 ms against 0.108). Head dim 72/80: MT = 2
  // (0.032 ms against 0.038 at 1024 rows x 16 heads of 72); 64: 64-row blocks (0.037 against 0.040).
  if (hd <= 64) return fa::launch<64, 4, 1>(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, hd, scale, causal, st, batch, sq,
                                              skv, so);
  if (hd <= 80) return fa::launch<80, 4, 2>(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, hd, scale, causal, st, batch, sq,
                                              skv, so);
  if (hd <= 96) return fa::launch<96, 4, 1>(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, hd, scale, causal, st, batch, sq,
                                              skv, so);
  if ((long long)(L + 127) / 128 * H * batch >= 3LL * fa::sm_count())
    return fa::launch<128, 4, 2>(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, hd, scale, causal, st, batch, sq,
                                              skv, so);
  return fa::launch<128, 4, 1>(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, hd, scale, causal, st, batch, sq,
                                              skv, so);
}

// flash_attention: o[i, h*hd..] = softmax(scale * q_h k_g^T (+ causal mask)) v_g for query head h, kv head g = h / (H/Hkv).
// q rows of stride ldq elements, k and v rows of stride ldkv, o rows of stride ldo (all bf16, head h at column offset h*hd).
// Returns false (and launches nothing) when the shape is unsupported (hd not in the compiled set), so callers fall back.
// Supported: hd a multiple of 8 up to 128 (run as 64, 80, 96 or 128), H a multiple of Hkv, ldq, ldkv,
// ldo multiples of 8 and q, k, v, o 16-byte aligned; any L, Lk >= 1. Causal: key j <= query i
// (the same positions, as softmax_k).
inline bool flash_attention(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo, int L,
                            int Lk, int H, int Hkv, int hd, float scale, bool causal, cudaStream_t st) {
  return flash_attention_batched(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, Hkv, hd, scale, causal, st, 1, 0, 0, 0);
}

}  // namespace img
}  // namespace mqcuda
