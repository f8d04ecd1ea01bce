// backend.cu: the CUDA device backend (libmodelqual_cuda.so) behind native/include/mq_backend.h.
//
// Why this shape: the CPU runtime dlopen()s this library only when an engine is opened with device
// "cuda", so the CPU build never needs CUDA. The runtime keeps scheduling, top-k/top-p sampling and
// stop rules; this file owns the weights (converted from the bundle's stored precision to the compute
// precision at load), the KV cache of every slot, the forward pass and the token choice of greedy and plain
// temperature requests (argmax, or Gumbel-max sampling fused into the same reduction:
// mqb_forward_sampled). It keeps one path per step shape, the fastest measured on the H200; the
// experiments that chose it (a persistent megakernel, tensor-core products, other attention
// schemes) and their journal live in lab/cuda.
//
// Numerics: weights and GEMM inputs in the chosen precision T, every product accumulated in fp32
// (cuBLAS CUBLAS_COMPUTE_32F, and fmaf in our kernels); the residual stream, norms, RoPE, softmax
// and logits stay fp32. The KV cache is stored in T.
//
// Kernels (all ours except the matrix products of more than tile_max_b rows and the LM head's of
// more than gemv_max_b, which go to cuBLAS):
//   embed            token (+ position for gpt2) embedding into the fp32 residual
//   prep             RMSNorm / LayerNorm / SwiGLU / gelu_new / copy of one row into T (GEMM input)
//   gemv<T,B>        small-batch matrix-vector product with the prep fused in front, the bias and
//                    the residual add fused behind, and greedy argmax fused for the LM head
//   sk::tile         bf16/fp16 layer products of 1..tile_max_b (16) rows on the tensor cores
//                    (skinny.cuh), the weights streamed by the copy engine (TMA) through a
//                    shared-memory pipeline; for qwen3's qkv and gate/up (up to fuse_max_b rows)
//                    with the RMSNorm made as it stages its input and, for gate/up, the SwiGLU in
//                    its epilogue (tile_fused: no prep kernels). At 1..gemv_max_b rows it takes
//                    the products the GEMV would have had nothing to fuse into (gpt2's LayerNorm,
//                    GELU and biases stay with the GEMV)
//   sk::skinny       the products of gemv_max_b+1..sk_max_b rows with the weights in registers
//                    (off by default: sk_max_b 0; prep_kernel makes their input rows)
//   qkv_post         per-head q_norm/k_norm, RoPE (rotate_half), q scaling, K/V append to the cache
//   attention        causal attention of each token over its slot's cache (prefill and mixed steps,
//                    in chunks of at most Tcap tokens (Knobs); fp32 models and
//                    head_dims prefill_attn does not take)
//   pa::prefill_attn bf16/fp16 prefill and mixed steps' attention on the tensor cores
//                    (prefill_attn.cuh: FlashAttention-2's scheme, tiles of 64 tokens)
//   decode_attn      decode steps whose (token, KV head) grid cannot fill the GPU: qkv_post and
//                    attention in one kernel, positions split over blocks; the last split merges
//                    (attn_item). Larger decode steps run qkv_post + attention.
//   argmax           packed (value, -index) atomicMax; ties go to the lowest index like torch.argmax;
//                    with a temperature the value is logit/T + Gumbel noise (gumbel_score)
// A decode step (every entry appends one token) runs as a CUDA graph captured per batch bucket
// (1, 2, 4, 8, ...); the kernels use programmatic dependent launch on Hopper so a kernel's start
// overlaps the previous kernel's tail.
//
// Settings: the few environment knobs are read in one place (Knobs, below). mqb_debug_set (not
// part of the ABI; the lab's benchmark uses it) varies the kernel choices at run time:
// "graphs", "mixed_graphs", "pdl", "blas_tune", "gemv_max_b", "sk_max_b", "tile_max_b",
// "fuse_max_b", "attn_split", "fused_attn", "skinny" and the keys below.
// "attn_flash" 0 runs decode attention through attend (block-wide phases) instead of
// attend_flash, "attn_lanes" 0 has attend score one thread per position, "prefill_tc" 0 sends bf16/fp16 prefill attention back to
// attention_kernel ("prefill_flash" 0: through attend there), "prefill_one" n sends the one-token
// tiles of a chunk of at least n rows to attention_kernel (default 17; 0 never:
// mqb_model::prefill_one), "prep_vec" 0 has the element-wise preps load one value at a time
// (mqb_model::prep_vec), "post_n" 0 has qkv_post_kernel and decode_attn_kernel hold 8 values a
// lane whatever the head_dim (mqb_model::post_n), "tile_pre" n has each tile-kernel
// block ask for n weight chunks before its wait (default 3), "slim" (bitmask, default 3) 0 runs
// the kernels that carry every mode's code (mqb_model::slim), "attn_cluster" 0 merges decode
// attention's position splits through L2 instead of a thread-block cluster's distributed shared
// memory (mqb_model::attn_cluster), "tile_cluster" 0 adds the tile kernel's K splits through
// its workspace in L2 instead (mqb_model::tile_cluster), "attn_push" 0 has split 0 of a decode
// attention cluster read the other splits' partials instead of their pushing them to it
// (mqb_model::attn_push), "tile_push" 0 the same for the tile kernel's K splits
// (mqb_model::tile_push), "rms_compact_b" n the most rows whose RMSNorm the tile kernel stages in
// its compact form (mqb_model::rms_compact_b), "pre_params" 0 loads the q/k norms' weights,
// RoPE and the RMSNorm preps' weights after the kernels' wait, RoPE by sincosf there
// (mqb_model::pre_params),
// "timeline" 1 records when every GEMV, tile-kernel and decode-attention launch of a decode step
// started, passed its wait and ended (mqb_debug_timeline; tl_mark).
// mqb_debug_chain runs decode steps back to back with their tokens fed on the device, the host
// out of the loop.
// Faults (MODELQUAL_FAULTS, comma separated; shared names with the CPU runtime):
//   qwen3.rope_theta_x10  multiply rope_theta by 10
//   qwen3.drop_q_norm     skip q_norm
//
// Thread safety: one model is driven by one thread at a time (the engine's worker).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#ifndef MQB_HOST_TEST
#include <cuda.h>  // cuTensorMapEncodeTiled: the tile kernel's weight copies (libcuda)
#endif
#include <memory>

#include "blas_pick.h"  // the cuBLASLt algorithm of each decode bucket's products, timed once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mq_backend.h"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Errors

struct Fail : std::runtime_error {
  explicit Fail(const std::string &m) : std::runtime_error(m) {}
};

std::string fmt(const char *f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

void ck(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw Fail(fmt("cuda backend: %s failed: %s (%s)", what, cudaGetErrorName(e),
                   cudaGetErrorString(e)));
}

void ckb(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Fail(fmt("cuda backend: cuBLAS %s failed with status %d", what, (int)s));
}

void set_err(char *err, size_t errlen, const std::string &m) {
  if (err && errlen > 0) {
    snprintf(err, errlen, "%s", m.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Hyperparameters

enum Family { GPT2, QWEN3 };

struct Cfg {
  Family fam = QWEN3;
  std::string family;             // the runtime's family name ("qwen3vl": qwen3's decoder and a vision tower)
  bool vision = false;            // qwen3vl: images (vision.cuh)
  std::string tprefix;            // the decoder's tensors' prefix past "model.": "language_model." for qwen3vl
  int mrope[3] = {0, 0, 0};       // qwen3vl's mrope_section (t, h, w)
  int V = 0, H = 0, L = 0, nh = 0, nkv = 0, D = 0, I = 0, maxpos = 0;
  double eps = 1e-6, theta = 10000;
  bool tied = false, attn_bias = false, inv_layer_scale = false;
};

bool fault(const char *name) {
  const char *f = getenv("MODELQUAL_FAULTS");
  if (!f) return false;
  std::string s(f), n(name);
  size_t start = 0;
  while (start <= s.size()) {
    size_t e = s.find(',', start);
    if (e == std::string::npos) e = s.size();
    std::string item = s.substr(start, e - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item == n) return true;
    start = e + 1;
  }
  return false;
}

// cfg_from_hparams reads the hyper-parameters the runtime's family resolve step produced (Go
// parses config.json once; the family file applies transformers' defaults and refuses what it
// does not implement), so this backend never parses JSON.
Cfg cfg_from_hparams(const std::string &family, const mqb_hparam *hp, int n) {
  auto get = [&](const char *k) -> const mqb_hparam * {
    for (int i = 0; i < n; ++i)
      if (hp[i].key && strcmp(hp[i].key, k) == 0) return &hp[i];
    return nullptr;
  };
  auto num = [&](const char *k) -> double {
    const mqb_hparam *h = get(k);
    if (!h || h->str) throw Fail(fmt("cuda backend: hyper-parameter %s is missing; the runtime's %s resolve step must set it", k, family.c_str()));
    return h->value;
  };
  auto pos = [&](const char *k) -> int {
    double v = num(k);
    if (v <= 0 || v != std::floor(v) || v > 1e9) throw Fail(fmt("cuda backend: hyper-parameter %s = %g must be a positive integer", k, v));
    return (int)v;
  };
  Cfg g;
  g.family = family;
  if (family == "gpt2") g.fam = GPT2;
  else if (family == "qwen3") g.fam = QWEN3;
  else if (family == "qwen3vl") g.fam = QWEN3, g.vision = true, g.tprefix = "language_model.";
  else throw Fail(fmt("cuda backend: family %s is not supported; known: gpt2, qwen3, qwen3vl", family.c_str()));
  g.V = pos("vocab_size");
  g.H = pos("hidden_size");
  g.L = pos("num_layers");
  g.nh = pos("num_heads");
  g.nkv = pos("num_kv_heads");
  g.D = pos("head_dim");
  g.I = pos("intermediate_size");
  g.maxpos = pos("max_positions");
  g.eps = num("norm_eps");
  g.theta = num("rope_theta");
  g.tied = num("tie_word_embeddings") != 0;
  g.attn_bias = num("attention_bias") != 0;
  g.inv_layer_scale = num("scale_attn_by_inverse_layer_idx") != 0;
  if (g.nh % g.nkv != 0)
    throw Fail(fmt("cuda backend: num_heads %d is not a multiple of num_kv_heads %d", g.nh, g.nkv));
  if (g.vision) {
    g.mrope[0] = (int)num("mrope_section_t");
    g.mrope[1] = (int)num("mrope_section_h");
    g.mrope[2] = (int)num("mrope_section_w");
    if (g.mrope[0] + g.mrope[1] + g.mrope[2] != g.D / 2)
      throw Fail(fmt("cuda backend: mrope_section must sum to head_dim/2 = %d", g.D / 2));
  }
  if (g.fam == QWEN3 && fault(g.vision ? "qwen3vl.rope_theta_x10" : "qwen3.rope_theta_x10")) g.theta *= 10;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Host-side precision conversion

enum DType { DT_BF16, DT_F16, DT_F32 };

uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return (uint16_t)(u >> 16);
}

uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t fe = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (fe == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = (int32_t)fe - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t hm = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (hm & 1u))) hm++;
    return (uint16_t)(sign | hm);
  }
  uint32_t hm = mant >> 13, rem = mant & 0x1fffu;
  uint32_t r = sign | ((uint32_t)e << 10) | hm;
  if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) r++;
  return (uint16_t)r;
}

// elem reads element i of a stored tensor (the bundle keeps tensors at their build precision).
inline float elem(const void *data, int32_t dtype, int64_t i) {
  uint32_t u;
  switch (dtype) {
    case MQB_DTYPE_BF16: {
      u = (uint32_t)static_cast<const uint16_t *>(data)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case MQB_DTYPE_F16: {
      const uint16_t h = static_cast<const uint16_t *>(data)[i];
      const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff;
      float v = e == 0 ? std::ldexp((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : std::ldexp((float)(man | 0x400), (int)e - 25);
      memcpy(&u, &v, 4);
      u |= sign;
      memcpy(&v, &u, 4);
      return v;
    }
    default:
      return static_cast<const float *>(data)[i];
  }
}

inline bool same_dtype(int32_t stored, DType compute) {
  return (stored == MQB_DTYPE_F32 && compute == DT_F32) || (stored == MQB_DTYPE_BF16 && compute == DT_BF16) ||
         (stored == MQB_DTYPE_F16 && compute == DT_F16);
}

size_t dt_size(DType d) { return d == DT_F32 ? 4 : 2; }

// parallel_for splits [0,n) over up to 16 host threads (weight conversion of a 0.6B model).
template <typename F>
void parallel_for(int64_t n, F fn) {
  int nt = (int)std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), 16);
  if (n < 1 << 16) nt = 1;
  std::vector<std::thread> th;
  int64_t per = (n + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    int64_t a = t * per, b = std::min(n, a + per);
    if (a >= b) break;
    th.emplace_back([=] { fn(a, b); });
  }
  for (auto &x : th) x.join();
}

// ---------------------------------------------------------------------------------------------
// Device helpers

template <typename T>
struct TT;
template <>
struct TT<float> {
  static constexpr int CH = 4;  // elements per 16-byte vector
  static __device__ __forceinline__ float tof(float x) { return x; }
  static __device__ __forceinline__ float fromf(float x) { return x; }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};
template <>
struct TT<__nv_bfloat16> {
  static constexpr int CH = 8;
  static __device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 fromf(float x) { return __float2bfloat16(x); }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 t = __bfloat1622float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};
template <>
struct TT<__half> {
  static constexpr int CH = 8;
  static __device__ __forceinline__ float tof(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half fromf(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 t = __half22float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void *p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

#include "warp.cuh"  // warp_sum, warp_max
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// block_sum: every thread of the block must call it; red holds 32 floats of shared memory.
__device__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = (lane < nw) ? red[lane] : 0.f;
  return warp_sum(t);
}

// argkey packs a logit and its index so that an unsigned max picks the largest logit and, among
// equal logits, the lowest index (torch.argmax's first occurrence).
__device__ __forceinline__ unsigned long long argkey(float v, int idx) {
  unsigned int u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)idx);
}

// decode_key is the index argkey packed (the host reads the argmax, advance_kernel feeds it on).
__host__ __device__ __forceinline__ int decode_key(unsigned long long k) {
  return (int)(0xFFFFFFFFu - (unsigned int)(k & 0xFFFFFFFFull));
}

// Samp carries the per-row sampling of a step: inv_temp[r] > 0 draws row r's token from
// softmax(logits / T) with the Gumbel-max trick (key rkey[r], fresh per step); 0 is greedy.
struct Samp {
  const float *inv_temp;
  const unsigned long long *rkey;
};

// gumbel_score: logit/T plus a Gumbel(0,1) variate hashed from (key, idx) (splitmix64), so that
// the argmax over the vocabulary is an exact draw from softmax(logits/T). 24 bits of uniform
// resolution: the variate lies within +-17.3.
__device__ __forceinline__ float gumbel_score(float v, float invT, unsigned long long key, int idx) {
  unsigned long long z = key + (unsigned long long)(idx + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float w = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);  // uniform on (0, 1)
  const float e = -log1pf(-w);                                       // Exp(1)
  return v * invT - logf(e);
}

// score_key is the argmax key of logit v at idx for row r under s (greedy when not sampling).
__device__ __forceinline__ unsigned long long score_key(float v, int idx, int r, const Samp &s) {
  const float it = s.inv_temp ? s.inv_temp[r] : 0.f;
  return argkey(it > 0.f ? gumbel_score(v, it, s.rkey[r], idx) : v, idx);
}

// Dynamic shared memory (extern __shared__), spelled through a macro so the host-only smoke test
// (stub headers, MQB_HOST_TEST) can compile the kernels as plain functions.
#ifdef MQB_HOST_TEST
#define DYN_SMEM(T, name) static T name[16384]
#else
#define DYN_SMEM(T, name) extern __shared__ T name[]
#endif

enum PrepMode { PREP_PLAIN = 0, PREP_RMS = 1, PREP_LN = 2, PREP_SWIGLU = 3, PREP_GELU = 4 };

// PrepArgs describes how the input row b of a linear layer is made:
//   PLAIN : srcT[r*ld + k]                       (already in T)
//   RMS   : src[r*ld + k] * rstd * w[k]          (RMSNorm)
//   LN    : (src - mean) * rstd * w[k] + bb[k]   (LayerNorm)
//   SWIGLU: silu(src[r*ld + k]) * src[r*ld + K + k]
//   GELU  : gelu_new(src[r*ld + k])
// with r = rows ? rows[b] : b.
template <typename T>
struct PrepArgs {
  int mode;
  const float *src;
  const T *srcT;
  int ld;
  const int *rows;
  const float *w;
  const float *bb;
  float eps;
  unsigned long long *tlb = nullptr;  // timeline records (debug "timeline"), slot tls; NULL: none
  int tls = -1;
};

constexpr int TL_FIELDS = 8;  // timeline values per slot (tl_mark)

// gtimer is the GPU's global nanosecond timer (0 in the host emulation).
__device__ __forceinline__ unsigned long long gtimer() {
#if defined(__CUDA_ARCH__)
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return 0ull;
#endif
}

// tl_mark records, for timeline slot s (one kernel launch), when thread 0 of each block got to
// what: 0 block start (the first and the last block's), 1 past the wait for the previous
// kernel, 2 block end (the last block's), 3-6 the phases of decode attention (the last block's:
// q/k/v made, then attend's scores, softmax and V sums, or attend_flash's whole pass at 6) or 3-5
// those of the tile kernel (input staged, chunks multiplied, K splits summed). The
// debug timeline (mqb_debug_timeline) shows where a chain of dependent kernels spends its time,
// which per-kernel events cannot: they serialise it.
__device__ __forceinline__ void tl_mark(unsigned long long *b, int s, int what) {
  if (!b || s < 0 || threadIdx.x != 0) return;
  const unsigned long long t = gtimer();
  unsigned long long *r = b + (size_t)s * TL_FIELDS;
  if (what == 0) {
    atomicMax(r, ~t);
    atomicMax(r + 1, t);
  } else {
    atomicMax(r + what + 1, t);
  }
}

// swiglu: silu(g) * u, qwen3's MLP activation (prep, the tile kernel's epilogue).
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.f + expf(-g)) * u; }

