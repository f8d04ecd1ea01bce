// chain_floor.cu: the least a batch-1 decode step of the Qwen3-0.6B shape takes as a chain of
// dependent kernels that do nothing but its matrix-vector products (NOTES.md, runs 156-158).
// Standalone, on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/chain_floor native/cuda/probe/chain_floor.cu && /tmp/chain_floor
//
// Why: the batch-1 target (70 % of the bandwidth bound, about 403 us a step on an H200) leaves about
// 130 us a step for everything that is not streaming weights. mk_probe.cu and df_probe.cu measured
// what a persistent kernel's handoffs cost beside the weight stream (runs 66-68, 94-103); this
// measures the floor of the other design, one kernel per piece of work: the step's 1.19 GB of
// weights as bf16 matrix-vector products with fp32 sums, each kernel waiting only for the output
// vector of the kernel before it (programmatic dependent launch, its first rows' weights loaded
// before the wait, the next kernel released at its top), and no attention, norms or residual.
// The bytes of a layer are cut into 5 (with a stand-in for decode attention between qkv and
// o_proj), 4, 2 or 1 kernels: what fusing a layer's kernels could buy at best. The weights are the
// shape's (28 layers: qkv 4,096 x 1,024, o_proj 1,024 x 2,048, gate/up 6,144 x 1,024, down 1,024 x
// 3,072; the LM head 151,936 x 1,024), each kernel's own, read from DRAM as in a step.
//
// Before timing it checks the products against a double-precision sum on the host (rows of the
// LM head, and of a kernel that covers two pieces of different K) and exits 1 if one is off.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "probe.cuh"

typedef __nv_bfloat16 bf16;

constexpr int THREADS = 256;  // 8 warps; a warp owns whole rows
// gemv_chain's U: the 16-byte vectors a lane holds of one row, K <= 32 * 8 * U (4: K 1,024; 8:
// 2,048; 12: 3,072), a template argument so that a kernel of short rows keeps few registers.
constexpr int MAXP = 4;       // pieces (weight matrices) one kernel may cover
constexpr int KMAX = 3072;

// Piece: rows [row0, row0 + N) of a kernel's output are W[N, K] times the input vector's first K.
// (N is not read on the device, but keep it: without it nvcc 11.8 copies the pieces to a 112-byte
// stack frame for find's run-time index, and on the H200, built with CUDA 13.0's nvcc, the chain
// ran about 60 % slower: NOTES run 159.)
struct Piece {
  const bf16 *W;
  int N, K, row0;
};
struct Args {
  Piece p[MAXP];
  int np, rows, kmax, pdl, wait;
  int late;  // 1: release the next kernel after the wait (as backend.cu's kernels do), not at the top
  int pre;   // the first row before the wait: 0 loaded into registers, 1 only prefetched into L2 (as
             // backend.cu's gemv_kernel), 2 not touched
  const float *x;
  float *y;
};

__device__ __forceinline__ void find(const Args &a, int row, const bf16 *&w, int &K) {
  int i = 0;
  while (i + 1 < a.np && row >= a.p[i + 1].row0) ++i;
  K = a.p[i].K;
  w = a.p[i].W + (size_t)(row - a.p[i].row0) * K;
}

// load_row: a lane's 16-byte vectors of a row, lane + 32 u, all issued before any is used.
template <int U>
__device__ __forceinline__ void load_row(const bf16 *w, int K, int lane, uint4 (&r)[U]) {
  const uint4 *p = reinterpret_cast<const uint4 *>(w);
  const int nv = K / 8;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (lane + 32 * u < nv) r[u] = __ldg(p + lane + 32 * u);
}

