// common.cuh: the CUDA backend's includes, errors (Fail, ck) and host-side precision conversion.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#ifndef MQB_HOST_TEST
#include <cuda.h>  // cuTensorMapEncodeTiled: the tile kernel's weight copies (libcuda)
#endif
#include <memory>

#include "blas_pick.h"  // the cuBLASLt algorithm of each decode bucket's products, timed once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mq_backend.h"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Errors

struct Fail : std::runtime_error {
  explicit Fail(const std::string &m) : std::runtime_error(m) {}
};

inline std::string fmt(const char *f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline void ck(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw Fail(fmt("cuda backend: %s failed: %s (%s)", what, cudaGetErrorName(e),
                   cudaGetErrorString(e)));
}

inline void ckb(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Fail(fmt("cuda backend: cuBLAS %s failed with status %d", what, (int)s));
}

inline void set_err(char *err, size_t errlen, const std::string &m) {
  if (err && errlen > 0) {
    snprintf(err, errlen, "%s", m.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Host-side precision conversion

enum DType { DT_BF16, DT_F16, DT_F32 };

inline uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return (uint16_t)(u >> 16);
}

inline uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t fe = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (fe == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = (int32_t)fe - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t hm = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (hm & 1u))) hm++;
    return (uint16_t)(sign | hm);
  }
  uint32_t hm = mant >> 13, rem = mant & 0x1fffu;
  uint32_t r = sign | ((uint32_t)e << 10) | hm;
  if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) r++;
  return (uint16_t)r;
}

// elem reads element i of a stored tensor (the bundle keeps tensors at their build precision).
inline float elem(const void *data, int32_t dtype, int64_t i) {
  uint32_t u;
  switch (dtype) {
    case MQB_DTYPE_BF16: {
      u = (uint32_t)static_cast<const uint16_t *>(data)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case MQB_DTYPE_F16: {
      const uint16_t h = static_cast<const uint16_t *>(data)[i];
      const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff;
      float v = e == 0 ? std::ldexp((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : std::ldexp((float)(man | 0x400), (int)e - 25);
      memcpy(&u, &v, 4);
      u |= sign;
      memcpy(&v, &u, 4);
      return v;
    }
    default:
      return static_cast<const float *>(data)[i];
  }
}

inline bool same_dtype(int32_t stored, DType compute) {
  return (stored == MQB_DTYPE_F32 && compute == DT_F32) || (stored == MQB_DTYPE_BF16 && compute == DT_BF16) ||
         (stored == MQB_DTYPE_F16 && compute == DT_F16);
}

inline size_t dt_size(DType d) { return d == DT_F32 ? 4 : 2; }

// parallel_for splits [0,n) over up to 16 host threads (weight conversion of a 0.6B model).
template <typename F>
void parallel_for(int64_t n, F fn) {
  int nt = (int)std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), 16);
  if (n < 1 << 16) nt = 1;
  std::vector<std::thread> th;
  int64_t per = (n + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    int64_t a = t * per, b = std::min(n, a + per);
    if (a >= b) break;
    th.emplace_back([=] { fn(a, b); });
  }
  for (auto &x : th) x.join();
}


}  // namespace mqcuda
