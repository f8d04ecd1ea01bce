// prefill_attn.cuh: causal attention of prefill and mixed steps on the tensor cores (bf16/fp16
// KV cache, head_dim 16, 32, 64 or 128), after FlashAttention-2. Included by backend.cu after
// tile.cuh (sk::mma, sk::ldsm4, sk::pack2); the host side is prefill_tiles and run_tokens'
// attention there. Runs in the CPU emulation too (host_test/emu_test.cc emulates mma.sync and
// ldmatrix).
//
// Why: attention_kernel gives every (token, KV head) a block of its own that reads the token's
// whole causal range of K/V rows and scores it on the CUDA cores. 32 prompts of 128 tokens then
// spent 32-44 ms of a 45-60 ms prefill in attention (kernel sums, Qwen3-0.6B shape),
// ~1.1 ms per layer: most of a request's time to first token under load. Here they spend 2.1 ms
// and prefill in 15.9 ms; with the 2,048-token chunks the served concurrency-32 TTFT
// p50 fell from 61 ms to 37.
//
// How: a block takes a tile of up to BQ = 64 consecutive tokens of one sequence (prefill_tiles cuts
// the chunk's tokens so) and one query head: 4 warps of 16 query rows. It stages the tile's q rows
// (fp32, already normed, rotated and scaled by qkv_post) as T and keeps them in registers as
// mma.sync A fragments, then walks the cached positions 0..(the tile's last) in tiles of BK = 64
// (with a sliding window, from the K/V tile that holds the first row's first key: window_lo): K and
// V rows into shared memory, S = Q K^T (m16n8k16, fp32 accumulation), the causal mask (and the
// window's lower edge), an online softmax per row (running max and sum in fp32, the four lanes of a
// row's quad reduced by shuffles), then O += P V with P rounded to T as the A operand (the score
// accumulators of two n8 tiles are already an A fragment's layout) and V through ldmatrix .trans.
// Rows are finished by 1 / sum. Padded shared-memory rows (D + 8 elements) keep ldmatrix's eight
// rows on different banks.
#pragma once
#include "attention.cuh"
#include "tile.cuh"

