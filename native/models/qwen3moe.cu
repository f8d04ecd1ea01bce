// models/qwen3moe.cu: Qwen3MoeForCausalLM on CUDA (owner: qwen3moe family), the GPU side of
// models/qwen3moe.cc: Qwen3's decoder (qwen3.cuh: its tensors, norms, RoPE; the shared decoder
// of native/cuda/decoder.cuh runs attention and the dense layers) with the sparse layers'
// feed-forward replaced, through the ffn hook, by the mixture of experts below.
//
// A sparse layer's step, all on the device and of fixed launch shapes (so decode steps are
// captured in CUDA graphs like the dense families'):
//   1. moe_norm: post_attention_layernorm of the residual into xn (T);
//   2. moe_router: router logits [tokens, experts] in float32 (bias-free);
//   3. moe_topk: softmax over all experts in float32, the top k (lowest expert first on ties),
//      renormalised when norm_topk_prob; counts per expert and the routing counters;
//   4. moe_scan, moe_scatter: the (token, choice) pairs sorted by expert (a counting sort:
//      offsets, a list of the experts that received tokens, each pair's sorted position);
//   5. moe_up: grouped products over the sorted pairs: one block per (active expert, columns),
//      each expert's gate and up rows read once for every MOE_RB of its rows, silu(gate)*up;
//      experts no token chose are never read, so a batch-1 decode reads only its k experts;
//   6. moe_down: the grouped down projection the same way;
//   7. moe_combine: each token's k outputs weighted and added to the residual in choice order
//      (deterministic: no atomics on values).
//
// Weights: per sparse layer the router [experts, hidden] and the experts fused as transformers
// 5 keeps them, gate_up [experts, 2*width, hidden] (gate rows then up rows) and down [experts,
// hidden, width], uploaded from the bundle's per-expert tensors.
//
// Faults (MODELQUAL_FAULTS, the CPU runtime's names): qwen3moe.route_wrong_expert sends every
// token to the experts after its chosen ones; qwen3moe.rope_theta_x10, qwen3moe.drop_q_norm as
// qwen3's.
#include "qwen3.cuh"
#include "../cuda/launch.cuh"

namespace mqcuda {
namespace qwen3moe {

constexpr int MOE_RB = 4;          // rows of an expert a block computes per pass over its weights
constexpr int MOE_MAX_EXPERTS = 1024;

struct Moe {
  int NE = 0, K = 0, MI = 0;
  bool norm_topk = false, wrong = false;
  std::vector<bool> sparse;
  struct L {
    void *router = nullptr, *gate_up = nullptr, *down = nullptr;  // T
  };
  std::vector<L> layers;
  void *xn = nullptr;                       // T [Tcap, H]
  float *logits = nullptr;                  // [Tcap, NE]
  int *choice = nullptr;                    // [Tcap*K]
  float *wts = nullptr;                     // [Tcap*K]
  unsigned *counts = nullptr, *cursor = nullptr;  // [NE]
  int *offs = nullptr;                      // [NE+1]
  int *active = nullptr;                    // [NE], then active_n at active[NE]
  int *perm = nullptr, *pos_of = nullptr;   // [Tcap*K]
  float *act = nullptr;                     // [Tcap*K, MI]
  float *y = nullptr;                       // [Tcap*K, H]
  // routed: tokens per (layer, expert), 32-bit on the device (what atomicAdd takes everywhere,
  // the host emulation included); routing() widens them into routed64 by modular differences,
  // read after every step, long before 2^32 tokens could pass.
  unsigned *routed = nullptr;  // [L*NE]
  std::vector<unsigned> routed_last;
  std::vector<uint64_t> routed64;
};

inline Moe &moe(mqb_model &m) { return *static_cast<Moe *>(m.fstate.get()); }

// ---------------------------------------------------------------------------------------------
// Kernels

template <typename T>
__global__ void __launch_bounds__(256) moe_norm_kernel(const float *__restrict__ res, const float *__restrict__ w,
                                                       T *__restrict__ xn, int H, float eps) {
  pdl_wait();
  pdl_trigger();
  __shared__ float part[8];
  const int t = blockIdx.x;
  const float *x = res + (size_t)t * H;
  float s = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) s += x[i] * x[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) tot += part[i];
  const float inv = rsqrtf(tot / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) xn[(size_t)t * H + i] = TT<T>::fromf(x[i] * inv * w[i]);
}

// moe_router_kernel: logits[t, e] = xn[t] · W[e], a warp per expert.
template <typename T>
__global__ void __launch_bounds__(256) moe_router_kernel(const T *__restrict__ xn, const T *__restrict__ W,
                                                         float *__restrict__ logits, int H, int NE) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T *x = xn + (size_t)t * H;
  for (int e = warp; e < NE; e += blockDim.x >> 5) {
    const T *w = W + (size_t)e * H;
    float s = 0.f;
    for (int i = lane; i < H; i += 32) s += TT<T>::tof(x[i]) * TT<T>::tof(w[i]);
    s = warp_sum(s);
    if (lane == 0) logits[(size_t)t * NE + e] = s;
  }
}