__device__ __forceinline__ float gelu_new(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// prep_elem is element k of source row r in the element-wise modes (PLAIN, SWIGLU, GELU).
// M >= 0 is a.mode known at compile time (prep_kernel's instances); -1 reads a.mode (the fused GEMV).
template <typename T, int M = -1>
__device__ __forceinline__ T prep_elem(const PrepArgs<T> &a, int r, int K, int k) {
  const int mode = M >= 0 ? M : a.mode;
  if (mode == PREP_PLAIN) return a.srcT[(size_t)r * a.ld + k];
  const float *x = a.src + (size_t)r * a.ld;
  if (mode == PREP_SWIGLU) {
    return TT<T>::fromf(swiglu(x[k], x[K + k]));
  }
  return TT<T>::fromf(gelu_new(x[k]));  // PREP_GELU
}

// PREP_REGS: values per thread that prep_row holds in registers, so rows of up to
// PREP_REGS * blockDim.x values (3,072 with 256 threads) take one round trip to memory (16 made
// the fused GEMV at 2-4 rows spill under its 64-register bound).
constexpr int PREP_REGS = 12;

// prep_row writes input row b (PrepArgs) into dst, K values, with the whole block. Every value a
// thread handles is loaded before any is stored (but LayerNorm's bias, read as it is stored:
// gpt2 only, and a third register array would spill): a loop that loads, converts and stores one
// value at a time waits a full memory round trip per iteration (the store to dst may alias the
// next load, so the compiler keeps them in order), which Nsight Compute showed as 17 us for the
// 3,072-wide SwiGLU row of a batch-1 down projection. The arithmetic and the order of
// every sum are those of the one-at-a-time loop (prep_row_long), so the results are the same bits.
template <typename T, int M = -1>
__device__ void prep_row_long(const PrepArgs<T> &a, int b, int K, T *dst, float *red);

// WP: wpre holds the norm's weights w[tid + j * nt], loaded already (prep_kernel, before its
// wait); rows too long for the registers (prep_row_long) load their own.
template <typename T, int M = -1, bool WP = false>
__device__ void prep_row(const PrepArgs<T> &a, int b, int K, T *dst, float *red, const float *wpre = nullptr) {
  const int tid = threadIdx.x, nt = blockDim.x, mode = M >= 0 ? M : a.mode;
  if (K > PREP_REGS * nt) {
    prep_row_long<T, M>(a, b, K, dst, red);
    return;
  }
  const int r = a.rows ? a.rows[b] : b;
  if (mode == PREP_PLAIN) {
    const T *x = a.srcT + (size_t)r * a.ld;
    T v[PREP_REGS];
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) v[j] = x[tid + j * nt];
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) dst[tid + j * nt] = v[j];
    return;
  }
  const float *x = a.src + (size_t)r * a.ld;
  float v[PREP_REGS], w[PREP_REGS];
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j) {
    const int k = tid + j * nt;
    v[j] = k < K ? x[k] : 0.f;
    // SwiGLU's up half, or the norm weight (it does not depend on the row: loaded alongside)
    if (k < K)
      w[j] = mode == PREP_SWIGLU ? x[K + k] : (mode == PREP_RMS || mode == PREP_LN) ? (WP ? wpre[j] : a.w[k]) : 0.f;
  }
  if (mode == PREP_SWIGLU || mode == PREP_GELU) {
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j) {
      const int k = tid + j * nt;
      if (k < K)
        dst[k] = TT<T>::fromf(mode == PREP_SWIGLU ? swiglu(v[j], w[j]) : gelu_new(v[j]));
    }
    return;
  }
  if (mode == PREP_RMS) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) ss += v[j] * v[j];
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)K + a.eps);
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j)
      if (tid + j * nt < K) dst[tid + j * nt] = TT<T>::fromf(v[j] * rstd * w[j]);
    return;
  }
  // PREP_LN
  float sm = 0.f;
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j)
    if (tid + j * nt < K) sm += v[j];
  const float mean = block_sum(sm, red) / (float)K;
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j)
    if (tid + j * nt < K) {
      const float d = v[j] - mean;
      var += d * d;
    }
  const float rstd = rsqrtf(block_sum(var, red) / (float)K + a.eps);
#pragma unroll
  for (int j = 0; j < PREP_REGS; ++j) {
    const int k = tid + j * nt;
    if (k < K) dst[k] = TT<T>::fromf((v[j] - mean) * rstd * w[j] + a.bb[k]);
  }
}

// prep_row_long: prep_row for rows longer than PREP_REGS values per thread, one value at a time.
template <typename T, int M>
__device__ void prep_row_long(const PrepArgs<T> &a, int b, int K, T *dst, float *red) {
  const int r = a.rows ? a.rows[b] : b;
  const int tid = threadIdx.x, nt = blockDim.x, mode = M >= 0 ? M : a.mode;
  if (mode != PREP_RMS && mode != PREP_LN) {
    for (int k = tid; k < K; k += nt) dst[k] = prep_elem<T, M>(a, r, K, k);
    return;
  }
  const float *x = a.src + (size_t)r * a.ld;
  if (mode == PREP_RMS) {
    float ss = 0.f;
    for (int k = tid; k < K; k += nt) ss += x[k] * x[k];
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)K + a.eps);
    for (int k = tid; k < K; k += nt) dst[k] = TT<T>::fromf(x[k] * rstd * a.w[k]);
  } else {  // PREP_LN
    float s = 0.f;
    for (int k = tid; k < K; k += nt) s += x[k];
    const float mean = block_sum(s, red) / (float)K;
    float v = 0.f;
    for (int k = tid; k < K; k += nt) {
      float d = x[k] - mean;
      v += d * d;
    }
    const float rstd = rsqrtf(block_sum(v, red) / (float)K + a.eps);
    for (int k = tid; k < K; k += nt) dst[k] = TT<T>::fromf((x[k] - mean) * rstd * a.w[k] + a.bb[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels

template <typename T>
__global__ void __launch_bounds__(256) embed_kernel(const int *__restrict__ tok, const int *__restrict__ pos,
                                                    const T *__restrict__ wte, const float *__restrict__ wpe,
                                                    float *__restrict__ res, int H,
                                                    unsigned long long *keys, int R) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  if (keys && t == 0)  // argmax keys of this step start at 0 (below every packed logit)
    for (int i = threadIdx.x; i < R; i += blockDim.x) keys[i] = 0ull;
  const T *e = wte + (size_t)tok[t] * H;
  const float *pe = wpe ? wpe + (size_t)pos[t] * H : nullptr;
  float *o = res + (size_t)t * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = TT<T>::tof(e[i]) + (pe ? pe[i] : 0.f);
}

// prep_vec4 is prep_kernel's element-wise mode M (SWIGLU or GELU) 4 values at a time, for rows
// whose K, stride and base are multiples of 4 floats and no a.rows (linear checks). Each thread
// loads its next two groups of every source before it stores either: a grid-stride loop of
// single values waits a round trip per value (the stores may alias the next loads, as in
// prep_row), far from the copy rate on a 2,048-token chunk's SwiGLU (50 MB read): on the H200
// 32 prompts of 128 tokens spent 2.04 ms in the preps instead of 2.82, the call 14.4 instead of
// 15.1 (lab/cuda/NOTES.md). The same arithmetic per value as prep_elem, so the same bits.
template <typename T, int M>
__device__ void prep_vec4(const PrepArgs<T> &a, int B, int K, T *out) {
  struct __align__(8) T4 {
    T v[4];
  };
  const int K4 = K / 4;
  const size_t total = (size_t)B * K4, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += 2 * stride) {
    float4 g[2], u[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t j = i + h * stride;
      if (j < total) {
        const int b = (int)(j / K4), k = (int)(j - (size_t)b * K4) * 4;
        const float *x = a.src + (size_t)b * a.ld + k;
        g[h] = *reinterpret_cast<const float4 *>(x);
        if (M == PREP_SWIGLU) u[h] = *reinterpret_cast<const float4 *>(x + K);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t j = i + h * stride;
      if (j < total) {
        const float gv[4] = {g[h].x, g[h].y, g[h].z, g[h].w};
        const float uv[4] = {u[h].x, u[h].y, u[h].z, u[h].w};
        T4 o;
#pragma unroll
        for (int e = 0; e < 4; ++e) o.v[e] = TT<T>::fromf(M == PREP_SWIGLU ? swiglu(gv[e], uv[e]) : gelu_new(gv[e]));
        reinterpret_cast<T4 *>(out)[j] = o;
      }
    }
  }
}

// prep_kernel makes the T input rows [B, K] of a cuBLAS product (decode batches above gemv_max_b,
// prefill). Norms: a block per row (prep_row); element-wise modes: the grid strides over all B*K
// values, so a few rows of the 3072-wide SwiGLU still spread over many SMs.
// One instance per mode M (the launch's a.mode): one instance with every mode's code was 47 KB of
// instructions, fetched cold at each of a batch-32 layer's three preps (lab/cuda/NOTES.md).
// PRE (pre_params): a norm's weights are loaded before the wait (they do not depend on the
// previous kernel), for rows that fit prep_row's registers. V4 (prep_vec): the element-wise
// modes through prep_vec4.
template <typename T, int M, bool PRE = false, bool V4 = false>
__global__ void __launch_bounds__(256) prep_kernel(PrepArgs<T> a, int B, int K, T *__restrict__ out) {
  __shared__ float red[32];
  const int mode = M >= 0 ? M : a.mode;  // M = -1: every mode, read from a (debug "slim" without bit 1)
  const bool norm = mode == PREP_RMS || mode == PREP_LN;
  float wpre[PREP_REGS];
  if (PRE && norm) {
#pragma unroll
    for (int j = 0; j < PREP_REGS; ++j) {
      const int k = threadIdx.x + j * blockDim.x;
      wpre[j] = k < K ? a.w[k] : 0.f;
    }
  }
  pdl_wait();
  pdl_trigger();
  if (norm) {
    prep_row<T, M, PRE>(a, blockIdx.x, K, out + (size_t)blockIdx.x * K, red, wpre);
    return;
  }
  if constexpr (V4 && (M == PREP_SWIGLU || M == PREP_GELU)) {
    prep_vec4<T, M>(a, B, K, out);
    return;
  }
  const size_t total = (size_t)B * K;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const int b = (int)(i / K), k = (int)(i - (size_t)b * K);
    out[i] = prep_elem<T, M>(a, a.rows ? a.rows[b] : b, K, k);
  }
}

__global__ void __launch_bounds__(256) add_bias_kernel(float *__restrict__ y, const float *__restrict__ bias, int N,
                                                       int total) {
  pdl_wait();
  pdl_trigger();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) y[i] += bias[i % N];
}

