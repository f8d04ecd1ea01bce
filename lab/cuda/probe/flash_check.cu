// flash_check.cu: img::flash_attention (native/cuda/ops/flash_attn.cuh) on the GPU against an
// fp32 reference, and its speed against the materialised path the image pipelines used before it
// (native/models/zimage.cu attention(): cuBLAS bf16 batched products -> fp32 S [H, L, Lk] ->
// softmax_k -> bf16 P -> product). Built and run by lab/cuda/flash_check.sh for sm_90a with
// MQB_SM90A, as the library is, so flash_attention is the product's dispatch (head dim 128,
// non-causal: flash_wgmma.cuh's Hopper kernel); each compiled kernel is also timed alone (the
// variants: the mma.sync block shapes and "D128 wgmma").
//
// Reference: S = q k^T by cuBLAS (bf16 inputs, fp32 accumulation: exact products), an fp32
// softmax in place (fp32 P), O = P V in fp32 (SGEMM with fp32 V, no TF32). Each shape reports
// max|d| and mean|d| of flash and of the materialised path against it, the median time of a call
// of each (CUDA events, 3 warm calls, then 5 runs of `iters` calls), TFLOP/s at 4 L Lk hd H flops
// (causal: the same count, and half of it as the work done), and each compiled block shape of the
// kernel timed alone. First line: cuBLAS bf16 GEMM 8192^3 TFLOP/s on this card.
#include "../../../native/cuda/ops/flash_attn.cuh"
#include "../../../native/cuda/ops/image_attention.cuh"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mqcuda::img;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)
#define CB(x)                                                            \
  do {                                                                   \
    cublasStatus_t s_ = (x);                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
      fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)s_, __LINE__); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

static cublasHandle_t blas;
static cudaStream_t st;
static FILE *out;

static void say(const char *f, ...) {
  char b[1024];
  va_list a;
  va_start(a, f);
  vsnprintf(b, sizeof b, f, a);
  va_end(a);
  fputs(b, stdout);
  fputs(b, out);
  fflush(out);
}

