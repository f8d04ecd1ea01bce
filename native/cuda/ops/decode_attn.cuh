// decode_attn.cuh: decode attention fused with the q/k/v post-processing, positions split over
// blocks (thread-block clusters where they fit), the last split merging.
#pragma once
#include "attention.cuh"

namespace mqcuda {

template <typename T>
struct DecAttn {
  const float *qkv;                 // [tokens, (nh + 2 nkv) D] fp32: the step's qkv product
  const int *pos, *slot;            // per token: its position (the new one) and cache slot
  int nh, nkv, D, maxctx;           // maxctx: the cache's rows a slot (mqb_model::kv_rows; kv_row)
  const float *qn, *kn, *inv_freq;  // q/k RMSNorm weights (NULL: none), RoPE (NULL: none, gpt2)
  float eps, qscale;
  T *kc, *vc;                       // this layer's cache [slots, maxctx rows, nkv, D]
  T *out;                           // [tokens, nh D]
  float *part_acc, *part_ml;        // split partials [tokens*nkv*S][G*D], [..][G][2]
  unsigned int *cnt;                // [tokens*nkv] splits finished; zero between steps
  int score_lanes;                  // attend scores a position with several lanes (debug "attn_lanes")
  int flash;                        // attend_flash instead of attend (debug "attn_flash")
  int cluster;                      // the S splits of an item are one thread-block cluster (1, 1, S)
  int push;                         // with cluster: the partials pushed to split 0 (debug "attn_push")
  const float2 *rope_tab;           // mqb_model::rope_tab (head_pre; with inv_freq)
  const int *sdelta;                // per slot: the rotary position's offset (qwen3vl; NULL: none)
  int window;                       // sliding window (Cfg::window; 0: the whole cache): window_lo
};

// cluster_sync is barrier.cluster with release / acquire order: every block of the thread-block
// cluster has arrived, and what each wrote to its shared memory before is visible to the others.
// dsmem(p, rank) is the address of p (in this block's shared memory) in block `rank` of the
// cluster (distributed shared memory), for plain loads. decode_attn_kernel's split merge and the
// tile kernel's K-split sum use them (attn_cluster, tile_cluster); the CPU emulation, which runs
// one block at a time, never takes those paths.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// cluster_arrive / cluster_wait split one cluster barrier: a kernel whose blocks store into
// another block's shared memory (the pushed merges: attn_push, tile_push) arrives when it begins
// and waits before its first remote store, which is then sure to find the other block running
// (CUDA's rule for distributed shared memory) without a barrier on the critical path.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
template <typename V>
__device__ __forceinline__ V *dsmem(V *p, unsigned rank) {
#if defined(__CUDA_ARCH__)
  unsigned long long r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(reinterpret_cast<unsigned long long>(p)), "r"(rank));
  return reinterpret_cast<V *>(r);
#else
  (void)rank;
  return p;
#endif
}

// split_range is split z of S's positions [lo, hi) of the positions lo0..n-1 of a sequence
// (lo0: window_lo of its new position; 0 without a sliding window).
__device__ __forceinline__ void split_range(int lo0, int n, int S, int z, int &lo, int &hi) {
  const int span = (n - lo0 + S - 1) / S;
  lo = min(n, lo0 + z * span);
  hi = min(n, lo + span);
}

// dec_head_pre loads the HeadPre of head h that attn_item's item (token t, split z of S; any KV
// head) makes: h < G a query head, G its k and G + 1 its v, those two only in the split that
// holds the new position (else, and for h > G + 1, nothing). decode_attn_kernel with PRE calls
// it before the wait for its warp's first head (h = warp), attn_item for the others.
template <typename T, int N>
__device__ __forceinline__ void dec_head_pre(const DecAttn<T> &a, int t, int S, int z, int h, HeadPreN<N> &hp) {
  const int G = a.nh / a.nkv, p = a.pos[t];
  int lo, hi;
  split_range(window_lo(p, a.window), p + 1, S, z, lo, hi);
  if (h > G + 1 || (h >= G && !(lo <= p && p < hi))) return;
  const int pr = p + (a.sdelta ? a.sdelta[a.slot[t]] : 0);
  const float2 *rope = a.inv_freq && h <= G ? a.rope_tab + (size_t)pr * (a.D / 2) : nullptr;
  head_pre(hp, h < G ? a.qn : (h == G ? a.kn : nullptr), rope, a.D);
}