__global__ void moe_zero_kernel(unsigned *counts, unsigned *cursor, int NE) {
  pdl_wait();
  pdl_trigger();
  for (int e = threadIdx.x; e < NE; e += blockDim.x) counts[e] = 0, cursor[e] = 0;
}

// moe_topk_kernel: one warp per token: softmax over the NE logits (float32), the K largest
// probabilities (lowest index among equals), renormalised when norm; counts[e] += 1 per choice
// (the dispatch), and routed[e] += 1 for the step's real tokens only (t < *n_real: no graph
// padding, no warm-up), the served routing counts.
__global__ void __launch_bounds__(32) moe_topk_kernel(const float *__restrict__ logits, int NE, int K, int norm,
                                                      int wrong, int *__restrict__ choice, float *__restrict__ wts,
                                                      unsigned *__restrict__ counts, unsigned *__restrict__ routed,
                                                      const int *__restrict__ n_real) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, lane = threadIdx.x;
  const bool real = t < *n_real;
  constexpr int PER = MOE_MAX_EXPERTS / 32;
  float p[PER];
  const float *lg = logits + (size_t)t * NE;
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int e = lane + 32 * j;
    p[j] = e < NE ? lg[e] : -INFINITY;
    mx = fmaxf(mx, p[j]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int e = lane + 32 * j;
    p[j] = e < NE ? expf(p[j] - mx) : 0.f;
    sum += p[j];
  }
  sum = warp_sum(sum);
  float tot = 0.f;
  float mine = 0.f;  // lane k keeps choice k's probability
  int mine_e = 0;
  for (int k = 0; k < K; ++k) {
    // the largest remaining probability; ties to the lowest expert
    float bv = -1.f;
    int be = NE;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int e = lane + 32 * j;
      if (e < NE && (p[j] > bv || (p[j] == bv && e < be))) bv = p[j], be = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = (int)__shfl_xor_sync(0xffffffffu, (float)be, o);  // exact below 2^24
      if (ov > bv || (ov == bv && oe < be)) bv = ov, be = oe;
    }
    const float prob = bv / sum;
    tot += prob;
    if (lane == k % 32) mine = prob, mine_e = be;
    if ((be & 31) == lane) p[be >> 5] = -2.f;  // taken
    if (k >= 32) {  // more than 32 choices: written as chosen (lanes hold the first 32)
      if (lane == 0) {
        const int e = wrong ? (be + 1) % NE : be;
        choice[(size_t)t * K + k] = e;
        wts[(size_t)t * K + k] = prob;
        atomicAdd(&counts[e], 1u);
        if (real) atomicAdd(&routed[e], 1u);
      }
    }
  }
  if (lane < K && lane < 32) {
    const int e = wrong ? (mine_e + 1) % NE : mine_e;
    choice[(size_t)t * K + lane] = e;
    wts[(size_t)t * K + lane] = mine;
    atomicAdd(&counts[e], 1u);
    if (real) atomicAdd(&routed[e], 1u);
  }
  __syncwarp();
  if (norm) {
    for (int k = lane; k < K; k += 32) wts[(size_t)t * K + k] /= tot;
  }
}

// moe_scan_kernel: offsets of each expert's pairs and the list of experts with any (count at
// active[NE]); one thread (NE is at most MOE_MAX_EXPERTS, once a layer).
__global__ void moe_scan_kernel(const unsigned *__restrict__ counts, int NE, int *__restrict__ offs,
                                int *__restrict__ active) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x != 0) return;
  int o = 0, n = 0;
  for (int e = 0; e < NE; ++e) {
    offs[e] = o;
    o += (int)counts[e];
    if (counts[e] > 0) active[n++] = e;
  }
  offs[NE] = o;
  active[NE] = n;
}

__global__ void moe_scatter_kernel(const int *__restrict__ choice, int P, const int *__restrict__ offs,
                                   unsigned *__restrict__ cursor, int *__restrict__ perm, int *__restrict__ pos_of) {
  pdl_wait();
  pdl_trigger();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  const int e = choice[p];
  const int pos = offs[e] + (int)atomicAdd(&cursor[e], 1u);
  perm[pos] = p;
  pos_of[p] = pos;
}