// gemv_kernel: out[b, n] (+)= sum_k W[n, k] * x_b[k] + bias[n] for B <= 4 rows, x_b made by
// prep_row into shared memory. Each warp owns whole output rows (grid-stride); every lane loads
// 16-byte vectors, U of them in flight. With keys != NULL it also reduces the greedy argmax.
template <typename T, int B>
__global__ void __launch_bounds__(256, 4) gemv_kernel(PrepArgs<T> a, int K, const T *__restrict__ W, int N,
                                                   const float *__restrict__ bias, float *out, int accumulate,
                                                   unsigned long long *keys, Samp samp) {
  constexpr int CH = TT<T>::CH;
  constexpr int U = 4;
  DYN_SMEM(uint4, gsm_raw);
  T *xs = reinterpret_cast<T *>(gsm_raw);
  __shared__ float red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nch = K / CH;
  const int gw = blockIdx.x * 8 + warp, nw = gridDim.x * 8;
  tl_mark(a.tlb, a.tls, 0);
  if (gw < N) {  // weights do not depend on earlier kernels: start pulling them into L2 now
    const char *wr = reinterpret_cast<const char *>(W + (size_t)gw * K);
    const int bytes = K * (int)sizeof(T);
    for (int off = lane * 128; off < bytes; off += 32 * 128) prefetch_l2(wr + off);
  }
  pdl_wait();
  pdl_trigger();
  tl_mark(a.tlb, a.tls, 1);
  for (int b = 0; b < B; ++b) prep_row<T>(a, b, K, xs + (size_t)b * K, red);
  __syncthreads();
  unsigned long long best[B];
#pragma unroll
  for (int b = 0; b < B; ++b) best[b] = 0ull;
  for (int row = gw; row < N; row += nw) {
    const uint4 *wr = reinterpret_cast<const uint4 *>(W + (size_t)row * K);
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = 0.f;
    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
      uint4 wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * 32;
        if (c < nch) wv[u] = __ldg(wr + c);
        else wv[u] = make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * 32;
        if (c < nch) {
          float wf[CH];
          TT<T>::unpack(wv[u], wf);
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const uint4 xv = reinterpret_cast<const uint4 *>(xs + (size_t)b * K)[c];
            float xf[CH];
            TT<T>::unpack(xv, xf);
#pragma unroll
            for (int e = 0; e < CH; ++e) acc[b] = fmaf(wf[e], xf[e], acc[b]);
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = warp_sum(acc[b]);
    if (lane == 0) {
      const float bv = bias ? bias[row] : 0.f;
#pragma unroll
      for (int b = 0; b < B; ++b) {
        float *o = out + (size_t)b * N + row;
        float v = acc[b] + bv;
        if (accumulate) v += *o;
        *o = v;
        if (keys) {
          unsigned long long k = score_key(v, row, b, samp);
          best[b] = k > best[b] ? k : best[b];
        }
      }
    }
  }
  if (keys && lane == 0) {
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (best[b]) atomicMax(keys + b, best[b]);
  }
  if (a.tlb) {
    __syncthreads();
    tl_mark(a.tlb, a.tls, 2);
  }
}

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
__global__ void rope_table_kernel(const float *__restrict__ inv_freq, int half, int n, float2 *__restrict__ tab) {
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
      T *c = kind == 1 ? kc + (((size_t)s * maxctx + p) * nkv + (hh - nh)) * D
                       : vc + (((size_t)s * maxctx + p) * nkv + (hh - nh - nkv)) * D;
#pragma unroll
      for (int n = 0; n < N; ++n)
        if (lane + 32 * n < D) c[lane + 32 * n] = TT<T>::fromf(buf[lane + 32 * n]);
    }
    __syncwarp();
  }
}

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
// positions [lo, hi) of the K/V rows kb/vb (row stride rs elements), with online softmax per
// tile of ATT_TILE positions. Leaves the unnormalised sums in oacc[j*D + d] and the running max
// and sum in s_m[j], s_l[j] (s_m = -inf for an empty range). A thread scores one position with
// all of its K row's 16-byte loads in flight; V is read 8 positions deep per thread group.
// Position fresh (-1: none) was written in this launch and is read through L2 (ld.global.cg);
// the others, written by earlier launches, through the read-only L1 path (ld.global.nc).
template <typename T, int GM>
__device__ void attend(const float *qs, const T *kb, const T *vb, size_t rs, int lo, int hi, int fresh, int D, int G,
                       float *sc, float *red, float *s_m, float *s_l, float *s_c, float *oacc,
                       unsigned long long *tlb = nullptr, int tls = -1, bool lanes_ok = true) {
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
          const T *kr = kb + (size_t)(t0 + pp) * rs + sl * CH;
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
        const T *kr = kb + (size_t)(t0 + pp) * rs;
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
    tl_mark(tlb, tls, 4);
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
    tl_mark(tlb, tls, 5);
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
          const T *vp = vb + (size_t)(t0 + pp) * rs + ch * CH;
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
  tl_mark(tlb, tls, 6);
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

// prefetch_kv_rows asks L2 for the cached K and V rows [lo, hi) of KV head kh of cache slot sl.
// decode_attn_kernel calls it before it waits for the previous kernel (programmatic dependent
// launch): rows of earlier steps do not depend on that kernel. Only there: the fused kernel runs
// where few sequences decode, whose rows fit in L2 (batch 1: 852 against 827 tok/s).
// attention_kernel did the same and lost 12 % at batch 32 with 2,048 positions (268 MB
// of rows per layer asked of a 50 MB L2), so it does not prefetch.
template <typename T>
__device__ void prefetch_kv_rows(const T *kc, const T *vc, int sl, int kh, int lo, int hi, int nkv, int D, int maxctx) {
  const int rowl = max(1, D * (int)sizeof(T) / 128);  // 128-byte lines per row
  const size_t rs = (size_t)nkv * D, base = ((size_t)sl * maxctx * nkv + kh) * D;
  for (int i = threadIdx.x; i < (hi - lo) * rowl; i += blockDim.x) {
    const size_t at = base + (size_t)(lo + i / rowl) * rs;
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
__device__ void attend_flash(const float *qs, const T *kb, const T *vb, size_t rs, int lo, int hi, int fresh, int D,
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
      const size_t off = (size_t)pos * rs + sl * CH;
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

// attend_either runs attend_flash or attend by flash_fits. tlb, tls and score_lanes are attend's
// timeline slot and lane scoring; attend_flash's single pass marks phase 6. FLASH_ONLY (the launch
// checked the rule: flash_only) compiles attend_flash alone, so that the kernel carries no attend:
// dead code too costs a launch (lab/cuda/NOTES.md: batch 1 +4 %).
template <typename T, int GM, bool FLASH_ONLY = false>
__device__ void attend_either(bool flash, const float *qs, const T *kb, const T *vb, size_t rs, int lo, int hi,
                              int fresh, int D, int G, float *sc, float *red, float *s_m, float *s_l, float *s_c,
                              float *oacc, unsigned long long *tlb = nullptr, int tls = -1, bool score_lanes = true) {
  if (FLASH_ONLY || flash_fits<T>(flash, D)) {
    attend_flash<T, GM>(qs, kb, vb, rs, lo, hi, fresh, D, G, sc, red, s_m, s_l, oacc);
    tl_mark(tlb, tls, 6);
  } else if constexpr (!FLASH_ONLY) {
    attend<T, GM>(qs, kb, vb, rs, lo, hi, fresh, D, G, sc, red, s_m, s_l, s_c, oacc, tlb, tls, score_lanes);
  }
}

// attention_kernel (prefill and mixed steps, and decode steps of many sequences): block (token
// t, KV head g) attends the G query heads of group g (already normed, rotated and scaled by
// qkv_post) over positions 0..pos[t] of the token's slot: causal for a prompt, the whole cache
// for a continuing sequence. flash (decode steps, and prefill with debug prefill_flash, the
// default) goes through attend_flash; debug attn_flash 0 sends both back to attend. Two blocks
// per SM for up to ATT_2BLK_GM query heads per KV head (see there; H200, lab/cuda/NOTES.md: 8.1
// us alone instead of 11.7, 7.5 us per layer of a batch-32 step instead of 11.3). FLASH_ONLY:
// the instance for steps that attend_flash takes (flash_only), without attend's code. toks
// (NULL: block x is token x) lists the tokens to take, -1 for none (a graphed chunk's fixed grid):
// a prefill or mixed chunk's one-token tiles (prefill_tiles).
template <typename T, int GM, bool FLASH_ONLY>
__global__ void __launch_bounds__(ATT_THREADS, GM <= ATT_2BLK_GM ? 2 : 1)
    attention_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                     const int *__restrict__ tpos, const int *__restrict__ tslot, T *__restrict__ out, int nh,
                     int nkv, int D, int maxctx, int flash, const int *__restrict__ toks) {
  DYN_SMEM(float, asm_);
  __shared__ float s_m[MAXG], s_l[MAXG], s_c[MAXG];
  pdl_wait();
  pdl_trigger();
  const int t = toks ? toks[blockIdx.x] : (int)blockIdx.x, g = blockIdx.y, G = nh / nkv;
  if (t < 0) return;  // block-uniform
  float *qs = asm_, *oacc = qs + GM * D, *sc = oacc + GM * D, *red = sc + GM * ATT_TILE;
  for (int i = threadIdx.x; i < G * D; i += ATT_THREADS) qs[i] = q[((size_t)t * nh + (size_t)g * G) * D + i];
  const size_t base = ((size_t)tslot[t] * maxctx * nkv + g) * D, rs = (size_t)nkv * D;
  attend_either<T, GM, FLASH_ONLY>(flash != 0, qs, kc + base, vc + base, rs, 0, tpos[t] + 1, -1, D, G, sc, red, s_m,
                                   s_l, s_c, oacc);
  for (int i = threadIdx.x; i < G * D; i += ATT_THREADS)
    out[((size_t)t * nh + (size_t)g * G) * D + i] = TT<T>::fromf(oacc[i] / s_l[i / D]);
}

// DecAttn: one layer's decode attention with the q/k/v post-processing fused in (attn_item).
template <typename T>
struct DecAttn {
  const float *qkv;                 // [tokens, (nh + 2 nkv) D] fp32: the step's qkv product
  const int *pos, *slot;            // per token: its position (the new one) and cache slot
  int nh, nkv, D, maxctx;
  const float *qn, *kn, *inv_freq;  // q/k RMSNorm weights (NULL: none), RoPE (NULL: none, gpt2)
  float eps, qscale;
  T *kc, *vc;                       // this layer's cache [slots, maxctx, nkv, D]
  T *out;                           // [tokens, nh D]
  float *part_acc, *part_ml;        // split partials [tokens*nkv*S][G*D], [..][G][2]
  unsigned int *cnt;                // [tokens*nkv] splits finished; zero between steps
  unsigned long long *tlb;          // timeline records (PrepArgs::tlb), slot tls
  int tls;
  int score_lanes;                  // attend scores a position with several lanes (debug "attn_lanes")
  int flash;                        // attend_flash instead of attend (debug "attn_flash")
  int cluster;                      // the S splits of an item are one thread-block cluster (1, 1, S)
  int push;                         // with cluster: the partials pushed to split 0 (debug "attn_push")
  const float2 *rope_tab;           // mqb_model::rope_tab (head_pre; with inv_freq)
  const int *sdelta;                // per slot: the rotary position's offset (qwen3vl; NULL: none)
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

// split_range is split z of S's positions [lo, hi) of the n positions 0..n-1 of a sequence.
__device__ __forceinline__ void split_range(int n, int S, int z, int &lo, int &hi) {
  const int span = (n + S - 1) / S;
  lo = min(n, z * span);
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
  split_range(p + 1, S, z, lo, hi);
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
// then attention over the split's positions. With S > 1 every split leaves its unnormalised
// partial, and the split that finishes last for (t, kh) merges all S in split order (fixed
// order: the same inputs give the same bits) and resets the counter; with a.cluster the S splits
// are one cluster and split 0 merges them through distributed shared memory. Used by
// decode_attn_kernel (one item per block).
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
  split_range(p + 1, S, z, lo, hi);
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
  tl_mark(a.tlb, a.tls, 3);
  const size_t base = ((size_t)sl * a.maxctx * nkv + kh) * D, rs = (size_t)nkv * D;
  if (mine) {
    // The new k and v rows, CH elements (16 bytes) per thread: one short loop, where one value
    // per thread unrolled into 5 KB of stores (seen in the SASS).
    constexpr int CH = TT<T>::CH;
    const size_t at = base + (size_t)p * rs;
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
  attend_either<T, GM, FLASH_ONLY>(a.flash != 0, qs, a.kc + base, a.vc + base, rs, lo, hi, mine ? p : -1, D, G, sc,
                                   red, s_m, s_l, s_c, oacc, a.tlb, a.tls, a.score_lanes != 0);
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
  tl_mark(a.tlb, a.tls, 0);
  if (a.cluster && a.push && gridDim.z > 1) cluster_arrive();  // attn_item's pushed merge waits for it
  {  // the split's earlier positions (attn_item's range without the new one)
    const int p = a.pos[blockIdx.x];
    int lo, hi;
    split_range(p + 1, gridDim.z, blockIdx.z, lo, hi);
    prefetch_kv_rows(a.kc, a.vc, a.slot[blockIdx.x], blockIdx.y, lo, min(p, hi), a.nkv, a.D, a.maxctx);
  }
  HeadPreN<N> hp;
  if (PRE) dec_head_pre(a, blockIdx.x, gridDim.z, blockIdx.z, threadIdx.x >> 5, hp);
  pdl_wait();
  pdl_trigger();
  tl_mark(a.tlb, a.tls, 1);
  attn_item<T, GM, FLASH_ONLY, PRE, N>(a, blockIdx.x, blockIdx.y, gridDim.z, blockIdx.z, dsm, &hp);
  tl_mark(a.tlb, a.tls, 2);  // after attn_item's last barrier (split 0 of a pushed merge: its thread 0's share)
}

// argmax_kernel: grid (chunks, rows); each block reduces a chunk of one logits row.
__global__ void __launch_bounds__(256) argmax_kernel(const float *__restrict__ logits, int V,
                                                     unsigned long long *keys, Samp samp) {
  __shared__ unsigned long long wbest[8];
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.y;
  const int chunk = (V + gridDim.x - 1) / gridDim.x;
  const int a = blockIdx.x * chunk, b = min(V, a + chunk);
  unsigned long long best = 0ull;
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) {
    unsigned long long k = score_key(logits[(size_t)r * V + i], i, r, samp);
    best = k > best ? k : best;
  }
  best = warp_max_u64(best);
  if ((threadIdx.x & 31) == 0) wbest[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) best = wbest[w] > best ? wbest[w] : best;
    if (best) atomicMax(keys + r, best);
  }
}

#include "skinny.cuh"
#include "prefill_attn.cuh"
#include "vision_kernels.cuh"

// ---------------------------------------------------------------------------------------------
// Model

struct Layer {
  void *w_qkv = nullptr, *w_o = nullptr, *w_up = nullptr, *w_down = nullptr;  // T, [out, in]
  float *b_qkv = nullptr, *b_o = nullptr, *b_up = nullptr, *b_down = nullptr;
  float *ln1_w = nullptr, *ln1_b = nullptr, *ln2_w = nullptr, *ln2_b = nullptr;
  float *qn = nullptr, *kn = nullptr;
  void *kc = nullptr, *vc = nullptr;  // T, [slots, maxctx, nkv, D]
  float qscale = 1.f;
};

struct GraphEntry {
  cudaGraphExec_t exec = nullptr;
  bool warmed = false;
};

// qwen3vl's vision tower and per-slot images (vision.cuh).
struct VisBlock {
  void *qkv_w = nullptr, *proj_w = nullptr, *fc1_w = nullptr, *fc2_w = nullptr;  // T, [out, in]
  float *qkv_b = nullptr, *proj_b = nullptr, *fc1_b = nullptr, *fc2_b = nullptr;
  float *n1w = nullptr, *n1b = nullptr, *n2w = nullptr, *n2b = nullptr;
};
struct VisMerger {
  float *nw = nullptr, *nb = nullptr, *fc1_b = nullptr, *fc2_b = nullptr;
  void *fc1_w = nullptr, *fc2_w = nullptr;
  bool post = false;  // LayerNorm over the four merged patches (DeepStack) rather than per patch
};
struct SlotImage {
  bool live = false, encoded = false;
  std::vector<float> pixels;             // the processor's patches [gh * gw, 3 * tp * p * p]
  int gh = 0, gw = 0, n_img = 0, prompt_len = 0, delta = 0;
  std::vector<int32_t> pos3;             // per prompt position: (t, h, w)
  std::vector<int> img_index;            // per prompt position: image token index or -1
  float *dev = nullptr;                  // [1 + deepstack][n_img][E]: embeddings, DeepStack features
  size_t dev_bytes = 0;
};
struct Vis {
  int vh = 0, depth = 0, heads = 0, vi = 0, p = 0, tp = 0, merge = 0, npos = 0, side = 0, image_token = 0;
  int s1 = 0, s2 = 0;                    // mrope_section h, w
  std::vector<int> deep;                 // deepstack_visual_indexes
  bool drop_deepstack = false;           // fault qwen3vl.drop_deepstack
  void *pe_w = nullptr;
  float *pe_b = nullptr, *pos = nullptr;
  std::vector<VisBlock> blocks;
  VisMerger merger;
  std::vector<VisMerger> deep_mergers;
  std::vector<float> vinv;               // the vision rotary's inverse frequencies
  std::mutex mu;                         // slot and sdelta_h: set_image may run beside a step
  std::vector<SlotImage> slot;           // per KV slot (the scratch slot's last)
  std::vector<int> sdelta_h;             // per slot: rope delta (get_rope_index), mirrored in sdelta
  bool sdelta_dirty = false;
  int *sdelta = nullptr;                 // device [slots]
  // the chunk being run (vis_chunk_begin): per token the image row (NULL: none), its DeepStack
  // stride, its rotary row, its (t, h, w); device arrays of Tcap, host staging
  const float **src = nullptr;
  int *stride = nullptr, *rrow = nullptr, *pos3 = nullptr;
  std::vector<const float *> src_h;
  std::vector<int> stride_h, rrow_h, pos3_h;
  std::pair<void *, size_t> ws[8] = {};  // the tower's activations (vis_buf)
};

}  // namespace mqcuda

using namespace mqcuda;

struct mqb_model {
  Cfg c;
  Vis vis;             // qwen3vl only (c.vision)
  bool vis_on = false;  // the chunk being run has image rows (vis_chunk_begin)
  DType dt = DT_BF16;
  int dev = 0, sms = 0;
  int max_batch = 0, max_ctx = 0, slots = 0, scratch = 0;
  int Tcap = 0, Rcap = 0;
  int gemv_max_b = 4;
  bool attn_lanes = true;  // attend's several-lanes-per-position scores (debug "attn_lanes")
  bool attn_flash = true;  // decode attention through attend_flash (debug "attn_flash")
  // Prefill attention through attend_flash too (debug "prefill_flash"; with attn_flash), where
  // the tensor cores do not take it (prefill_tc): prompts of 128 tokens prefill in 13-19 % less
  // time than through attend (batch 1 2.47 against 2.85 ms, 32 45.4 against 55.9).
  bool prefill_flash = true;
  // Prefill and mixed steps' attention of bf16/fp16 models on the tensor cores
  // (prefill_attn.cuh) where head_dim allows (debug "prefill_tc"; 0: attention_kernel): 32
  // prompts of 128 tokens prefill in 15.9 ms instead of 46.5, one in 1.93 instead of 2.50 (run
  // 63). ptile is the chunk's tiles (prefill_tiles), ptile_h its pinned host copy, Tcap each.
  bool prefill_tc = true;
  // With prefill_tc, the one-token tiles of a chunk of at least prefill_one entries (rows; its
  // decode entries: a served mixed step's running sequences) go through attention_kernel, as a
  // decode step's tokens do, and only the longer tiles through prefill_attn_kernel (debug
  // "prefill_one"; 0: every tile there). In prefill_attn_kernel a one-token tile is a block of
  // four warps with one row, walking the context 64 positions at a time: 26 of them beside a
  // 128-token prompt took 0.77-0.85 ms of the step's 2.2 summed kernel ms. A second
  // launch costs its own latency, so few tiles stay there (ms a step of one prompt of
  // 128 and N decodes, routed / not: N 3 2.07-2.22 / 1.99-2.00, 7 2.06-2.24 / 1.99, 14 2.14-2.27 /
  // 2.08-2.21, 26 2.20-2.34 / 2.38). Rows, not tiles, decide, so a graph's bucket fixes the choice.
  int prefill_one = 17;
  // The element-wise preps (SwiGLU, GELU: the down projection's input where cuBLAS makes it)
  // load 4 values of a row at a time, two such loads of each source in flight per thread (debug
  // "prep_vec"; 0: one value at a time, as the kernel with every mode's code still does). Same
  // bits either way.
  bool prep_vec = true;
  // qkv_post_kernel holds head_n(D) values a lane (4 at head_dim 128) instead of HV (8), so no
  // lane issues the guarded-off half of every unrolled step, and so does decode_attn_kernel at
  // head_dim 128 with pre_params (debug "post_n" 0: HV in both). Same bits.
  bool post_n = true;
  // ptile: the chunk's tiles (prefill_tiles), then its one-token tiles' token indices (ints);
  // ptile_h its pinned host copy. Room for Tcap of each.
  pa::Tile *ptile = nullptr, *ptile_h = nullptr;
  std::vector<int> ones_h;  // prefill_tiles' one-token tiles, before the copy into ptile_h
  // Debug timeline (mqb_debug_set "timeline"): TL_SLOTS records of TL_FIELDS timestamps, one per
  // GEMV, tile-kernel and decode-attention launch of the last decode step's dispatch, labelled in tl_labels;
  // tl_buf is tl_mem while on, NULL while off.
  unsigned long long *tl_buf = nullptr, *tl_mem = nullptr;
  bool tl_decode = false;
  int tl_next = 0, tl_count = 0;
  std::vector<std::string> tl_labels;
  int attn_split = 0;  // decode attention position splits (MQB_ATTN_SPLIT; 0 = enough to fill the SMs)
  int fused_attn = 1;  // decode_attn_kernel: 1 for small decode grids, 2 always, 0 never (MQB_FUSED_ATTN)
  // Parameters that do not depend on the previous kernel loaded before its wait (debug
  // "pre_params"): q_norm / k_norm weights and RoPE's cos / sin (from rope_tab, made at load:
  // [max_ctx][D / 2] (cos, sin), with head_vec's own sincosf arguments) in qkv_post_kernel and
  // decode_attn_kernel (head_pre), the RMSNorm weights in prep_kernel. 0: loaded after the wait,
  // cos / sin by sincosf there.
  bool pre_params = true;
  float2 *rope_tab = nullptr;
  // Skinny tensor-core products (skinny.cuh) for bf16/fp16 products of gemv_max_b+1..sk_max_b
  // rows with N <= sk_max_n (the layers', not the LM head's); sk_on (unless debug
  // "skinny" 0, cuBLAS then) also governs the tile kernel. sk_max_b is 0: the skinny kernel
  // beat cuBLAS at batch 8 (+8 %, lab/cuda/NOTES.md) but the tile kernel with the RMSNorm and
  // SwiGLU fused beats it at 5-8 rows by 17 %; debug "sk_max_b" (up to 32) brings it
  // back, and sk_kw / sk_ks force a slice width / slices per block (0 = chosen by skinny_cfg).
  bool sk_on = false;
  int sk_max_b = 0, sk_max_n = 0, sk_kw = 0, sk_ks = 0;
  // Products of sk_max_b+1..tile_max_b rows go through sk::tile_kernel (weights streamed by the
  // copy engine through a shared-memory pipeline) when sk_on: above gemv_max_b always, at 1..
  // gemv_max_b rows where the GEMV would have had nothing to fuse (linear). tile_max_b is 16: on
  // the H200 batch 16 decodes 7.8 % faster through it than through cuBLAS, batch 32 13 % slower
  // (lab/cuda/NOTES.md). Debug "tile_max_b" (up to 32) sets the range, tile_rt / tile_z force
  // row tiles per block / K splits (0 = chosen by tile_cfg).
  int tile_max_b = 16, tile_rt = 0, tile_z = 0;
  // Weight chunks each tile-kernel block asks for before griddepcontrol.wait (debug "tile_pre",
  // 1..sk::TSTAGES): 3. All four buffers' worth made batches 1-16 1-2 % slower.
  int tile_pre = sk::TSTAGES - 1;
  // Kernels compiled per mode, so that a launch fetches no other mode's instructions (debug
  // "slim", a bitmask, default 3): bit 0 the attention kernels without attend where attend_flash
  // takes the step, bit 1 prep_kernel per PrepMode. A kernel's code is fetched cold at each
  // launch of a layer's chain: on the H200 bit 0 made batch 1 4-5 % faster, bit 1 batch 32 0.6 %
  // (lab/cuda/NOTES.md; the tile kernel per TileFuse mode was tried there and lost).
  int slim = 3;
  // A fused decode step's position splits (2-8 of them) merge through distributed shared memory,
  // the splits of an item one thread-block cluster (debug "attn_cluster"; 0: partials through L2,
  // a counter and the last split's merge). On the H200 batch 1's attention took 228 us a step
  // instead of 268, batches 2 and 4 decoded 3.5-3.8 % faster, 8 and 16 as before (lab/cuda/NOTES.md).
  bool attn_cluster = true;
  // With attn_cluster: the splits z > 0 push their partials into split 0's shared memory (its
  // park, where that fits: attn_park_fits) before one cluster barrier, instead of split 0
  // reading them between two (debug "attn_push" 0). On the H200 (lab/cuda/NOTES.md) the merge
  // took 1.21 us a layer at batch 1 instead of 2.02; batches 1-4 decoded 1.2-1.3 % faster, 8 the same.
  bool attn_push = true, attn_park_fits = false;
  // The tile kernel's K splits (2-8 of them) add their partials through distributed shared
  // memory, a row block's splits one cluster (sk::split_total's park; debug "tile_cluster"; 0:
  // through the workspace, a counter and the last split's sum). On the H200 batch 1 decoded 7.3 %
  // faster (o_proj 106 us a step instead of 164), batch 2 4.2 %, 4-16 1.6-2.1 % (lab/cuda/NOTES.md).
  bool tile_cluster = true;
  // The tile kernel's RMSNorm staging in its compact form (sk::TileFuse::compact) up to
  // rms_compact_b rows: on the H200 batch 1 decoded 2.7-2.8 % faster (the staging 1.3 us a layer
  // instead of 2.0), batch 2 1.3 %, 4 as fast, 8 and 16 6-10 % slower (lab/cuda/NOTES.md;
  // debug "rms_compact_b", 0: the other form at every batch).
  int rms_compact_b = 2;
  // With tile_cluster: the splits z > 0 push their partials into split 0's shared memory (a park
  // past its input, where that fits: tile_launch) before one cluster barrier, instead of split 0
  // reading them between two (debug "tile_push" 0). On the H200 batches 1-16 decoded 0.7-2.3 %
  // faster (lab/cuda/NOTES.md: o_proj's split sum 1.22 us a layer at batch 1 instead of 1.52).
  bool tile_push = true;
  // Products whose input is an RMSNorm (qkv, gate/up) go through sk::tile_kernel with the norm,
  // and gate/up with the SwiGLU, fused (tile_fused) for sk_max_b+1..fuse_max_b rows. fuse_max_b
  // is 16: on the H200 batches 12 and 16 decode 6-7 % faster so; at 24 and 32 the tile kernel,
  // fused, is 8 % slower than cuBLAS with the prep kernels (lab/cuda/NOTES.md). Debug
  // "fuse_max_b" (0: off, prep kernels and the unfused products).
  int fuse_max_b = 16;
#ifndef MQB_HOST_TEST
  // The copy engine's descriptions of the weight matrices the tile kernel has read, by (W, N, K,
  // box rows): made at first use (tile_map), also while a graph is captured.
  std::map<std::tuple<const void *, int, int, int>, CUtensorMap> tmaps;
#endif
  float *sk_ws = nullptr;          // split-K partials [Z][32][N]
  size_t sk_ws_floats = 0;
  unsigned int *sk_cnt = nullptr;  // [sk_max_n / 16] blocks done per row block, zero between products
  int step_splits = 1;  // decode attention splits of the step being run (attn_splits)
  float *part_acc = nullptr, *part_ml = nullptr;
  unsigned int *att_cnt = nullptr;  // [ATT_SPLIT_MAX_T * nkv] attention splits done, zero between steps
  bool use_graphs = true, use_pdl = true;
  bool mixed_graphs = true;  // prefill and mixed chunks as graphs too (run_chunk; off with MQB_GRAPHS=0)
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void *blas_ws = nullptr;
  // The cuBLAS products of decode buckets (a graph's batch: the layers' products above
  // tile_max_b rows, the LM head above gemv_max_b) run the cuBLASLt algorithm blas_pick timed
  // fastest on this model's weights: tuned while the model loads (warm_up), or at a shape's
  // first eager step where that did not see it. blas_tune false (MQB_BLAS_TUNE=0, debug
  // "blas_tune" 0) runs cublasGemmEx's default. tune_here: a decode step is being run
  // (decode_step sets it; prefill's token counts vary, so its products keep the default).
  // blas_log (MQB_BLAS_LOG=1) prints each choice.
  bool blas_tune = true, tune_here = false, blas_log = false;
  // warm: warm_up's prefills and graph captures at load (MQB_WARMUP, default 1; 0 in the CPU
  // emulation).
  bool warm = true;
  std::unique_ptr<blaspick::Picker> picker;
  std::vector<void *> allocs;

  void *emb = nullptr;    // T [V, H]
  float *wpe = nullptr;   // gpt2 [maxpos, H]
  void *lm = nullptr;     // T [V, H] (== emb when tied)
  float *normf_w = nullptr, *normf_b = nullptr;
  float *inv_freq = nullptr;
  std::vector<Layer> layers;

  // activations
  float *res = nullptr, *qkv = nullptr, *qbuf = nullptr, *mlp = nullptr, *logits = nullptr;
  void *attn = nullptr, *xbuf = nullptr;
  unsigned long long *keys = nullptr;
  int *meta = nullptr;      // device: tok[Tcap] pos[Tcap] slot[Tcap] rows[Rcap]
  // Sampling on the device (mqb_forward_sampled): per logits row 1/T (0 = greedy) and a key.
  float *samp_temp = nullptr, *samp_temp_h = nullptr;
  unsigned long long *samp_key = nullptr, *samp_key_h = nullptr;
  int *meta_h = nullptr;    // pinned host mirror
  unsigned long long *keys_h = nullptr;
  std::map<int, GraphEntry> graphs;

  // Profiling (mqb_debug_set "profile"): eager steps with an event after every kernel; the
  // time between consecutive events is charged to the later kernel's label.
  bool prof = false;
  std::string label;
  std::vector<cudaEvent_t> evpool;
  size_t evused = 0;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  std::map<std::string, std::pair<double, long>> pacc;
  long psteps = 0;

  int *d_tok() const { return meta; }
  int *d_pos() const { return meta + Tcap; }
  int *d_slot() const { return meta + 2 * Tcap; }
  int *d_rows() const { return meta + 3 * Tcap; }
  size_t meta_count() const { return (size_t)3 * Tcap + Rcap; }

  void *dmalloc(size_t bytes) {
    void *p = nullptr;
    ck(cudaMalloc(&p, bytes ? bytes : 16), fmt("cudaMalloc of %zu bytes", bytes).c_str());
    allocs.push_back(p);
    return p;
  }

  void clear_graphs() {
    for (auto &kv : graphs)
      if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    graphs.clear();
  }

  ~mqb_model() {
    if (dev >= 0) cudaSetDevice(dev);
    if (stream) cudaStreamSynchronize(stream);
    clear_graphs();
    picker.reset();
    if (blas) cublasDestroy(blas);
    for (void *p : allocs) cudaFree(p);
    if (meta_h) cudaFreeHost(meta_h);
    if (ptile_h) cudaFreeHost(ptile_h);
    if (keys_h) cudaFreeHost(keys_h);
    if (samp_temp_h) cudaFreeHost(samp_temp_h);
    if (samp_key_h) cudaFreeHost(samp_key_h);
    for (auto e : evpool) cudaEventDestroy(e);
    for (auto &s : vis.slot)
      if (s.dev) cudaFree(s.dev);
    for (auto &b : vis.ws)
      if (b.first) cudaFree(b.first);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace mqcuda {

void mark(mqb_model &m, const std::string &label);

// tl_slot: the next timeline slot for a launch labelled m.label in a decode step (-1: no
// timeline, not a decode step, or out of slots).
constexpr int TL_SLOTS = 1024;
int tl_slot(mqb_model &m) {
  if (!m.tl_buf || !m.tl_decode || m.tl_next >= TL_SLOTS) return -1;
  if ((int)m.tl_labels.size() <= m.tl_next) m.tl_labels.resize(m.tl_next + 1);
  m.tl_labels[m.tl_next] = m.label;
  m.tl_count = m.tl_next + 1;
  return m.tl_next++;
}

// launch runs a kernel on the model's stream, with programmatic dependent launch when enabled;
// launch_cl with thread-block clusters of shape cl where it has more than one block.
template <typename... K, typename... A>
void launch_cl(mqb_model &m, dim3 cl, void (*k)(K...), dim3 grid, dim3 block, size_t smem, const A &...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = m.stream;
  cudaLaunchAttribute attr[2];
  int na = 0;
#ifndef MQB_HOST_TEST
  if (cl.x * cl.y * cl.z > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = cl.x;
    attr[na].val.clusterDim.y = cl.y;
    attr[na].val.clusterDim.z = cl.z;
    ++na;
  }
#else
  (void)cl;
#endif
  const int base = na;
  if (m.use_pdl) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = na;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
  if (e != cudaSuccess && m.use_pdl) {
    // Programmatic dependent launch refused: say so once and continue with plain launches.
    (void)cudaGetLastError();
    fprintf(stderr, "cuda backend: programmatic dependent launch disabled: %s\n", cudaGetErrorString(e));
    m.use_pdl = false;
    cfg.attrs = base ? attr : nullptr;
    cfg.numAttrs = base;
    e = cudaLaunchKernelEx(&cfg, k, args...);
  }
  ck(e, "kernel launch");
  mark(m, m.label);
}
template <typename... K, typename... A>
void launch(mqb_model &m, void (*k)(K...), dim3 grid, dim3 block, size_t smem, const A &...args) {
  launch_cl(m, dim3(1, 1, 1), k, grid, block, smem, args...);
}

void mark(mqb_model &m, const std::string &label) {
  if (!m.prof) return;
  if (m.evused == m.evpool.size()) {
    cudaEvent_t e;
    ck(cudaEventCreate(&e), "cudaEventCreate");
    m.evpool.push_back(e);
  }
  cudaEvent_t e = m.evpool[m.evused++];
  ck(cudaEventRecord(e, m.stream), "cudaEventRecord");
  m.marks.emplace_back(label, e);
}

// prof_collect runs after the stream was synchronized: charges each interval to its label.
void prof_collect(mqb_model &m) {
  if (!m.prof) return;
  for (size_t i = 1; i < m.marks.size(); ++i) {
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, m.marks[i - 1].second, m.marks[i].second), "cudaEventElapsedTime");
    auto &a = m.pacc[m.marks[i].first];
    a.first += ms;
    a.second += 1;
  }
  m.marks.clear();
  m.evused = 0;
  m.psteps++;
}

template <typename T>
cudaDataType_t cuda_type();
template <>
cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <>
cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

// shape_time is the rough time (us) of a product launch that skinny_cfg and tile_cfg rank shapes
// by: the weights (weight_bytes) stream at DRAM speed over the whole GPU, the busiest SM pulls its
// blocks' weights and staged input (sm_bytes) at one SM's share of L2 bandwidth, and a K split over
// Z blocks adds the partials' round trips through L2 (write, count, then ceil(Z / ZU) loads).
double shape_time(double weight_bytes, double sm_bytes, int Z) {
  constexpr double dram = 4.0e6, sm_bw = 1.0e5, lat = 0.7;  // bytes/us, bytes/us per SM, us
  double t = std::max(weight_bytes / dram, sm_bytes / sm_bw);
  if (Z > 1) t += lat * (2 + (Z + sk::ZU - 1) / sk::ZU);
  return t;
}

// split_fits: the partials of a K split over Z blocks fit the workspace (always, for the shapes
// skinny_setup sized it for; a debug-forced shape that does not is skipped).
bool split_fits(const mqb_model &m, int Z, int N) { return Z == 1 || (size_t)Z * sk::MAXB * N <= m.sk_ws_floats; }

// skinny_cfg chooses the launch shape of a skinny product of B rows through W [N, K] (sk::Cfg) by
// shape_time, each block once per wave of blocks. Ties go to the wider slice. sk_kw / sk_ks
// (debug) restrict the shapes tried. Z = 0: no shape fits.
sk::Cfg skinny_cfg(const mqb_model &m, int N, int K, int B) {
  sk::Cfg best;
  double best_t = 0;
  if (N % 16 != 0 || K % 32 != 0) return best;
  const int rows = (B + 7) / 8 * 8;
  for (int Kw = sk::GMAX * 32; Kw >= 32; Kw -= 32) {
    if ((m.sk_kw && Kw != m.sk_kw) || K % Kw) continue;
    for (int KS : {1, 2, 4, 8}) {
      const int Kc = KS * Kw;
      if ((m.sk_ks && KS != m.sk_ks) || Kc > sk::KC_MAX || K % Kc || !split_fits(m, K / Kc, N)) continue;
      sk::Cfg c;
      c.RT = sk::WARPS / KS;
      c.KS = KS;
      c.Kw = Kw;
      c.Z = K / Kc;
      const int waves = (c.blocks(N) + m.sms - 1) / m.sms;
      const double t = shape_time((double)N * K * 2, (double)(c.RT * 16 + rows) * Kc * 2 * waves, c.Z);
      if (!best.Z || t < best_t * 0.999) {
        best = c;
        best_t = t;
      }
    }
  }
  return best;
}

// tile_cfg chooses sk::tile_kernel's launch shape for B rows through W [N, K] by shape_time, with
// two blocks per SM where shared memory allows. rms: the input rows are normalized while staged
// (sk::TileFuse::xr: every block reads its rows' K fp32 values); swiglu: W is [gate; up] and a
// block takes 8 RT rows of each half. Z = 0: no shape fits.
sk::TCfg tile_cfg(const mqb_model &m, int N, int K, int B, bool rms = false, bool swiglu = false) {
  sk::TCfg best;
  double best_t = 0;
  if (N % 16 != 0 || (rms && (K % 4 != 0 || K > sk::RMS_KMAX))) return best;
  const int nb = (B + 7) / 8;
  for (int RT : {8, 4, 2}) {
    if (m.tile_rt && RT != m.tile_rt) continue;
    const int KS = sk::WARPS / RT, KC = 64 * KS;
    if (K % KC || (swiglu && (N / 2) % (8 * RT) != 0)) continue;
    for (int Z = 1; Z <= K / KC; ++Z) {
      if ((m.tile_z && Z != m.tile_z) || K % Z || (K / Z) % KC || K / Z > sk::TKR_MAX || !split_fits(m, Z, N))
        continue;
      sk::TCfg c;
      c.RT = RT;
      c.KS = KS;
      c.Z = Z;
      c.Kr = K / Z;
      const int per_sm = std::max(1, std::min(2, (int)(sk::SMEM_SM / sk::tile_smem_bytes(nb, c.Kr))));
      const int rounds = (c.blocks(N) + m.sms * per_sm - 1) / (m.sms * per_sm);
      const double block_bytes = (double)RT * 16 * c.Kr * 2 + (double)nb * 8 * (rms ? K * 4 : c.Kr * 2);
      const double t = shape_time((double)N * K * 2, block_bytes * per_sm * rounds, Z);
      if (!best.Z || t < best_t * 0.999) {
        best = c;
        best_t = t;
      }
    }
  }
  return best;
}

// by_octets calls f with std::integral_constant<int, nb> (1..4: octets of input rows), the NB
// template argument of the tensor-core product kernels.
template <typename F>
void by_octets(int nb, const F &f) {
  switch (nb) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// tile_map describes W [N, K] to the copy engine for sk::tile_kernel: boxes of rows x 64 elements
// (128 bytes: the 128-byte swizzle's width), rows past N read as zero. Made once per matrix and
// box height. The CPU emulation's TmaMap is the matrix itself.
#ifndef MQB_HOST_TEST
template <typename T>
const sk::TmaMap &tile_map(mqb_model &m, const T *W, int N, int K, int rows) {
  const auto key = std::make_tuple(static_cast<const void *>(W), N, K, rows);
  const auto it = m.tmaps.find(key);
  if (it != m.tmaps.end()) return it->second;
  CUtensorMap tm;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N};
  const cuuint64_t strides[1] = {(cuuint64_t)K * sizeof(T)};
  const cuuint32_t box[2] = {64, (cuuint32_t)rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = cuTensorMapEncodeTiled(
      &tm, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<T *>(W), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw Fail(fmt("cuTensorMapEncodeTiled failed (error %d) for a %d x %d weight", (int)r, N, K));
  return m.tmaps.emplace(key, tm).first->second;
}
#else
template <typename T>
sk::TmaMap tile_map(mqb_model &, const T *W, int N, int K, int rows) {
  return sk::TmaMap{W, K, N, rows};
}
#endif

// tile_launch launches sk::tile_kernel in shape c (with act, its boxes are half as high: a gate
// box and an up box per K slice).
template <typename T>
void tile_launch(mqb_model &m, const sk::TCfg &c, const T *W, int N, int K, const T *X, int B, float *out, int acc,
                 const sk::TileFuse<T> &f0) {
  const int nb = (B + 7) / 8;
  sk::TileFuse<T> f = f0;
  f.tlb = m.tl_buf;
  f.tls = tl_slot(m);
  const auto &tm = tile_map(m, W, N, K, (f.act ? 8 : 16) * c.RT);
  const int clz = cluster_of(m.tile_cluster, c.Z);  // a row block's Z splits
  // tile_push: the park for the pushed partials, where it fits without costing a block per SM
  // (tile_cfg's choice assumed tile_smem_bytes) within the kernels' shared-memory attribute.
  const size_t base = sk::tile_smem_bytes(nb, c.Kr), park = sk::tile_park_bytes(nb, c.RT, c.Z);
  const bool push = clz > 1 && m.tile_push && base + park <= sk::tile_smem_bytes(4, sk::TKR_MAX) &&
                    sk::SMEM_SM / (base + park) >= std::min<size_t>(2, sk::SMEM_SM / base);
  auto go = [&](auto kernel) {
    launch_cl(m, dim3(1, clz, 1), kernel, dim3(c.row_blocks(N), c.Z), dim3(sk::THREADS), base + (push ? park : 0), tm,
              N, K, X, B, out, acc, c.RT, c.KS, c.Kr, m.tile_pre, push ? 2 : clz > 1 ? 1 : 0, m.sk_ws, m.sk_cnt, f);
  };
  by_octets(nb, [&](auto o) { go(sk::tile_kernel<T, decltype(o)::value>); });
}

// tile_shape: sk::tile_kernel's launch shape for a product of B rows through W [N, K] where the
// tile kernel takes it (bf16/fp16 weights, on, above the skinny kernel's range and within its
// own, a layer's shape that tile_cfg fits); Z = 0 where it does not.
sk::TCfg tile_shape(const mqb_model &m, int B, int N, int K) {
  if (!m.sk_on || B <= m.sk_max_b || B > m.tile_max_b || N > m.sk_max_n) return sk::TCfg{};
  return tile_cfg(m, N, K, B);
}

// skinny_linear runs out (+)= X W^T through skinny.cuh where it applies (bf16/fp16, on: the skinny
// kernel up to sk_max_b rows, the tile kernel above that up to tile_max_b (tile_shape); the shape
// fits); false: the caller uses cuBLAS.
template <typename T>
bool skinny_linear(mqb_model &m, const std::string &role, const T *X, int B, int K, const T *W, int N, float *out,
                   bool accumulate) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    if (!m.sk_on || B > std::max(m.sk_max_b, m.tile_max_b) || N > m.sk_max_n) return false;
    const int nb = (B + 7) / 8;  // octets of input rows: the kernels' NB
    const int acc = accumulate ? 1 : 0;
    if (B > m.sk_max_b) {
      const sk::TCfg c = tile_shape(m, B, N, K);
      if (!c.Z) return false;
      m.label = role + ":tile_rt" + std::to_string(c.RT) + "_z" + std::to_string(c.Z);
      tile_launch<T>(m, c, W, N, K, X, B, out, acc, sk::TileFuse<T>{});
      return true;
    }
    const sk::Cfg c = skinny_cfg(m, N, K, B);
    if (!c.Z) return false;
    m.label = role + ":skinny";
    const dim3 grid(c.row_blocks(N), c.Z);
    const size_t smem = sk::smem_bytes(nb, c.KS * c.Kw);
    auto go = [&](auto kernel) {
      launch(m, kernel, grid, dim3(sk::THREADS), smem, W, N, K, X, B, out, acc, c.RT, c.KS, c.Kw, m.sk_ws, m.sk_cnt);
    };
    by_octets(nb, [&](auto o) { go(sk::skinny_kernel<T, decltype(o)::value>); });
    return true;
  }
}

// tile_fused runs a product whose input rows are the RMSNorm of the fp32 residual (qkv, gate/up)
// through sk::tile_kernel with the norm made while the rows are staged, for the decode batches
// of sk_max_b+1..fuse_max_b rows: no prep kernel. With act, W is [gate; up] and the kernel
// writes silu(gate) * up into act [B, N / 2] (T) instead of out, which makes the down
// projection's input: no SwiGLU prep either. false: it does not apply (the caller runs the
// product unfused).
template <typename T>
bool tile_fused(mqb_model &m, const std::string &role, const PrepArgs<T> &a, int B, int K, const T *W, int N,
                float *out, T *act) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    if (!m.sk_on || B <= m.sk_max_b || B > m.fuse_max_b || N > m.sk_max_n || a.mode != PREP_RMS || a.rows ||
        a.ld != K)
      return false;
    const sk::TCfg c = tile_cfg(m, N, K, B, true, act != nullptr);
    if (!c.Z) return false;
    m.label = role + (act ? ":tile_rms_swiglu_rt" : ":tile_rms_rt") + std::to_string(c.RT) + "_z" + std::to_string(c.Z);
    sk::TileFuse<T> f;
    f.xr = a.src;
    f.nw = a.w;
    f.eps = a.eps;
    f.act = act;
    f.compact = B <= m.rms_compact_b && K <= 4 * sk::THREADS ? 1 : 0;
    tile_launch<T>(m, c, W, N, K, nullptr, B, out, 0, f);
    return true;
  }
}

int bucket_for(const mqb_model &m, int n);

// layer_weights: W and the same product's weights in every other layer (W alone where it is not
// a layer's, the LM head's), which blas_pick cycles through so that each timed call reads its
// weights from DRAM.
std::vector<const void *> layer_weights(const mqb_model &m, const void *W) {
  for (void *Layer::*f : {&Layer::w_qkv, &Layer::w_o, &Layer::w_up, &Layer::w_down}) {
    std::vector<const void *> ws;
    bool has = false;
    for (const Layer &ly : m.layers) {
      ws.push_back(ly.*f);
      has = has || ly.*f == W;
    }
    if (has) return ws;
  }
  return {W};
}

// gemm: out[B, N] (+)= X[B, K] · W[N, K]^T on cuBLAS (fp32 out): a decode bucket's shape with
// the algorithm blas_pick chose for it (mqb_model::blas_tune), any other with cublasGemmEx's
// default. cuBLAS launches its kernels itself, so in a captured graph the edge into one is plain,
// not programmatic like the edges into ours, and it must stay so: cuBLAS's kernels do not wait for
// the kernel before them (lab/cuda/NOTES.md made those edges programmatic: batch 32 decoded 9 %
// faster and parity failed, max|d| 1.05, graph != eager).
template <typename T>
void gemm(mqb_model &m, const std::string &r, const T *W, const T *X, int B, int K, int N, float *out, bool acc) {
  const blaspick::Shape s{cuda_type<T>(), N, K, B, acc};
  const blaspick::Plan *p = nullptr;
  if (m.blas_tune && m.tune_here && B == bucket_for(m, B)) {
    p = m.picker->find(s);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (!p) ck(cudaStreamIsCapturing(m.stream, &cap), "cudaStreamIsCapturing");  // asked only before a tuning
    if (!p && cap == cudaStreamCaptureStatusNone) {  // a capture follows the bucket's eager step
      p = m.picker->tune(s, layer_weights(m, W));
      if (m.blas_log) fprintf(stderr, "cuda backend: blas %s %s\n", r.c_str(), p->what.c_str());
    }
  }
  m.picker->run(s, p, W, X, out);
  mark(m, r + ":gemm");
}

// linear: out[B, N] (+)= prep(a)[B, K] · W[N, K]^T + bias, fp32 out. bf16/fp16 layer products of
// up to tile_max_b rows run on skinny.cuh's tensor-core kernels: with the RMSNorm fused
// (tile_fused), or with an input that needs no prep (skinny_linear); other products of small B
// use the fused GEMV kernel; larger B makes the T input with prep_kernel and runs the tile kernel
// or cuBLAS.
template <typename T>
void linear(mqb_model &m, const char *role, const PrepArgs<T> &a0, int B, int K, const void *Wv, int N,
            const float *bias, float *out, bool accumulate, unsigned long long *keys, Samp samp = Samp{}) {
  if (B <= 0) return;  // a prefill chunk that ends no entry has no logits rows
  const std::string r = role;
  const T *W = static_cast<const T *>(Wv);
  PrepArgs<T> a = a0;
  if (!bias && !keys && !accumulate && tile_fused<T>(m, r, a, B, K, W, N, out, nullptr)) return;
  const bool plain = a.mode == PREP_PLAIN && !a.rows && a.ld == K;  // the input rows as they are
  // The GEMV takes small batches where it fuses something (the input's prep, a bias, the argmax);
  // a layer's product with none of them goes to the tile kernel, which beats it at 1-4 rows on the
  // H200 (batch 1 937 against 895 tok/s, 4 3,804 against 1,836: lab/cuda/NOTES.md).
  if (B <= m.gemv_max_b && !(plain && !bias && !keys && tile_shape(m, B, N, K).Z)) {
    m.label = r + ":gemv";
    a.tlb = m.tl_buf;
    a.tls = tl_slot(m);
    const int blocks = std::max(1, std::min((N + 7) / 8, m.sms * 4));
    const size_t smem = (size_t)B * K * sizeof(T);
    const int acc = accumulate ? 1 : 0;
    switch (B) {
      case 1: launch(m, gemv_kernel<T, 1>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      case 2: launch(m, gemv_kernel<T, 2>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      case 3: launch(m, gemv_kernel<T, 3>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      default: launch(m, gemv_kernel<T, 4>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
    }
    return;
  }
  const T *X;
  if (plain) {
    X = a.srcT;
  } else {
    m.label = r + ":prep";
    const bool norm = a.mode == PREP_RMS || a.mode == PREP_LN;
    // prep_vec4's rows: K, the stride and the base 4-float aligned, no row list.
    const bool v4 = m.prep_vec && (m.slim & 2) && (a.mode == PREP_SWIGLU || a.mode == PREP_GELU) && K % 4 == 0 &&
                    a.ld % 4 == 0 && !a.rows && reinterpret_cast<uintptr_t>(a.src) % 16 == 0;
    const int blocks = norm ? B
                       : (int)std::min<int64_t>(((int64_t)B * (v4 ? K / 4 : K) + 255) / 256, (int64_t)m.sms * 8);
    auto k = !(m.slim & 2)           ? prep_kernel<T, -1>
             : a.mode == PREP_RMS    ? (m.pre_params ? prep_kernel<T, PREP_RMS, true> : prep_kernel<T, PREP_RMS>)
             : a.mode == PREP_LN     ? prep_kernel<T, PREP_LN>
             : a.mode == PREP_SWIGLU ? (v4 ? prep_kernel<T, PREP_SWIGLU, false, true> : prep_kernel<T, PREP_SWIGLU>)
             : a.mode == PREP_GELU   ? (v4 ? prep_kernel<T, PREP_GELU, false, true> : prep_kernel<T, PREP_GELU>)
                                     : prep_kernel<T, PREP_PLAIN>;
    launch(m, k, dim3(blocks), dim3(256), 0, a, B, K, static_cast<T *>(m.xbuf));
    X = static_cast<const T *>(m.xbuf);
  }
  if (!skinny_linear<T>(m, r, X, B, K, W, N, out, accumulate)) gemm<T>(m, r, W, X, B, K, N, out, accumulate);
  if (bias) {
    m.label = r + ":bias";
    const int total = B * N;
    launch(m, add_bias_kernel, dim3(std::min((total + 255) / 256, m.sms * 8)), dim3(256), 0, out, bias, N, total);
  }
  m.label = r + ":argmax";
  if (keys) launch(m, argmax_kernel, dim3(std::max(1, std::min(64, (N + 4095) / 4096)), B), dim3(256), 0,
                   (const float *)out, N, keys, samp);
}

template <typename T>
PrepArgs<T> prep(int mode, const float *src, const T *srcT, int ld, const int *rows, const float *w,
                 const float *bb, float eps) {
  PrepArgs<T> a;
  a.mode = mode;
  a.src = src;
  a.srcT = srcT;
  a.ld = ld;
  a.rows = rows;
  a.w = w;
  a.bb = bb;
  a.eps = eps;
  return a;
}


// gm_for: the attention kernels' compile-time bound on query heads per KV head (1, 2, 4 or 8).
int gm_for(int G) { return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8; }

// launch_gm launches kern<GM> for the runtime bound gm (a generic lambda per kernel family).
template <typename F>
void launch_gm(int gm, const F &f) {
  switch (gm) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    default: f(std::integral_constant<int, 8>()); break;
  }
}

// flash_only: this model's attention steps with flash asked for go through attend_flash alone
// (flash_fits), so the attention kernels' instance without attend runs them; debug "slim"
// without bit 0: the instance with both.
template <typename T>
bool flash_only(const mqb_model &m, int D) {
  return (m.slim & 1) && flash_fits<T>(m.attn_flash, D);
}

// attn_splits: how many position splits decode_attn_kernel uses for a decode step of Tn tokens
// whose longest context is nmax positions: "attn_split" when set, else the more
// of two rules, in (token, KV head, split) blocks that fit the SMs:
//  - long contexts: splits of at least ATT_SPLIT_MIN_POS positions (lab/cuda/NOTES.md: 16 splits of
//    ~20 positions at batch 1 cost more in partials and the merge than they save);
//  - few items (a batch of 1-4 sequences): ATT_FEW_SPLITS, up to ATT_FEW_BLOCKS blocks in all,
//    of at least ATT_FEW_POS positions each. On the H200 (positions 32-332) 4 splits
//    made batch 1 5-6 % and batch 2 3 % faster (8 splits at batch 1 as 4; splits growing with
//    the positions, one per 64, 2 % slower than 4), while batch 8 lost 16 % with 4 and 1-2 % with 2.
int attn_splits(const mqb_model &m, int Tn, int nmax) {
  if (Tn > ATT_SPLIT_MAX_T) return 1;
  if (m.attn_split > 0) return m.attn_split;
  const int items = std::max(1, Tn * m.c.nkv);
  const int fill = m.sms / items;
  const int len = (nmax + ATT_SPLIT_MIN_POS - 1) / ATT_SPLIT_MIN_POS;
  const int few =
      std::min(std::min(ATT_FEW_SPLITS, ATT_FEW_BLOCKS / items), (nmax + ATT_FEW_POS - 1) / ATT_FEW_POS);
  return std::max(1, std::min(ATT_SPLIT_MAX, std::min(fill, std::max(len, few))));
}

// TileGrid: a prefill or mixed chunk's attention grids (prefill_tiles): multi tiles through
// prefill_attn_kernel, one-token tiles (with prefill_one) through attention_kernel. A graphed
// chunk's are fixed sizes, the entries past the chunk's empty (run_chunk).
struct TileGrid {
  int multi = 0, one = 0;
  bool operator==(const TileGrid &o) const { return multi == o.multi && one == o.one; }
};

// ones_apart: whether a chunk of R rows sends its one-token tiles to attention_kernel (prefill_one).
bool ones_apart(const mqb_model &m, int R) { return m.prefill_one > 0 && R >= m.prefill_one; }

// prefill_tiles cuts the Tn tokens of the chunk in meta_h into pa::Tiles (runs of up to pa::BQ
// tokens of one slot at consecutive positions); with apart a run of one token is listed apart, by
// its token index, after the tiles. Pads both lists to pad (empty tiles, token -1), uploads them
// to m.ptile and returns their lengths.
TileGrid prefill_tiles(mqb_model &m, int Tn, bool apart, TileGrid pad = {}) {
  const int *pos = m.meta_h + m.Tcap, *slot = m.meta_h + 2 * m.Tcap;
  std::vector<int> &ones = m.ones_h;
  ones.clear();
  int n = 0;
  for (int i = 0; i < Tn;) {
    int k = 1;
    while (i + k < Tn && k < pa::BQ && slot[i + k] == slot[i] && pos[i + k] == pos[i] + k) ++k;
    if (k == 1 && apart) ones.push_back(i);
    else m.ptile_h[n++] = pa::Tile{i, k};
    i += k;
  }
  // A graphed chunk's launch has a fixed grid (run_chunk): the tiles past the chunk's are
  // empty, and their blocks return at once.
  while (n < pad.multi) m.ptile_h[n++] = pa::Tile{0, 0};
  while ((int)ones.size() < pad.one) ones.push_back(-1);
  std::memcpy(reinterpret_cast<int *>(m.ptile_h + n), ones.data(), sizeof(int) * ones.size());
  ck(cudaMemcpyAsync(m.ptile, m.ptile_h, sizeof(pa::Tile) * n + sizeof(int) * ones.size(), cudaMemcpyHostToDevice,
                     m.stream),
     "tile upload");
  return TileGrid{n, (int)ones.size()};
}

// prefill_attention launches pa::prefill_attn_kernel over the chunk's ntiles tiles (m.ptile) for
// layer ly's query heads (bf16/fp16 only; run_tokens checks pa::supported(D) first).
template <typename T>
void prefill_attention(mqb_model &m, const Layer &ly, int ntiles) {
  if constexpr (!std::is_same<T, float>::value) {
    const Cfg &c = m.c;
    auto go = [&](auto kernel) {
      launch(m, kernel, dim3(ntiles, c.nh), dim3(pa::THREADS), 0, (const float *)m.qbuf, (const T *)ly.kc,
             (const T *)ly.vc, (const int *)m.d_pos(), (const int *)m.d_slot(), (const pa::Tile *)m.ptile,
             static_cast<T *>(m.attn), c.nh, c.nkv, m.max_ctx);
    };
    switch (c.D) {
      case 16: go(pa::prefill_attn_kernel<T, 16>); break;
      case 32: go(pa::prefill_attn_kernel<T, 32>); break;
      case 64: go(pa::prefill_attn_kernel<T, 64>); break;
      default: go(pa::prefill_attn_kernel<T, 128>); break;
    }
  }
}

// run_tokens: the forward pass over the T tokens described by the device meta arrays, logits of
// the R rows listed in rows[] into m.logits, and (want_keys) their argmax keys into m.keys.
// decode says every token is the next one of a different sequence (rows = tokens): attention
// may then run fused with the q/k/v post-processing (decode_attn_kernel, by the fused_attn rule
// below).
template <typename T>
void run_tokens(mqb_model &m, int Tn, int R, bool want_keys, bool decode, const TileGrid *tiles) {
  const Cfg &c = m.c;
  const int H = c.H, QKV = (c.nh + 2 * c.nkv) * c.D, AO = c.nh * c.D;
  const float eps = (float)c.eps;
  const bool q3 = c.fam == QWEN3;
  // Fused decode attention where the (token, KV head) grid cannot fill the GPU, so position
  // splits can (fused_attn 1); always with 2. At batch 32 it measured slower than qkv_post +
  // attention on the H200 (lab/cuda/NOTES.md).
  const bool fused = decode && (m.fused_attn == 2 || (m.fused_attn == 1 && Tn * c.nkv < m.sms));
  const int gm = gm_for(c.nh / c.nkv);
  const size_t asmem = attn_smem(gm, c.D);
  const int S = fused ? m.step_splits : 1;
  const int clz = cluster_of(m.attn_cluster, S);  // an item's S position splits
  // Prefill / mixed steps of bf16/fp16 models: attention on the tensor cores (prefill_attn.cuh),
  // over the chunk's tiles (cut once per chunk), the one-token tiles through attention_kernel.
  const bool tc_prefill = !decode && !std::is_same<T, float>::value && m.prefill_tc && pa::supported(c.D);
  const TileGrid grid = !tc_prefill ? TileGrid{} : tiles ? *tiles : prefill_tiles(m, Tn, ones_apart(m, R));
  m.tl_decode = decode;
  m.tl_next = 0;
  mark(m, "start");
  m.label = "embed";
  launch(m, embed_kernel<T>, dim3(Tn), dim3(256), 0, (const int *)m.d_tok(), (const int *)m.d_pos(),
         (const T *)m.emb, (const float *)m.wpe, m.res, H, want_keys ? m.keys : nullptr, R);
  // qwen3vl (vision.cuh): the image tokens take the image's rows and their own M-RoPE rows.
  const int *rrow = m.vis_on ? m.vis.rrow : nullptr;
  const int *sdelta = c.vision ? m.vis.sdelta : nullptr;
  if (m.vis_on) {
    m.label = "image_rows";
    launch(m, img_rows_kernel, dim3(Tn), dim3(256), 0, m.res, H, (const float *const *)m.vis.src,
           (const int *)m.vis.stride, -1);
    m.label = "mrope_rows";
    launch(m, mrope_rows_kernel, dim3(Tn), dim3(128), 0, m.rope_tab, c.D / 2, m.max_ctx, (const int *)rrow,
           (const int *)m.vis.pos3, c.mrope[1], c.mrope[2]);
  }
  for (int l = 0; l < c.L; ++l) {
    Layer &ly = m.layers[l];
    auto attention = [&]() {
      m.label = "attention";
      if (fused) {
        const DecAttn<T> da{m.qkv, m.d_pos(), m.d_slot(), c.nh, c.nkv, c.D, m.max_ctx, ly.qn, ly.kn,
                            q3 ? m.inv_freq : nullptr, eps, ly.qscale, static_cast<T *>(ly.kc),
                            static_cast<T *>(ly.vc), static_cast<T *>(m.attn), m.part_acc, m.part_ml, m.att_cnt,
                            m.tl_buf, tl_slot(m), m.attn_lanes ? 1 : 0, m.attn_flash ? 1 : 0, clz > 1 ? 1 : 0,
                            clz > 1 && m.attn_push && m.attn_park_fits ? 1 : 0, m.rope_tab, sdelta};
        const size_t dsmem_bytes = asmem + (da.push ? sizeof(float) * (size_t)clz * attn_park(gm, c.D) : 0);
        launch_gm(gm, [&](auto g) {
          constexpr int G = decltype(g)::value;
          // head_dim 128 with pre_params: head_vec with 4 values a lane (post_n, as qkv_post)
          auto k = !flash_only<T>(m, c.D) ? decode_attn_kernel<T, G, false>
                   : !m.pre_params        ? decode_attn_kernel<T, G, true>
                   : m.post_n && head_n(c.D) == 4 ? decode_attn_kernel<T, G, true, true, 4>
                                                  : decode_attn_kernel<T, G, true, true>;
          launch_cl(m, dim3(1, 1, clz), k, dim3(Tn, c.nkv, S), dim3(ATT_THREADS), dsmem_bytes, da);
        });
        return;
      }
      m.label = "qkv_post";
      auto post = [&](auto n) {
        constexpr int N = decltype(n)::value;
        launch(m, m.pre_params ? qkv_post_kernel<T, true, N> : qkv_post_kernel<T, false, N>,
               dim3(Tn, (c.nh + 2 * c.nkv + 7) / 8), dim3(256), sizeof(float) * 8 * c.D, (const float *)m.qkv,
               (const int *)m.d_pos(), (const int *)m.d_slot(), c.nh, c.nkv, c.D, (const float *)ly.qn,
               (const float *)ly.kn, eps, (const float *)(q3 ? m.inv_freq : nullptr), ly.qscale, m.qbuf,
               static_cast<T *>(ly.kc), static_cast<T *>(ly.vc), m.max_ctx, (const float2 *)m.rope_tab, rrow, sdelta);
      };
      switch (m.post_n ? head_n(c.D) : HV) {
        case 1: post(std::integral_constant<int, 1>{}); break;
        case 2: post(std::integral_constant<int, 2>{}); break;
        case 4: post(std::integral_constant<int, 4>{}); break;
        default: post(std::integral_constant<int, HV>{}); break;
      }
      m.label = "attention";
      // The one-token tiles' tokens are decode-like: attend_flash, as a decode step's.
      const bool flash = decode || m.prefill_flash || tc_prefill;  // with m.attn_flash
      if (tc_prefill && grid.multi > 0) prefill_attention<T>(m, ly, grid.multi);
      if (tc_prefill && grid.one == 0) return;
      launch_gm(gm, [&](auto g) {
        auto k = flash && flash_only<T>(m, c.D) ? attention_kernel<T, decltype(g)::value, true>
                                                : attention_kernel<T, decltype(g)::value, false>;
        launch(m, k, dim3(tc_prefill ? grid.one : Tn, c.nkv), dim3(ATT_THREADS), asmem, (const float *)m.qbuf,
               (const T *)ly.kc, (const T *)ly.vc, (const int *)m.d_pos(), (const int *)m.d_slot(),
               static_cast<T *>(m.attn), c.nh, c.nkv, c.D, m.max_ctx, m.attn_flash && flash ? 1 : 0,
               tc_prefill ? reinterpret_cast<const int *>(m.ptile + grid.multi) : (const int *)nullptr);
      });
    };
    linear<T>(m, "qkv", prep<T>(q3 ? PREP_RMS : PREP_LN, m.res, nullptr, H, nullptr, ly.ln1_w, ly.ln1_b, eps), Tn, H,
              ly.w_qkv, QKV, ly.b_qkv, m.qkv, false, nullptr);
    attention();
    linear<T>(m, "o_proj", prep<T>(PREP_PLAIN, nullptr, (const T *)m.attn, AO, nullptr, nullptr, nullptr, eps), Tn, AO,
              ly.w_o, H, ly.b_o, m.res, true, nullptr);
    const PrepArgs<T> up_in = prep<T>(q3 ? PREP_RMS : PREP_LN, m.res, nullptr, H, nullptr, ly.ln2_w, ly.ln2_b, eps);
    // qwen3 batches in the tile kernel's fused range: RMSNorm, gate/up and SwiGLU in one kernel,
    // whose T output (in m.mlp's memory) is the down projection's input as it is.
    T *act = reinterpret_cast<T *>(m.mlp);
    const bool swiglu_made =
        q3 && !ly.b_up && tile_fused<T>(m, "up", up_in, Tn, H, static_cast<const T *>(ly.w_up), 2 * c.I, nullptr, act);
    if (!swiglu_made) linear<T>(m, "up", up_in, Tn, H, ly.w_up, q3 ? 2 * c.I : c.I, ly.b_up, m.mlp, false, nullptr);
    const PrepArgs<T> down_in =
        swiglu_made ? prep<T>(PREP_PLAIN, nullptr, act, c.I, nullptr, nullptr, nullptr, eps)
                    : prep<T>(q3 ? PREP_SWIGLU : PREP_GELU, m.mlp, nullptr, q3 ? 2 * c.I : c.I, nullptr, nullptr,
                              nullptr, eps);
    linear<T>(m, "down", down_in, Tn, c.I, ly.w_down, H, ly.b_down, m.res, true, nullptr);
    if (m.vis_on && !m.vis.drop_deepstack && l < (int)m.vis.deep.size()) {  // DeepStack feature l
      m.label = "deepstack";
      launch(m, img_rows_kernel, dim3(Tn), dim3(256), 0, m.res, H, (const float *const *)m.vis.src,
             (const int *)m.vis.stride, l);
    }
  }
  linear<T>(m, "lm_head",
            prep<T>(c.fam == QWEN3 ? PREP_RMS : PREP_LN, m.res, nullptr, H, (const int *)m.d_rows(), m.normf_w,
                    m.normf_b, eps),
            R, H, m.lm, c.V, nullptr, m.logits, false, want_keys ? m.keys : nullptr, Samp{m.samp_temp, m.samp_key});
}

// run_dispatch runs run_tokens for the model's precision. tiles: the prefill attention's tiles
// are uploaded already (a graphed chunk's, padded to those sizes); NULL cuts them here.
void run_dispatch(mqb_model &m, int Tn, int R, bool want_keys, bool decode, const TileGrid *tiles = nullptr) {
  switch (m.dt) {
    case DT_BF16: run_tokens<__nv_bfloat16>(m, Tn, R, want_keys, decode, tiles); break;
    case DT_F16: run_tokens<__half>(m, Tn, R, want_keys, decode, tiles); break;
    default: run_tokens<float>(m, Tn, R, want_keys, decode, tiles); break;
  }
}

void upload_meta(mqb_model &m) {
  ck(cudaMemcpyAsync(m.meta, m.meta_h, sizeof(int) * m.meta_count(), cudaMemcpyHostToDevice, m.stream),
     "meta upload");
  ck(cudaMemcpyAsync(m.samp_temp, m.samp_temp_h, sizeof(float) * m.Rcap, cudaMemcpyHostToDevice, m.stream),
     "sampling upload");
  ck(cudaMemcpyAsync(m.samp_key, m.samp_key_h, sizeof(unsigned long long) * m.Rcap, cudaMemcpyHostToDevice,
                     m.stream),
     "sampling upload");
}

// set_samp fills logits row r's sampling from entry e of the caller's arrays (NULL: greedy).
void set_samp(mqb_model &m, int r, int e, const float *temp, const uint64_t *rkey) {
  const float t = temp && e >= 0 ? temp[e] : 0.f;
  m.samp_temp_h[r] = t > 0.f ? 1.f / t : 0.f;
  m.samp_key_h[r] = rkey && e >= 0 ? (unsigned long long)rkey[e] : 0ull;
}

// step_dispatch runs the decode step of b entries whose meta is uploaded, kernel by kernel (the
// kernel-by-kernel path always writes the logits buffer).
void step_dispatch(mqb_model &m, int b, bool) { run_dispatch(m, b, b, true, true); }

// advance_kernel feeds a decode step's argmax back as the next step's tokens on the device and
// moves each real entry one position on (mqb_debug_chain).
__global__ void advance_kernel(int *tok, int *pos, const unsigned long long *keys, int n) {
  const int i = threadIdx.x;
  if (i < n) {
    tok[i] = decode_key(keys[i]);
    pos[i] += 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Loading

struct TensorMap {
  std::map<std::string, const mqb_tensor *> by;
  explicit TensorMap(const mqb_tensor *t, int n) {
    for (int i = 0; i < n; ++i) {
      if (!t[i].name) continue;
      std::string s = t[i].name;
      for (const char *pre : {"transformer.", "model."}) {
        size_t pl = strlen(pre);
        if (s.compare(0, pl, pre) == 0) {
          s = s.substr(pl);
          break;
        }
      }
      by[s] = &t[i];
    }
  }
  const mqb_tensor *find(const std::string &n) const {
    auto it = by.find(n);
    return it == by.end() ? nullptr : it->second;
  }
  const mqb_tensor *need(const std::string &n, std::vector<int64_t> shape) const {
    const mqb_tensor *t = find(n);
    if (!t) throw Fail(fmt("cuda backend: tensor %s is missing", n.c_str()));
    bool ok = t->ndim == (int)shape.size() && t->data;
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = t->shape[i] == shape[i];
    if (!ok) {
      std::string want, got;
      for (auto s : shape) want += fmt("%lld,", (long long)s);
      for (int i = 0; i < t->ndim && i < 4; ++i) got += fmt("%lld,", (long long)t->shape[i]);
      throw Fail(fmt("cuda backend: tensor %s has shape [%s], want [%s]%s", n.c_str(), got.c_str(), want.c_str(),
                     t->data ? "" : " (no data)"));
    }
    return t;
  }
};

// Part is a block of output rows of a fused weight: rows [0, n) of src, which is [n, K] (an
// nn.Linear weight) or, when transposed, [K, n] (a GPT-2 Conv1D weight).
struct Part {
  const mqb_tensor *src;
  int64_t n;
  bool transposed;
};

void *upload_matrix(mqb_model &m, const std::vector<Part> &parts, int64_t K) {
  int64_t N = 0;
  for (auto &p : parts) N += p.n;
  const size_t es = dt_size(m.dt);
  std::vector<unsigned char> host((size_t)N * K * es);
  int64_t r0 = 0;
  for (const auto &p : parts) {
    unsigned char *dst = host.data() + (size_t)r0 * K * es;
    const DType dt = m.dt;
    const int32_t sdt = p.src->dtype;
    const void *src = p.src->data;
    if (!p.transposed && same_dtype(sdt, dt)) {  // stored at the compute precision: copy rows
      memcpy(dst, src, (size_t)p.n * K * es);
      r0 += p.n;
      continue;
    }
    parallel_for(p.n, [&, dst, dt, sdt, src](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        for (int64_t k = 0; k < K; ++k) {
          const float v = elem(src, sdt, p.transposed ? k * p.n + r : r * K + k);
          const size_t idx = (size_t)r * K + k;
          if (dt == DT_F32) memcpy(dst + idx * 4, &v, 4);
          else {
            uint16_t h = dt == DT_BF16 ? f2bf(v) : f2h(v);
            memcpy(dst + idx * 2, &h, 2);
          }
        }
      }
    });
    r0 += p.n;
  }
  void *d = m.dmalloc(host.size());
  ck(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice), "weight upload");
  return d;
}

float *upload_f32(mqb_model &m, const std::vector<const mqb_tensor *> &parts) {
  std::vector<float> host;
  for (auto *t : parts) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
    for (int64_t i = 0; i < n; ++i) host.push_back(elem(t->data, t->dtype, i));
  }
  float *d = static_cast<float *>(m.dmalloc(host.size() * sizeof(float)));
  ck(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return d;
}

}  // namespace mqcuda
#include "vision.cuh"
namespace mqcuda {

int env_int(const char *k, int dflt) {
  const char *v = getenv(k);
  if (!v || !*v) return dflt;
  return atoi(v);
}

// Knobs: the backend's only environment settings, read once per model open. Everything else is
// the one measured-fastest path (lab/cuda/NOTES.md has how each default was chosen; the lab's
// benchmark varies kernels through mqb_debug_set, never through the environment).
//   MQB_GRAPHS=0      run decode and prefill steps eagerly instead of as captured CUDA graphs
//                     (debugging a kernel with compute-sanitizer, say); default 1
//   MQB_WARMUP=0      leave the prefill warm-up and graph captures to the first requests (faster
//                     open, slower first requests); default 1 (0 in the CPU emulation)
//   MQB_TCAP=n        most tokens in one prefill or mixed chunk; default 2048 (8 or 32 prompts of
//                     128 tokens prefill 7-10 % faster than in chunks of 512; 4,096 measured the same)
//   MQB_BLAS_TUNE=0   use cuBLAS's default algorithm instead of timing candidates once per shape
//   MQB_BLAS_LOG=1    print the algorithm blas_pick chose for each shape
struct Knobs {
  bool graphs, warmup, blas_tune, blas_log;
  int tcap;
};

Knobs knobs() {
#ifdef MQB_HOST_TEST
  const int warm_default = 0;  // an emulated launch takes about half a second
#else
  const int warm_default = 1;
#endif
  return Knobs{env_int("MQB_GRAPHS", 1) != 0, env_int("MQB_WARMUP", warm_default) != 0,
               env_int("MQB_BLAS_TUNE", 1) != 0, env_int("MQB_BLAS_LOG", 0) != 0, env_int("MQB_TCAP", 2048)};
}

void load(mqb_model &m, const mqb_model_params *p) {
  const Cfg &c = m.c;
  TensorMap tm(p->tensors, p->n_tensors);
  const int64_t H = c.H, D = c.D, I = c.I, V = c.V, nh = c.nh, nkv = c.nkv;
  if (c.fam == GPT2) {
    const mqb_tensor *wte = tm.need("wte.weight", {V, H});
    m.emb = upload_matrix(m, {{wte, V, false}}, H);
    m.lm = m.emb;
    m.wpe = upload_f32(m, {tm.need("wpe.weight", {(int64_t)c.maxpos, H})});
    m.normf_w = upload_f32(m, {tm.need("ln_f.weight", {H})});
    m.normf_b = upload_f32(m, {tm.need("ln_f.bias", {H})});
    for (int l = 0; l < c.L; ++l) {
      Layer &ly = m.layers[l];
      const std::string pre = fmt("h.%d.", l);
      ly.ln1_w = upload_f32(m, {tm.need(pre + "ln_1.weight", {H})});
      ly.ln1_b = upload_f32(m, {tm.need(pre + "ln_1.bias", {H})});
      ly.ln2_w = upload_f32(m, {tm.need(pre + "ln_2.weight", {H})});
      ly.ln2_b = upload_f32(m, {tm.need(pre + "ln_2.bias", {H})});
      ly.w_qkv = upload_matrix(m, {{tm.need(pre + "attn.c_attn.weight", {H, 3 * H}), 3 * H, true}}, H);
      ly.b_qkv = upload_f32(m, {tm.need(pre + "attn.c_attn.bias", {3 * H})});
      ly.w_o = upload_matrix(m, {{tm.need(pre + "attn.c_proj.weight", {H, H}), H, true}}, H);
      ly.b_o = upload_f32(m, {tm.need(pre + "attn.c_proj.bias", {H})});
      ly.w_up = upload_matrix(m, {{tm.need(pre + "mlp.c_fc.weight", {H, I}), I, true}}, H);
      ly.b_up = upload_f32(m, {tm.need(pre + "mlp.c_fc.bias", {I})});
      ly.w_down = upload_matrix(m, {{tm.need(pre + "mlp.c_proj.weight", {I, H}), H, true}}, I);
      ly.b_down = upload_f32(m, {tm.need(pre + "mlp.c_proj.bias", {H})});
      ly.qscale = 1.f / sqrtf((float)D);
      if (c.inv_layer_scale) ly.qscale /= (float)(l + 1);
    }
  } else {
    const std::string &tp = c.tprefix;  // "language_model." for qwen3vl
    const mqb_tensor *et = tm.need(tp + "embed_tokens.weight", {V, H});
    m.emb = upload_matrix(m, {{et, V, false}}, H);
    const mqb_tensor *lmh = tm.find("lm_head.weight");
    if (c.tied || !lmh) {
      if (!c.tied && !lmh) throw Fail("cuda backend: tensor lm_head.weight is missing and tie_word_embeddings is false");
      m.lm = m.emb;
    } else {
      m.lm = upload_matrix(m, {{tm.need("lm_head.weight", {V, H}), V, false}}, H);
    }
    m.normf_w = upload_f32(m, {tm.need(tp + "norm.weight", {H})});
    const bool drop_qn = fault(c.vision ? "qwen3vl.drop_q_norm" : "qwen3.drop_q_norm");
    for (int l = 0; l < c.L; ++l) {
      Layer &ly = m.layers[l];
      const std::string pre = tp + fmt("layers.%d.", l);
      ly.ln1_w = upload_f32(m, {tm.need(pre + "input_layernorm.weight", {H})});
      ly.ln2_w = upload_f32(m, {tm.need(pre + "post_attention_layernorm.weight", {H})});
      const mqb_tensor *q = tm.need(pre + "self_attn.q_proj.weight", {nh * D, H});
      const mqb_tensor *k = tm.need(pre + "self_attn.k_proj.weight", {nkv * D, H});
      const mqb_tensor *v = tm.need(pre + "self_attn.v_proj.weight", {nkv * D, H});
      ly.w_qkv = upload_matrix(m, {{q, nh * D, false}, {k, nkv * D, false}, {v, nkv * D, false}}, H);
      ly.w_o = upload_matrix(m, {{tm.need(pre + "self_attn.o_proj.weight", {H, nh * D}), H, false}}, nh * D);
      if (c.attn_bias) {
        ly.b_qkv = upload_f32(m, {tm.need(pre + "self_attn.q_proj.bias", {nh * D}),
                                  tm.need(pre + "self_attn.k_proj.bias", {nkv * D}),
                                  tm.need(pre + "self_attn.v_proj.bias", {nkv * D})});
        ly.b_o = upload_f32(m, {tm.need(pre + "self_attn.o_proj.bias", {H})});
      }
      if (!drop_qn) ly.qn = upload_f32(m, {tm.need(pre + "self_attn.q_norm.weight", {D})});
      ly.kn = upload_f32(m, {tm.need(pre + "self_attn.k_norm.weight", {D})});
      const mqb_tensor *gt = tm.need(pre + "mlp.gate_proj.weight", {I, H});
      const mqb_tensor *ut = tm.need(pre + "mlp.up_proj.weight", {I, H});
      ly.w_up = upload_matrix(m, {{gt, I, false}, {ut, I, false}}, H);
      ly.w_down = upload_matrix(m, {{tm.need(pre + "mlp.down_proj.weight", {H, I}), H, false}}, I);
      ly.qscale = 1.f / sqrtf((float)D);
    }
    std::vector<float> inv(D / 2);
    for (int64_t j = 0; j < D / 2; ++j)
      inv[j] = 1.0f / powf((float)c.theta, (float)(2 * j) / (float)D);
    m.inv_freq = static_cast<float *>(m.dmalloc(inv.size() * sizeof(float)));
    ck(cudaMemcpy(m.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice), "inv_freq upload");
    // RoPE's (cos, sin) for every position the cache holds (head_pre): 2 MB at 4,096 positions
    // of head_dim 128. qwen3vl: Tcap rows more, a chunk's image tokens' own M-RoPE rows.
    const int half = (int)(D / 2);
    m.rope_tab = static_cast<float2 *>(
        m.dmalloc(sizeof(float2) * (size_t)(m.max_ctx + (c.vision ? m.Tcap : 0)) * half));
    m.label = "rope_table";
    launch(m, rope_table_kernel, dim3(std::min((m.max_ctx * half + 255) / 256, 1024)), dim3(256), 0,
           (const float *)m.inv_freq, half, m.max_ctx, m.rope_tab);
    ck(cudaStreamSynchronize(m.stream), "rope table");
    if (c.vision) vis_load(m, tm);
  }
}

// set_kernel_attrs lets the attention kernels use more than 48 KB of shared memory when the
// head shape needs it (large head_dim and many query heads per KV head).
template <typename T>
void set_kernel_attrs(int gm, size_t att_bytes) {
  if (att_bytes <= 48 * 1024) return;
  launch_gm(gm, [&](auto g) {
    for (auto k : {attention_kernel<T, decltype(g)::value, false>, attention_kernel<T, decltype(g)::value, true>})
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_bytes),
         "cudaFuncSetAttribute(attention)");
    constexpr int G = decltype(g)::value;
    for (auto k : {decode_attn_kernel<T, G, false>, decode_attn_kernel<T, G, true>, decode_attn_kernel<T, G, true, true>,
                   decode_attn_kernel<T, G, true, true, 4>})
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_bytes),
         "cudaFuncSetAttribute(decode attention)");
  });
}