template <int U>
__device__ __forceinline__ float dot_row(const uint4 (&r)[U], const float *xs, int K, int lane) {
  float s = 0.f;
  const int nv = K / 8;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + 32 * u;
    if (i < nv) {
      const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&r[u]);
      const float4 x0 = reinterpret_cast<const float4 *>(xs)[2 * i];
      const float4 x1 = reinterpret_cast<const float4 *>(xs)[2 * i + 1];
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        s = fmaf(f.x, xv[2 * j], s);
        s = fmaf(f.y, xv[2 * j + 1], s);
      }
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// gemv_chain: y[row] = W_piece[row] . x for every row of the kernel's pieces, a warp a row
// (grid-stride). The first row's weights are loaded before the wait: they do not depend on the
// kernel before. wait 0 (a measure, not a valid step) skips the wait: the kernels then overlap
// with no dependency, as far as the SMs' resources let them.
template <int U>
__global__ void __launch_bounds__(THREADS, U <= 4 ? 4 : 2) gemv_chain(Args a) {
  __shared__ __align__(16) float xs[KMAX];
  if (a.pdl && !a.late) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31;
  const int nw = gridDim.x * (THREADS / 32);
  int row = blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
  uint4 r[U];
  const bf16 *w = nullptr;
  int K = 0;
  if (row < a.rows) {
    find(a, row, w, K);
    if (a.pre == 0) load_row(w, K, lane, r);
    if (a.pre == 1)
      for (int off = lane * 128; off < K * 2; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char *>(w) + off));
  }
  if (a.pdl && a.wait) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (a.pdl && a.late) asm volatile("griddepcontrol.launch_dependents;");
  if (row < a.rows && a.pre != 0) load_row(w, K, lane, r);
  for (int i = threadIdx.x; i < a.kmax; i += THREADS) xs[i] = a.x[i];
  __syncthreads();
  while (row < a.rows) {
    const float s = dot_row(r, xs, K, lane);
    if (lane == 0) a.y[row] = s;
    row += nw;
    if (row < a.rows) {
      find(a, row, w, K);
      load_row(w, K, lane, r);
    }
  }
}

// attn_standin: where decode attention sits at batch 1 (8 KV heads x 16 position splits = 128
// blocks): each block reads 8 KB of "cache" (before the wait: earlier steps' rows) and its 32
// values of the qkv output, and writes 16 of o_proj's 2,048 inputs.
__global__ void __launch_bounds__(THREADS) attn_standin(const float *x, const uint4 *cache, float *y, int pdl) {
  __shared__ float red[THREADS / 32];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  const uint4 c = __ldg(cache + (size_t)blockIdx.x * 512 + (threadIdx.x & 511));
  const uint4 c2 = __ldg(cache + (size_t)blockIdx.x * 512 + 256 + (threadIdx.x & 255));
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  float v = (threadIdx.x < 32 ? x[blockIdx.x * 32 + threadIdx.x] : 0.f) + 1e-30f * (float)(c.x ^ c2.y);
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 16) y[blockIdx.x * 16 + threadIdx.x] = red[0] * (1.f + 0.01f * (float)threadIdx.x);
}

__global__ void fill_bf16(bf16 *w, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    w[i] = __float2bfloat16(((float)(h & 0xffff) / 65535.f - 0.5f) / 32.f);
  }
}

static int g_sms = 132;

// launch runs gemv_chain<U> over a's pieces, U from the longest row.
static void launch(cudaStream_t s, bool pdl, int grid, const Args &a) {
  void (*k)(Args) = a.kmax <= 1024 ? gemv_chain<4> : a.kmax <= 2048 ? gemv_chain<8> : gemv_chain<12>;
  launch_pdl(s, dim3(grid), dim3(THREADS), pdl, k, a);
}

struct Mat {
  bf16 *W;
  int N, K;
};

// make_args: one kernel over the pieces ms, reading x, writing y.
static Args make_args(const std::vector<Mat> &ms, const float *x, float *y, bool pdl, bool wait = true, int late = 0,
                      int pre = 0) {
  Args a = {};
  a.np = (int)ms.size();
  int row = 0, kmax = 0;
  for (int i = 0; i < a.np; ++i) {
    a.p[i] = Piece{ms[i].W, ms[i].N, ms[i].K, row};
    row += ms[i].N;
    kmax = std::max(kmax, ms[i].K);
  }
  a.rows = row;
  a.kmax = kmax;
  a.pdl = pdl ? 1 : 0;
  a.wait = wait ? 1 : 0;
  a.late = late;
  a.pre = pre;
  a.x = x;
  a.y = y;
  return a;
}

