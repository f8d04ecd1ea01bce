// launch.cuh: kernel launches on the model's stream (programmatic dependent launch, clusters).
// Per-kernel times come from Nsight Systems (nsys), not from bookkeeping here.
#pragma once
#include "model.cuh"

namespace mqcuda {

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
}
template <typename... K, typename... A>
void launch(mqb_model &m, void (*k)(K...), dim3 grid, dim3 block, size_t smem, const A &...args) {
  launch_cl(m, dim3(1, 1, 1), k, grid, block, smem, args...);
}

}  // namespace mqcuda
