// lt_epilogue.cu: which cuBLASLt epilogues the heuristic offers for the image pipelines' products
// (lab, not product). diffusion_cuda.cuh's product() asks for bias or GELU-tanh+bias fused into
// the GEMM, bf16 inputs, fp32 bias, bf16 or fp32 out; on an H100 (2026-12-07) FLUX's
// 4096 x 12288 x 3072 GELU product got none and ran unfused (cuBLAS to fp32, then epilogue_k).
// This prints, for FLUX.1's and Z-Image's feed-forward shapes, how many algorithms the heuristic
// returns for each epilogue, output type, bias type and output row stride, so the product can ask
// for one that exists. Build and run on the GPU host:
//   nvcc -O2 -arch=sm_90 lab/cuda/probe/lt_epilogue.cu -lcublasLt -o /tmp/lt_epilogue && /tmp/lt_epilogue
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>

static int offered(cublasLtHandle_t lt, int M, int N, int K, int ldy, cudaDataType_t dt, cudaDataType_t bt, cublasLtEpilogue_t ep,
                   bool prefs, int *state0) {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulPreference_t pref;
  const int32_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
  cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K);
  cublasLtMatrixLayoutCreate(&d, dt, N, M, ldy);
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t ws = 32u << 20;
  const uint32_t al = 256;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (prefs) {
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
  }
  cublasLtMatmulHeuristicResult_t r[8] = {};
  int n = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 8, r, &n);
  *state0 = n > 0 ? (int)r[0].state : (int)s;
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(d);
  cublasLtMatmulDescDestroy(op);
  return s == CUBLAS_STATUS_SUCCESS ? n : -(int)s;
}

int main() {
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  printf("cublasLt version %zu\n", cublasLtGetVersion());
  const int shapes[][4] = {{256, 12288, 3072, 12288}, {4096, 12288, 3072, 12288}, {4352, 12288, 3072, 15360},
                           {4352, 12288, 3072, 12288}, {2112, 10240, 3840, 10240}};
  const struct {
    cublasLtEpilogue_t e;
    const char *n;
  } eps[] = {{CUBLASLT_EPILOGUE_BIAS, "BIAS"}, {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"}, {CUBLASLT_EPILOGUE_GELU, "GELU"}};
  for (auto &s : shapes)
    for (auto &e : eps)
      for (int dt = 0; dt < 2; dt++)
        for (int bt = 0; bt < 2; bt++)
          for (int pr = 0; pr < 2; pr++) {
            int st = 0;
            const int n = offered(lt, s[0], s[1], s[2], s[3], dt ? CUDA_R_32F : CUDA_R_16BF, bt ? CUDA_R_32F : CUDA_R_16BF, e.e, pr, &st);
            printf("LTEPI M %5d N %5d K %5d ldy %5d %-9s out %s bias %s align-prefs %d: %d algorithms (first state %d)\n", s[0], s[1],
                   s[2], s[3], e.n, dt ? "fp32" : "bf16", bt ? "fp32" : "bf16", pr, n, st);
          }
  cublasLtDestroy(lt);
  return 0;
}
