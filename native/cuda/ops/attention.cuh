// attention.cuh: causal attention of each token over its slot's cache (attend, attend_flash,
// attention_kernel): prefill and mixed steps of fp32 models and decode steps run unfused.
#pragma once
#include "rotary.cuh"

namespace mqcuda {

constexpr int ATT_THREADS = 256;
constexpr int ATT_TILE = 512;
constexpr int ATT_GRP = 16;          // V-accumulating thread groups of attend
constexpr int MAXG = 8;
constexpr int ATT_SPLIT_MAX = 16;    // most position splits of one (token, KV head) in a decode step
constexpr int ATT_SPLIT_MAX_T = 64;  // split only decode steps of at most this many tokens
constexpr int ATT_SPLIT_MIN_POS = 256;  // shortest position range worth a split of its own
constexpr int ATT_FEW_SPLITS = 4;   // a decode step of few (token, KV head) items: this many splits,
constexpr int ATT_FEW_BLOCKS = 64;  // ... up to this many blocks in all,
constexpr int ATT_FEW_POS = 16;     // ... of at least this many positions each
// attention_kernel instances of up to this many query heads per KV head are compiled to fit two
// blocks per SM (at most 128 registers a thread; no spills with nvcc 13.0): a decode step of 32
// sequences of the Qwen3-0.6B shape is 256 blocks, two waves at one block per SM (164
// registers). GM 4 and 8 keep one block (not measured with two). decode_attn_kernel stays at
// one: at 17-32 sequences it lost to qkv_post + attention with two blocks per SM too (measured on
// the H200, lab/cuda/NOTES.md), and below that its grid is smaller than the GPU.
constexpr int ATT_2BLK_GM = 2;
constexpr int ATT_CLUSTER_MAX = 8;  // the most blocks of one cluster (cluster_of): portable
// cluster_of: how many blocks of n splits (decode attention's positions, a product's K) form one
// thread-block cluster: all n where on and 2 <= n <= 8 (a portable cluster), else 1 (no cluster;
// the splits meet in L2). The CPU emulation runs one block at a time: never a cluster there.
inline int cluster_of(bool on, int n) {
#ifdef MQB_HOST_TEST
  (void)on;
  (void)n;
  return 1;
#else
  return on && n > 1 && n <= ATT_CLUSTER_MAX ? n : 1;
#endif
}

__device__ __forceinline__ uint4 ldcg4(const void *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }

// attn_smem: bytes of dynamic shared memory attn_item (and attention_kernel) use for up to GM
// query heads per KV head of D values: q, the new k and v, the output sums, one tile of scores
// and the V groups' partial sums.
__host__ __device__ inline size_t attn_smem(int GM, int D) {
  return sizeof(float) * ((size_t)2 * GM * D + 2 * (size_t)D + (size_t)GM * ATT_TILE + (size_t)ATT_GRP * GM * D);
}

// attn_park: floats per split of decode_attn_kernel's park (debug "attn_push"), which follows
// attn_smem in split 0's shared memory: a split's G * D sums, then its G (max, sum) pairs.
__host__ __device__ inline int attn_park(int GM, int D) { return GM * D + 2 * GM; }

// lanes_fit: a K row of nch 16-byte chunks can be split over nch lanes of a warp (nch a power
// of two of at most 32: every head_dim in use), as attend's lane scoring and attend_flash need.
__host__ __device__ __forceinline__ bool lanes_fit(int nch) { return nch <= 32 && (nch & (nch - 1)) == 0; }

// flash_fits: attend_flash takes an attention step where flash is asked for and a K row of
// head_dim D fits a warp's lanes; otherwise attend does. The one place that rule lives:
// attend_either applies it on the device, flash_only on the host to pick a kernel instance.
template <typename T>
__host__ __device__ __forceinline__ bool flash_fits(bool flash, int D) { return flash && lanes_fit(D / TT<T>::CH); }

// attend: one block of ATT_THREADS; the G <= GM query heads in qs (G*D floats) attend over
// positions [lo, hi) of the K/V rows kb/vb (row stride rs elements, position p in row
// kv_row(p, rows)), with online softmax per tile of ATT_TILE positions. Leaves the unnormalised sums in oacc[j*D + d] and the running max
// and sum in s_m[j], s_l[j] (s_m = -inf for an empty range). A thread scores one position with
// all of its K row's 16-byte loads in flight; V is read 8 positions deep per thread group.
// Position fresh (-1: none) was written in this launch and is read through L2 (ld.global.cg);
// the others, written by earlier launches, through the read-only L1 path (ld.global.nc).
template <typename T, int GM>
__device__ void attend(const float *qs, const T *kb, const T *vb, size_t rs, int rows, int lo, int hi, int fresh, int D, int G,
                       float *sc, float *red, float *s_m, float *s_l, float *s_c, float *oacc,
                       bool lanes_ok = true) {
  constexpr int CH = TT<T>::CH;
  constexpr int KU = 16;  // K chunks in flight per pass (D = 128 bf16 in one pass)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nch = D / CH;
  const int ngrp = min(ATT_GRP, ATT_THREADS / nch);
  const int grp = tid / nch, ch = tid % nch;
  if (tid < GM) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.f;
    s_c[tid] = 0.f;
  }
  float acc[GM][CH];
#pragma unroll
  for (int j = 0; j < GM; ++j)
#pragma unroll
    for (int e = 0; e < CH; ++e) acc[j][e] = 0.f;
  // lanes: K rows of nch chunks, nch a power of two of at most 32 (every head_dim in use), are
  // scored by nch lanes per position; qf is the lane's chunk of each query head.
  const bool lanes = lanes_ok && lanes_fit(nch);
  float qf[GM][CH];
  __syncthreads();  // qs was written by the caller
  if (lanes) {
    const int sl = lane % nch;
#pragma unroll
    for (int j = 0; j < GM; ++j)
#pragma unroll
      for (int e = 0; e < CH; ++e) qf[j][e] = j < G ? qs[j * D + sl * CH + e] : 0.f;
  }
  for (int t0 = lo; t0 < hi; t0 += ATT_TILE) {
    const int tn = min(ATT_TILE, hi - t0);
    if (lanes) {
      // nch lanes score one position (one 16-byte chunk of its K row each, then a shuffle sum),
      // SU positions per lane group with their loads in flight together: a few positions no
      // longer wait on one thread's serial 128-wide dot product (a timeline: scores 4.5
      // us of a 12.6 us attention at batch 1: attention 10.8 us instead of
      // 12.5-13.7 at positions 32-48, tokens/s at 48-348 within 1 %; SU = 8 no better).
      constexpr int SU = 4;
      const int ppw = 32 / nch, sub = lane / nch, sl = lane - sub * nch;
      const int stride = (ATT_THREADS / 32) * ppw;
      for (int base = warp * ppw; base < tn; base += SU * stride) {  // warp-uniform: shuffles below
        uint4 raw[SU];
#pragma unroll
        for (int u = 0; u < SU; ++u) {
          const int pp = base + u * stride + sub;
          const T *kr = kb + (size_t)kv_row(t0 + pp, rows) * rs + sl * CH;
          raw[u] = pp >= tn ? make_uint4(0u, 0u, 0u, 0u)
                   : t0 + pp == fresh ? ldcg4(kr)
                                      : __ldg(reinterpret_cast<const uint4 *>(kr));
        }
#pragma unroll
        for (int u = 0; u < SU; ++u) {
          float kf[CH];
          TT<T>::unpack(raw[u], kf);
          float s[GM];
#pragma unroll
          for (int j = 0; j < GM; ++j) {
            s[j] = 0.f;
            if (j < G)
#pragma unroll
              for (int e = 0; e < CH; ++e) s[j] = fmaf(qf[j][e], kf[e], s[j]);
          }
          for (int o = nch >> 1; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < GM; ++j) s[j] += __shfl_xor_sync(0xffffffffu, s[j], o);
          const int pp = base + u * stride + sub;
          if (sl == 0 && pp < tn)
#pragma unroll
            for (int j = 0; j < GM; ++j)
              if (j < G) sc[j * ATT_TILE + pp] = s[j];
        }
      }
    } else {
      for (int pp = tid; pp < tn; pp += ATT_THREADS) {
        const T *kr = kb + (size_t)kv_row(t0 + pp, rows) * rs;
        float s[GM];
#pragma unroll
        for (int j = 0; j < GM; ++j) s[j] = 0.f;
        for (int c0 = 0; c0 < nch; c0 += KU) {
          uint4 raw[KU];
#pragma unroll
          for (int u = 0; u < KU; ++u)
            raw[u] = c0 + u >= nch ? make_uint4(0u, 0u, 0u, 0u)
                     : t0 + pp == fresh ? ldcg4(kr + (c0 + u) * CH)
                                        : __ldg(reinterpret_cast<const uint4 *>(kr + (c0 + u) * CH));
#pragma unroll
          for (int u = 0; u < KU; ++u) {
            if (c0 + u < nch) {
              float kf[CH];
              TT<T>::unpack(raw[u], kf);
#pragma unroll
              for (int j = 0; j < GM; ++j) {
                if (j < G) {
                  const float *qq = qs + j * D + (c0 + u) * CH;
#pragma unroll
                  for (int e = 0; e < CH; ++e) s[j] = fmaf(qq[e], kf[e], s[j]);
                }
              }
            }
          }
        }
#pragma unroll
        for (int j = 0; j < GM; ++j)
          if (j < G) sc[j * ATT_TILE + pp] = s[j];
      }
    }
    __syncthreads();
    if (warp < G) {
      float *row = sc + warp * ATT_TILE;
      float mx = -INFINITY;
      for (int pp = lane; pp < tn; pp += 32) mx = fmaxf(mx, row[pp]);
      mx = warp_max(mx);
      const float mold = s_m[warp], mnew = fmaxf(mold, mx);
      const float corr = (mold == -INFINITY) ? 0.f : expf(mold - mnew);
      float sum = 0.f;
      for (int pp = lane; pp < tn; pp += 32) {
        const float e = expf(row[pp] - mnew);
        row[pp] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        s_l[warp] = s_l[warp] * corr + sum;
        s_m[warp] = mnew;
        s_c[warp] = corr;
      }
    }
    __syncthreads();
    if (grp < ngrp) {
#pragma unroll
      for (int j = 0; j < GM; ++j) {
        if (j < G) {
          const float c = s_c[j];
#pragma unroll
          for (int e = 0; e < CH; ++e) acc[j][e] *= c;
        }
      }
      for (int p0 = grp; p0 < tn; p0 += 8 * ngrp) {  // 8 positions' V vectors in flight
        uint4 raw[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int pp = p0 + u * ngrp;
          const T *vp = vb + (size_t)kv_row(t0 + pp, rows) * rs + ch * CH;
          raw[u] = pp >= tn ? make_uint4(0u, 0u, 0u, 0u)
                   : t0 + pp == fresh ? ldcg4(vp) : __ldg(reinterpret_cast<const uint4 *>(vp));
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int pp = p0 + u * ngrp;
          if (pp < tn) {
            float vf[CH];
            TT<T>::unpack(raw[u], vf);
#pragma unroll
            for (int j = 0; j < GM; ++j) {
              if (j < G) {
                const float pj = sc[j * ATT_TILE + pp];
#pragma unroll
                for (int e = 0; e < CH; ++e) acc[j][e] = fmaf(pj, vf[e], acc[j][e]);
              }
            }
          }
        }
      }
    }
    __syncthreads();
  }
  if (grp < ngrp) {
#pragma unroll
    for (int j = 0; j < GM; ++j)
      if (j < G) {
#pragma unroll
        for (int e = 0; e < CH; ++e) red[((size_t)grp * G + j) * D + ch * CH + e] = acc[j][e];
      }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += ATT_THREADS) {
    const int j = i / D, d = i - j * D;
    float s = 0.f;
    for (int q = 0; q < ngrp; ++q) s += red[((size_t)q * G + j) * D + d];
    oacc[i] = s;
  }
  __syncthreads();
}

