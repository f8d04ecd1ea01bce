// flash_wgmma_check.cu: the product's Hopper attention kernel (native/cuda/ops/flash_wgmma.cuh),
// through the product's own dispatch (flash_attention_batched), against an fp32 reference and
// timed against the portable mma.sync kernel it replaces for head dim 128 (lab, not product).
// Why: the pipelines' parity runs check the kernel only where FLUX.1 and Z-Image happen to call it;
// this covers what they may not: batches (a CFG pair's two sequences), grouped-query heads, a
// key length other than the query length, and lengths that are not multiples of the tiles.
//
// Each case: q, k, v random bf16; both kernels' outputs held to a row-sampled fp32 reference
// (max |d| within max(2 x the mma.sync kernel's, 0.02)); then each timed (median of 5 x 10 calls).
// Prints one CHK line a case and "CHK all cases within bounds" or "CHK FAIL"; exit 1 on a failure.
//
// Build and run on the GPU host (wgmma needs the sm_90a target; MQB_SM90A lets the dispatch use it):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DMQB_SM90A -Inative/include -Inative/cuda \
//     lab/cuda/probe/flash_wgmma_check.cu native/cuda/blas_pick.cc -lcublas -lcublasLt -lcuda -o /tmp/fwc && /tmp/fwc
#include "../../../native/cuda/ops/flash_attn.cuh"

#include <cmath>

#include "probe.cuh"  // CK, median_ms

using bf16 = __nv_bfloat16;

// ref_k: one (sampled row, head) per block: fp32 attention of bf16 q, k, v for item b of the batch.
__global__ void ref_k(const bf16 *q, int ldq, const bf16 *k, const bf16 *v, int ldkv, int Lk, int rep, float scale,
                      const int *rows, const int *items, long long sq, long long skv, float *out) {
  extern __shared__ float sc[];
  __shared__ float red[256];
  const int r = rows[blockIdx.x], b = items[blockIdx.x], h = blockIdx.y, kh = h / rep;
  q += b * sq + (size_t)r * ldq + h * 128;
  k += b * skv + kh * 128;
  v += b * skv + kh * 128;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
    float d = 0.f;
    for (int e = 0; e < 128; e++) d += __bfloat162float(q[e]) * __bfloat162float(k[(size_t)j * ldkv + e]);
    sc[j] = d * scale;
    mx = fmaxf(mx, sc[j]);
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j < Lk; j += blockDim.x) sum += (sc[j] = expf(sc[j] - mx));
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  sum = red[0];
  for (int e = threadIdx.x; e < 128; e += blockDim.x) {
    float a = 0.f;
    for (int j = 0; j < Lk; j++) a += sc[j] * __bfloat162float(v[(size_t)j * ldkv + e]);
    out[((size_t)blockIdx.x * gridDim.y + h) * 128 + e] = a / sum;
  }
}

__global__ void fill_k(bf16 *x, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t z = (uint32_t)i * 2654435761u ^ seed;
    z ^= z >> 15, z *= 2246822519u, z ^= z >> 13, z *= 3266489917u, z ^= z >> 16;
    x[i] = __float2bfloat16(amp * ((z & 0xffffff) / 8388608.f - 1.f));
  }
}