// merge_splits writes out[i] (i < G * D, the block's threads striding) from S position splits'
// partials, in split order, skipping empty ranges: m(q, j), l(q, j) are split q's running max
// and sum for query head j, acc(q, i) its unnormalised sum. attn_item's two merges (partials
// through L2, or through a cluster's shared memory) differ only in where these are read.
template <typename T, typename M, typename L, typename A>
__device__ __forceinline__ void merge_splits(int S, int G, int D, T *out, const M &m, const L &l, const A &acc) {
  for (int i = threadIdx.x; i < G * D; i += ATT_THREADS) {
    const int j = i / D;
    float mx = -INFINITY;
    for (int q = 0; q < S; ++q) mx = fmaxf(mx, m(q, j));
    float Lsum = 0.f, Asum = 0.f;
    for (int q = 0; q < S; ++q) {
      const float mq = m(q, j);
      if (mq == -INFINITY) continue;  // empty range
      const float w = expf(mq - mx);
      Lsum += w * l(q, j);
      Asum += w * acc(q, i);
    }
    out[i] = TT<T>::fromf(Asum / Lsum);
  }
}

// attn_item: token t's new position p, KV head kh, position split z of S: q of the G query heads
// (RMSNorm, RoPE, scale), and in the split that holds p the new k and v, appended to the cache;
// then attention over the split's positions (the S splits share window_lo(p)..p). With S > 1 every
// split leaves its unnormalised partial, and the split that finishes last for (t, kh) merges all S
// in split order (fixed order: the same inputs give the same bits) and resets the counter; with
// a.cluster the S splits are one cluster and split 0 merges them through distributed shared memory.
// Used by decode_attn_kernel (one item per block).
// PRE: hp holds the HeadPre of the warp's first head (dec_head_pre), the rest load their own.
// N: head_vec's values per lane (head_n).
template <typename T, int GM, bool FLASH_ONLY = false, bool PRE = false, int N = HV>
__device__ void attn_item(const DecAttn<T> &a, int t, int kh, int S, int z, float *smem,
                          HeadPreN<N> *hp = nullptr) {
  __shared__ float s_m[MAXG], s_l[MAXG], s_c[MAXG];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, nwarp = ATT_THREADS / 32;
  const int nkv = a.nkv, D = a.D, G = a.nh / nkv;
  float *qs = smem, *kvv = qs + GM * D, *oacc = kvv + 2 * D, *sc = oacc + GM * D, *red = sc + GM * ATT_TILE;
  const int p = a.pos[t], sl = a.slot[t];
  int lo, hi;
  split_range(window_lo(p, a.window), p + 1, S, z, lo, hi);
  const bool mine = lo <= p && p < hi;  // this split holds the new token's position
  const float *row = a.qkv + (size_t)t * (a.nh + 2 * nkv) * D;
  const bool rope = a.inv_freq != nullptr;
  const int pr = p + (a.sdelta ? a.sdelta[sl] : 0);  // the rotary position (qwen3vl's rope delta)
  // The G query heads, then k, then v, through one call site: each inlined copy of head_vec is
  // code that the warps running it fetch cold after the previous kernel (lab/cuda/NOTES.md: cold
  // code costs 0.1-0.3 us per KB on the critical path: one copy instead of three, +1-4 %).
  for (int h = warp; h < G + 2; h += nwarp) {
    if (h >= G && !mine) continue;
    const bool q = h < G, k = h == G;
    const float *src = row + (size_t)(q ? kh * G + h : (k ? a.nh + kh : a.nh + nkv + kh)) * D;
    if (PRE && h != warp) dec_head_pre(a, t, S, z, h, *hp);
    head_vec<PRE, N>(src, q ? a.qn : (k ? a.kn : nullptr), a.eps, a.inv_freq, pr, q ? a.qscale : 1.f, D,
                  q ? qs + h * D : (k ? kvv : kvv + D), rope && h <= G, hp);
  }
  __syncthreads();
  const size_t base = ((size_t)sl * a.maxctx * nkv + kh) * D, rs = (size_t)nkv * D;
  if (mine) {
    // The new k and v rows, CH elements (16 bytes) per thread: one short loop, where one value
    // per thread unrolled into 5 KB of stores (seen in the SASS).
    constexpr int CH = TT<T>::CH;
    const size_t at = base + (size_t)kv_row(p, a.maxctx) * rs;
#pragma unroll 1
    for (int i = tid * CH; i < 2 * D; i += ATT_THREADS * CH) {
      alignas(16) T v[CH];
#pragma unroll
      for (int e = 0; e < CH; ++e) v[e] = TT<T>::fromf(kvv[i + e]);
      T *dst = i < D ? a.kc + at + i : a.vc + at + (i - D);
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(v);
    }
    __syncthreads();
  }
  attend_either<T, GM, FLASH_ONLY>(a.flash != 0, qs, a.kc + base, a.vc + base, rs, a.maxctx, lo, hi, mine ? p : -1, D, G, sc,
                                   red, s_m, s_l, s_c, oacc, a.score_lanes != 0);
  T *out = a.out + ((size_t)t * a.nh + (size_t)kh * G) * D;
  if (S == 1) {
    for (int i = tid; i < G * D; i += ATT_THREADS) out[i] = TT<T>::fromf(oacc[i] / s_l[i / D]);
    __syncthreads();
    return;
  }
  if (a.cluster) {
    // The S splits of (t, kh) are one cluster, split z its block z, merged by split 0 in split
    // order (the arithmetic of the merge below, so the same bits). No partials through L2, no
    // fence, no counter (debug "attn_cluster").
    if (a.push) {
      // attn_push: each split z > 0 writes its partial into split 0's park (distributed shared
      // memory), so one barrier serves: after it no block reads another's memory.
      float *park = smem + attn_smem(GM, D) / sizeof(float);
      const int st = attn_park(GM, D);
      cluster_wait();  // decode_attn_kernel's arrival at its start: every split is running
      if (z > 0) {
        float *dst = dsmem(park + (size_t)z * st, 0u);
        for (int i = tid; i < G * D; i += ATT_THREADS) dst[i] = oacc[i];
        if (tid < G) {
          dst[GM * D + 2 * tid] = s_m[tid];
          dst[GM * D + 2 * tid + 1] = s_l[tid];
        }
      }
      cluster_sync();
      if (z == 0)
        merge_splits(
            S, G, D, out, [&](int q, int j) { return q ? park[q * st + GM * D + 2 * j] : s_m[j]; },
            [&](int q, int j) { return q ? park[q * st + GM * D + 2 * j + 1] : s_l[j]; },
            [&](int q, int i) { return q ? park[q * st + i] : oacc[i]; });
      return;
    }
    // Else each leaves its partial in its own shared memory (oacc, s_m, s_l), split 0 reads them
    // through distributed shared memory, and the second barrier keeps every block's shared
    // memory alive until it has.
    cluster_sync();
    if (z == 0)
      merge_splits(
          S, G, D, out, [&](int q, int j) { return *dsmem(s_m + j, q); }, [&](int q, int j) { return *dsmem(s_l + j, q); },
          [&](int q, int i) { return *dsmem(oacc + i, q); });
    cluster_sync();
    return;
  }
  const int bk = t * nkv + kh;
  float *pacc = a.part_acc + ((size_t)bk * S + z) * G * D;
  float *pml = a.part_ml + ((size_t)bk * S + z) * G * 2;
  for (int i = tid; i < G * D; i += ATT_THREADS) __stcg(pacc + i, oacc[i]);
  if (tid < G) {
    __stcg(pml + 2 * tid, s_m[tid]);
    __stcg(pml + 2 * tid + 1, s_l[tid]);
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(a.cnt + bk, 1u) == (unsigned)(S - 1);
  __syncthreads();
  if (s_last) {  // every split's partial is visible: merge them in split order
    __threadfence();
    const float *pa = a.part_acc + (size_t)bk * S * G * D;
    const float *pm = a.part_ml + (size_t)bk * S * G * 2;
    merge_splits(
        S, G, D, out, [&](int q, int j) { return __ldcg(pm + ((size_t)q * G + j) * 2); },
        [&](int q, int j) { return __ldcg(pm + ((size_t)q * G + j) * 2 + 1); },
        [&](int q, int i) { return __ldcg(pa + (size_t)q * G * D + i); });
    if (tid == 0) a.cnt[bk] = 0u;
  }
  __syncthreads();
}

// decode_attn_kernel: a decode step's attention (one new token per sequence), replacing
// qkv_post_kernel + attention_kernel there: grid (token, KV head, split), one attn_item each.
// Splitting the positions lets a few sequences use every SM; the merge needs no extra launch.
// Launched with clusters (1, 1, S) where a.cluster is set (run_tokens' clz). PRE (pre_params):
// the q/k/v heads' HeadPre loaded before the wait too. N: head_vec's values per lane (head_n;
// run_tokens takes 4 at head_dim 128 with pre_params, else HV).
template <typename T, int GM, bool FLASH_ONLY, bool PRE = false, int N = HV>
__global__ void __launch_bounds__(ATT_THREADS) decode_attn_kernel(const DecAttn<T> a) {
  DYN_SMEM(float, dsm);
  if (a.cluster && a.push && gridDim.z > 1) cluster_arrive();  // attn_item's pushed merge waits for it
  {  // the split's earlier positions (attn_item's range without the new one)
    const int p = a.pos[blockIdx.x];
    int lo, hi;
    split_range(window_lo(p, a.window), p + 1, gridDim.z, blockIdx.z, lo, hi);
    prefetch_kv_rows(a.kc, a.vc, a.slot[blockIdx.x], blockIdx.y, lo, min(p, hi), a.nkv, a.D, a.maxctx);
  }
  HeadPreN<N> hp;
  if (PRE) dec_head_pre(a, blockIdx.x, gridDim.z, blockIdx.z, threadIdx.x >> 5, hp);
  pdl_wait();
  pdl_trigger();
  attn_item<T, GM, FLASH_ONLY, PRE, N>(a, blockIdx.x, blockIdx.y, gridDim.z, blockIdx.z, dsm, &hp);
}

}  // namespace mqcuda
