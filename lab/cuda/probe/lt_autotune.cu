// lt_autotune.cu: would timing cuBLASLt's candidates (as blas_pick does for decode) speed up the
// image pipelines' products? (lab, not product). diffusion_cuda.cuh's product() and gemm() run
// the heuristic's first algorithm for each shape. This times, for every product of a FLUX.1 step
// at 1024² (dev: 512 text rows; 4,096 image rows; D 3,072) and of a Z-Image-Turbo CFG step at
// 1024² (two sequences of 4,128 rows; D 3,840), each of the heuristic's first 16 algorithms with
// the product's own settings (bf16 operands, fp32 accumulation, the bias or GELU-tanh+bias
// epilogue with the bias in the output's type, bf16 or fp32 out at the product's row stride,
// 256-byte alignment, 32 MiB workspace), and prints the first against the best, per product and
// weighted by how often a step runs it: the milliseconds a step would save; and the same among
// the algorithms whose output equals the first's byte for byte (a choice among those could be
// made per process without changing an image, so served and CLI images stay the same bytes).
// (Z-Image's products have no epilogue and run through cublasGemmStridedBatchedEx, whose own
// choice may differ from cuBLASLt's first; its "first" here is cuBLASLt's.) On an H100
// (lab/cuda/results/gpu_2026-12-08a_h100) cuBLASLt offered 8 algorithms a product; every
// non-split-K one computed the first's bits.
// Weights are cycled through 8 copies so each call reads its operand from DRAM as in a step.
// Build and run on the GPU host (seconds):
//   nvcc -O2 -std=c++17 -arch=sm_90 lab/cuda/probe/lt_autotune.cu -lcublasLt -o /tmp/lt_autotune && /tmp/lt_autotune
#include <cublasLt.h>
#include <cuda_bf16.h>

#include "probe.cuh"  // CK, median_ms

enum Epi { kNone, kBias, kGelu };
struct Prod {
  const char *pipe, *name;
  int M, N, K, ldy;
  bool ybf16;
  Epi epi;
  int per_step;  // calls in one denoising step
};

static const int kCopies = 8;
static const size_t kWs = 32u << 20;

// differ_k: *cnt += how many of the n bytes of a and b differ.
__global__ void differ_k(const unsigned char *a, const unsigned char *b, size_t n, unsigned long long *cnt) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) c += a[i] != b[i];
  if (c) atomicAdd(cnt, c);
}

