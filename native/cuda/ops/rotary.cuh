// rotary.cuh: per-head q/k RMSNorm and RoPE (rotate_half), the rotary table, and qkv_post_kernel
// (norm, RoPE, q scaling, K/V append to the cache).
#pragma once
#include "device.cuh"

namespace mqcuda {

// HeadPre is a lane's share of what head_vec needs besides the head's own values, for the HV
// values i = lane + 32 n it holds: the norm's weights and RoPE's cos and sin at the token's
// position. head_pre loads it; none of it depends on the previous kernel, so the kernels load it
// before griddepcontrol.wait (mqb_model::pre_params), and after the wait head_vec only loads the
// head, normalises and rotates. Without the table (pre_params 0) the weights and RoPE's
// frequencies are loaded with the head after the wait and cos/sin made there by sincosf, whose
// code (the Payne-Hanek path, per value) is most of head_vec's (lab/cuda/NOTES.md).
// N (HeadPreN, head_pre, head_vec) is how many of those values a lane holds at most: HV covers
// every head_dim up to 256; qkv_post_kernel and decode_attn_kernel take D / 32 rounded up to a
// power of two (head_n), as a lane issues every unrolled step, guarded off or not
// (lab/cuda/NOTES.md).
constexpr int HV = 8;  // head_vec's values per lane: D <= 256
template <int N = HV>
struct HeadPreN {
  float w[N], c[N], s[N];
};
using HeadPre = HeadPreN<HV>;

// head_n is the N for head_dim D: the fewest values per lane, a power of two, that hold a head.
inline int head_n(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : HV; }

// head_pre fills h for a head of D values: norm weights nw (NULL: no norm), RoPE from rope (the
// position's row of mqb_model::rope_tab, (cos, sin) per frequency; NULL: no RoPE).
template <int N>
__device__ __forceinline__ void head_pre(HeadPreN<N> &h, const float *nw, const float2 *rope, int D) {
  const int lane = threadIdx.x & 31, half = D / 2;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int i = lane + 32 * n;
    h.w[n] = nw && i < D ? nw[i] : 0.f;
    const float2 cs = rope && i < D ? rope[i < half ? i : i - half] : make_float2(1.f, 0.f);
    h.c[n] = cs.x;
    h.s[n] = cs.y;
  }
}

// rope_table_kernel writes tab[p * half + j] = (cos, sin) of (float)p * inv_freq[j] for the n
// positions: exactly head_vec's own sincosf arguments, so either way gives the same bits.
static __global__ void rope_table_kernel(const float *__restrict__ inv_freq, int half, int n, float2 *__restrict__ tab) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * half; i += gridDim.x * blockDim.x) {
    float sn, cs;
    sincosf((float)(i / half) * inv_freq[i % half], &sn, &cs);
    tab[i] = make_float2(cs, sn);
  }
}