namespace mqcuda {

namespace pa {

constexpr int BQ = 64;       // query rows (tokens) per block: 4 warps of 16
constexpr int BK = 64;       // cached positions per K/V tile
constexpr int THREADS = 128;

// Tile: tokens t0 .. t0 + n - 1 of a chunk (n <= BQ), consecutive positions of one sequence.
struct Tile {
  int t0, n;
};

// supported: head_dims the kernel is instantiated for.
__host__ __device__ constexpr bool supported(int D) { return D == 16 || D == 32 || D == 64 || D == 128; }

// stage_rows copies the cached positions k0 .. k0 + BK - 1 of one KV head (row stride rs
// elements, from src; position k in row kv_row(k, rows)) into shared rows of RS elements with
// asynchronous 16-byte copies (sk::stage16), and zeros the positions below klo (before every
// row's window: a windowed cache may have given their rows to newer positions) and past pmax
// with plain stores, so no row outside the tile's keys is read. Every thread of the block takes part.
template <typename T, int D>
__device__ __forceinline__ void stage_rows(T *dst, const T *src, size_t rs, int rows, int k0, int klo, int pmax) {
  constexpr int RS = D + 8;
  for (int i = threadIdx.x; i < BK * (D / 8); i += THREADS) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    if (k0 + r >= klo && k0 + r <= pmax)
      sk::stage16(dst + r * RS + c, src + (size_t)kv_row(k0 + r, rows) * rs + c);
    else
      *reinterpret_cast<uint4 *>(dst + r * RS + c) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The asynchronous copies' groups: stage_commit closes the copies issued so far into a group;
// stage_wait_but_one waits for all groups but the newest, stage_wait_all for all of them. (In
// the CPU emulation sk::stage16 copies at once, and these are no-ops.)
__device__ __forceinline__ void stage_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void stage_wait_but_one() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}
__device__ __forceinline__ void stage_wait_all() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// prefill_attn_kernel: grid (tiles, query heads), THREADS threads. q [tokens, nh, D] fp32; the
// cache [slots, maxctx rows, nkv, D] in T holds every position a token attends (qkv_post
// appended the chunk's; position k in row kv_row(k, maxctx)); out [tokens, nh, D] in T. window:
// the sliding window (0: none): a row at position p attends keys window_lo(p, window)..p.
template <typename T, int D>
__global__ void __launch_bounds__(THREADS) prefill_attn_kernel(const float *__restrict__ q, const T *__restrict__ kc,
                                                              const T *__restrict__ vc, const int *__restrict__ tpos,
                                                              const int *__restrict__ tslot,
                                                              const Tile *__restrict__ tiles, T *__restrict__ out,
                                                              int nh, int nkv, int maxctx, int window) {
  constexpr int RS = D + 8;  // shared row stride in elements (16-byte aligned rows)
  constexpr int DK = D / 16, DN = D / 8, NT = BK / 8;
  __shared__ uint4 kraw[BK * RS * sizeof(T) / 16], vraw[BK * RS * sizeof(T) / 16];  // 16-byte aligned
  T *ks = reinterpret_cast<T *>(kraw), *vs = reinterpret_cast<T *>(vraw);
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const Tile tile = tiles[blockIdx.x];
  if (tile.n == 0) return;  // past a graphed chunk's tiles (its grid is fixed: run_chunk)
  const int h = blockIdx.y, kh = h / (nh / nkv);
  const int slot = tslot[tile.t0], p0 = tpos[tile.t0], pmax = p0 + tile.n - 1;
  // The tile's q rows as T in ks (rows past n zero), then each warp's 16 rows as A fragments.
  for (int i = threadIdx.x; i < BQ * (D / 4); i += THREADS) {
    const int r = i / (D / 4), c = (i % (D / 4)) * 4;
    const float4 v = r < tile.n ? *reinterpret_cast<const float4 *>(q + ((size_t)(tile.t0 + r) * nh + h) * D + c)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
    T *d = ks + r * RS + c;
    d[0] = TT<T>::fromf(v.x);
    d[1] = TT<T>::fromf(v.y);
    d[2] = TT<T>::fromf(v.z);
    d[3] = TT<T>::fromf(v.w);
  }
  __syncthreads();
  uint32_t qa[DK][4];
#pragma unroll
  for (int kk = 0; kk < DK; ++kk) sk::ldsm4(qa[kk], ks + (w * 16 + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
  __syncthreads();  // ks is the K tile's from here
  // This lane's rows of the tile: r0 = 16 w + g (accumulator elements 0, 1) and r0 + 8 (2, 3).
  const int r0 = w * 16 + g;
  const int qp[2] = {p0 + r0, p0 + r0 + 8};
  const bool live[2] = {r0 < tile.n, r0 + 8 < tile.n};
  // The window's lower edge: keys at or below qlo[r] are masked (-1 without a window: none).
  const int qlo[2] = {window > 0 ? qp[0] - window : -1, window > 0 ? qp[1] - window : -1};
  const int wlast = p0 + min(w * 16 + 15, tile.n - 1);  // the warp's last position (if it has rows)
  const int wfirst = window_lo(p0 + w * 16, window);     // the first key of the warp's first row
  float o[DN][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dn][e] = 0.f;
  const size_t rs = (size_t)nkv * D, base = ((size_t)slot * maxctx * nkv + kh) * D;
  const bool active = w * 16 < tile.n;  // warp-uniform: the warp has rows of the tile
  float s[NT][4];
  const int klo = window_lo(p0, window);  // the tile's first key (its first row's)
  for (int k0 = klo / BK * BK; k0 <= pmax; k0 += BK) {
    // K rows k0 .. k0 + BK - 1, then V's, as two groups of asynchronous copies: every load of a
    // tile is in flight at once, without registers, and V lands while the scores are made (a
    // mixed step's prefill attention 0.85 -> 0.77 ms against register loads, lab/cuda/NOTES.md).
    // Rows before the tile's first key or past its last position are zeros (masked for every
    // row, and finite, so 0 * V stays 0).
    stage_rows<T, D>(ks, kc + base, rs, maxctx, k0, klo, pmax);
    stage_commit();
    stage_rows<T, D>(vs, vc + base, rs, maxctx, k0, klo, pmax);
    stage_commit();
    stage_wait_but_one();
    __syncthreads();
    // A warp whose rows all precede k0, or whose windows all begin past the tile, skips it.
    const bool live_tile = active && wlast >= k0 && wfirst < k0 + BK;
    if (live_tile) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
      // S = Q K^T: lanes address K rows (positions) 16 np + 8 (lane >> 4) + (lane & 7) at k half
      // (lane >> 3) & 1, giving b0, b1 of n tiles 2 np and 2 np + 1.
#pragma unroll
      for (int kk = 0; kk < DK; ++kk)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          sk::ldsm4(b, ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * RS + kk * 16 + ((lane >> 3) & 1) * 8);
          sk::mma<T>(s[2 * np], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
          sk::mma<T>(s[2 * np + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[2], b[3]);
        }
      // Mask, then the online softmax of rows r0 (elements 0, 1) and r0 + 8 (2, 3).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = mrow[r];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float &x = s[nt][2 * r + e];
            const int k = k0 + nt * 8 + 2 * t + e;
            if (!live[r] || k > qp[r] || k <= qlo[r]) x = -INFINITY;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ms = mx == -INFINITY ? 0.f : mx;  // a row with nothing unmasked yet stays at zero
        const float corr = expf(mrow[r] - ms);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = expf(s[nt][2 * r + e] - ms);
            s[nt][2 * r + e] = p;
            sum += p;
          }
        lrow[r] = lrow[r] * corr + sum;
        mrow[r] = mx;
#pragma unroll
        for (int dn = 0; dn < DN; ++dn) {
          o[dn][2 * r] *= corr;
          o[dn][2 * r + 1] *= corr;
        }
      }
    }
    stage_wait_all();
    __syncthreads();  // V has landed for every thread's copies
    if (live_tile) {
      // O += P V: P's n tiles 2 kk and 2 kk + 1 are the A fragment of positions 16 kk..; lanes
      // address V rows 16 kk + 8 ((lane >> 3) & 1) + (lane & 7) at dim tile 2 dp + (lane >> 4).
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint32_t a0 = sk::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        const uint32_t a1 = sk::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = sk::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const uint32_t a3 = sk::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < DN / 2; ++dp) {
          uint32_t b[4];
          sk::ldsm4<true>(b, vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RS + (dp * 2 + (lane >> 4)) * 8);
          sk::mma<T>(o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
          sk::mma<T>(o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this K/V tile
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!live[r]) continue;
    T *dst = out + ((size_t)(tile.t0 + r0 + 8 * r) * nh + h) * D;
    const float inv = 1.f / lrow[r];
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      dst[dn * 8 + 2 * t] = TT<T>::fromf(o[dn][2 * r] * inv);
      dst[dn * 8 + 2 * t + 1] = TT<T>::fromf(o[dn][2 * r + 1] * inv);
    }
  }
}

}  // namespace pa

}  // namespace mqcuda