// prefetch_kv_rows asks L2 for the cached K and V of positions [lo, hi) of KV head kh of cache
// slot sl (rows rows a slot: kv_row).
// decode_attn_kernel calls it before it waits for the previous kernel (programmatic dependent
// launch): rows of earlier steps do not depend on that kernel. Only there: the fused kernel runs
// where few sequences decode, whose rows fit in L2 (batch 1: 852 against 827 tok/s).
// attention_kernel did the same and lost 12 % at batch 32 with 2,048 positions (268 MB
// of rows per layer asked of a 50 MB L2), so it does not prefetch.
template <typename T>
__device__ void prefetch_kv_rows(const T *kc, const T *vc, int sl, int kh, int lo, int hi, int nkv, int D, int rows) {
  const int rowl = max(1, D * (int)sizeof(T) / 128);  // 128-byte lines per row
  const size_t rs = (size_t)nkv * D, base = ((size_t)sl * rows * nkv + kh) * D;
  for (int i = threadIdx.x; i < (hi - lo) * rowl; i += blockDim.x) {
    const size_t at = base + (size_t)kv_row(lo + i / rowl, rows) * rs;
    const int off = (i % rowl) * 128;
    prefetch_l2(reinterpret_cast<const char *>(kc + at) + off);
    prefetch_l2(reinterpret_cast<const char *>(vc + at) + off);
  }
}

