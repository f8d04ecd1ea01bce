// blas_pick: the cuBLASLt algorithm each decode-bucket matrix product runs, chosen once per
// process by timing the candidates on the model's own weights.
//
// Why: cublasGemmEx's default picks a kernel from cuBLAS's heuristic, which for the skinny
// products of a batch-32 decode step (32 rows against 1-150k output columns) leaves the H200's
// bandwidth mostly unused: in a graph-replayed trace the o projection (4 MB of weights) took 6 us
// a layer and down 5.4 us plus a split-K reduce kernel (lab/cuda/NOTES.md), against 1-1.5 us of
// weight bytes at the copy bandwidth. Timing the heuristic's candidates and their split-K
// variants is what TensorRT's tactic selection and PyTorch's TunableOp do for the same reason.
// What it bought on the H200 (lab/cuda/NOTES.md): 0-12 % a product, 2-4 % a batch-32 step,
// 4-7 % served at concurrency 32; a product's cost in a graph is mostly fixed (5-6 us whatever its
// size), which no algorithm choice removes.
//
// The weights of every layer are cycled through while timing, so each call reads its weights from
// DRAM as in a real step (one layer's weights alone would sit in the 50 MB L2). The default
// (cublasGemmEx) is a candidate and is kept unless another is at least 3 % faster, so tuning never
// makes a shape slower than before by more than the noise; a faster one must also compute what the
// default computes, or the next is tried. Within a process a shape's choice is
// fixed, so graph replays and eager steps compute the same bits; across processes two choices can
// differ, like cuBLAS's own choice across versions.
//
// Host code only (no kernels): compiled by the host compiler, so that it does not need nvcc; the
// CPU emulation (host_test/) compiles it against stub/ and an emulated cuBLASLt.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace blaspick {

// Shape of out[B, N] (+)= X[B, K] · W[N, K]^T with T inputs (type), fp32 out and accumulation.
struct Shape {
  cudaDataType_t type;
  int N, K, B;
  bool acc;  // beta 1: out accumulates (the residual's products)
  bool operator<(const Shape &o) const {
    return std::tie(type, N, K, B, acc) < std::tie(o.type, o.N, o.K, o.B, o.acc);
  }
};

// Plan: what one shape runs. lt false: cublasGemmEx's default (tuning kept it, or it failed).
struct Plan {
  bool lt = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t ws = 0;
  std::string what;  // the choice and its timings, for the log
};

// Candidate: one algorithm tried for a shape (lt false: the default) and its timed passes.
struct Candidate {
  bool lt;
  cublasLtMatmulAlgo_t algo;
  size_t ws;
  std::vector<float> ms;
};

class Picker {
 public:
  // blas: the handle the default runs on (its stream and workspace are the ones given here).
  Picker(cublasHandle_t blas, cudaStream_t stream, void *ws, size_t ws_bytes);
  ~Picker();
  Picker(const Picker &) = delete;
  Picker &operator=(const Picker &) = delete;

  // find: the plan of a shape already tuned, or nullptr.
  const Plan *find(const Shape &s) const;
  // tune times the candidates of s on weights (one per layer; W of the call is one of them) with
  // an input and an output of its own, and keeps the fastest. The stream must not be capturing:
  // it synchronises. Never throws: a candidate that fails is skipped, and if tuning itself fails
  // the plan is the default (Plan::what says why).
  const Plan *tune(const Shape &s, const std::vector<const void *> &weights);
  // plans: every shape tuned so far (the CPU emulation's test reads the choices).
  const std::map<Shape, Plan> &plans() const { return plans_; }
  // run: out (+)= X · W^T with s's plan (the default where the plan has none). Throws on failure.
  void run(const Shape &s, const Plan *p, const void *W, const void *X, float *out) const;

 private:
  cublasStatus_t gemm_default(const Shape &s, const void *W, const void *X, float *out) const;
  // gemm_lt: the product with d's descriptors and algorithm algo (workspace ws bytes).
  cublasStatus_t gemm_lt(const Shape &s, const Plan &d, const cublasLtMatmulAlgo_t &algo, size_t ws, const void *W,
                         const void *X, float *out) const;
  double max_diff(const Shape &s, const Candidate &c, const Plan &lt, const void *W, const void *X, float *out) const;
  cublasHandle_t blas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void *ws_;
  size_t ws_bytes_;
  std::map<Shape, Plan> plans_;
};

}  // namespace blaspick