int main() {
  struct Case {
    const char *name;
    int L, Lk, H, Hkv, batch;
  } cases[] = {
      {"flux 1024^2 (4352 x 24)", 4352, 4352, 24, 24, 1},
      {"zimage 1024^2 CFG pair (4128 x 30, batch 2)", 4128, 4128, 30, 30, 2},
      {"zimage 512^2 CFG pair (1056 x 30, batch 2)", 1056, 1056, 30, 30, 2},
      {"odd (1000 x 3)", 1000, 1000, 3, 3, 1},
      {"short (77 x 2)", 77, 77, 2, 2, 1},
      {"GQA 8 heads on 2, batch 3 (517 x 8)", 517, 517, 8, 2, 3},
      {"cross: 300 queries, 1111 keys (x 4)", 300, 1111, 4, 4, 1},
  };
  int fails = 0;
  const cudaStream_t st = 0;  // median_ms records its events on the default stream
  for (const Case &c : cases) {
    const int ldq = c.H * 128, ldkv = c.Hkv * 128, rep = c.H / c.Hkv;
    const long long sq = (long long)c.L * ldq, skv = (long long)c.Lk * ldkv;
    bf16 *q, *k, *v, *o[2];
    CK(cudaMalloc(&q, 2 * sq * c.batch));
    CK(cudaMalloc(&k, 2 * skv * c.batch));
    CK(cudaMalloc(&v, 2 * skv * c.batch));
    for (auto &x : o) CK(cudaMalloc(&x, 2 * sq * c.batch));
    fill_k<<<1024, 256>>>(q, sq * c.batch, 1, 2.f);
    fill_k<<<1024, 256>>>(k, skv * c.batch, 2, 2.f);
    fill_k<<<1024, 256>>>(v, skv * c.batch, 3, 1.f);
    const float scale = 1.f / sqrtf(128.f);
    // wg: the product's dispatch (the wgmma kernel on sm_90a builds); mma: the portable kernel
    // flash_attention_batched would otherwise pick for head dim 128
    auto wg = [&] {
      if (!mqcuda::img::flash_attention_batched(q, ldq, k, v, ldkv, o[0], ldq, c.L, c.Lk, c.H, c.Hkv, 128, scale, false,
                                                st, c.batch, sq, skv, sq))
        fprintf(stderr, "flash_attention_batched refused %s\n", c.name), exit(1);
    };
    auto mma = [&] {
      namespace fa = mqcuda::img::fa;
      const bool big = (long long)(c.L + 127) / 128 * c.H * c.batch >= 3LL * fa::sm_count();
      const bool ok = big ? fa::launch<128, 4, 2>(q, ldq, k, v, ldkv, o[1], ldq, c.L, c.Lk, c.H, rep, 128, scale, false,
                                                  st, c.batch, sq, skv, sq)
                          : fa::launch<128, 4, 1>(q, ldq, k, v, ldkv, o[1], ldq, c.L, c.Lk, c.H, rep, 128, scale, false,
                                                  st, c.batch, sq, skv, sq);
      if (!ok) fprintf(stderr, "fa::launch refused %s\n", c.name), exit(1);
    };
    wg();
    mma();
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<int> rows, items;
    for (int b = 0; b < c.batch; b++) {
      for (int r = b; r < c.L; r += 37) rows.push_back(r), items.push_back(b);
      rows.push_back(c.L - 1), items.push_back(b);
    }
    int *drows, *ditems;
    float *ref;
    const size_t n = rows.size();
    CK(cudaMalloc(&drows, 4 * n));
    CK(cudaMalloc(&ditems, 4 * n));
    CK(cudaMalloc(&ref, 4 * n * c.H * 128));
    CK(cudaMemcpy(drows, rows.data(), 4 * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ditems, items.data(), 4 * n, cudaMemcpyHostToDevice));
    ref_k<<<dim3(n, c.H), 256, 4 * c.Lk>>>(q, ldq, k, v, ldkv, c.Lk, rep, scale, drows, ditems, sq, skv, ref);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<float> hr(n * c.H * 128);
    CK(cudaMemcpy(hr.data(), ref, 4 * hr.size(), cudaMemcpyDeviceToHost));
    double md[2];
    for (int i = 0; i < 2; i++) {
      std::vector<bf16> hx(sq * c.batch);
      CK(cudaMemcpy(hx.data(), o[i], 2 * hx.size(), cudaMemcpyDeviceToHost));
      md[i] = 0;
      for (size_t s = 0; s < n; s++)
        for (int h = 0; h < c.H; h++)
          for (int e = 0; e < 128; e++) {
            const double x = __bfloat162float(hx[items[s] * sq + (size_t)rows[s] * ldq + h * 128 + e]);
            const double d = fabs(x - hr[(s * c.H + h) * 128 + e]);
            md[i] = d == d ? std::max(md[i], d) : INFINITY;
          }
    }
    auto time = [&](auto f) {
      return median_ms(5, 1, [&](bool setup) {
               if (!setup)
                 for (int i = 0; i < 10; i++) f();
             }) /
             10;
    };
    const float tw = time(wg), tm = time(mma);
    const double fl = 4.0 * c.L * (double)c.Lk * 128 * c.H * c.batch / 1e9;
    const bool ok = md[0] <= std::max(2 * md[1], 0.02);
    fails += !ok;
    printf("CHK %-46s wgmma %.1f us (%.0f TFLOP/s, max|d| %.3g%s) | mma.sync %.1f us (%.0f, max|d| %.3g) | %.2fx\n",
           c.name, 1e3 * tw, fl / tw, md[0], ok ? "" : " FAIL", 1e3 * tm, fl / tm, md[1], tm / tw);
    fflush(stdout);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o[0]), cudaFree(o[1]), cudaFree(drows), cudaFree(ditems),
        cudaFree(ref);
  }
  printf("CHK %s\n", fails ? "FAIL" : "all cases within bounds");
  return fails ? 1 : 0;
}