// skinny_setup turns the skinny products on for a bf16/fp16 model (unless debug "skinny" 0): the
// workspace holds the partials of the finest K split any launch shape of the layers' products
// can have (debug sk_kw / sk_ks included), and the kernels may use the shared memory of the
// widest K range.
template <typename T>
void skinny_setup(mqb_model &m) {
  if constexpr (!std::is_same<T, float>::value) {
    const Cfg &c = m.c;
    const int QKV = (c.nh + 2 * c.nkv) * c.D, MLP = c.fam == QWEN3 ? 2 * c.I : c.I, AO = c.nh * c.D;
    const int shapes[4][2] = {{QKV, c.H}, {c.H, AO}, {MLP, c.H}, {c.H, c.I}};  // N, K of qkv, o, up, down
    size_t ws = 0;
    for (const auto &nk : shapes) {
      m.sk_max_n = std::max(m.sk_max_n, nk[0]);
      ws = std::max(ws, (size_t)(nk[1] / 32) * sk::MAXB * nk[0]);
    }
    m.sk_ws_floats = ws;
    m.sk_ws = static_cast<float *>(m.dmalloc(sizeof(float) * ws));
    const int nc = (m.sk_max_n + 15) / 16;
    m.sk_cnt = static_cast<unsigned int *>(m.dmalloc(sizeof(unsigned int) * nc));
    ck(cudaMemset(m.sk_cnt, 0, sizeof(unsigned int) * nc), "cudaMemset(sk_cnt)");
    const size_t smem = sk::smem_bytes(4, sk::KC_MAX);
    auto attr = [&](auto k) {
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
         "cudaFuncSetAttribute(skinny)");
    };
    const size_t tsmem = sk::tile_smem_bytes(4, sk::TKR_MAX);
    for (int nb = 1; nb <= 4; ++nb)
      by_octets(nb, [&](auto o) {
        attr(sk::skinny_kernel<T, decltype(o)::value>);
        ck(cudaFuncSetAttribute(sk::tile_kernel<T, decltype(o)::value>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)tsmem),
           "cudaFuncSetAttribute(tile)");
      });
    m.sk_on = true;
  }
}