// moe_up_kernel: for the expert active[blockIdx.y] and the MI columns of blockIdx.x (a warp
// each), act[pos, j] = silu(x·gate_j) * (x·up_j) over the expert's sorted pairs, MOE_RB rows a
// pass (their inputs staged in shared memory as float).
template <typename T>
__global__ void __launch_bounds__(256) moe_up_kernel(const T *__restrict__ xn, const T *__restrict__ GU,
                                                     const int *__restrict__ active, const int *__restrict__ offs,
                                                     const int *__restrict__ perm, float *__restrict__ act, int H,
                                                     int MI, int NE, int K) {
  pdl_wait();
  pdl_trigger();
  DYN_SMEM(float, xs);  // [MOE_RB][H]
  if ((int)blockIdx.y >= active[NE]) return;
  const int e = active[blockIdx.y];
  const int r0 = offs[e], r1 = offs[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = blockIdx.x * (blockDim.x >> 5) + warp;
  const T *g = GU + ((size_t)e * 2 * MI + j) * H;
  const T *u = GU + ((size_t)e * 2 * MI + MI + j) * H;
  for (int r = r0; r < r1; r += MOE_RB) {
    const int nr = min(MOE_RB, r1 - r);
    __syncthreads();
    for (int i = threadIdx.x; i < nr * H; i += blockDim.x) {
      const int rr = i / H, c = i % H;
      xs[rr * H + c] = TT<T>::tof(xn[(size_t)(perm[r + rr] / K) * H + c]);
    }
    __syncthreads();
    if (j >= MI) continue;
    float ag[MOE_RB] = {}, au[MOE_RB] = {};
    for (int c = lane; c < H; c += 32) {
      const float gw = TT<T>::tof(g[c]), uw = TT<T>::tof(u[c]);
#pragma unroll
      for (int rr = 0; rr < MOE_RB; ++rr)
        if (rr < nr) ag[rr] += gw * xs[rr * H + c], au[rr] += uw * xs[rr * H + c];
    }
#pragma unroll
    for (int rr = 0; rr < MOE_RB; ++rr) {
      if (rr >= nr) break;
      const float gs = warp_sum(ag[rr]), us = warp_sum(au[rr]);
      if (lane == 0) act[(size_t)(r + rr) * MI + j] = gs / (1.f + expf(-gs)) * us;
    }
  }
}

// moe_down_kernel: y[pos, c] = act[pos] · down_c for the expert active[blockIdx.y], a warp per
// output column c.
template <typename T>
__global__ void __launch_bounds__(256) moe_down_kernel(const float *__restrict__ act, const T *__restrict__ DN,
                                                       const int *__restrict__ active, const int *__restrict__ offs,
                                                       float *__restrict__ y, int H, int MI, int NE) {
  pdl_wait();
  pdl_trigger();
  DYN_SMEM(float, as_);  // [MOE_RB][MI]
  if ((int)blockIdx.y >= active[NE]) return;
  const int e = active[blockIdx.y];
  const int r0 = offs[e], r1 = offs[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c = blockIdx.x * (blockDim.x >> 5) + warp;
  const T *w = DN + ((size_t)e * H + c) * MI;
  for (int r = r0; r < r1; r += MOE_RB) {
    const int nr = min(MOE_RB, r1 - r);
    __syncthreads();
    for (int i = threadIdx.x; i < nr * MI; i += blockDim.x) as_[i] = act[(size_t)r * MI + i];
    __syncthreads();
    if (c >= H) continue;
    float acc[MOE_RB] = {};
    for (int k = lane; k < MI; k += 32) {
      const float wv = TT<T>::tof(w[k]);
#pragma unroll
      for (int rr = 0; rr < MOE_RB; ++rr)
        if (rr < nr) acc[rr] += wv * as_[rr * MI + k];
    }
#pragma unroll
    for (int rr = 0; rr < MOE_RB; ++rr) {
      if (rr >= nr) break;
      const float s = warp_sum(acc[rr]);
      if (lane == 0) y[(size_t)(r + rr) * H + c] = s;
    }
  }
}

__global__ void __launch_bounds__(256) moe_combine_kernel(const float *__restrict__ y, const float *__restrict__ wts,
                                                          const int *__restrict__ pos_of, float *__restrict__ res,
                                                          int H, int K) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < K; ++k) s += wts[(size_t)t * K + k] * y[(size_t)pos_of[t * K + k] * H + c];
    res[(size_t)t * H + c] += s;
  }
}