// attend_flash: attend's result (unnormalised sums in oacc, running max and sum in s_m, s_l;
// s_m = -inf for an empty range) for a decode step, computed without block-wide phases: the
// block's lane groups (nch lanes, a position at a time: 16 groups for bf16 head_dim 128) each
// run their own online softmax over every 16th position, with its K and V chunks loaded
// together, SU positions in flight; the groups of a warp merge by shuffles and the 8 warps
// through shared memory (red: 8 GM D floats, sc: 16 GM). attend's scores, softmax and V
// phases were each a round trip to L2 and a barrier (lab/cuda/NOTES.md: 2.7 + 1.1 + 2.1 us
// of attention's 10.8 at batch 1). Needs lanes_fit(nch).
template <typename T, int GM>
__device__ void attend_flash(const float *qs, const T *kb, const T *vb, size_t rs, int rows, int lo, int hi, int fresh, int D,
                             int G, float *sc, float *red, float *s_m, float *s_l, float *oacc) {
  constexpr int CH = TT<T>::CH;
  constexpr int SU = 4;
  constexpr int NW = ATT_THREADS / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nch = D / CH, ppw = 32 / nch, sub = lane / nch, sl = lane - sub * nch;
  const int ngroups = NW * ppw, g = warp * ppw + sub;
  float qf[GM][CH], acc[GM][CH], m[GM], l[GM];
  __syncthreads();  // qs was written by the caller
#pragma unroll
  for (int j = 0; j < GM; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < CH; ++e) {
      qf[j][e] = j < G ? qs[j * D + sl * CH + e] : 0.f;
      acc[j][e] = 0.f;
    }
  }
  const int span = hi - lo;
  for (int base = 0; base < span; base += SU * ngroups) {  // block-uniform: shuffles below
    uint4 kr[SU], vr[SU];
#pragma unroll
    for (int u = 0; u < SU; ++u) {
      const int pp = base + u * ngroups + g, pos = lo + pp;
      const size_t off = (size_t)kv_row(pos, rows) * rs + sl * CH;
      const bool ok = pp < span;
      kr[u] = !ok           ? make_uint4(0u, 0u, 0u, 0u)
              : pos == fresh ? ldcg4(kb + off)
                             : __ldg(reinterpret_cast<const uint4 *>(kb + off));
      vr[u] = !ok           ? make_uint4(0u, 0u, 0u, 0u)
              : pos == fresh ? ldcg4(vb + off)
                             : __ldg(reinterpret_cast<const uint4 *>(vb + off));
    }
#pragma unroll
    for (int u = 0; u < SU; ++u) {
      const bool ok = base + u * ngroups + g < span;
      float kf[CH], vf[CH], sc_[GM];
      TT<T>::unpack(kr[u], kf);
      TT<T>::unpack(vr[u], vf);
#pragma unroll
      for (int j = 0; j < GM; ++j) {
        sc_[j] = 0.f;
#pragma unroll
        for (int e = 0; e < CH; ++e) sc_[j] = fmaf(qf[j][e], kf[e], sc_[j]);
      }
      for (int o = nch >> 1; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < GM; ++j) sc_[j] += __shfl_xor_sync(0xffffffffu, sc_[j], o);
      if (ok) {
#pragma unroll
        for (int j = 0; j < GM; ++j) {
          if (j < G) {
            const float mn = fmaxf(m[j], sc_[j]);
            const float corr = expf(m[j] - mn), pj = expf(sc_[j] - mn);  // m = -inf: corr 0
            l[j] = l[j] * corr + pj;
#pragma unroll
            for (int e = 0; e < CH; ++e) acc[j][e] = fmaf(pj, vf[e], acc[j][e] * corr);
            m[j] = mn;
          }
        }
      }
    }
  }
  // The groups of a warp (lanes sl, sl + nch, ...) merge into the first.
  for (int o = nch; o < 32; o <<= 1) {
#pragma unroll
    for (int j = 0; j < GM; ++j) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[j], o), lo_ = __shfl_xor_sync(0xffffffffu, l[j], o);
      const float mn = fmaxf(m[j], mo);
      const float a = m[j] == -INFINITY ? 0.f : expf(m[j] - mn), b = mo == -INFINITY ? 0.f : expf(mo - mn);