static int grid_for(int rows, int bps) { return std::max(1, std::min((rows + 7) / 8, g_sms * bps)); }

// check: rows of one kernel's output against a double sum on the host over the same bf16 weights
// and fp32 input. Returns the largest |d| / (sum |w x| + 1e-6) over the rows it looked at.
static double check(cudaStream_t s, const std::vector<Mat> &ms, float *x, float *y, int nrows_each) {
  std::vector<float> xh(KMAX);
  for (int i = 0; i < KMAX; ++i) xh[i] = std::sin(0.37f * i) * 0.5f;
  CK(cudaMemcpy(x, xh.data(), sizeof(float) * KMAX, cudaMemcpyHostToDevice));
  const Args a = make_args(ms, x, y, false);
  launch(s, false, grid_for(a.rows, 4), a);
  CK(cudaStreamSynchronize(s));
  double worst = 0;
  int row0 = 0;
  for (const Mat &m : ms) {
    std::vector<bf16> wr(m.K);
    for (int j = 0; j < nrows_each; ++j) {
      const int r = (int)(((long long)j * 7919 + 13) % m.N);
      CK(cudaMemcpy(wr.data(), m.W + (size_t)r * m.K, sizeof(bf16) * m.K, cudaMemcpyDeviceToHost));
      float got;
      CK(cudaMemcpy(&got, y + row0 + r, sizeof(float), cudaMemcpyDeviceToHost));
      double ref = 0, mag = 0;
      for (int k = 0; k < m.K; ++k) {
        const double t = (double)__bfloat162float(wr[k]) * xh[k];
        ref += t;
        mag += std::fabs(t);
      }
      worst = std::max(worst, std::fabs(got - ref) / (mag + 1e-6));
    }
    row0 += m.N;
  }
  return worst;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  setvbuf(stdout, nullptr, _IONBF, 0);
  const int L = 28, H = 1024, QKV = 4096, AO = 2048, I = 3072, V = 151936;
  struct LayerW {
    Mat qkv, o, up, down;
  };
  std::vector<LayerW> lw(L);
  size_t bytes = 0;
  auto alloc = [&](int N, int K, unsigned seed) {
    Mat m{nullptr, N, K};
    CK(cudaMalloc(&m.W, sizeof(bf16) * (size_t)N * K));
    fill_bf16<<<g_sms * 8, 256>>>(m.W, (size_t)N * K, seed);
    bytes += sizeof(bf16) * (size_t)N * K;
    return m;
  };
  for (int l = 0; l < L; ++l)
    lw[l] = LayerW{alloc(QKV, H, 4 * l + 1), alloc(H, AO, 4 * l + 2), alloc(2 * I, H, 4 * l + 3), alloc(H, I, 4 * l + 4)};
  const Mat head = alloc(V, H, 999);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  float *buf[2];
  for (auto &b : buf) {
    CK(cudaMalloc(&b, sizeof(float) * (V + KMAX)));
    CK(cudaMemset(b, 0, sizeof(float) * (V + KMAX)));
  }
  uint4 *cache;
  CK(cudaMalloc(&cache, sizeof(uint4) * 128 * 512));
  CK(cudaMemset(cache, 0, sizeof(uint4) * 128 * 512));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // The products checked before anything is timed.
  const double e_head = check(s, {head}, buf[0], buf[1], 64);
  const double e_mlp = check(s, {lw[3].up, lw[3].down}, buf[0], buf[1], 64);
  const bool ok = e_head < 1e-4 && e_mlp < 1e-4;
  printf("CHECK LM head rows max |d|/sum|w x| %.2e, gate/up + down in one kernel %.2e: %s\n", e_head, e_mlp,
         ok ? "pass" : "FAIL");
  if (!ok) return 1;

  {
    void (*ks[3])(Args) = {gemv_chain<4>, gemv_chain<8>, gemv_chain<12>};
    for (int i = 0; i < 3; ++i) {
      cudaFuncAttributes fa;
      CK(cudaFuncGetAttributes(&fa, ks[i]));
      int occ = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ks[i], THREADS, 0));
      printf("KERNEL gemv_chain<%2d> (K <= %d): %d registers, %zu bytes of stack, %d blocks an SM at most\n", 4 * (i + 1),
             1024 * (i + 1), fa.numRegs, fa.localSizeBytes, occ);
    }
  }
  const double gbs = copy_gbs(9, 2);
  const double bound_us = bytes / (gbs * 1e3);
  printf("weights %.3f GB a step; device-to-device copy %.0f GB/s; bound %.1f us a step = %.0f tok/s; 70 %% of it "
         "%.1f us\n",
         bytes / 1e9, gbs, bound_us, 1e6 / bound_us, bound_us / 0.7);

  struct Variant {
    const char *name;
    int per_layer;  // 5: qkv | attention stand-in | o | gate/up | down; 4; 2: qkv+o | gate/up+down; 1
    int bps;
    bool pdl, wait;
    int late, pre;  // Args::late, Args::pre
  };
  const Variant vs[] = {
      {"5 a layer (with attention stand-in)", 5, 4, true, true},
      {"4 a layer", 4, 4, true, true},
      {"4 a layer, 2 blocks an SM", 4, 2, true, true},
      {"4 a layer, 8 blocks an SM", 4, 8, true, true},
      {"4 a layer, no PDL", 4, 4, false, true},
      {"4 a layer, no wait (not a valid step)", 4, 4, true, false},
      {"2 a layer", 2, 4, true, true},
      {"1 a layer", 1, 4, true, true},
      {"1 a layer, 2 blocks an SM", 1, 2, true, true},
      {"4 a layer, released after the wait", 4, 4, true, true, 1, 0},
      {"4 a layer, first row prefetched to L2 only", 4, 4, true, true, 0, 1},
      {"4 a layer, both (as backend.cu's GEMV)", 4, 4, true, true, 1, 1},
      {"4 a layer, nothing before the wait", 4, 4, true, true, 0, 2},
      {"2 a layer, released after the wait", 2, 4, true, true, 1, 0},
  };
  for (const Variant &v : vs) {
    int nk = 0, p = 0;
    auto kern = [&](const std::vector<Mat> &ms) {
      const Args a = make_args(ms, buf[p], buf[p ^ 1], v.pdl, v.wait, v.late, v.pre);
      launch(s, v.pdl, grid_for(a.rows, v.bps), a);
      p ^= 1;
      ++nk;
    };
    auto step = [&]() {
      nk = 0;
      p = 0;
      for (int l = 0; l < L; ++l) {
        const LayerW &w = lw[l];
        switch (v.per_layer) {
          case 5:
            kern({w.qkv});
            launch_pdl(s, dim3(128), dim3(THREADS), v.pdl, attn_standin, (const float *)buf[p], (const uint4 *)cache, buf[p ^ 1],
                       v.pdl ? 1 : 0);
            p ^= 1;
            ++nk;
            kern({w.o});
            kern({w.up});
            kern({w.down});
            break;
          case 4:
            kern({w.qkv});
            kern({w.o});
            kern({w.up});
            kern({w.down});
            break;
          case 2:
            kern({w.qkv, w.o});
            kern({w.up, w.down});
            break;
          default:
            kern({w.qkv, w.o, w.up, w.down});
            break;
        }
      }
      kern({head});
    };
    std::vector<double> ts;
    // 40 untimed replays first, as runs 156-158 dropped their first two timed rounds of 20
    const double us = replay_us(s, step, 40, &ts);
    printf("STEP %-42s kernels %4d | %7.1f us a step (%.1f-%.1f) | %5.0f tok/s = %4.1f %% of the bound | %.2f us a "
           "kernel beyond the stream\n",
           v.name, nk, us, ts.front(), ts.back(), 1e6 / us, 100.0 * bound_us / us, (us - bound_us) / nk);
  }
  return 0;
}