// ---------------------------------------------------------------------------------------------
// The family's hooks

template <typename T>
void run_moe(mqb_model &m, int l, int Tn) {
  Moe &s = moe(m);
  const Cfg &c = m.c;
  const Moe::L &w = s.layers[l];
  const int H = c.H, NE = s.NE, K = s.K, MI = s.MI, P = Tn * K;
  T *xn = static_cast<T *>(s.xn);
  launch(m, moe_norm_kernel<T>, dim3(Tn), dim3(256), 0, (const float *)m.res, (const float *)m.layers[l].ln2_w, xn, H,
         (float)c.eps);
  launch(m, moe_router_kernel<T>, dim3(Tn), dim3(256), 0, (const T *)xn, (const T *)w.router, s.logits, H, NE);
  launch(m, moe_zero_kernel, dim3(1), dim3(256), 0, s.counts, s.cursor, NE);
  launch(m, moe_topk_kernel, dim3(Tn), dim3(32), 0, (const float *)s.logits, NE, K, s.norm_topk ? 1 : 0,
         s.wrong ? 1 : 0, s.choice, s.wts, s.counts, s.routed + (size_t)l * NE, (const int *)m.d_n_real());
  launch(m, moe_scan_kernel, dim3(1), dim3(32), 0, (const unsigned *)s.counts, NE, s.offs, s.active);
  launch(m, moe_scatter_kernel, dim3((P + 255) / 256), dim3(256), 0, (const int *)s.choice, P, (const int *)s.offs,
         s.cursor, s.perm, s.pos_of);
  const int experts_hit = std::min(NE, P);
  launch(m, moe_up_kernel<T>, dim3((MI + 7) / 8, experts_hit), dim3(256), sizeof(float) * MOE_RB * H, (const T *)xn,
         (const T *)w.gate_up, (const int *)s.active, (const int *)s.offs, (const int *)s.perm, s.act, H, MI, NE, K);
  launch(m, moe_down_kernel<T>, dim3((H + 7) / 8, experts_hit), dim3(256), sizeof(float) * MOE_RB * MI,
         (const float *)s.act, (const T *)w.down, (const int *)s.active, (const int *)s.offs, s.y, H, MI, NE);
  launch(m, moe_combine_kernel, dim3(Tn), dim3(256), 0, (const float *)s.y, (const float *)s.wts,
         (const int *)s.pos_of, m.res, H, K);
}

bool ffn(mqb_model &m, int l, int Tn) {
  Moe &s = moe(m);
  if (!s.sparse[l]) return false;
  switch (m.dt) {
    case DT_BF16: run_moe<__nv_bfloat16>(m, l, Tn); break;
    case DT_F16: run_moe<__half>(m, l, Tn); break;
    default: run_moe<float>(m, l, Tn); break;
  }
  return true;
}

int routing(mqb_model &m, uint64_t *out, int64_t cap, int32_t *layers, int32_t *experts) {
  Moe &s = moe(m);
  *layers = m.c.L;
  *experts = s.NE;
  if (!out) return 0;
  const size_t n = (size_t)m.c.L * s.NE;
  if (cap < (int64_t)n) throw Fail(fmt("cuda backend: routing counts need %zu entries, cap is %lld", n, (long long)cap));
  std::vector<unsigned> h(n);
  ck(cudaStreamSynchronize(m.stream), "routing counts");
  ck(cudaMemcpy(h.data(), s.routed, n * sizeof(unsigned), cudaMemcpyDeviceToHost), "routing counts");
  s.routed_last.resize(n, 0);
  s.routed64.resize(n, 0);
  for (size_t i = 0; i < n; ++i) {
    s.routed64[i] += (uint32_t)(h[i] - s.routed_last[i]);
    s.routed_last[i] = h[i];
    out[i] = s.routed64[i];
  }
  return 0;
}

void configure_qwen3moe(Cfg &c, const HParams &hp) {
  qwen3::configure(c, "qwen3moe");
  struct {
    int NE, K, MI;
    std::string sparse;
  } r;
  r.NE = hp.pos("num_experts");
  r.K = hp.pos("num_experts_per_tok");
  r.MI = hp.pos("moe_intermediate_size");
  (void)hp.num("norm_topk_prob");
  const mqb_hparam *sp = hp.get("sparse_layers");
  if (!sp || !sp->str) throw Fail("cuda backend: hyper-parameter sparse_layers is missing; the runtime's qwen3moe resolve sets it");
  r.sparse = sp->str;
  if (r.NE > MOE_MAX_EXPERTS) throw Fail(fmt("cuda backend: %d experts; at most %d are supported", r.NE, MOE_MAX_EXPERTS));
  if ((int)r.sparse.size() != c.L) throw Fail("cuda backend: sparse_layers does not name every layer");
  if (r.MI % 8 != 0) throw Fail(fmt("cuda backend: moe_intermediate_size %d must be a multiple of 8", r.MI));
}

