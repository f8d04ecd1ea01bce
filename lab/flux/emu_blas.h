// emu_blas.h: what the CPU emulation (native/cuda/host_test/emu_cuda.h) lacks for the image
// pipelines: the 4-argument warp shuffle and cublasGemmStridedBatchedEx. Included after
// emu_cuda.h by emu_lib.cc (lab, not product).
#pragma once
#include <thread>

// The 4-argument warp shuffle the image kernels spell (width 32: the emulator's warp).
float __shfl_xor_sync(unsigned m, float v, int o, int) { return __shfl_xor_sync(m, v, o); }

// cublasGemmStridedBatchedEx: column-major C[m, n] = op(A)[m, k] op(B)[k, n] per batch, bf16 or
// fp32 inputs, fp32 accumulation, C fp32 or bf16 (beta 0 only, as the pipelines call it). Rows of
// the batches run on the host's threads.
static float ld_any(const void *p, cudaDataType_t t, size_t i) { return ld_elem(p, t, i); }
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType_t at, int lda, long long sA,
                                          const void *B, cudaDataType_t bt, int ldb, long long sB, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, long long sC, int batch, cublasComputeType_t,
                                          cublasGemmAlgo_t) {
  const float al = *(const float *)alpha;
  assert(*(const float *)beta == 0.f);
  auto body = [=]() {
    const size_t ea = at == CUDA_R_32F ? 4 : 2, eb = bt == CUDA_R_32F ? 4 : 2, ec = ct == CUDA_R_32F ? 4 : 2;
    const int nt = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int w = 0; w < nt; w++)
      th.emplace_back([=]() {
        std::vector<float> acol(k);
        for (int bi = 0; bi < batch; bi++) {
          const char *Ab = (const char *)A + ea * (size_t)(sA * bi);
          const char *Bb = (const char *)B + eb * (size_t)(sB * bi);
          char *Cb = (char *)C + ec * (size_t)(sC * bi);
          for (int j = w; j < n; j += nt) {
            std::vector<float> bcol(k);
            for (int p = 0; p < k; p++)
              bcol[p] = tb == CUBLAS_OP_N ? ld_any(Bb, bt, (size_t)j * ldb + p) : ld_any(Bb, bt, (size_t)p * ldb + j);
            for (int i = 0; i < m; i++) {
              float s = 0.f;
              for (int p = 0; p < k; p++) s += (ta == CUBLAS_OP_T ? ld_any(Ab, at, (size_t)i * lda + p) : ld_any(Ab, at, (size_t)p * lda + i)) * bcol[p];
              s *= al;
              const size_t ci = (size_t)j * ldc + i;
              if (ct == CUDA_R_32F) ((float *)Cb)[ci] = s;
              else ((__nv_bfloat16 *)Cb)[ci] = __float2bfloat16(s);
            }
          }
        }
      });
    for (auto &t : th) t.join();
    ++n_gemm;
  };
  enqueue(body);
  return CUBLAS_STATUS_SUCCESS;
}
