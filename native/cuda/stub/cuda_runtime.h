// Stub of the CUDA runtime API for host-only builds of backend.cu on machines without nvcc:
// check_syntax.sh (declarations only) and host_test (emu.cc implements them, running kernels
// on CPU threads). Not used by the real build.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cmath>
#define __global__
#define __device__
#define __host__
#define __shared__ static
#include <functional>
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n)
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
void __syncthreads();
void __syncwarp(unsigned m = 0xffffffffu);
float __shfl_xor_sync(unsigned, float, int);
unsigned long long __shfl_xor_sync(unsigned, unsigned long long, int);
unsigned __float_as_uint(float);
float __uint_as_float(unsigned);
float rsqrtf(float);
inline float __fmul_rn(float a, float b) { return a * b; }
void sincosf(float, float *, float *);
template <typename T> T __ldg(const T *p) { return *p; }
template <typename T> T __ldcg(const T *p) { return *p; }
template <typename T> void __stcg(T *p, T v) { *p = v; }
void __threadfence();
unsigned atomicAdd(unsigned *, unsigned);
unsigned long long atomicMax(unsigned long long *, unsigned long long);
template <typename T> T min(T a, T b) { return a < b ? a : b; }
template <typename T> T max(T a, T b) { return a > b ? a : b; }
enum cudaError_t { cudaSuccess = 0, cudaErrorStreamCaptureUnsupported = 900 };
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUevent_st *cudaEvent_t;
cudaError_t cudaEventCreate(cudaEvent_t *);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventElapsedTime(float *, cudaEvent_t, cudaEvent_t);
typedef struct CUgraphExec_st *cudaGraphExec_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount, cudaDevAttrComputeCapabilityMajor };
enum cudaStreamCaptureMode { cudaStreamCaptureModeThreadLocal };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization };
enum cudaDataType_t { CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF };
#define cudaStreamNonBlocking 1u
struct cudaLaunchAttributeValue { int programmaticStreamSerializationAllowed; };
struct cudaLaunchAttribute { cudaLaunchAttributeID id; cudaLaunchAttributeValue val; };
struct cudaLaunchConfig_t { dim3 gridDim, blockDim; size_t dynamicSmemBytes; cudaStream_t stream; cudaLaunchAttribute *attrs; unsigned numAttrs; };
const char *cudaGetErrorName(cudaError_t);
const char *cudaGetErrorString(cudaError_t);
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaDeviceGetAttribute(int *, cudaDeviceAttr, int);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaMemcpy(void *, const void *, size_t, cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemset(void *, int, size_t);
cudaError_t cudaMemsetAsync(void *, int, size_t, cudaStream_t);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *);
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphDestroy(cudaGraph_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
template <typename T> cudaError_t cudaFuncSetAttribute(T *, cudaFuncAttribute, int);
// emu_launch runs (or, while a stream is capturing, records) body over the grid.
cudaError_t emu_launch(dim3 grid, dim3 block, std::function<void()> body);
template <typename... ExpTypes, typename... ActTypes>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(ExpTypes...), ActTypes &&...args) {
  return [&](ExpTypes... coerced) {
    return emu_launch(config->gridDim, config->blockDim, [=]() { kernel(coerced...); });
  }(static_cast<ActTypes &&>(args)...);
}