void open_qwen3moe(mqb_model &m, const mqb_model_params *p) {
  auto s = std::make_shared<Moe>();
  // configure checked these hyper-parameters.
  const HParams hp{p->hparams, p->n_hparams, "qwen3moe"};
  s->NE = hp.pos("num_experts");
  s->K = hp.pos("num_experts_per_tok");
  s->MI = hp.pos("moe_intermediate_size");
  s->norm_topk = hp.num("norm_topk_prob") != 0;
  const mqb_hparam *sp = hp.get("sparse_layers");
  for (const char *ch = sp->str; *ch; ++ch) s->sparse.push_back(*ch == '1');
  s->wrong = fault("qwen3moe.route_wrong_expert");
  m.fstate = s;
}

void load_qwen3moe(mqb_model &m, const TensorMap &tm) {
  Moe &s = moe(m);
  qwen3::DecoderOptions o{"", "qwen3moe"};
  o.sparse = &s.sparse;
  qwen3::load_decoder(m, tm, o);
  const Cfg &c = m.c;
  const int64_t H = c.H, MI = s.MI, NE = s.NE;
  s.layers.resize(c.L);
  for (int l = 0; l < c.L; ++l) {
    if (!s.sparse[l]) continue;
    const std::string pre = fmt("layers.%d.mlp.", l);
    s.layers[l].router = upload_matrix(m, {{tm.need(pre + "gate.weight", {NE, H}), NE, false}}, H);
    std::vector<Part> gu, dn;
    for (int e = 0; e < NE; ++e) {
      const std::string x = pre + fmt("experts.%d.", e);
      gu.push_back({tm.need(x + "gate_proj.weight", {MI, H}), MI, false});
      gu.push_back({tm.need(x + "up_proj.weight", {MI, H}), MI, false});
      dn.push_back({tm.need(x + "down_proj.weight", {H, MI}), H, false});
    }
    s.layers[l].gate_up = upload_matrix(m, gu, H);
    s.layers[l].down = upload_matrix(m, dn, MI);
  }
  const size_t es = dt_size(m.dt), P = (size_t)m.Tcap * s.K;
  s.xn = m.dmalloc(es * m.Tcap * H);
  s.logits = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * NE));
  s.choice = static_cast<int *>(m.dmalloc(sizeof(int) * P));
  s.wts = static_cast<float *>(m.dmalloc(sizeof(float) * P));
  s.counts = static_cast<unsigned *>(m.dmalloc(sizeof(unsigned) * NE));
  s.cursor = static_cast<unsigned *>(m.dmalloc(sizeof(unsigned) * NE));
  s.offs = static_cast<int *>(m.dmalloc(sizeof(int) * (NE + 1)));
  s.active = static_cast<int *>(m.dmalloc(sizeof(int) * (NE + 1)));
  s.perm = static_cast<int *>(m.dmalloc(sizeof(int) * P));
  s.pos_of = static_cast<int *>(m.dmalloc(sizeof(int) * P));
  s.act = static_cast<float *>(m.dmalloc(sizeof(float) * P * MI));
  s.y = static_cast<float *>(m.dmalloc(sizeof(float) * P * H));
  s.routed = static_cast<unsigned *>(m.dmalloc(sizeof(unsigned) * c.L * NE));
  ck(cudaMemset(s.routed, 0, sizeof(unsigned) * c.L * NE), "cudaMemset(routed)");
  const size_t smem = sizeof(float) * MOE_RB * std::max<int64_t>(H, MI);
  if (smem > 48 * 1024) {
    switch (m.dt) {
      case DT_BF16:
        ck(cudaFuncSetAttribute(moe_up_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
        break;
      case DT_F16:
        ck(cudaFuncSetAttribute(moe_up_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
        break;
      default:
        ck(cudaFuncSetAttribute(moe_up_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "smem");
        break;
    }
  }
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"qwen3moe"};
  f.configure = configure_qwen3moe;
  f.open = open_qwen3moe;
  f.load = load_qwen3moe;
  f.ffn = ffn;
  f.routing = routing;
  return f;
}());

}  // namespace qwen3moe
}  // namespace mqcuda
