// blas_pick.cc: see blas_pick.h.
#include "blas_pick.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace blaspick {
namespace {

constexpr int kHeuristics = 32;         // candidates asked of cuBLASLt's heuristic
constexpr int kSplitFrom = 4;           // split-K variants are tried for the first this many
constexpr int kRounds = 5;              // timed passes per candidate, interleaved; the median counts
constexpr int kMinCalls = 4;            // a pass makes at least this many calls (cycling weights)
constexpr double kKeepDefault = 0.97;   // another candidate must beat the default by 3 %
constexpr double kAgree = 1e-3;         // a winner's max |difference| from the default, relative

void ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("blas_pick: ") + what + ": " + cudaGetErrorString(e));
}

// attr_int reads an algorithm's config or capability attribute of any integer width (the widths
// differ between attributes and cuBLAS versions); -1 where it cannot be read.
template <typename Get, typename Attr>
long long attr_int(Get get, const cublasLtMatmulAlgo_t &a, Attr attr) {
  size_t need = 0;
  if (get(&a, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS || need == 0 || need > 8) return -1;
  uint64_t v = 0;
  size_t got = 0;
  if (get(&a, attr, &v, need, &got) != CUBLAS_STATUS_SUCCESS) return -1;
  return (long long)v;
}

long long cfg(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  return attr_int(cublasLtMatmulAlgoConfigGetAttribute, a, attr);
}
long long cap(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoCapAttributes_t attr) {
  return attr_int(cublasLtMatmulAlgoCapGetAttribute, a, attr);
}

std::string describe(const cublasLtMatmulAlgo_t &a) {
  char buf[160];
  snprintf(buf, sizeof buf, "algo %lld tile %lld stages %lld splitK %lld reduction %lld swizzle %lld",
           cfg(a, CUBLASLT_ALGO_CONFIG_ID), cfg(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
           cfg(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           cfg(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cfg(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  return buf;
}

// alignment: the largest power of two up to 256 that divides every pointer.
uint32_t alignment(const std::vector<const void *> &ps) {
  uint32_t al = 256;
  for (const void *p : ps)
    while (al > 2 && (reinterpret_cast<uintptr_t>(p) % al) != 0) al >>= 1;
  return al;
}

void destroy(Plan &p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

}  // namespace

Picker::Picker(cublasHandle_t blas, cudaStream_t stream, void *ws, size_t ws_bytes)
    : blas_(blas), stream_(stream), ws_(ws), ws_bytes_(ws_bytes) {
  if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) lt_ = nullptr;  // tune() then keeps the default
}

Picker::~Picker() {
  for (auto &kv : plans_) destroy(kv.second);
  if (lt_) cublasLtDestroy(lt_);
}

const Plan *Picker::find(const Shape &s) const {
  auto it = plans_.find(s);
  return it == plans_.end() ? nullptr : &it->second;
}

cublasStatus_t Picker::gemm_default(const Shape &s, const void *W, const void *X, float *out) const {
  const float alpha = 1.f, beta = s.acc ? 1.f : 0.f;
  return cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, s.N, s.B, s.K, &alpha, W, s.type, s.K, X, s.type, s.K, &beta,
                      out, CUDA_R_32F, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t Picker::gemm_lt(const Shape &s, const Plan &d, const cublasLtMatmulAlgo_t &algo, size_t ws,
                               const void *W, const void *X, float *out) const {
  const float alpha = 1.f, beta = s.acc ? 1.f : 0.f;
  return cublasLtMatmul(lt_, d.op, &alpha, W, d.a, X, d.b, &beta, out, d.c, out, d.c, &algo, ws_, ws, stream_);
}

void Picker::run(const Shape &s, const Plan *p, const void *W, const void *X, float *out) const {
  const cublasStatus_t st = p && p->lt ? gemm_lt(s, *p, p->algo, p->ws, W, X, out) : gemm_default(s, W, X, out);
  if (st != CUBLAS_STATUS_SUCCESS) {
    char buf[260];
    snprintf(buf, sizeof buf, "cuda backend: %s failed (status %d) for the product N=%d K=%d B=%d%s",
             p && p->lt ? "cublasLtMatmul" : "cublasGemmEx", (int)st, s.N, s.K, s.B,
             p && p->lt ? " with the algorithm blas_pick chose (MQB_BLAS_TUNE=0 runs cuBLAS's default)" : "");
    throw std::runtime_error(buf);
  }
}

// max_diff: the largest |c's out - the default's out| over the largest |default out|, for one
// call on W from a zeroed output (accumulating products included).
double Picker::max_diff(const Shape &s, const Candidate &c, const Plan &lt, const void *W, const void *X,
                        float *out) const {
  const size_t n = (size_t)s.N * s.B;
  float *ref = nullptr;
  ok(cudaMalloc(reinterpret_cast<void **>(&ref), sizeof(float) * n), "check output");
  std::vector<float> a(n), b(n);
  cudaError_t e = cudaMemsetAsync(ref, 0, sizeof(float) * n, stream_);
  if (e == cudaSuccess) e = cudaMemsetAsync(out, 0, sizeof(float) * n, stream_);
  bool ran = e == cudaSuccess && gemm_default(s, W, X, ref) == CUBLAS_STATUS_SUCCESS &&
             gemm_lt(s, lt, c.algo, c.ws, W, X, out) == CUBLAS_STATUS_SUCCESS;
  ran = ran && cudaMemcpyAsync(a.data(), out, sizeof(float) * n, cudaMemcpyDeviceToHost, stream_) == cudaSuccess &&
        cudaMemcpyAsync(b.data(), ref, sizeof(float) * n, cudaMemcpyDeviceToHost, stream_) == cudaSuccess &&
        cudaStreamSynchronize(stream_) == cudaSuccess;
  cudaFree(ref);
  if (!ran) return 1e30;
  double scale = 0, d = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, (double)std::fabs(b[i]));
    d = std::max(d, (double)std::fabs(a[i] - b[i]));
    if (a[i] != a[i]) return 1e30;  // NaN
  }
  return scale > 0 ? d / scale : d;
}

// input_bytes: the tuning input X [B, K] in type: values k/16 for k in -8..8, exact in fp32,
// bf16 and fp16, so that the winner's check against the default compares non-trivial sums.
std::vector<unsigned char> input_bytes(cudaDataType_t type, int B, int K) {
  const size_t n = (size_t)B * K, es = type == CUDA_R_32F ? 4 : 2;
  std::vector<unsigned char> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    const float v = (float)((int)((i * 37 + 11) % 17) - 8) / 16.f;
    uint32_t f;
    memcpy(&f, &v, 4);
    if (es == 4) {
      memcpy(&out[i * 4], &f, 4);
      continue;
    }
    uint16_t h = (uint16_t)(f >> 16);  // bf16: the upper half, exact for these values
    if (type == CUDA_R_16F)  // fp16 from the fields (normal values with few mantissa bits: exact)
      h = v == 0.f ? 0 : (uint16_t)(((f >> 16) & 0x8000u) | ((((f >> 23) & 0xffu) - 127 + 15) << 10) | ((f >> 13) & 0x3ffu));
    memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

const Plan *Picker::tune(const Shape &s, const std::vector<const void *> &weights) {
  Plan &plan = plans_[s];  // from here on the shape has a plan: the default until a candidate wins
  if (!lt_ || weights.empty()) return &plan;
  float *out = nullptr;
  void *X = nullptr;
  std::vector<cudaEvent_t> ev;
  std::vector<cudaGraphExec_t> execs;
  std::vector<Candidate> cands;
  Plan lt;  // the cuBLASLt descriptors; moved into plan if a candidate of theirs wins
  try {
    ok(cudaMalloc(reinterpret_cast<void **>(&out), sizeof(float) * (size_t)s.N * s.B), "scratch output");
    ok(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)s.N * s.B, stream_), "scratch output");
    const std::vector<unsigned char> xin = input_bytes(s.type, s.B, s.K);
    ok(cudaMalloc(&X, xin.size()), "tuning input");
    ok(cudaMemcpy(X, xin.data(), xin.size(), cudaMemcpyHostToDevice), "tuning input");
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    if (cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&lt.a, s.type, s.K, s.N, s.K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&lt.b, s.type, s.K, s.B, s.K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, s.N, s.B, s.N) != CUBLAS_STATUS_SUCCESS) {
      throw std::runtime_error("blas_pick: cuBLASLt descriptors");
    }
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t res[kHeuristics];
    int nres = 0;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      const uint64_t wsb = ws_bytes_;
      const uint32_t alw = alignment(weights), alx = alignment({X}), alo = alignment({out});
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alw, sizeof alw);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alx, sizeof alx);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alo, sizeof alo);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alo, sizeof alo);
      if (cublasLtMatmulAlgoGetHeuristic(lt_, lt.op, lt.a, lt.b, lt.c, lt.c, pref, kHeuristics, res, &nres) !=
          CUBLAS_STATUS_SUCCESS)
        nres = 0;
      cublasLtMatmulPreferenceDestroy(pref);
    }
    cands.push_back(Candidate{false, {}, 0, {}});  // the default
    for (int i = 0; i < nres; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws_bytes_)
        cands.push_back(Candidate{true, res[i].algo, res[i].workspaceSize, {}});
    // Split-K variants of the first candidates: few rows leave most SMs idle unless K is split.
    const size_t nheur = cands.size();
    for (size_t i = 1; i < nheur && i <= (size_t)kSplitFrom; ++i) {
      if (cap(cands[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 1) continue;
      const long long mask = cap(cands[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
      for (uint32_t split : {2u, 3u, 4u, 6u, 8u, 16u}) {
        if ((int)split * 64 > s.K) continue;
        for (uint32_t scheme : {(uint32_t)CUBLASLT_REDUCTION_SCHEME_INPLACE, (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE}) {
          if (mask >= 0 && !(mask & scheme)) continue;
          cublasLtMatmulAlgo_t a = cands[i].algo;
          if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split) !=
                  CUBLAS_STATUS_SUCCESS ||
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                   sizeof scheme) != CUBLAS_STATUS_SUCCESS)
            continue;
          cublasLtMatmulHeuristicResult_t chk{};
          if (cublasLtMatmulAlgoCheck(lt_, lt.op, lt.a, lt.b, lt.c, lt.c, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
              chk.state != CUBLAS_STATUS_SUCCESS || chk.workspaceSize > ws_bytes_)
            continue;
          cands.push_back(Candidate{true, a, chk.workspaceSize, {}});
        }
      }
    }
    // One pass: every weight once (at least kMinCalls calls), as the layers of a step would.
    const int calls = std::max<int>(kMinCalls, (int)weights.size());
    auto pass = [&](Candidate &c) {
      for (int i = 0; i < calls; ++i) {
        const void *W = weights[i % weights.size()];
        const cublasStatus_t st = c.lt ? gemm_lt(s, lt, c.algo, c.ws, W, X, out) : gemm_default(s, W, X, out);
        if (st != CUBLAS_STATUS_SUCCESS) return false;
      }
      return true;
    };
    // Each candidate's pass is captured in a CUDA graph and timed by replaying it, as the decode
    // step's graph replays it: launched call by call, the timing would be the host's launch rate.
    std::vector<char> alive(cands.size(), 1);
    for (size_t i = 0; i < cands.size(); ++i) alive[i] = pass(cands[i]);  // warm-up (loads modules)
    ok(cudaStreamSynchronize(stream_), "warm-up");
    (void)cudaGetLastError();
    execs.assign(cands.size(), nullptr);
    for (size_t i = 0; i < cands.size(); ++i) {
      if (!alive[i]) continue;
      cudaGraph_t g = nullptr;
      ok(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      const bool ran = pass(cands[i]);
      const cudaError_t e = cudaStreamEndCapture(stream_, &g);
      if (ran && e == cudaSuccess && g) {
#if defined(CUDART_VERSION) && CUDART_VERSION < 12000
        alive[i] = cudaGraphInstantiate(&execs[i], g, nullptr, nullptr, 0) == cudaSuccess;
#else
        alive[i] = cudaGraphInstantiate(&execs[i], g, 0) == cudaSuccess;
#endif
      } else {
        alive[i] = 0;
      }
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
    }
    ev.resize(2 * cands.size(), nullptr);
    for (auto &e : ev) ok(cudaEventCreate(&e), "cudaEventCreate");
    for (int r = 0; r <= kRounds; ++r) {  // round 0 warms the graphs up and is not counted
      for (size_t i = 0; i < cands.size(); ++i) {
        if (!alive[i]) continue;
        ok(cudaEventRecord(ev[2 * i], stream_), "cudaEventRecord");
        alive[i] = cudaGraphLaunch(execs[i], stream_) == cudaSuccess;
        ok(cudaEventRecord(ev[2 * i + 1], stream_), "cudaEventRecord");
      }
      ok(cudaStreamSynchronize(stream_), "timing");
      for (size_t i = 0; i < cands.size(); ++i) {
        float ms = 0.f;
        if (r > 0 && alive[i] && cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]) == cudaSuccess)
          cands[i].ms.push_back(ms / calls);
      }
    }
    auto median = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 1e30 : (double)v[v.size() / 2];
    };
    // Candidates by time; the first that beats the default by kKeepDefault and computes what the
    // default computes (summation order aside) wins. The check catches a wrong layout or a split-K
    // variant that drops a part, and the next fastest is tried instead.
    const double tdef = median(cands[0].ms);
    std::vector<std::pair<double, size_t>> order;
    for (size_t i = 1; i < cands.size(); ++i)
      if (alive[i] && !cands[i].ms.empty()) order.emplace_back(median(cands[i].ms), i);
    std::sort(order.begin(), order.end());
    size_t best = 0;
    std::string check;
    for (const auto &o : order) {
      if (o.first > kKeepDefault * tdef) break;
      const double d = max_diff(s, cands[o.second], lt, weights[0], X, out);
      char cb[200];
      if (d <= kAgree) {
        snprintf(cb, sizeof cb, "; max|d| against the default %.3g", d);
        check += cb;
        best = o.second;
        break;
      }
      snprintf(cb, sizeof cb, "; %s refused: max|d| against the default %.3g", describe(cands[o.second].algo).c_str(), d);
      check += cb;
    }
    char buf[320];
    snprintf(buf, sizeof buf, "N=%d K=%d B=%d%s: default %.2f us, chosen %.2f us (%s), %zu candidates", s.N, s.K,
             s.B, s.acc ? " accumulate" : "", tdef * 1e3, median(cands[best].ms) * 1e3,
             best == 0 ? "the default" : describe(cands[best].algo).c_str(), cands.size());
    std::string ranks;
    for (size_t j = 0; j < order.size() && j < 3; ++j) {
      char rb[200];
      snprintf(rb, sizeof rb, "; #%zu %.2f us (%s)", j + 1, order[j].first * 1e3, describe(cands[order[j].second].algo).c_str());
      ranks += rb;
    }
    const std::string what = std::string(buf) + check + ranks;
    if (best != 0) {
      lt.lt = true;
      lt.algo = cands[best].algo;
      lt.ws = cands[best].ws;
      lt.what = what;
      plan = lt;
      lt = Plan{};
    } else {
      plan.what = what;
    }
  } catch (const std::exception &e) {
    plan = Plan{};
    plan.what = std::string("tuning failed, the default runs: ") + e.what();
    (void)cudaGetLastError();
  }
  destroy(lt);
  for (auto e : ev)
    if (e) cudaEventDestroy(e);
  for (auto x : execs)
    if (x) cudaGraphExecDestroy(x);
  cudaStreamSynchronize(stream_);
  if (out) cudaFree(out);
  if (X) cudaFree(X);
  return &plan;
}

}  // namespace blaspick
