// debug_abi.cu: the lab's entry points into libmodelqual_cuda.so, compiled only into the lab's
// builds of the library (lab/cuda/before_after.sh and run_device.sh pass it to CMake as
// MQB_EXTRA_SOURCES, or to nvcc beside the product's sources). The product library has none of
// them: mqb_bench.py and before_after.py check for each symbol and do without it.
//   mqb_debug_set       varies the kernel choices of a loaded model (below)
//   mqb_debug_chain     decode steps back to back with their tokens fed on the device
// Per-kernel times and a decode step's timeline come from Nsight Systems (nsys profile), which
// the GPU machine has: the product keeps no timing bookkeeping of its own.
#include "../../native/cuda/ops/linear.cuh"

using namespace mqcuda;

namespace mqcuda {
int bucket_for(const mqb_model &m, int n);
int graph_key(int b, int splits);
}  // namespace mqcuda

namespace {

// advance_kernel feeds a decode step's argmax back as the next step's tokens on the device and
// moves each real entry one position on (mqb_debug_chain).
__global__ void advance_kernel(int *tok, int *pos, const unsigned long long *keys, int n) {
  const int i = threadIdx.x;
  if (i < n) {
    tok[i] = decode_key(keys[i]);
    pos[i] += 1;
  }
}

}  // namespace

extern "C" {

// mqb_debug_set flips one of the model's kernel choices on a loaded model, so the benchmark driver
// compares variants without reloading weights: "graphs", "mixed_graphs", "pdl", "blas_tune",
// "gemv_max_b", "skinny" (0: cuBLAS instead of the tile kernel), "tile_max_b",
// "tile_rt", "tile_z", "tile_pre", "fuse_max_b", "attn_cluster", "attn_push",
// "tile_cluster", "tile_push", "rms_compact_b", "attn_split", "fused_attn", "pre_params",
// "attn_lanes", "attn_flash", "prefill_flash", "prefill_tc", "prefill_one", "prep_vec",
// "post_n" (mqb_model's fields say what each one chooses).
int mqb_debug_set(mqb_model *m, const char *key, int32_t value) {
  if (!m || !key) return 1;
  std::string k = key;
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    ck(cudaStreamSynchronize(m->stream), "sync");
  } catch (...) {
    return 1;
  }
  m->clear_graphs();
  if (k == "graphs") m->use_graphs = value != 0;
  else if (k == "mixed_graphs") m->mixed_graphs = value != 0;
  else if (k == "pdl") m->use_pdl = value != 0;
  else if (k == "blas_tune") m->blas_tune = value != 0;  // the shapes tuned so far keep their plans
  else if (k == "skinny") {
    if (value && !m->sk_ws) return 1;  // fp32 weights: cuBLAS only
    m->sk_on = value != 0;
  }
  else if (k == "tile_max_b") m->tile_max_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "tile_rt") m->tile_rt = (value == 2 || value == 4 || value == 8) ? value : 0;
  else if (k == "tile_z") m->tile_z = std::max(0, (int)value);
  else if (k == "tile_pre") m->tile_pre = std::max(1, std::min(sk::TSTAGES, (int)value));
  else if (k == "attn_cluster") m->attn_cluster = value != 0;
  else if (k == "attn_push") m->attn_push = value != 0;
  else if (k == "tile_cluster") m->tile_cluster = value != 0;
  else if (k == "rms_compact_b") m->rms_compact_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "tile_push") m->tile_push = value != 0;
  else if (k == "fuse_max_b") m->fuse_max_b = std::max(0, std::min(sk::MAXB, (int)value));
  else if (k == "attn_split") m->attn_split = std::max(0, std::min(ATT_SPLIT_MAX, (int)value));
  else if (k == "fused_attn") m->fused_attn = std::max(0, std::min(2, (int)value));
  else if (k == "pre_params") {
    if (m->c.token_rope && value == 0) return 1;  // per-token rotary rows exist only in rope_tab
    m->pre_params = value != 0;
  }
  else if (k == "attn_lanes") m->attn_lanes = value != 0;
  else if (k == "attn_flash") m->attn_flash = value != 0;
  else if (k == "prefill_flash") m->prefill_flash = value != 0;
  else if (k == "prefill_tc") m->prefill_tc = value != 0;
  else if (k == "prefill_one") m->prefill_one = std::max(0, (int)value);
  else if (k == "prep_vec") m->prep_vec = value != 0;
  else if (k == "post_n") m->post_n = value != 0;
  else if (k == "gemv_max_b") {
    const size_t es = dt_size(m->dt);
    const int Kmax = std::max(std::max(m->c.H, m->c.I), m->c.nh * m->c.D);
    int gb = std::min(4, (int)value);
    while (gb > 0 && (size_t)gb * Kmax * es > 48 * 1024) --gb;
    m->gemv_max_b = std::max(0, gb);
  } else return 1;
  return 0;
}

// mqb_debug_chain runs steps more greedy decode steps of the n entries of the last mqb_forward
// decode call (start_pos: the positions that call fed), each fed the previous step's argmax on
// the device, with no host synchronisation in between: what pipelined decoding would reach with
// the host's per-step work and the graph launch hidden behind the GPU's. Every step's graph must
// have been captured by earlier decode calls; tokens_out gets the last step's argmax. Not part
// of the ABI.
int mqb_debug_chain(mqb_model *m, int32_t n, int32_t steps, const int32_t *start_pos, int32_t *tokens_out, char *err,
                    size_t errlen) {
  if (!m || n < 1 || n > 64 || steps < 1 || !start_pos || !tokens_out) {
    set_err(err, errlen, "mqb_debug_chain: bad arguments");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    if (!m->use_graphs) throw std::runtime_error("mqb_debug_chain needs graphs");
    const int b = std::max(n, bucket_for(*m, n));
    for (int s = 0; s < steps; ++s) {
      int nmax = 1;
      for (int i = 0; i < n; ++i) nmax = std::max(nmax, start_pos[i] + s + 2);
      m->step_splits = attn_splits(*m, b, nmax);
      auto it = m->graphs.find(graph_key(b, m->step_splits));
      if (it == m->graphs.end() || !it->second.exec)
        throw std::runtime_error(
            fmt("no captured graph for batch %d with %d splits; run decode steps first", b, m->step_splits));
      cudaLaunchConfig_t cfg = {};  // no programmatic serialization: it reads the last step's keys
      cfg.gridDim = dim3(1);
      cfg.blockDim = dim3(64);
      cfg.stream = m->stream;
      ck(cudaLaunchKernelEx(&cfg, advance_kernel, m->d_tok(), m->d_pos(), (const unsigned long long *)m->keys, (int)n),
         "advance_kernel");
      ck(cudaGraphLaunch(it->second.exec, m->stream), "cudaGraphLaunch");
    }
    ck(cudaMemcpyAsync(m->keys_h, m->keys, sizeof(unsigned long long) * n, cudaMemcpyDeviceToHost, m->stream),
       "argmax download");
    ck(cudaStreamSynchronize(m->stream), "chain");
    for (int i = 0; i < n; ++i) tokens_out[i] = decode_key(m->keys_h[i]);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

}  // extern "C"