// head_vec: RMSNorm over one head of D values (nw may be NULL: no norm), then RoPE (rotate_half)
// at position p when rope, times scale, into dst (shared memory). One warp; src is fp32.
// The same arithmetic, in the same order, as transformers' Qwen3 q_norm/k_norm and
// apply_rotary_pos_emb (cos/sin from inv_freq * position in fp32). hp (PRE): the weights and
// cos/sin loaded already (head_pre; nw and rope still say whether to use them), else loaded
// here from nw and inv_freq. N: values per lane (D <= 32 N).
template <bool PRE = false, int N = HV>
__device__ void head_vec(const float *src, const float *nw, float eps, const float *inv_freq, int p, float scale,
                         int D, float *dst, bool rope, const HeadPreN<N> *hp = nullptr) {
  // A lane's values, the norm weights and the RoPE frequencies are loaded together before any
  // is used (one memory round trip, not one per value: see prep_row).
  const int lane = threadIdx.x & 31, half = D / 2;
  float xv[N], wv[N], fq[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int i = lane + 32 * n;
    xv[n] = wv[n] = fq[n] = 0.f;
    if (i < D) {
      xv[n] = __ldcg(src + i);
      if (PRE) wv[n] = hp->w[n];
      else if (nw) wv[n] = nw[i];
      if (!PRE && rope) fq[n] = inv_freq[i < half ? i : i - half];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (lane + 32 * n < D) ss += xv[n] * xv[n];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / (float)D + eps);
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (lane + 32 * n < D) dst[lane + 32 * n] = nw ? xv[n] * r * wv[n] : xv[n];
  __syncwarp();
  float o[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int i = lane + 32 * n;
    o[n] = 0.f;
    if (i < D) {
      float v = dst[i];
      if (rope) {
        float sn, cs;
        if (PRE) {
          cs = hp->c[n];
          sn = hp->s[n];
        } else {
          sincosf((float)p * fq[n], &sn, &cs);
        }
        const float rot = i < half ? -dst[i + half] : dst[i - half];
        v = fmaf(v, cs, __fmul_rn(rot, sn));  // explicit, so both ways round alike
      }
      o[n] = v * scale;
    }
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (lane + 32 * n < D) dst[lane + 32 * n] = o[n];
  __syncwarp();
}

// kv_row: the cache row that holds position p of a slot of rows rows. A slot holds the model's
// whole context (rows = max_context: the row is the position), or, with a sliding window, a ring
// of at least window + Tcap - 1 rows (mqb_model::kv_rows) where position p lives in row p mod
// rows: every key a query can still attend (window_lo) is newer than the rows a chunk's writes
// reuse. Without a window the modulo is never reached (one compare).
__host__ __device__ __forceinline__ int kv_row(int p, int rows) { return p < rows ? p : p % rows; }

// qkv_post_kernel: grid (token, head group); each warp takes one head of the fused q|k|v row:
// head_vec (q_norm / k_norm, RoPE, q scaled by qscale), then q written fp32 to qout[t, h, :] and
// k and v appended to the token's slot in the cache.
// PRE (pre_params): each warp's first head's HeadPre is loaded before the wait, from rope_tab.
// N: values per lane, head_n(D) (the kernel's instructions are most of its time: a 2,048-token
// prefill chunk's 65,536 heads took 55 us a layer with HV, with pdl off too, and as long with
// every load in flight at once; lab/cuda/NOTES.md).
template <typename T, bool PRE = false, int N = HV>
__global__ void __launch_bounds__(256) qkv_post_kernel(const float *__restrict__ qkv, const int *__restrict__ tpos,
                                                       const int *__restrict__ tslot, int nh, int nkv, int D,
                                                       const float *__restrict__ qn, const float *__restrict__ kn,
                                                       float eps, const float *__restrict__ inv_freq, float qscale,
                                                       float *__restrict__ qout, T *__restrict__ kc,
                                                       T *__restrict__ vc, int maxctx, const float2 *__restrict__ rope_tab,
                                                       const int *__restrict__ rrow, const int *__restrict__ sdelta) {
  DYN_SMEM(float, qsm);
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  const int p = tpos[t], s = tslot[t];  // the step's meta, uploaded before it: no wait needed
  // The rotary row: the position, but for qwen3vl (vision.cuh) a token's own M-RoPE row (rrow)
  // or the position plus its slot's rope delta (sdelta).
  const int pr = rrow ? rrow[t] : p + (sdelta ? sdelta[s] : 0);
  const int nhead = nh + 2 * nkv, hh0 = blockIdx.y * nwarp + warp;
  auto kind_of = [&](int hh) { return hh < nh ? 0 : (hh < nh + nkv ? 1 : 2); };  // q, k, v
  auto norm_of = [&](int kind) { return kind == 0 ? qn : (kind == 1 ? kn : nullptr); };
  auto rope_of = [&](int kind) { return kind != 2 && inv_freq ? rope_tab + (size_t)pr * (D / 2) : nullptr; };
  HeadPreN<N> hp;
  if (PRE && hh0 < nhead) head_pre(hp, norm_of(kind_of(hh0)), rope_of(kind_of(hh0)), D);
  pdl_wait();
  pdl_trigger();
  float *buf = qsm + warp * D;
  for (int hh = hh0; hh < nhead; hh += nwarp * gridDim.y) {
    const int kind = kind_of(hh);
    if (PRE && hh != hh0) head_pre(hp, norm_of(kind), rope_of(kind), D);
    head_vec<PRE, N>(qkv + (size_t)t * nhead * D + (size_t)hh * D, norm_of(kind), eps, inv_freq, pr,
                     kind == 0 ? qscale : 1.f, D, buf, kind != 2 && inv_freq, &hp);
    // A lane stores the values it made (i = lane + 32 n), through one row pointer.
    if (kind == 0) {
      float *q = qout + ((size_t)t * nh + hh) * D;
#pragma unroll
      for (int n = 0; n < N; ++n)
        if (lane + 32 * n < D) q[lane + 32 * n] = buf[lane + 32 * n];
    } else {
      const size_t at = (size_t)s * maxctx + kv_row(p, maxctx);  // maxctx: the cache's rows a slot
      T *c = kind == 1 ? kc + (at * nkv + (hh - nh)) * D : vc + (at * nkv + (hh - nh - nkv)) * D;
#pragma unroll
      for (int n = 0; n < N; ++n)
        if (lane + 32 * n < D) c[lane + 32 * n] = TT<T>::fromf(buf[lane + 32 * n]);
    }
    __syncwarp();
  }
}

}  // namespace mqcuda