#pragma unroll
      for (int e = 0; e < CH; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[j][e], o);
        acc[j][e] = acc[j][e] * a + ao * b;
      }
      l[j] = l[j] * a + lo_ * b;
      m[j] = mn;
    }
  }
  float *pm = sc, *pl = sc + NW * GM;  // [warp][GM]
  if (sub == 0) {
#pragma unroll
    for (int j = 0; j < GM; ++j) {
      if (j < G) {
        if (sl == 0) {
          pm[warp * GM + j] = m[j];
          pl[warp * GM + j] = l[j];
        }
#pragma unroll
        for (int e = 0; e < CH; ++e) red[((size_t)warp * GM + j) * D + sl * CH + e] = acc[j][e];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += ATT_THREADS) {
    const int j = i / D;
    float M = -INFINITY;
    for (int w = 0; w < NW; ++w) M = fmaxf(M, pm[w * GM + j]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
      for (int w = 0; w < NW; ++w) {
        const float mw = pm[w * GM + j];
        if (mw == -INFINITY) continue;
        const float f = expf(mw - M);
        L += pl[w * GM + j] * f;
        A += red[((size_t)w * GM + j) * D + (i - j * D)] * f;
      }
    }
    oacc[i] = A;
    if (i - j * D == 0) {
      s_m[j] = M;
      s_l[j] = L;
    }
  }
  __syncthreads();
}

// attend_either runs attend_flash or attend by flash_fits; score_lanes is attend's lane scoring.
// FLASH_ONLY (the launch
// checked the rule: flash_only) compiles attend_flash alone, so that the kernel carries no attend:
// dead code too costs a launch (lab/cuda/NOTES.md: batch 1 +4 %).
template <typename T, int GM, bool FLASH_ONLY = false>
__device__ void attend_either(bool flash, const float *qs, const T *kb, const T *vb, size_t rs, int rows, int lo, int hi,
                              int fresh, int D, int G, float *sc, float *red, float *s_m, float *s_l, float *s_c,
                              float *oacc, bool score_lanes = true) {
  if (FLASH_ONLY || flash_fits<T>(flash, D)) {
    attend_flash<T, GM>(qs, kb, vb, rs, rows, lo, hi, fresh, D, G, sc, red, s_m, s_l, oacc);
  } else if constexpr (!FLASH_ONLY) {
    attend<T, GM>(qs, kb, vb, rs, rows, lo, hi, fresh, D, G, sc, red, s_m, s_l, s_c, oacc, score_lanes);
  }
}

// window_lo: the first position a query at position p attends with a sliding window of window
// positions (0: none, the whole cache): keys k with p - window < k <= p, as transformers'
// sliding_window_overlay (kv_idx > q_idx - sliding_window) on top of the causal mask.
__host__ __device__ __forceinline__ int window_lo(int p, int window) {
  return window > 0 && p + 1 > window ? p + 1 - window : 0;
}

// attention_kernel (prefill and mixed steps, and decode steps of many sequences): block (token t,
// KV head g) attends the G query heads of group g (already normed, rotated and scaled by qkv_post)
// over positions window_lo(pos[t], window)..pos[t] of the token's slot: causal for a prompt, the
// whole cache (or its last window positions) for a continuing sequence. flash (decode steps, and
// prefill with debug prefill_flash, the default) goes through attend_flash; debug attn_flash 0
// sends both back to attend. Two blocks per SM for up to ATT_2BLK_GM query heads per KV head (see
// there; H200, lab/cuda/NOTES.md: 8.1 us alone instead of 11.7, 7.5 us per layer of a batch-32 step
// instead of 11.3). FLASH_ONLY: the instance for steps that attend_flash takes (flash_only),
// without attend's code. toks (NULL: block x is token x) lists the tokens to take, -1 for none (a
// graphed chunk's fixed grid): a prefill or mixed chunk's one-token tiles (prefill_tiles).
template <typename T, int GM, bool FLASH_ONLY>
__global__ void __launch_bounds__(ATT_THREADS, GM <= ATT_2BLK_GM ? 2 : 1)
    attention_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                     const int *__restrict__ tpos, const int *__restrict__ tslot, T *__restrict__ out, int nh,
                     int nkv, int D, int rows, int flash, const int *__restrict__ toks, int window) {
  DYN_SMEM(float, asm_);
  __shared__ float s_m[MAXG], s_l[MAXG], s_c[MAXG];
  pdl_wait();
  pdl_trigger();
  const int t = toks ? toks[blockIdx.x] : (int)blockIdx.x, g = blockIdx.y, G = nh / nkv;
  if (t < 0) return;  // block-uniform
  float *qs = asm_, *oacc = qs + GM * D, *sc = oacc + GM * D, *red = sc + GM * ATT_TILE;
  for (int i = threadIdx.x; i < G * D; i += ATT_THREADS) qs[i] = q[((size_t)t * nh + (size_t)g * G) * D + i];
  const size_t base = ((size_t)tslot[t] * rows * nkv + g) * D, rs = (size_t)nkv * D;
  attend_either<T, GM, FLASH_ONLY>(flash != 0, qs, kc + base, vc + base, rs, rows, window_lo(tpos[t], window), tpos[t] + 1, -1,
                                   D, G, sc, red, s_m, s_l, s_c, oacc);
  for (int i = threadIdx.x; i < G * D; i += ATT_THREADS)
    out[((size_t)t * nh + (size_t)g * G) * D + i] = TT<T>::fromf(oacc[i] / s_l[i / D]);
}

// DecAttn: one layer's decode attention with the q/k/v post-processing fused in (attn_item).

}  // namespace mqcuda