int main() {
  const Prod prods[] = {
      // FLUX.1 1024², dev (T 512, N 4096, L 4608): 19 double blocks (image and text streams), 38 single
      {"flux", "double img q|k|v (bias, bf16)", 4096, 9216, 3072, 9216, true, kBias, 19},
      {"flux", "double txt q|k|v (bias, bf16)", 512, 9216, 3072, 9216, true, kBias, 19},
      {"flux", "double img out (bias)", 4096, 3072, 3072, 3072, false, kBias, 19},
      {"flux", "double txt out (bias)", 512, 3072, 3072, 3072, false, kBias, 19},
      {"flux", "double img ff1 (gelu, bf16)", 4096, 12288, 3072, 12288, true, kGelu, 19},
      {"flux", "double txt ff1 (gelu, bf16)", 512, 12288, 3072, 12288, true, kGelu, 19},
      {"flux", "double img ff2 (bias)", 4096, 3072, 12288, 3072, false, kBias, 19},
      {"flux", "double txt ff2 (bias)", 512, 3072, 12288, 3072, false, kBias, 19},
      {"flux", "single q|k|v (bias, bf16)", 4608, 9216, 3072, 9216, true, kBias, 38},
      {"flux", "single mlp (gelu, bf16, ld 5D)", 4608, 12288, 3072, 15360, true, kGelu, 38},
      {"flux", "single out (bias)", 4608, 3072, 15360, 3072, false, kBias, 38},
      // Z-Image-Turbo 1024², a CFG pair (2 x 4,128 rows), 30 layers
      {"zimage", "q|k|v (bf16)", 8256, 11520, 3840, 11520, true, kNone, 30},
      {"zimage", "o", 8256, 3840, 3840, 3840, false, kNone, 30},
      {"zimage", "w1|w3 (bf16)", 8256, 20480, 3840, 20480, true, kNone, 30},
      {"zimage", "w2", 8256, 3840, 10240, 3840, false, kNone, 30},
  };
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, cublasLt %zu\n", prop.name, cublasLtGetVersion());
  size_t wmax = 0, xmax = 0, ymax = 0;
  for (const Prod &p : prods)
    wmax = std::max(wmax, (size_t)p.N * p.K), xmax = std::max(xmax, (size_t)p.M * p.K), ymax = std::max(ymax, (size_t)p.M * p.ldy);
  __nv_bfloat16 *w, *x, *bias;
  void *y, *y0, *ws;
  unsigned long long *cnt;
  CK(cudaMalloc(&w, wmax * kCopies * 2));
  CK(cudaMalloc(&x, xmax * 2));
  CK(cudaMalloc(&y, ymax * 4));
  CK(cudaMalloc(&y0, ymax * 4));
  CK(cudaMalloc(&cnt, 8));
  CK(cudaMalloc(&bias, 20480 * 4));
  CK(cudaMalloc(&ws, kWs));
  {  // small random values (the bits do not change the kernels' time, but zeros might)
    std::vector<__nv_bfloat16> h(1 << 20);
    for (size_t i = 0; i < h.size(); i++) h[i] = __float2bfloat16((float)((i * 2654435761u) % 2001) / 1000.f - 1.f);
    for (size_t o = 0; o < wmax * kCopies; o += h.size()) CK(cudaMemcpy(w + o, h.data(), 2 * std::min(h.size(), wmax * kCopies - o), cudaMemcpyHostToDevice));
    for (size_t o = 0; o < xmax; o += h.size()) CK(cudaMemcpy(x + o, h.data(), 2 * std::min(h.size(), xmax - o), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bias, h.data(), 20480 * 4, cudaMemcpyHostToDevice));
  }
  double step_first[2] = {0, 0}, step_best[2] = {0, 0}, step_same[2] = {0, 0};
  for (const Prod &p : prods) {
    // the product's descriptor (diffusion_cuda.cuh lt_plan): column-major y^T [N, M] = W [K, N]^T x^T [K, M]
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    const int32_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N, bt = p.ybf16 ? CUDA_R_16BF : CUDA_R_32F;
    const uint32_t ep = p.epi == kNone ? CUBLASLT_EPILOGUE_DEFAULT : p.epi == kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    const uint64_t wsz = kWs;
    const uint32_t al = 256;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
    if (p.epi != kNone) {
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, p.K, p.N, p.K);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, p.K, p.M, p.K);
    cublasLtMatrixLayoutCreate(&d, p.ybf16 ? CUDA_R_16BF : CUDA_R_32F, p.N, p.M, p.ldy);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz);
    for (auto at : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, at, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t r[16] = {};
    int n = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 16, r, &n);
    const double flop = 2.0 * p.M * p.N * p.K;
    double first = -1, best = 1e30, same = 1e30;
    int bi = -1, si = -1;
    const size_t ybytes = (size_t)p.M * p.ldy * (p.ybf16 ? 2 : 4);
    for (int i = 0; i < n; i++) {
      if (r[i].state != CUBLAS_STATUS_SUCCESS) continue;
      const float one = 1.f, zero = 0.f;
      bool ok = true;
      int c = 0;
      // 5 calls a timing (the weights' copies in turn), the median of 5 after 1 dropped
      const double t = median_ms(5, 1, [&](bool setup) {
        if (setup) return;
        for (int j = 0; j < 5; j++, c++) {
          const __nv_bfloat16 *wc = w + (size_t)(c % kCopies) * p.N * p.K;
          ok = ok && cublasLtMatmul(lt, op, &one, wc, a, x, b, &zero, y, d, y, d, &r[i].algo, ws, kWs, nullptr) == CUBLAS_STATUS_SUCCESS;
        }
      }) / 5;
      if (!ok) continue;
      // the output on copy 0 against the first algorithm's, byte for byte: a faster algorithm that
      // computes the same bits could be chosen per process without changing any image
      CK(cudaMemset(y, 0, ybytes));
      ok = cublasLtMatmul(lt, op, &one, w, a, x, b, &zero, y, d, y, d, &r[i].algo, ws, kWs, nullptr) == CUBLAS_STATUS_SUCCESS;
      unsigned long long nd = 0;
      if (first < 0) {
        CK(cudaMemcpy(y0, y, ybytes, cudaMemcpyDeviceToDevice));
      } else {
        CK(cudaMemset(cnt, 0, 8));
        differ_k<<<1024, 256>>>((const unsigned char *)y, (const unsigned char *)y0, ybytes, cnt);
        CK(cudaMemcpy(&nd, cnt, 8, cudaMemcpyDeviceToHost));
      }
      if (!ok) continue;
      if (first < 0) first = t;
      if (t < best) best = t, bi = i;
      if (nd == 0 && t < same) same = t, si = i;
      int32_t split = 0;
      size_t got = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &got);
      printf("   #%2d %.3f ms split-K %d, %llu bytes differ from #0's\n", i, t, split, nd);
    }
    const int g = p.pipe[0] == 'f' ? 0 : 1;
    if (first > 0) {
      step_first[g] += first * p.per_step, step_best[g] += best * p.per_step, step_same[g] += same * p.per_step;
      printf("%-6s %-32s %5d x %5d x %5d: %2d algos; first %.3f ms (%.0f TFLOP/s), best #%d %.3f ms (%.0f TFLOP/s): %.3fx\n", p.pipe,
             p.name, p.M, p.N, p.K, n, first, flop / first / 1e9, bi, best, flop / best / 1e9, first / best);
      printf("       same bits as the first: best #%d %.3f ms: %.3fx\n", si, same, first / same);
    } else {
      printf("%-6s %-32s %5d x %5d x %5d: no algorithm ran (%d offered)\n", p.pipe, p.name, p.M, p.N, p.K, n);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(op);
  }
  printf("STEP flux (dev 1024², the products above): first algorithms %.1f ms, best %.1f ms: %.1f ms a step (%.3fx)\n", step_first[0],
         step_best[0], step_first[0] - step_best[0], step_first[0] / step_best[0]);
  printf("STEP zimage (1024² CFG pair): first algorithms %.1f ms, best %.1f ms: %.1f ms a step (%.3fx)\n", step_first[1], step_best[1],
         step_first[1] - step_best[1], step_first[1] / step_best[1]);
  for (int g = 0; g < 2; g++)
    printf("STEP %s, best of those computing the first's bits: %.1f ms, %.1f ms a step saved (%.3fx)\n", g ? "zimage" : "flux",
           step_same[g], step_first[g] - step_same[g], step_first[g] / step_same[g]);
  return 0;
}