// CHUNK_GRAPH_MAX is the largest prefill or mixed chunk that runs as a graph (run_chunk). On the
// H200 (lab/cuda/NOTES.md) a graph saved 0.35-0.45 ms of launches a chunk: 21 % of a 128-token
// prompt's 2.1 ms, 12 % of a prompt beside 26 decodes, 4-8 % of 1,024-4,096 prompt tokens; where
// padding to a coarse bucket added a third to the tokens it lost 5 %.
constexpr int CHUNK_GRAPH_MAX = 512;

// chunk_bucket is the token count a graphed chunk of Tn <= CHUNK_GRAPH_MAX tokens runs at: 16,
// 32, 48 or 64, then a multiple of 64 (at most 63 tokens of padding).
int chunk_bucket(int Tn) { return Tn <= 64 ? (Tn + 15) / 16 * 16 : (Tn + 63) / 64 * 64; }

void decode_step(mqb_model &m, int n, const int32_t *slots, const int32_t *tokens, const int32_t *start_pos,
                 const float *temp, const uint64_t *rkey, float *logits_out, int32_t *argmax_out);
void run_graphed(mqb_model &m, GraphEntry *&ge, const std::function<void()> &body);
void run_chunk(mqb_model &m, int Tn, int R, bool want_keys, float *logits_out, int32_t *argmax_out,
               const std::vector<int> &row_entry);

