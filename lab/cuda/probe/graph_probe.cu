// graph_probe.cu: what a CUDA graph of a decode step's shape costs to launch, apart from its
// kernels' work (NOTES.md, "Runs 82-86"). Standalone, on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/graph_probe native/cuda/probe/graph_probe.cu && /tmp/graph_probe
//
// Why: a traced batch-32 step spends ~240 us outside its kernels' span, and cudaGraphLaunch of
// the step's 284-node graph took 241 us of host time traced (run 56); with the host out of the
// loop the kernels ran slower while the next graph was submitted (runs 35-38). This measures, for
// chains of N near-empty kernels of G blocks (the decode step's node count and grid sizes), with
// and without programmatic dependent launch: the host time of cudaGraphLaunch, the GPU time of a
// replay launched back to back, and a synchronous loop (small upload, launch, copy back, sync:
// what decode_step does per step).
// PROBE_SET=code (or all, the default) then asks what a kernel's code size costs in such a chain:
// chains of kernels of FMAS independent-chain FMAs each (about 16 bytes of code per FMA), either
// one kernel repeated (its code stays in the SM's instruction caches) or NK distinct kernels
// cycled (each launch may find its code evicted, as a decode step's 5-10 kernels a layer do).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <vector>

#include "probe.cuh"

__global__ void tiny(float *buf, int i, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) buf[blockIdx.x] += (float)i;
}

// big<ID, F>: F FMAs in 8 independent chains, unrolled into straight-line code (~16 F bytes).
template <int ID, int F>
__global__ void big(float *buf, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  float x[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = buf[(threadIdx.x + j) & 255];
#pragma unroll
  for (int i = 0; i < F / 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], 1.0001f + (float)(i * 8 + j + ID) * 1e-7f, (float)(i + ID) * 1e-6f);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += x[j];
  if (threadIdx.x == 0) buf[256 + blockIdx.x] = s;
}

template <int F>
using BigFn = void (*)(float *, int);
template <int F>
BigFn<F> big_fn(int id) {
  switch (id % 10) {
    case 0: return big<0, F>;
    case 1: return big<1, F>;
    case 2: return big<2, F>;
    case 3: return big<3, F>;
    case 4: return big<4, F>;
    case 5: return big<5, F>;
    case 6: return big<6, F>;
    case 7: return big<7, F>;
    case 8: return big<8, F>;
    default: return big<9, F>;
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int F>
static void code_rows(cudaStream_t s, float *buf) {
  const int N = 140;
  for (int G : {132, 256})
    for (int NK : {1, 2, 5, 10}) {
      const double us = replay_us(s, [&] {
        for (int i = 0; i < N; ++i) launch_pdl(s, dim3(G), dim3(128), true, big_fn<F>(i % NK), buf, 1);
      });
      printf("CODE fmas %5d (~%3d KB of code) grid %3d distinct kernels %2d | %7.1f us per replay of %d | %5.2f us per kernel\n",
             F, F * 16 / 1024, G, NK, us, N, us / N);
    }
}

int main() {
  const char *set = getenv("PROBE_SET");
  const bool all = !set || !*set || !strcmp(set, "all");
  if (all || !strcmp(set, "code")) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *buf;
    CK(cudaMalloc(&buf, 1 << 20));
    CK(cudaMemset(buf, 0, 1 << 20));
    code_rows<64>(s, buf);
    code_rows<512>(s, buf);
    code_rows<2048>(s, buf);
    code_rows<4096>(s, buf);
    if (!all) return 0;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *buf;
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaMemset(buf, 0, 1 << 20));
  int *meta_d, *meta_h, *back_h;
  CK(cudaMalloc(&meta_d, 32 << 10));
  CK(cudaMallocHost(&meta_h, 32 << 10));
  CK(cudaMallocHost(&back_h, 4096));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int Ns[] = {142, 284};
  const int Gs[] = {1, 132, 256};
  printf("GRAPH nodes grid pdl | launch_host_us(med) | replay_gpu_us | sync_loop_us(upload 25KB+launch+copy back+sync)\n");
  for (int N : Ns)
    for (int G : Gs)
      for (int pdl = 0; pdl < 2; ++pdl) {
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < N; ++i) launch_pdl(s, dim3(G), dim3(128), pdl != 0, tiny, buf, i, pdl);
        cudaGraph_t g;
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ex;
        CK(graph_instantiate(&ex, g));
        CK(cudaGraphUpload(ex, s));
        for (int w = 0; w < 20; ++w) CK(cudaGraphLaunch(ex, s));
        CK(cudaStreamSynchronize(s));
        std::vector<double> host;
        for (int r = 0; r < 200; ++r) {
          const double t0 = now_us();
          CK(cudaGraphLaunch(ex, s));
          host.push_back(now_us() - t0);
          CK(cudaStreamSynchronize(s));
        }
        const int R = 100;
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < R; ++r) CK(cudaGraphLaunch(ex, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<double> loop;
        for (int r = 0; r < 200; ++r) {
          const double t0 = now_us();
          CK(cudaMemcpyAsync(meta_d, meta_h, 25 << 10, cudaMemcpyHostToDevice, s));
          CK(cudaGraphLaunch(ex, s));
          CK(cudaMemcpyAsync(back_h, buf, 256, cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
          loop.push_back(now_us() - t0);
        }
        printf("GRAPH %4d %4d %d | %8.1f | %8.1f | %8.1f\n", N, G, pdl, median(host), 1000.0 * ms / R, median(loop));
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(g));
      }
  return 0;
}