// gemm: C[M, N] (row-major, ldc, batch stride sC) = A[M, K] (lda, sA) x (transB ? B[N, K]^T :
// B[K, N]) as zimage.cu's gemm, with the element types given.
static void gemm(const void *A, cudaDataType_t at, int lda, long long sA, const void *B, cudaDataType_t bt, int ldb,
                 long long sB, bool transB, void *C, cudaDataType_t ct, int ldc, long long sC, int M, int N, int K,
                 int batch) {
  const float one = 1.f, zero = 0.f;
  CB(cublasGemmStridedBatchedEx(blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, bt, ldb, sB, A,
                                at, lda, sA, &zero, C, ct, ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// softmax32_k: one row of S [rows, n] per block, in place in fp32, causal as softmax_k.
__global__ void softmax32_k(float *S, int n, float scale, int qlen, bool causal) {
  __shared__ float sh[32];
  float *s = S + (size_t)blockIdx.x * n;
  const int lim = causal ? (int)(blockIdx.x % qlen) + 1 : n;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, s[j] * scale);
  mx = mqcuda::img::block_max(mx, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(s[j] * scale - mx);
  sum = mqcuda::img::block_sum(sum, sh);
  for (int j = threadIdx.x; j < n; j += blockDim.x) s[j] = j < lim ? expf(s[j] * scale - mx) / sum : 0.f;
}
__global__ void to_f32_k(const bf16 *x, float *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

struct Shape {
  const char *name;
  int L, Lk, H, Hkv, hd;
  bool causal;
};

typedef bool (*Launch)(const bf16 *, int, const bf16 *, const bf16 *, int, bf16 *, int, int, int, int, int, int, float,
                       bool, cudaStream_t, int, long long, long long, long long);
struct Variant {
  const char *name;
  int D;
  Launch fn;
};
// wgmma: flash_wgmma.cuh's Hopper kernel alone (head dim 128, non-causal; sm_90a builds with
// MQB_SM90A on a compute 9.0 device), in the variants' signature; false where it does not run.
static bool wgmma(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, bf16 *o, int ldo, int L, int Lk, int H,
                  int rep, int hd, float scale, bool causal, cudaStream_t st, int batch, long long sq, long long skv,
                  long long so) {
  return hd == 128 && !causal && fw::launch(q, ldq, k, v, ldkv, o, ldo, L, Lk, H, rep, scale, st, batch, sq, skv, so);
}
static const Variant variants[] = {
    {"D128 wgmma", 128, wgmma},
    {"D64 4w MT1", 64, fa::launch<64, 4, 1>},    {"D64 8w MT1", 64, fa::launch<64, 8, 1>},
    {"D64 4w MT2", 64, fa::launch<64, 4, 2>},    {"D80 4w MT1", 80, fa::launch<80, 4, 1>},
    {"D80 8w MT1", 80, fa::launch<80, 8, 1>},    {"D80 4w MT2", 80, fa::launch<80, 4, 2>},
    {"D128 4w MT1", 128, fa::launch<128, 4, 1>}, {"D128 8w MT1", 128, fa::launch<128, 8, 1>},
    {"D128 4w MT2", 128, fa::launch<128, 4, 2>}, {"D128 8w MT2", 128, fa::launch<128, 8, 2>},
    {"D64 4w MT2 BK32", 64, fa::launch<64, 4, 2, 32>}, {"D128 4w MT2 BK32", 128, fa::launch<128, 4, 2, 32>},
    {"D128 4w MT1 BK32", 128, fa::launch<128, 4, 1, 32>},
};

// time_ms: the median over 5 runs of iters calls of f, per call.
template <typename F>
static double time_ms(int iters, const F &f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ts;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < iters; ++i) f();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms / iters);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[2];
}

static void diff(const std::vector<float> &ref, const std::vector<bf16> &got, double &mx, double &mean) {
  mx = 0, mean = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs((double)__bfloat162float(got[i]) - ref[i]);
    mx = std::isfinite(d) ? std::max(mx, d) : INFINITY;
    mean += d;
  }
  mean /= ref.size();
}

int main(int argc, char **argv) {
  out = fopen(argc > 1 ? argv[1] : "flash_check.txt", "w");
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CB(cublasCreate(&blas));
  CB(cublasSetStream(blas, st));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  {  // the card's bf16 GEMM rate
    const int n = 8192;
    bf16 *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)n * n * 2));
    CK(cudaMalloc(&b, (size_t)n * n * 2));
    CK(cudaMalloc(&c, (size_t)n * n * 2));
    CK(cudaMemset(a, 0x3c, (size_t)n * n * 2));
    CK(cudaMemset(b, 0x3c, (size_t)n * n * 2));
    const double ms = time_ms(5, [&] {
      gemm(a, CUDA_R_16BF, n, 0, b, CUDA_R_16BF, n, 0, true, c, CUDA_R_16BF, n, 0, n, n, n, 1);
    });
    say("device %s; cuBLAS bf16 GEMM 8192^3 (fp32 accumulation, bf16 out): %.3f ms, %.0f TFLOP/s\n", prop.name, ms,
        2.0 * n * n * (double)n / ms / 1e9);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  const Shape shapes[] = {
      {"zimage 512x512", 1056, 1056, 30, 30, 128, false}, {"zimage 1024x1024", 4128, 4128, 30, 30, 128, false},
      {"flux 1024x1024", 4608, 4608, 24, 24, 128, false}, {"internvl vit", 1025, 1025, 16, 16, 64, false},
      {"qwen3vl vit (hd 72)", 1024, 1024, 16, 16, 72, false}, {"causal GQA 32/8", 2048, 2048, 32, 8, 128, true},
      {"GQA 8/2", 517, 517, 8, 2, 128, false},   {"cross 300 on 1111 keys", 300, 1111, 4, 4, 128, false},
      {"odd 1000", 1000, 1000, 3, 3, 128, false}, {"short 77", 77, 77, 2, 2, 128, false},
  };
  unsigned long long seed = 88172645463325252ull;
  auto rnd = [&] {  // xorshift64, uniform in [-1, 1)
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return (float)((seed >> 40) * (1.0 / (1ull << 23)) - 1.0);
  };
  bool all_ok = true;
  for (const Shape &s : shapes) {
    const int qw = s.H * s.hd, kw = s.Hkv * s.hd, rep = s.H / s.Hkv;
    const size_t nq = (size_t)s.L * qw, nk = (size_t)s.Lk * kw, ns = (size_t)s.H * s.L * s.Lk;
    std::vector<bf16> hq(nq), hk(nk), hv(nk);
    for (auto &x : hq) x = __float2bfloat16(rnd());
    for (auto &x : hk) x = __float2bfloat16(rnd());
    for (auto &x : hv) x = __float2bfloat16(rnd());
    bf16 *q, *k, *v, *o, *P;
    float *S, *v32, *oref;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nk * 2));
    CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&P, ns * 2));
    CK(cudaMalloc(&S, ns * 4));
    CK(cudaMalloc(&v32, nk * 4));
    CK(cudaMalloc(&oref, nq * 4));
    CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    const float scale = 1.f / sqrtf((float)s.hd);
    // the fp32 reference
    for (int g = 0; g < s.Hkv; g++)
      gemm(q + (size_t)g * rep * s.hd, CUDA_R_16BF, qw, s.hd, k + (size_t)g * s.hd, CUDA_R_16BF, kw, 0, true,
           S + (size_t)g * rep * s.L * s.Lk, CUDA_R_32F, s.Lk, (long long)s.L * s.Lk, s.L, s.Lk, s.hd, rep);
    softmax32_k<<<s.H * s.L, 256, 0, st>>>(S, s.Lk, scale, s.L, s.causal);
    to_f32_k<<<1024, 256, 0, st>>>(v, v32, nk);
    for (int g = 0; g < s.Hkv; g++)
      gemm(S + (size_t)g * rep * s.L * s.Lk, CUDA_R_32F, s.Lk, (long long)s.L * s.Lk, v32 + (size_t)g * s.hd, CUDA_R_32F,
           kw, 0, false, oref + (size_t)g * rep * s.hd, CUDA_R_32F, qw, s.hd, s.L, s.hd, s.Lk, rep);
    CK(cudaStreamSynchronize(st));
    std::vector<float> ref(nq);
    CK(cudaMemcpy(ref.data(), oref, nq * 4, cudaMemcpyDeviceToHost));
    std::vector<bf16> got(nq);
    // the materialised path, as zimage.cu's attention()
    auto materialised = [&] {
      for (int g = 0; g < s.Hkv; g++)
        gemm(q + (size_t)g * rep * s.hd, CUDA_R_16BF, qw, s.hd, k + (size_t)g * s.hd, CUDA_R_16BF, kw, 0, true,
             S + (size_t)g * rep * s.L * s.Lk, CUDA_R_32F, s.Lk, (long long)s.L * s.Lk, s.L, s.Lk, s.hd, rep);
      softmax_k<<<s.H * s.L, 256, 0, st>>>(S, s.Lk, scale, s.L, s.causal, P);
      for (int g = 0; g < s.Hkv; g++)
        gemm(P + (size_t)g * rep * s.L * s.Lk, CUDA_R_16BF, s.Lk, (long long)s.L * s.Lk, v + (size_t)g * s.hd,
             CUDA_R_16BF, kw, 0, false, o + (size_t)g * rep * s.hd, CUDA_R_16BF, qw, s.hd, s.L, s.hd, s.Lk, rep);
    };
    materialised();
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(got.data(), o, nq * 2, cudaMemcpyDeviceToHost));
    double mmax, mmean;
    diff(ref, got, mmax, mmean);
    CK(cudaMemset(o, 0xff, nq * 2));  // NaNs: a row flash skips shows
    const bool ran = flash_attention(q, qw, k, v, kw, o, qw, s.L, s.Lk, s.H, s.Hkv, s.hd, scale, s.causal, st);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), o, nq * 2, cudaMemcpyDeviceToHost));
    double fmax, fmean;
    diff(ref, got, fmax, fmean);
    const int iters = s.L >= 4000 ? 5 : 20;
    const double tf = time_ms(iters, [&] {
      flash_attention(q, qw, k, v, kw, o, qw, s.L, s.Lk, s.H, s.Hkv, s.hd, scale, s.causal, st);
    });
    const double tm = time_ms(iters, materialised);
    const double flops = 4.0 * s.L * (double)s.Lk * s.hd * s.H;
    // bound: bf16 output rounding (2^-9 of |o| < 1) plus P's rounding; the materialised path's
    // own error is the yardstick
    const bool ok = ran && fmax <= std::max(8e-3, 2 * mmax);
    all_ok = all_ok && ok;
    say("%-22s L %d Lk %d H %d/%d hd %d%s\n", s.name, s.L, s.Lk, s.H, s.Hkv, s.hd, s.causal ? " causal" : "");
    say("  vs fp32 reference: flash max|d| %.5f mean %.6f; materialised max|d| %.5f mean %.6f  %s\n", fmax, fmean, mmax,
        mmean, ok ? "ok" : "FAIL");
    say("  flash %.3f ms (%.0f TFLOP/s%s), materialised %.3f ms (%.0f TFLOP/s): %.2fx\n", tf, flops / tf / 1e9,
        s.causal ? (", causal work " + std::to_string((int)(flops / 2 / tf / 1e9))).c_str() : "", tm,
        flops / tm / 1e9, tm / tf);
    for (const Variant &va : variants) {
      const int D = s.hd <= 64 ? 64 : s.hd <= 80 ? 80 : 128;
      if (va.D != D) continue;
      if (!va.fn(q, qw, k, v, kw, o, qw, s.L, s.Lk, s.H, rep, s.hd, scale, s.causal, st, 1, 0, 0, 0)) {
        say("    %-17s not for this shape or GPU (the dispatch takes another kernel)\n", va.name);
        continue;
      }
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), o, nq * 2, cudaMemcpyDeviceToHost));
      double vmax, vmean;
      diff(ref, got, vmax, vmean);
      const double tv =
          time_ms(iters, [&] { va.fn(q, qw, k, v, kw, o, qw, s.L, s.Lk, s.H, rep, s.hd, scale, s.causal, st, 1, 0, 0, 0); });
      say("    %-17s %.3f ms %.0f TFLOP/s max|d| %.5f%s\n", va.name, tv, flops / tv / 1e9, vmax,
          vmax <= std::max(8e-3, 2 * mmax) ? "" : " FAIL");
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(P), cudaFree(S), cudaFree(v32), cudaFree(oref);
  }
  {  // Z-Image 512^2's CFG pair: two sequences in one flash_attention_batched launch against two calls
    const int L = 1056, H = 30, hd = 128, w = H * hd, B = 2;
    const size_t n = (size_t)B * L * w;
    std::vector<bf16> h(n);
    for (auto &x : h) x = __float2bfloat16(rnd());
    bf16 *x, *o1, *o2;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&o1, n * 2));
    CK(cudaMalloc(&o2, n * 2));
    CK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
    const float scale = 1.f / sqrtf((float)hd);
    const long long item = (long long)L * w;
    auto two = [&] {  // q = k = v = the item's rows (the bits only are compared)
      for (int b = 0; b < B; ++b)
        flash_attention(x + b * item, w, x + b * item, x + b * item, w, o1 + b * item, w, L, L, H, H, hd, scale, false, st);
    };
    auto one = [&] {
      return flash_attention_batched(x, w, x, x, w, o2, w, L, L, H, H, hd, scale, false, st, B, item, item, item);
    };
    two();
    const bool ran = one();
    CK(cudaStreamSynchronize(st));
    std::vector<bf16> a(n), b(n);
    CK(cudaMemcpy(a.data(), o1, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), o2, n * 2, cudaMemcpyDeviceToHost));
    const bool same = ran && memcmp(a.data(), b.data(), n * 2) == 0;
    all_ok = all_ok && same;
    const double t2 = time_ms(20, two), t1 = time_ms(20, [&] { one(); });
    say("zimage 512x512 CFG pair (2 x L 1056, H 30, hd 128): two calls %.3f ms, one batched launch %.3f ms "
        "(%.0f TFLOP/s); the same bits: %s\n",
        t2, t1, 4.0 * B * L * (double)L * hd * H / t1 / 1e9, same ? "yes" : "NO (FAIL)");
    cudaFree(x), cudaFree(o1), cudaFree(o2);
  }
  say("%s\n", all_ok ? "flash_check: all shapes ok" : "flash_check: FAIL");
  fclose(out);
  return all_ok ? 0 : 1;
}