// warm_up runs, while the model loads, what a server's first requests would otherwise pay for.
// On a freshly opened Qwen3-0.6B-shaped model (H200, mqb_bench.py coldstart) the first
// 128-token prompt took 16.5 ms against 2.3 warm, the first call of 31 prompts beside a decode
// 33.0 against 15.0 (the kernels' modules loaded and cuBLAS's heuristics asked at first use),
// and the first decode step of 32 sequences 4.5 against 1.4 (its graph captured): a served burst
// of 32 requests waited for all of it. So, with warm (MQB_WARMUP, default 1):
// - one prompt of every power-of-two length up to Tcap, then a chunk of up to Tcap tokens made
//   of one decode entry and max_batch - 1 prompts (what a burst of requests beside a running
//   one makes), all on the scratch slot, token 0 at every position so their K/V rows agree;
// - every graph bucket's decode step, eagerly (blas_pick tunes its cuBLAS products) and again
//   to capture its graph, once for each number of attention splits the bucket can take over
//   max_context (attn_splits: up to 16 at one sequence), so no graph is captured mid-request
//   (steps that hand out logits share these graphs, see graph_key);
// - with mixed_graphs, every graphed prefill or mixed chunk bucket (run_chunk: up to
//   CHUNK_GRAPH_MAX tokens, a power of two of rows up to max_batch), eagerly and captured.
// With warm 0 only the eager decode steps run, and only with blas_tune (the CPU emulation's
// default: an emulated launch takes about half a second, and its tuning checks need only these
// steps).
void warm_up(mqb_model &m) {
  if (m.warm) {
    std::vector<int> row_entry;
    // chunk runs one chunk of the given entries (token count, first position), each a
    // sequence on the scratch slot with its own row.
    auto chunk = [&](const std::vector<std::pair<int, int>> &entries) {
      int Tn = 0, rows = 0;
      for (const auto &[n, start] : entries) {
        for (int j = 0; j < n; ++j, ++Tn) {
          m.meta_h[Tn] = 0;
          m.meta_h[m.Tcap + Tn] = start + j;
          m.meta_h[2 * m.Tcap + Tn] = m.scratch;
        }
        m.meta_h[3 * m.Tcap + rows] = Tn - 1;
        set_samp(m, rows++, -1, nullptr, nullptr);
      }
      row_entry.assign(rows, 0);
      run_chunk(m, Tn, rows, true, nullptr, nullptr, row_entry);
    };
    const int top = std::min(m.Tcap, m.max_ctx);
    for (int Tn = 2;; Tn *= 2) {
      chunk({{std::min(Tn, top), 0}});
      if (Tn >= top) break;
    }
    const int R = std::min(m.max_batch, m.Rcap) - 1;  // a burst of prompts beside a decode
    if (R > 0 && top > R) {
      std::vector<std::pair<int, int>> burst(R + 1, {(top - 1) / R, 0});
      burst[0] = {1, 1};  // the decode entry: one token at position 1
      chunk(burst);
    }
    // Every graphed chunk bucket (run_chunk): Tg tokens in rows prompts, all of one token but
    // the last (so the tiles fit the graph's grid), eagerly, then captured.
    for (int Tg = 16; m.use_graphs && m.mixed_graphs && Tg <= std::min({CHUNK_GRAPH_MAX, m.Tcap, m.max_ctx});
         Tg = chunk_bucket(Tg + 1))
      for (int rows = 1; rows <= std::min(m.max_batch, Tg); rows *= 2) {
        std::vector<std::pair<int, int>> entries(rows, {1, 0});
        entries.back().first = Tg - (rows - 1);
        for (int k = 0; k < 2; ++k) chunk(entries);
      }
  }
  std::vector<int> bs;
  for (int n = 1; n <= m.max_batch; ++n)
    if (bs.empty() || bucket_for(m, n) != bs.back()) bs.push_back(bucket_for(m, n));
  for (int b : bs) {
    if (!m.warm && !m.blas_tune) break;
    std::vector<int> at = {1};  // the first context length at which each split count appears
    for (int nmax = 2, last = attn_splits(m, b, 1); m.warm && nmax <= m.max_ctx; ++nmax) {
      const int s = attn_splits(m, b, nmax);
      if (s != last) at.push_back(nmax);
      last = s;
    }
    const std::vector<int32_t> slots(b, m.scratch), zeros(b, 0);
    for (int nmax : at) {
      const std::vector<int32_t> pos(b, nmax - 1);
      for (int k = 0; k < (m.warm && m.use_graphs ? 2 : 1); ++k)  // eager (tunes), then captured
        decode_step(m, b, slots.data(), zeros.data(), pos.data(), nullptr, nullptr, nullptr, nullptr);
    }
  }
}

