// env.cuh: the CUDA backend's environment, read in this one file: the few knobs a user needs
// (Knobs) and the planted faults (MODELQUAL_FAULTS, shared names with the CPU runtime; each
// family's file declares and applies its own).
#pragma once
#include "common.cuh"

namespace mqcuda {

inline int env_int(const char *k, int dflt) {
  const char *v = getenv(k);
  if (!v || !*v) return dflt;
  return atoi(v);
}

// Knobs: the backend's only environment settings, read once per model open. Everything else is
// the one measured-fastest path (lab/cuda/NOTES.md has how each default was chosen; the lab's
// builds vary kernels through lab/cuda/debug_abi.cu, never through the environment).
//   MQB_GRAPHS=0      run decode and prefill steps (and the image pipelines' denoising steps)
//                     eagerly instead of as captured CUDA graphs (debugging a kernel with
//                     compute-sanitizer, say); default 1
//   MQB_WARMUP=0      leave the prefill warm-up and graph captures to the first requests (faster
//                     open, slower first requests); default 1 (0 in the CPU emulation)
//   MQB_TCAP=n        most tokens in one prefill or mixed chunk; default 2048 (8 or 32 prompts of
//                     128 tokens prefill 7-10 % faster than in chunks of 512; 4,096 measured the same);
//                     a sliding-window model's KV ring is window + MQB_TCAP - 1 rows a slot (kv_rows_for)
//   MQB_BLAS_TUNE=0   use cuBLAS's default algorithm instead of timing candidates once per shape
//   MQB_BLAS_LOG=1    print the algorithm blas_pick chose for each shape
struct Knobs {
  bool graphs, warmup, blas_tune, blas_log;
  int tcap;
};

inline Knobs knobs() {
#ifdef MQB_HOST_TEST
  const int warm_default = 0;  // an emulated launch takes about half a second
#else
  const int warm_default = 1;
#endif
  return Knobs{env_int("MQB_GRAPHS", 1) != 0, env_int("MQB_WARMUP", warm_default) != 0,
               env_int("MQB_BLAS_TUNE", 1) != 0, env_int("MQB_BLAS_LOG", 0) != 0, env_int("MQB_TCAP", 2048)};
}

// fault: whether MODELQUAL_FAULTS (comma separated) names the planted fault name.
inline bool fault(const char *name) {
  const char *f = getenv("MODELQUAL_FAULTS");
  if (!f) return false;
  std::string s(f), n(name);
  size_t start = 0;
  while (start <= s.size()) {
    size_t e = s.find(',', start);
    if (e == std::string::npos) e = s.size();
    std::string item = s.substr(start, e - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item == n) return true;
    start = e + 1;
  }
  return false;
}

}  // namespace mqcuda
