// launch.cuh: kernel launches on the model's stream (programmatic dependent launch, clusters)
// and the lab's profile and timeline bookkeeping they feed.
#pragma once
#include "model.cuh"

namespace mqcuda {

inline void mark(mqb_model &m, const std::string &label);

// tl_slot: the next timeline slot for a launch labelled m.label in a decode step (-1: no
// timeline, not a decode step, or out of slots).
constexpr int TL_SLOTS = 1024;
inline int tl_slot(mqb_model &m) {
  if (!m.tl_buf || !m.tl_decode || m.tl_next >= TL_SLOTS) return -1;
  if ((int)m.tl_labels.size() <= m.tl_next) m.tl_labels.resize(m.tl_next + 1);
  m.tl_labels[m.tl_next] = m.label;
  m.tl_count = m.tl_next + 1;
  return m.tl_next++;
}

// launch runs a kernel on the model's stream, with programmatic dependent launch when enabled;
// launch_cl with thread-block clusters of shape cl where it has more than one block.
template <typename... K, typename... A>
void launch_cl(mqb_model &m, dim3 cl, void (*k)(K...), dim3 grid, dim3 block, size_t smem, const A &...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = m.stream;
  cudaLaunchAttribute attr[2];
  int na = 0;
#ifndef MQB_HOST_TEST
  if (cl.x * cl.y * cl.z > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = cl.x;
    attr[na].val.clusterDim.y = cl.y;
    attr[na].val.clusterDim.z = cl.z;
    ++na;
  }
#else
  (void)cl;
#endif
  const int base = na;
  if (m.use_pdl) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = na;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
  if (e != cudaSuccess && m.use_pdl) {
    // Programmatic dependent launch refused: say so once and continue with plain launches.
    (void)cudaGetLastError();
    fprintf(stderr, "cuda backend: programmatic dependent launch disabled: %s\n", cudaGetErrorString(e));
    m.use_pdl = false;
    cfg.attrs = base ? attr : nullptr;
    cfg.numAttrs = base;
    e = cudaLaunchKernelEx(&cfg, k, args...);
  }
  ck(e, "kernel launch");
  mark(m, m.label);
}
template <typename... K, typename... A>
void launch(mqb_model &m, void (*k)(K...), dim3 grid, dim3 block, size_t smem, const A &...args) {
  launch_cl(m, dim3(1, 1, 1), k, grid, block, smem, args...);
}

inline void mark(mqb_model &m, const std::string &label) {
  if (!m.prof) return;
  if (m.evused == m.evpool.size()) {
    cudaEvent_t e;
    ck(cudaEventCreate(&e), "cudaEventCreate");
    m.evpool.push_back(e);
  }
  cudaEvent_t e = m.evpool[m.evused++];
  ck(cudaEventRecord(e, m.stream), "cudaEventRecord");
  m.marks.emplace_back(label, e);
}

// prof_collect runs after the stream was synchronized: charges each interval to its label.
inline void prof_collect(mqb_model &m) {
  if (!m.prof) return;
  for (size_t i = 1; i < m.marks.size(); ++i) {
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, m.marks[i - 1].second, m.marks[i].second), "cudaEventElapsedTime");
    auto &a = m.pacc[m.marks[i].first];
    a.first += ms;
    a.second += 1;
  }
  m.marks.clear();
  m.evused = 0;
  m.psteps++;
}

}  // namespace mqcuda