void open_model(mqb_model &m, const mqb_model_params *p) {
  if (!p) throw Fail("cuda backend: params is NULL");
  if (p->abi_version != MQB_ABI_VERSION)
    throw Fail(fmt("cuda backend: ABI version %d requested, this library implements %d; rebuild with make cuda",
                   p->abi_version, MQB_ABI_VERSION));
  const std::string family = p->family ? p->family : "";
  m.c = cfg_from_hparams(family, p->hparams, p->n_hparams);
  const std::string prec = p->precision ? p->precision : "bf16";
  if (prec == "bf16") m.dt = DT_BF16;
  else if (prec == "fp16") m.dt = DT_F16;
  else if (prec == "fp32") m.dt = DT_F32;
  else throw Fail(fmt("cuda backend: precision %s is not supported; use bf16, fp16 or fp32", prec.c_str()));
  if (p->max_batch <= 0 || p->max_context <= 0)
    throw Fail(fmt("cuda backend: max_batch %d and max_context %d must be positive", p->max_batch, p->max_context));
  if (p->max_context > m.c.maxpos)
    throw Fail(fmt("cuda backend: max_context %d exceeds the model's %d positions", p->max_context, m.c.maxpos));
  const Cfg &c = m.c;
  const int CH = m.dt == DT_F32 ? 4 : 8;
  const int G = c.nh / c.nkv;
  if (G > MAXG) throw Fail(fmt("cuda backend: %d query heads per KV head is more than the supported %d", G, MAXG));
  if (c.D % CH != 0 || c.D / CH > ATT_THREADS)
    throw Fail(fmt("cuda backend: head_dim %d must be a multiple of %d and at most %d", c.D, CH, ATT_THREADS * CH));
  if (c.H % CH != 0 || c.I % CH != 0 || (c.nh * c.D) % CH != 0)
    throw Fail(fmt("cuda backend: hidden %d, intermediate %d and heads*head_dim %d must be multiples of %d", c.H,
                   c.I, c.nh * c.D, CH));

  m.dev = p->device_index;
  ck(cudaSetDevice(m.dev), fmt("cudaSetDevice(%d)", m.dev).c_str());
  ck(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, m.dev), "cudaDeviceGetAttribute");
  int major = 0;
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, m.dev), "cudaDeviceGetAttribute");
  m.max_batch = p->max_batch;
  m.max_ctx = p->max_context;
  m.slots = m.max_batch + 1;  // the last one is the scratch slot (logits_all, graph padding)
  m.scratch = m.max_batch;
  // Prefill and mixed steps run in chunks of at most Tcap tokens (MQB_TCAP, default 2048): 8 or
  // 32 prompts of 128 tokens prefill in 7-10 % less time than in chunks of 512, whose
  // every chunk reads all the weights again; 4,096 measured the same as 2,048.
  const Knobs kn = knobs();
  m.Tcap = std::max(m.max_batch, std::max(64, kn.tcap));
  m.Rcap = std::max(64, m.max_batch);
  m.use_graphs = kn.graphs;
  m.mixed_graphs = kn.graphs;
  m.use_pdl = major >= 9;
  m.attn_split = 0;
  m.fused_attn = 1;
  const size_t es = dt_size(m.dt);
  const int Kmax = std::max(std::max(c.H, c.I), c.nh * c.D);
  int gb = 4;
  while (gb > 0 && (size_t)gb * Kmax * es > 48 * 1024) --gb;
  m.gemv_max_b = std::max(0, gb);

  ck(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ckb(cublasCreate(&m.blas), "cublasCreate");
  ckb(cublasSetStream(m.blas, m.stream), "cublasSetStream");
  const size_t ws = 64u << 20;
  m.blas_ws = m.dmalloc(ws);
  ckb(cublasSetWorkspace(m.blas, m.blas_ws, ws), "cublasSetWorkspace");
  ckb(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  m.blas_tune = kn.blas_tune;
  m.warm = kn.warmup;
  m.blas_log = kn.blas_log;
  m.picker.reset(new blaspick::Picker(m.blas, m.stream, m.blas_ws, ws));

  m.layers.resize(c.L);
  if (c.vision) vis_open(m, p);
  load(m, p);

  // KV cache: one allocation for all layers.
  const size_t per = (size_t)m.slots * m.max_ctx * c.nkv * c.D * es;
  unsigned char *kv = static_cast<unsigned char *>(m.dmalloc(per * 2 * c.L));
  for (int l = 0; l < c.L; ++l) {
    m.layers[l].kc = kv + per * (2 * l);
    m.layers[l].vc = kv + per * (2 * l + 1);
  }
  ck(cudaMemset(kv, 0, per * 2 * c.L), "cudaMemset(kv)");

  const int QKV = (c.nh + 2 * c.nkv) * c.D;
  const int MLP = c.fam == QWEN3 ? 2 * c.I : c.I;
  m.res = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * c.H));
  m.qkv = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * QKV));
  m.qbuf = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * c.nh * c.D));
  m.mlp = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * MLP));
  m.attn = m.dmalloc(es * m.Tcap * c.nh * c.D);
  m.xbuf = m.dmalloc(es * (size_t)m.Tcap * Kmax);
  m.logits = static_cast<float *>(m.dmalloc(sizeof(float) * (size_t)m.Rcap * c.V));
  m.keys = static_cast<unsigned long long *>(m.dmalloc(sizeof(unsigned long long) * m.Rcap));
  m.part_acc = static_cast<float *>(m.dmalloc(sizeof(float) * ATT_SPLIT_MAX_T * c.nkv * ATT_SPLIT_MAX * G * c.D));
  m.part_ml = static_cast<float *>(m.dmalloc(sizeof(float) * ATT_SPLIT_MAX_T * c.nkv * ATT_SPLIT_MAX * G * 2));
  m.att_cnt = static_cast<unsigned int *>(m.dmalloc(sizeof(unsigned int) * ATT_SPLIT_MAX_T * c.nkv));
  ck(cudaMemset(m.att_cnt, 0, sizeof(unsigned int) * ATT_SPLIT_MAX_T * c.nkv), "cudaMemset(att_cnt)");
  m.meta = static_cast<int *>(m.dmalloc(sizeof(int) * m.meta_count()));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.meta_h), sizeof(int) * m.meta_count()), "cudaMallocHost");
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.keys_h), sizeof(unsigned long long) * m.Rcap), "cudaMallocHost");
  m.samp_temp = static_cast<float *>(m.dmalloc(sizeof(float) * m.Rcap));
  m.samp_key = static_cast<unsigned long long *>(m.dmalloc(sizeof(unsigned long long) * m.Rcap));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.samp_temp_h), sizeof(float) * m.Rcap), "cudaMallocHost");
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.samp_key_h), sizeof(unsigned long long) * m.Rcap), "cudaMallocHost");
  memset(m.samp_temp_h, 0, sizeof(float) * m.Rcap);
  memset(m.samp_key_h, 0, sizeof(unsigned long long) * m.Rcap);
  memset(m.meta_h, 0, sizeof(int) * m.meta_count());
  m.ptile = static_cast<pa::Tile *>(m.dmalloc((sizeof(pa::Tile) + sizeof(int)) * m.Tcap));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.ptile_h), (sizeof(pa::Tile) + sizeof(int)) * m.Tcap),
     "cudaMallocHost");

  const int gm = gm_for(G);
  // The decode attention's park (attn_push) where it fits beside attn_smem in one block (sm_90:
  // all of an SM's 227 KB, sk::SMEM_SM).
  const size_t park = sizeof(float) * ATT_CLUSTER_MAX * attn_park(gm, c.D);
  m.attn_park_fits = attn_smem(gm, c.D) + park <= sk::SMEM_SM;
  const size_t ab = attn_smem(gm, c.D) + (m.attn_park_fits ? park : 0);
  switch (m.dt) {
    case DT_BF16: set_kernel_attrs<__nv_bfloat16>(gm, ab); skinny_setup<__nv_bfloat16>(m); break;
    case DT_F16: set_kernel_attrs<__half>(gm, ab); skinny_setup<__half>(m); break;
    default: set_kernel_attrs<float>(gm, ab); break;
  }
  ck(cudaDeviceSynchronize(), "load");
  warm_up(m);
}

// chunk_graph_key names a graphed prefill or mixed chunk's graph (run_chunk): negative, apart
// from the decode steps' keys.
int chunk_graph_key(const mqb_model &m, int Tg, int Rg, bool keys) {
  return -1 - ((Tg * (m.Rcap + 1) + Rg) * 2 + (keys ? 1 : 0));
}

// run_chunk: uploads the meta already in meta_h, runs, and copies back keys/logits of R rows.
// With graphs and mixed_graphs (on unless MQB_GRAPHS=0) a chunk of up to CHUNK_GRAPH_MAX
// tokens runs as the graph of its bucket (chunk_bucket tokens, a power of two of rows): a served
// point's prefill and mixed steps (prompts beside running decodes) otherwise launch their ~300
// kernels one by one. warm_up captures every bucket's graph at load. The padding
// tokens are a sequence of their own on the scratch slot from position 0, the padding rows
// repeat the last token's; neither is read back.
void run_chunk(mqb_model &m, int Tn, int R, bool want_keys, float *logits_out, int32_t *argmax_out,
               const std::vector<int> &row_entry) {
  GraphEntry *ge = nullptr;
  const int Tg = chunk_bucket(Tn);
  int Rg = 1;
  while (Rg < R) Rg *= 2;
  Rg = std::min(Rg, m.Rcap);
  // Tiles of at most pa::BQ tokens, one sequence each: at most Tg / BQ + one more per entry
  // (R rows, a prompt continued in the next chunk, the padding); one-token tiles at most one
  // per entry.
  const bool ones = ones_apart(m, Rg);
  const TileGrid G{std::min(Tg, Tg / pa::BQ + Rg + 2), ones ? std::min(Tg, Rg + 2) : 0};
  m.vis_on = vis_chunk_begin(m, Tn);  // qwen3vl: a chunk with image rows runs eagerly
  struct VisOff {
    bool &on;
    ~VisOff() { on = false; }
  } vis_off{m.vis_on};
  if (m.use_graphs && m.mixed_graphs && !m.prof && !m.vis_on && Tg <= std::min(CHUNK_GRAPH_MAX, m.Tcap) &&
      Tg - Tn <= m.max_ctx) {
    for (int j = Tn; j < Tg; ++j) {
      m.meta_h[j] = 0;
      m.meta_h[m.Tcap + j] = j - Tn;
      m.meta_h[2 * m.Tcap + j] = m.scratch;
    }
    for (int r = R; r < Rg; ++r) {
      m.meta_h[3 * m.Tcap + r] = Tg - 1;
      set_samp(m, r, -1, nullptr, nullptr);
    }
    if (prefill_tiles(m, Tg, ones, G) == G) ge = &m.graphs[chunk_graph_key(m, Tg, Rg, want_keys)];
  }
  upload_meta(m);
  if (ge) run_graphed(m, ge, [&] { run_dispatch(m, Tg, Rg, want_keys, false, &G); });
  else run_dispatch(m, Tn, R, want_keys, false);
  ck(cudaGetLastError(), "forward");
  if (want_keys)
    ck(cudaMemcpyAsync(m.keys_h, m.keys, sizeof(unsigned long long) * R, cudaMemcpyDeviceToHost, m.stream),
       "argmax download");
  ck(cudaStreamSynchronize(m.stream), "forward");
  prof_collect(m);
  if (ge) ge->warmed = true;
  const size_t V = m.c.V;
  for (int r = 0; r < R; ++r) {
    const int e = row_entry[r];
    if (argmax_out) argmax_out[e] = decode_key(m.keys_h[r]);
    if (logits_out)
      ck(cudaMemcpy(logits_out + (size_t)e * V, m.logits + (size_t)r * V, sizeof(float) * V, cudaMemcpyDeviceToHost),
         "logits download");
  }
}

int bucket_for(const mqb_model &m, int n) {
  int b = 1;
  while (b < n) b *= 2;
  return std::min(b, m.max_batch);
}

// graph_key names a decode step's graph in mqb_model::graphs: a graph bakes in the batch bucket,
// and the attention splits. A step that hands out logits (a top-k or top-p request's, sampled on
// the host) is the same graph as a greedy one, and shares it, so such a request neither waits
// for a capture nor adds a graph (decode_step).
int graph_key(int b, int splits) { return b * (ATT_SPLIT_MAX + 1) + splits; }

// run_graphed runs body (a step's launches on m.stream) through the graph in *ge: eagerly until
// the caller has marked it warmed (after the first run: modules load, cuBLAS asks its
// heuristics), then captured and instantiated once, then replayed. ge NULL runs body eagerly. A capture that fails
// (a driver without PDL-in-graph support, say) must not fail the request: graphs are switched
// off for this model, said on stderr, *ge is set to NULL and body runs eagerly.
void run_graphed(mqb_model &m, GraphEntry *&ge, const std::function<void()> &body) {
  if (ge && ge->warmed && !ge->exec) {
    std::string why;
    ck(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      body();
    } catch (const std::exception &e) {
      why = e.what();
    }
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(m.stream, &g);
    if (e != cudaSuccess && why.empty()) why = fmt("cudaStreamEndCapture: %s", cudaGetErrorString(e));
    if (why.empty()) {
#if defined(CUDART_VERSION) && CUDART_VERSION < 12000  // CUDA 11's signature (compile checks with nvcc 11.8)
      e = cudaGraphInstantiate(&ge->exec, g, nullptr, nullptr, 0);
#else
      e = cudaGraphInstantiate(&ge->exec, g, 0);
#endif
      if (e != cudaSuccess) {
        why = fmt("cudaGraphInstantiate: %s", cudaGetErrorString(e));
        ge->exec = nullptr;
      }
    }
    if (g) cudaGraphDestroy(g);
    if (!why.empty()) {
      (void)cudaGetLastError();
      fprintf(stderr, "cuda backend: CUDA graphs disabled, running eagerly: %s\n", why.c_str());
      m.clear_graphs();
      m.use_graphs = false;
      ge = nullptr;
    }
  }
  if (ge && ge->exec) {
    ck(cudaGraphLaunch(ge->exec, m.stream), "cudaGraphLaunch");
    return;
  }
  body();
  ck(cudaGetLastError(), "forward");
}

void decode_step(mqb_model &m, int n, const int32_t *slots, const int32_t *tokens, const int32_t *start_pos,
                 const float *temp, const uint64_t *rkey, float *logits_out, int32_t *argmax_out) {
  struct Tuning {  // mqb_model::tune_here for this step only, also when it throws
    bool &on;
    explicit Tuning(bool &f) : on(f) { on = true; }
    ~Tuning() { on = false; }
  } tuning(m.tune_here);
  const bool graphs = m.use_graphs && !m.prof;
  const int b = graphs ? std::max(n, bucket_for(m, n)) : n;
  int nmax = 1;
  for (int i = 0; i < n; ++i) nmax = std::max(nmax, start_pos[i] + 1);
  m.step_splits = attn_splits(m, b, nmax);
  for (int i = 0; i < b; ++i) {
    const bool real = i < n;
    m.meta_h[i] = real ? tokens[i] : 0;
    m.meta_h[m.Tcap + i] = real ? start_pos[i] : 0;
    m.meta_h[2 * m.Tcap + i] = real ? slots[i] : m.scratch;
    m.meta_h[3 * m.Tcap + i] = i;
    set_samp(m, i, real ? i : -1, temp, rkey);
  }
  if (vis_chunk_begin(m, b)) throw Fail("cuda backend: a decode step reached an image prompt");  // forward routes those
  upload_meta(m);
  if (m.tl_buf) ck(cudaMemsetAsync(m.tl_buf, 0, sizeof(unsigned long long) * TL_FIELDS * TL_SLOTS, m.stream), "timeline reset");
  GraphEntry *ge = graphs ? &m.graphs[graph_key(b, m.step_splits)] : nullptr;
  run_graphed(m, ge, [&] { step_dispatch(m, b, logits_out != nullptr); });
  ck(cudaMemcpyAsync(m.keys_h, m.keys, sizeof(unsigned long long) * n, cudaMemcpyDeviceToHost, m.stream),
     "argmax download");
  if (logits_out)
    ck(cudaMemcpyAsync(logits_out, m.logits, sizeof(float) * (size_t)n * m.c.V, cudaMemcpyDeviceToHost, m.stream),
       "logits download");
  ck(cudaStreamSynchronize(m.stream), "decode step");
  prof_collect(m);
  if (ge) ge->warmed = true;
  if (argmax_out)
    for (int i = 0; i < n; ++i) argmax_out[i] = decode_key(m.keys_h[i]);
}

void forward(mqb_model &m, int n, const int32_t *slots, const int32_t *n_tokens, const int32_t *tokens,
             const int32_t *start_pos, const float *temp, const uint64_t *rkey, float *logits_out,
             int32_t *argmax_out) {
  if (n <= 0) return;
  if (n > m.max_batch) throw Fail(fmt("cuda backend: forward of %d entries exceeds max_batch %d", n, m.max_batch));
  if (!slots || !n_tokens || !tokens || !start_pos) throw Fail("cuda backend: forward: NULL argument");
  std::vector<char> seen(m.max_batch, 0);
  bool decode = true;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= m.max_batch)
      throw Fail(fmt("cuda backend: entry %d: slot %d outside [0, %d)", i, slots[i], m.max_batch));
    if (seen[slots[i]]) throw Fail(fmt("cuda backend: entry %d: slot %d appears twice in one step", i, slots[i]));
    seen[slots[i]] = 1;
    if (n_tokens[i] <= 0) throw Fail(fmt("cuda backend: entry %d: n_tokens %d must be positive", i, n_tokens[i]));
    if (start_pos[i] < 0 || (int64_t)start_pos[i] + n_tokens[i] > m.max_ctx)
      throw Fail(fmt("cuda backend: entry %d: positions %d..%d exceed max_context %d", i, start_pos[i],
                     start_pos[i] + n_tokens[i] - 1, m.max_ctx));
    for (int j = 0; j < n_tokens[i]; ++j) {
      const int tk = tokens[total + j];
      if (tk < 0 || tk >= m.c.V)
        throw Fail(fmt("cuda backend: entry %d: token %d outside the vocabulary of %d", i, tk, m.c.V));
    }
    total += n_tokens[i];
    if (n_tokens[i] != 1 || vis_in_prompt(m, slots[i], start_pos[i])) decode = false;
  }
  if (decode && n <= m.Tcap) {
    decode_step(m, n, slots, tokens, start_pos, temp, rkey, logits_out, argmax_out);
    return;
  }
  // General path (prefill or mixed): pack tokens into chunks of at most Tcap; an entry longer
  // than the room left is continued in the next chunk (its KV cache makes that exact).
  const bool want_keys = argmax_out != nullptr;
  int Tn = 0, R = 0;
  std::vector<int> row_entry;
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    int done = 0;
    while (done < n_tokens[i]) {
      const int take = std::min(n_tokens[i] - done, m.Tcap - Tn);
      for (int j = 0; j < take; ++j) {
        m.meta_h[Tn + j] = tokens[off + done + j];
        m.meta_h[m.Tcap + Tn + j] = start_pos[i] + done + j;
        m.meta_h[2 * m.Tcap + Tn + j] = slots[i];
      }
      Tn += take;
      done += take;
      if (done == n_tokens[i]) {
        m.meta_h[3 * m.Tcap + R] = Tn - 1;
        set_samp(m, R, i, temp, rkey);
        row_entry.push_back(i);
        ++R;
      }
      if (Tn == m.Tcap) {
        run_chunk(m, Tn, R, want_keys, logits_out, argmax_out, row_entry);
        Tn = 0;
        R = 0;
        row_entry.clear();
      }
    }
    off += n_tokens[i];
  }
  if (Tn > 0) run_chunk(m, Tn, R, want_keys, logits_out, argmax_out, row_entry);
}

void logits_all(mqb_model &m, const int32_t *ids, int32_t n, float *out) {
  if (n <= 0) return;
  if (!ids || !out) throw Fail("cuda backend: logits_all: NULL argument");
  if (n > m.max_ctx) throw Fail(fmt("cuda backend: logits_all of %d tokens exceeds max_context %d", n, m.max_ctx));
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= m.c.V)
      throw Fail(fmt("cuda backend: logits_all: token %d at %d outside the vocabulary of %d", ids[i], i, m.c.V));
  const int chunk = std::min(m.Tcap, m.Rcap);
  for (int s = 0; s < n; s += chunk) {
    const int cn = std::min(chunk, n - s);
    for (int j = 0; j < cn; ++j) {
      m.meta_h[j] = ids[s + j];
      m.meta_h[m.Tcap + j] = s + j;
      m.meta_h[2 * m.Tcap + j] = m.scratch;
      m.meta_h[3 * m.Tcap + j] = j;
      set_samp(m, j, -1, nullptr, nullptr);
    }
    upload_meta(m);
    m.vis_on = vis_chunk_begin(m, cn);  // the scratch slot's image (mqb_set_image), if any
    struct VisOff {
      bool &on;
      ~VisOff() { on = false; }
    } vis_off{m.vis_on};
    run_dispatch(m, cn, cn, false, false);
    ck(cudaGetLastError(), "logits_all");
    ck(cudaMemcpyAsync(out + (size_t)s * m.c.V, m.logits, sizeof(float) * (size_t)cn * m.c.V,
                       cudaMemcpyDeviceToHost, m.stream),
       "logits download");
    ck(cudaStreamSynchronize(m.stream), "logits_all");
    prof_collect(m);
  }
}

}  // namespace mqcuda

// ---------------------------------------------------------------------------------------------
// C ABI

extern "C" {

int32_t mqb_abi_version(void) { return MQB_ABI_VERSION; }

const char *const *mqb_families(void) {
  static const char *const families[] = {"gpt2", "qwen3", "qwen3vl", nullptr};
  return families;
}

int mqb_model_open(const mqb_model_params *p, mqb_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "cuda backend: out is NULL");
    return 1;
  }
  *out = nullptr;
  std::unique_ptr<mqb_model> m(new mqb_model());
  m->dev = p ? p->device_index : 0;
  try {
    open_model(*m, p);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  *out = m.release();
  return 0;
}

void mqb_model_close(mqb_model *m) { delete m; }

int32_t mqb_vocab_size(const mqb_model *m) { return m ? m->c.V : 0; }

int mqb_forward(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens, const int32_t *tokens,
                const int32_t *start_pos, float *logits_out, int32_t *argmax_out, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    forward(*m, n, slots, n_tokens, tokens, start_pos, nullptr, nullptr, logits_out, argmax_out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_forward_sampled(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens,
                        const int32_t *tokens, const int32_t *start_pos, const float *temperature,
                        const uint64_t *rng_key, int32_t *token_out, float *logits_out, char *err,
                        size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  if (!token_out || !temperature || !rng_key) {
    set_err(err, errlen, "cuda backend: mqb_forward_sampled: temperature, rng_key and token_out are required");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    forward(*m, n, slots, n_tokens, tokens, start_pos, temperature, rng_key, logits_out, token_out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_logits_all(mqb_model *m, const int32_t *ids, int32_t n, float *out, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    logits_all(*m, ids, n, out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

// The cache needs no clearing: attention reads only positions below the ones a request writes,
// and the runtime restarts a slot at position 0. Kept for the ABI.
// qwen3vl: the slot's image is dropped (its device buffer kept for the slot's next image).
void mqb_slot_reset(mqb_model *m, int32_t slot) {
  if (m) drop_image(*m, slot);
}

int mqb_set_image(mqb_model *m, int32_t slot, const float *pixels, int64_t n_pixels, int32_t grid_t, int32_t grid_h,
                  int32_t grid_w, const int32_t *prompt, int32_t n, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    set_image(*m, slot, pixels, n_pixels, grid_t, grid_h, grid_w, prompt, n);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

// mqb_debug_set is not part of mq_backend.h: the benchmark driver flips "graphs", "pdl" and
// "gemv_max_b" on one loaded model to compare variants without reloading weights.
int mqb_debug_set(mqb_model *m, const char *key, int32_t value) {
  if (!m || !key) return 1;
  std::string k = key;
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    ck(cudaStreamSynchronize(m->stream), "sync");
  } catch (...) {
    return 1;
  }
  m->clear_graphs();
  if (k == "graphs") m->use_graphs = value != 0;
  else if (k == "mixed_graphs") m->mixed_graphs = value != 0;
  else if (k == "pdl") m->use_pdl = value != 0;
  else if (k == "blas_tune") m->blas_tune = value != 0;  // the shapes tuned so far keep their plans
  else if (k == "skinny") {
    if (value && !m->sk_ws) return 1;  // fp32 weights: cuBLAS only
    m->sk_on = value != 0;
  }
  else if (k == "sk_max_b") m->sk_max_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "sk_kw") m->sk_kw = (value > 0 && value % 32 == 0 && value <= sk::GMAX * 32) ? value : 0;
  else if (k == "sk_ks") m->sk_ks = (value == 1 || value == 2 || value == 4 || value == 8) ? value : 0;
  else if (k == "tile_max_b") m->tile_max_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "tile_rt") m->tile_rt = (value == 2 || value == 4 || value == 8) ? value : 0;
  else if (k == "tile_z") m->tile_z = std::max(0, (int)value);
  else if (k == "tile_pre") m->tile_pre = std::max(1, std::min(sk::TSTAGES, (int)value));
  else if (k == "slim") m->slim = (int)value & 3;
  else if (k == "attn_cluster") m->attn_cluster = value != 0;
  else if (k == "attn_push") m->attn_push = value != 0;
  else if (k == "tile_cluster") m->tile_cluster = value != 0;
  else if (k == "rms_compact_b") m->rms_compact_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "tile_push") m->tile_push = value != 0;
  else if (k == "fuse_max_b") m->fuse_max_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "attn_split") m->attn_split = std::max(0, std::min(ATT_SPLIT_MAX, (int)value));
  else if (k == "fused_attn") m->fused_attn = std::max(0, std::min(2, (int)value));
  else if (k == "pre_params") {
    if (m->c.vision && value == 0) return 1;  // qwen3vl's M-RoPE rows exist only in rope_tab
    m->pre_params = value != 0;
  }
  else if (k == "attn_lanes") m->attn_lanes = value != 0;
  else if (k == "attn_flash") m->attn_flash = value != 0;
  else if (k == "prefill_flash") m->prefill_flash = value != 0;
  else if (k == "prefill_tc") m->prefill_tc = value != 0;
  else if (k == "prefill_one") m->prefill_one = std::max(0, (int)value);
  else if (k == "prep_vec") m->prep_vec = value != 0;
  else if (k == "post_n") m->post_n = value != 0;
  else if (k == "timeline") {
    if (value && !m->tl_mem)
      m->tl_mem = static_cast<unsigned long long *>(m->dmalloc(sizeof(unsigned long long) * TL_FIELDS * TL_SLOTS));
    m->tl_buf = value ? m->tl_mem : nullptr;
  }
  else if (k == "profile") {
    m->prof = value != 0;
    m->marks.clear();
    m->evused = 0;
    m->pacc.clear();
    m->psteps = 0;
  }
  else if (k == "gemv_max_b") {
    const size_t es = dt_size(m->dt);
    const int Kmax = std::max(std::max(m->c.H, m->c.I), m->c.nh * m->c.D);
    int gb = std::min(4, (int)value);
    while (gb > 0 && (size_t)gb * Kmax * es > 48 * 1024) --gb;
    m->gemv_max_b = std::max(0, gb);
  } else return 1;
  return 0;
}

// mqb_debug_timeline writes the last decode step's timeline (debug "timeline" on) as JSON:
// {"kernels": [[label, first block start, last block start, last past-wait, last block end,
// attention's phases q/k/v, scores, softmax, V sums (attend_flash: 0, 0, its pass)], ...]}
// in ns from the first record's start, in launch order (0: not reached). Not part of the ABI.
int mqb_debug_timeline(mqb_model *m, char *buf, size_t len) {
  if (!m || !buf || len == 0 || !m->tl_buf) return 1;
  std::vector<unsigned long long> h(TL_FIELDS * (size_t)std::max(1, m->tl_count));
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    ck(cudaStreamSynchronize(m->stream), "sync");
    ck(cudaMemcpy(h.data(), m->tl_buf, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost), "timeline");
  } catch (...) {
    return 1;
  }
  unsigned long long t0 = ~0ull;
  for (int i = 0; i < m->tl_count; ++i)
    if (h[TL_FIELDS * i]) t0 = std::min(t0, ~h[TL_FIELDS * i]);
  std::string out = "{\"kernels\": [";
  for (int i = 0; i < m->tl_count; ++i) {
    const unsigned long long *r = &h[TL_FIELDS * (size_t)i];
    out += fmt("%s[\"%s\"", i ? ", " : "", m->tl_labels[i].c_str());
    for (int j = 0; j < TL_FIELDS; ++j) {
      const unsigned long long v = j == 0 ? (r[0] ? ~r[0] : 0ull) : r[j];
      out += fmt(", %lld", v ? (long long)(v - t0) : 0ll);
    }
    out += "]";
  }
  out += "]}";
  snprintf(buf, len, "%s", out.c_str());
  return out.size() < len ? 0 : 1;
}

// mqb_debug_chain runs steps more greedy decode steps of the n entries of the last mqb_forward
// decode call (start_pos: the positions that call fed), each fed the previous step's argmax on
// the device, with no host synchronisation in between: what pipelined decoding would reach with
// the host's per-step work and the graph launch hidden behind the GPU's. Every step's graph must
// have been captured by earlier decode calls; tokens_out gets the last step's argmax. Not part
// of the ABI.
int mqb_debug_chain(mqb_model *m, int32_t n, int32_t steps, const int32_t *start_pos, int32_t *tokens_out, char *err,
                    size_t errlen) {
  if (!m || n < 1 || n > 64 || steps < 1 || !start_pos || !tokens_out) {
    set_err(err, errlen, "mqb_debug_chain: bad arguments");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    if (!m->use_graphs || m->prof)
      throw std::runtime_error("mqb_debug_chain needs graphs and no profile");
    const int b = std::max(n, bucket_for(*m, n));
    for (int s = 0; s < steps; ++s) {
      int nmax = 1;
      for (int i = 0; i < n; ++i) nmax = std::max(nmax, start_pos[i] + s + 2);
      m->step_splits = attn_splits(*m, b, nmax);
      auto it = m->graphs.find(graph_key(b, m->step_splits));
      if (it == m->graphs.end() || !it->second.exec)
        throw std::runtime_error(
            fmt("no captured graph for batch %d with %d splits; run decode steps first", b, m->step_splits));
      cudaLaunchConfig_t cfg = {};  // no programmatic serialization: it reads the last step's keys
      cfg.gridDim = dim3(1);
      cfg.blockDim = dim3(64);
      cfg.stream = m->stream;
      ck(cudaLaunchKernelEx(&cfg, advance_kernel, m->d_tok(), m->d_pos(), (const unsigned long long *)m->keys, (int)n),
         "advance_kernel");
      ck(cudaGraphLaunch(it->second.exec, m->stream), "cudaGraphLaunch");
    }
    ck(cudaMemcpyAsync(m->keys_h, m->keys, sizeof(unsigned long long) * n, cudaMemcpyDeviceToHost, m->stream),
       "argmax download");
    ck(cudaStreamSynchronize(m->stream), "chain");
    for (int i = 0; i < n; ++i) tokens_out[i] = decode_key(m->keys_h[i]);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

// mqb_debug_profile writes the profile gathered since "profile" was set, as JSON
// {"steps": n, "kernels": {"label": [total_ms, count], ...}}, into buf. Not part of the ABI.
int mqb_debug_profile(mqb_model *m, char *buf, size_t len) {
  if (!m || !buf || len == 0) return 1;
  std::string out = fmt("{\"steps\": %ld, \"kernels\": {", m->psteps);
  bool first = true;
  for (const auto &kv : m->pacc) {
    out += fmt("%s\"%s\": [%.6f, %ld]", first ? "" : ", ", kv.first.c_str(), kv.second.first, kv.second.second);
    first = false;
  }
  out += "}}";
  snprintf(buf, len, "%s", out.c_str());
  return out.size() < len ? 0 : 1;
}

}  // extern "C"
