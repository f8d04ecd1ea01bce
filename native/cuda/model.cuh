// model.cuh: the CUDA backend's model (mqb_model: device, stream, weights, KV cache, graphs,
// the kernel choices), the decoder's configuration (Cfg) and the family registration
// (CudaFamily, MQB_REGISTER_FAMILY).
#pragma once
#include "ops/decode_attn.cuh"
#include "ops/prefill_attn.cuh"
#include "ops/tile.cuh"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Hyperparameters and the decoder's shape

// Cfg: the resolved hyper-parameters (cfg_from_hparams) and the decoder shape the family's
// configure hook picks; the shared decoder (decoder.cuh) reads only these, never a family name.
struct Cfg {
  std::string family;  // the runtime's family name (messages only)
  int V = 0, H = 0, L = 0, nh = 0, nkv = 0, D = 0, I = 0, maxpos = 0;
  double eps = 1e-6, theta = 10000;
  bool tied = false, attn_bias = false, inv_layer_scale = false;
  int norm = PREP_RMS;       // the layers' and the final norm: PREP_RMS or PREP_LN (with biases)
  bool gated = true;         // MLP: SwiGLU over gate|up (2 I wide), else gelu_new over I
  bool token_rope = false;   // rope_tab has Tcap rows past max_ctx for per-token rows (rope_rows)
  // Sliding-window attention (the config's sliding_window, set by the family's configure hook): a
  // query at position p attends keys p - window < k <= p in every attention path (window_lo);
  // 0: the whole cache. The cache then keeps only the rows a query can still read: a ring of
  // mqb_model::kv_rows rows a slot (kv_row).
  int window = 0;
  // RoPE's inverse frequencies (D/2) where the family's rotary scaling computed them (its
  // configure hook fills them); empty: theta^(-2j/D). rope_setup uploads them.
  std::vector<float> inv_freq;
  int mlp_width() const { return gated ? 2 * I : I; }
};

struct TensorMap;

// HParams reads the resolved hyper-parameters the runtime passed (mqb_model_params::hparams).
struct HParams {
  const mqb_hparam *hp;
  int n;
  std::string family;
  const mqb_hparam *get(const char *k) const {
    for (int i = 0; i < n; ++i)
      if (hp[i].key && strcmp(hp[i].key, k) == 0) return &hp[i];
    return nullptr;
  }
  double num(const char *k) const {
    const mqb_hparam *h = get(k);
    if (!h || h->str)
      throw Fail(fmt("cuda backend: hyper-parameter %s is missing; the runtime's %s resolve step must set it", k,
                     family.c_str()));
    return h->value;
  }
  int pos(const char *k) const {
    double v = num(k);
    if (v <= 0 || v != std::floor(v) || v > 1e9)
      throw Fail(fmt("cuda backend: hyper-parameter %s = %g must be a positive integer", k, v));
    return (int)v;
  }
};

}  // namespace mqcuda

struct mqb_model;

namespace mqcuda {

// CudaFamily is one family's GPU model, registered from its own file (native/models/<f>.cu) by
// MQB_REGISTER_FAMILY, as MQ_REGISTER_FAMILY registers the CPU model: the core (backend.cu) lists
// the registered names (mqb_families) and calls these hooks; it names no family. Hooks are plain
// function pointers set at registration: the per-step ones run once per chunk or layer, never per
// kernel. NULL: the family has no such step.
struct CudaFamily {
  const char *name;  // the runtime family, as MQ_REGISTER_FAMILY names it
  // Text families (the shared decoder):
  // configure sets c's decoder shape (norm, gated, token_rope) and reads the family's own
  // hyper-parameters and faults; the core has read the common ones.
  void (*configure)(Cfg &c, const HParams &hp) = nullptr;
  // open runs before load: the family's state (m.fstate), sized from p.
  void (*open)(mqb_model &m, const mqb_model_params *p) = nullptr;
  // load names the family's tensors and uploads them (weights.cuh: TensorMap, upload_*).
  void (*load)(mqb_model &m, const TensorMap &tm) = nullptr;
  // chunk_begin: whether the chunk of Tn tokens in meta_h has rows the family fills (then m.rows_on,
  // m.rope_rows set by it); embed_rows runs after the embedding, after_layer after layer l.
  bool (*chunk_begin)(mqb_model &m, int Tn) = nullptr;
  void (*embed_rows)(mqb_model &m, int Tn) = nullptr;
  void (*after_layer)(mqb_model &m, int l, int Tn) = nullptr;
  // ffn: layer l's feed-forward in place of the dense MLP (a mixture of experts): reads the
  // residual m.res of the Tn tokens and adds its output to it; false leaves the layer dense.
  bool (*ffn)(mqb_model &m, int l, int Tn) = nullptr;
  // routing: a mixture of experts' routing counts since open (mqb_routing).
  int (*routing)(mqb_model &m, uint64_t *out, int64_t cap, int32_t *layers, int32_t *experts) = nullptr;
  // in_prompt: slot's position p is inside a prompt the family still has to fill (not a decode).
  bool (*in_prompt)(mqb_model &m, int slot, int p) = nullptr;
  // set_image: n_images >= 1 images for slot, image k's grid (t, h, w) at grids[3k..3k+2] and its
  // pixels after the previous image's (mqb_set_images; mqb_set_image passes one).
  void (*set_image)(mqb_model &m, int slot, const float *pixels, int64_t n_pixels, const int32_t *grids, int n_images,
                    const int32_t *prompt, int n) = nullptr;
  // vision_ns: the device time of slot's vision tower and projector (mqb_vision_ns).
  int64_t (*vision_ns)(mqb_model &m, int slot) = nullptr;
  void (*slot_reset)(mqb_model &m, int slot) = nullptr;
  // Image families (task "image", the mqb_image_* entry points): open returns the model.
  void *(*image_open)(const mqb_model_params *p) = nullptr;
  void (*image_generate)(void *im, const mqb_image_args *a) = nullptr;
  void (*image_close)(void *im) = nullptr;
};

// register_family adds f (at static initialisation, MQB_REGISTER_FAMILY); find_family returns the
// family named name, or NULL. Defined in backend.cu.
bool register_family(const CudaFamily &f);
const CudaFamily *find_family(const std::string &name);

#define MQB_CONCAT_(a, b) a##b
#define MQB_CONCAT(a, b) MQB_CONCAT_(a, b)
#define MQB_REGISTER_FAMILY(...) \
  static const bool MQB_CONCAT(mqb_registered_, __LINE__) = ::mqcuda::register_family(__VA_ARGS__)

// ---------------------------------------------------------------------------------------------
// Model

struct Layer {
  void *w_qkv = nullptr, *w_o = nullptr, *w_up = nullptr, *w_down = nullptr;  // T, [out, in]
  float *b_qkv = nullptr, *b_o = nullptr, *b_up = nullptr, *b_down = nullptr;
  float *ln1_w = nullptr, *ln1_b = nullptr, *ln2_w = nullptr, *ln2_b = nullptr;
  float *qn = nullptr, *kn = nullptr;
  void *kc = nullptr, *vc = nullptr;  // T, [slots, kv_rows, nkv, D]
  float qscale = 1.f;
};

struct GraphEntry {
  cudaGraphExec_t exec = nullptr;
  bool warmed = false;
};

}  // namespace mqcuda

using namespace mqcuda;

struct mqb_model {
  Cfg c;
  const CudaFamily *fam = nullptr;  // the registered family (configure, load and its hooks)
  // The family's own state (a vision tower and its images, say), made by its open hook; freed
  // before the stream it may have used.
  std::shared_ptr<void> fstate;
  // The chunk being run has rows the family fills itself (CudaFamily::chunk_begin: image tokens):
  // it runs eagerly, with the family's embed_rows and after_layer hooks.
  bool rows_on = false;
  // Rotary positions the family moves (NULL: none): per token of the chunk being run its own row
  // of rope_tab (with rows_on; rows past max_ctx are the family's), per slot an offset added to
  // the position (decode graphs read it too).
  const int *rope_rows = nullptr;
  const int *rope_delta = nullptr;
  DType dt = DT_BF16;
  int dev = 0, sms = 0;
  int max_batch = 0, max_ctx = 0, slots = 0, scratch = 0;
  int Tcap = 0, Rcap = 0;
  // The KV cache's rows a slot (kv_rows_for): max_ctx, or with a sliding window a ring of
  // window + Tcap - 1 rows where that is fewer, position p in row kv_row(p, kv_rows).
  int kv_rows = 0;
  int gemv_max_b = 4;
  bool attn_lanes = true;  // attend's several-lanes-per-position scores (debug "attn_lanes")
  bool attn_flash = true;  // decode attention through attend_flash (debug "attn_flash")
  // Prefill attention through attend_flash too (debug "prefill_flash"; with attn_flash), where
  // the tensor cores do not take it (prefill_tc): prompts of 128 tokens prefill in 13-19 % less
  // time than through attend (batch 1 2.47 against 2.85 ms, 32 45.4 against 55.9).
  bool prefill_flash = true;
  // Prefill and mixed steps' attention of bf16/fp16 models on the tensor cores
  // (prefill_attn.cuh) where head_dim allows (debug "prefill_tc"; 0: attention_kernel): 32
  // prompts of 128 tokens prefill in 15.9 ms instead of 46.5, one in 1.93 instead of 2.50 (run
  // 63). ptile is the chunk's tiles (prefill_tiles), ptile_h its pinned host copy, Tcap each.
  bool prefill_tc = true;
  // With prefill_tc, the one-token tiles of a chunk of at least prefill_one entries (rows; its
  // decode entries: a served mixed step's running sequences) go through attention_kernel, as a
  // decode step's tokens do, and only the longer tiles through prefill_attn_kernel (debug
  // "prefill_one"; 0: every tile there). In prefill_attn_kernel a one-token tile is a block of
  // four warps with one row, walking the context 64 positions at a time: 26 of them beside a
  // 128-token prompt took 0.77-0.85 ms of the step's 2.2 summed kernel ms. A second
  // launch costs its own latency, so few tiles stay there (ms a step of one prompt of
  // 128 and N decodes, routed / not: N 3 2.07-2.22 / 1.99-2.00, 7 2.06-2.24 / 1.99, 14 2.14-2.27 /
  // 2.08-2.21, 26 2.20-2.34 / 2.38). Rows, not tiles, decide, so a graph's bucket fixes the choice.
  int prefill_one = 17;
  // The element-wise preps (SwiGLU, GELU: the down projection's input where cuBLAS makes it)
  // load 4 values of a row at a time, two such loads of each source in flight per thread (debug
  // "prep_vec"; 0: one value at a time, as the kernel with every mode's code still does). Same
  // bits either way.
  bool prep_vec = true;
  // qkv_post_kernel holds head_n(D) values a lane (4 at head_dim 128) instead of HV (8), so no
  // lane issues the guarded-off half of every unrolled step, and so does decode_attn_kernel at
  // head_dim 128 with pre_params (debug "post_n" 0: HV in both). Same bits.
  bool post_n = true;
  // ptile: the chunk's tiles (prefill_tiles), then its one-token tiles' token indices (ints);
  // ptile_h its pinned host copy. Room for Tcap of each.
  pa::Tile *ptile = nullptr, *ptile_h = nullptr;
  std::vector<int> ones_h;  // prefill_tiles' one-token tiles, before the copy into ptile_h
  int attn_split = 0;  // decode attention position splits (MQB_ATTN_SPLIT; 0 = enough to fill the SMs)
  int fused_attn = 1;  // decode_attn_kernel: 1 for small decode grids, 2 always, 0 never (MQB_FUSED_ATTN)
  // Parameters that do not depend on the previous kernel loaded before its wait (debug
  // "pre_params"): q_norm / k_norm weights and RoPE's cos / sin (from rope_tab, made at load:
  // [max_ctx][D / 2] (cos, sin), with head_vec's own sincosf arguments) in qkv_post_kernel and
  // decode_attn_kernel (head_pre), the RMSNorm weights in prep_kernel. 0: loaded after the wait,
  // cos / sin by sincosf there.
  bool pre_params = true;
  float2 *rope_tab = nullptr;
  // The tile kernel (tile.cuh) for bf16/fp16 products of a layer (N <= sk_max_n): sk_on is set
  // by tile_setup (fp32 models: GEMV and cuBLAS only).
  bool sk_on = false;
  int sk_max_n = 0;
  // Products of up to tile_max_b rows go through sk::tile_kernel (weights streamed by the
  // copy engine through a shared-memory pipeline) when sk_on: above gemv_max_b always, at 1..
  // gemv_max_b rows where the GEMV would have had nothing to fuse (linear). tile_max_b is 16: on
  // the H200 batch 16 decodes 7.8 % faster through it than through cuBLAS, batch 32 13 % slower
  // (lab/cuda/NOTES.md). Debug "tile_max_b" (up to 32) sets the range, tile_rt / tile_z force
  // row tiles per block / K splits (0 = chosen by tile_cfg).
  int tile_max_b = 16, tile_rt = 0, tile_z = 0;
  // Weight chunks each tile-kernel block asks for before griddepcontrol.wait (debug "tile_pre",
  // 1..sk::TSTAGES): 3. All four buffers' worth made batches 1-16 1-2 % slower.
  int tile_pre = sk::TSTAGES - 1;
  // A fused decode step's position splits (2-8 of them) merge through distributed shared memory,
  // the splits of an item one thread-block cluster (debug "attn_cluster"; 0: partials through L2,
  // a counter and the last split's merge). On the H200 batch 1's attention took 228 us a step
  // instead of 268, batches 2 and 4 decoded 3.5-3.8 % faster, 8 and 16 as before (lab/cuda/NOTES.md).
  bool attn_cluster = true;
  // With attn_cluster: the splits z > 0 push their partials into split 0's shared memory (its
  // park, where that fits: attn_park_fits) before one cluster barrier, instead of split 0
  // reading them between two (debug "attn_push" 0). On the H200 (lab/cuda/NOTES.md) the merge
  // took 1.21 us a layer at batch 1 instead of 2.02; batches 1-4 decoded 1.2-1.3 % faster, 8 the same.
  bool attn_push = true, attn_park_fits = false;
  // The tile kernel's K splits (2-8 of them) add their partials through distributed shared
  // memory, a row block's splits one cluster (sk::split_total's park; debug "tile_cluster"; 0:
  // through the workspace, a counter and the last split's sum). On the H200 batch 1 decoded 7.3 %
  // faster (o_proj 106 us a step instead of 164), batch 2 4.2 %, 4-16 1.6-2.1 % (lab/cuda/NOTES.md).
  bool tile_cluster = true;
  // The tile kernel's RMSNorm staging in its compact form (sk::TileFuse::compact) up to
  // rms_compact_b rows: on the H200 batch 1 decoded 2.7-2.8 % faster (the staging 1.3 us a layer
  // instead of 2.0), batch 2 1.3 %, 4 as fast, 8 and 16 6-10 % slower (lab/cuda/NOTES.md;
  // debug "rms_compact_b", 0: the other form at every batch).
  int rms_compact_b = 2;
  // With tile_cluster: the splits z > 0 push their partials into split 0's shared memory (a park
  // past its input, where that fits: tile_launch) before one cluster barrier, instead of split 0
  // reading them between two (debug "tile_push" 0). On the H200 batches 1-16 decoded 0.7-2.3 %
  // faster (lab/cuda/NOTES.md: o_proj's split sum 1.22 us a layer at batch 1 instead of 1.52).
  bool tile_push = true;
  // Products whose input is an RMSNorm (qkv, gate/up) go through sk::tile_kernel with the norm,
  // and gate/up with the SwiGLU, fused (tile_fused) for up to fuse_max_b rows. fuse_max_b
  // is 16: on the H200 batches 12 and 16 decode 6-7 % faster so; at 24 and 32 the tile kernel,
  // fused, is 8 % slower than cuBLAS with the prep kernels (lab/cuda/NOTES.md). Debug
  // "fuse_max_b" (0: off, prep kernels and the unfused products).
  int fuse_max_b = 16;
#ifndef MQB_HOST_TEST
  // The copy engine's descriptions of the weight matrices the tile kernel has read, by (W, N, K,
  // box rows): made at first use (tile_map), also while a graph is captured.
  std::map<std::tuple<const void *, int, int, int>, CUtensorMap> tmaps;
#endif
  float *sk_ws = nullptr;          // split-K partials [Z][32][N]
  size_t sk_ws_floats = 0;
  unsigned int *sk_cnt = nullptr;  // [sk_max_n / 16] blocks done per row block, zero between products
  int step_splits = 1;  // decode attention splits of the step being run (attn_splits)
  float *part_acc = nullptr, *part_ml = nullptr;
  unsigned int *att_cnt = nullptr;  // [ATT_SPLIT_MAX_T * nkv] attention splits done, zero between steps
  bool use_graphs = true, use_pdl = true;
  bool mixed_graphs = true;  // prefill and mixed chunks as graphs too (run_chunk; off with MQB_GRAPHS=0)
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void *blas_ws = nullptr;
  // The cuBLAS products of decode buckets (a graph's batch: the layers' products above
  // tile_max_b rows, the LM head above gemv_max_b) run the cuBLASLt algorithm blas_pick timed
  // fastest on this model's weights: tuned while the model loads (warm_up), or at a shape's
  // first eager step where that did not see it. blas_tune false (MQB_BLAS_TUNE=0, debug
  // "blas_tune" 0) runs cublasGemmEx's default. tune_here: a decode step is being run
  // (decode_step sets it; prefill's token counts vary, so its products keep the default).
  // blas_log (MQB_BLAS_LOG=1) prints each choice.
  bool blas_tune = true, tune_here = false, blas_log = false;
  // warm: warm_up's prefills and graph captures at load (MQB_WARMUP, default 1; 0 in the CPU
  // emulation).
  bool warm = true;
  bool warming = false;  // inside warm_up: upload_meta marks every step's tokens unreal (n_real 0)
  std::unique_ptr<blaspick::Picker> picker;
  std::vector<void *> allocs;

  void *emb = nullptr;    // T [V, H]
  float *wpe = nullptr;   // learned positions [maxpos, H] (NULL: none)
  void *lm = nullptr;     // T [V, H] (== emb when tied)
  float *normf_w = nullptr, *normf_b = nullptr;
  float *inv_freq = nullptr;
  std::vector<Layer> layers;

  // activations
  float *res = nullptr, *qkv = nullptr, *qbuf = nullptr, *mlp = nullptr, *logits = nullptr;
  void *attn = nullptr, *xbuf = nullptr;
  unsigned long long *keys = nullptr;
  int *meta = nullptr;      // device: tok[Tcap] pos[Tcap] slot[Tcap] rows[Rcap] n_real
  // Sampling on the device (mqb_forward_sampled): per logits row 1/T (0 = greedy) and a key.
  float *samp_temp = nullptr, *samp_temp_h = nullptr;
  unsigned long long *samp_key = nullptr, *samp_key_h = nullptr;
  int *meta_h = nullptr;    // pinned host mirror
  unsigned long long *keys_h = nullptr;
  std::map<int, GraphEntry> graphs;
  // hidden_states' output for the step being run (NULL: the step ends in the LM head).
  float *hidden_out = nullptr;

  int *d_tok() const { return meta; }
  int *d_pos() const { return meta + Tcap; }
  int *d_slot() const { return meta + 2 * Tcap; }
  int *d_rows() const { return meta + 3 * Tcap; }
  // n_real: the step's tokens that are requests' (or logits_all's); the rows after them are a
  // graph's padding, and a warm-up step has none. A family's per-token counters (a router's
  // tokens per expert) count only these, so a served metric never counts padding or warm-up.
  int *d_n_real() const { return meta + 3 * Tcap + Rcap; }
  int &n_real_h() { return meta_h[3 * Tcap + Rcap]; }
  size_t meta_count() const { return (size_t)3 * Tcap + Rcap + 1; }

  void *dmalloc(size_t bytes) {
    void *p = nullptr;
    ck(cudaMalloc(&p, bytes ? bytes : 16), fmt("cudaMalloc of %zu bytes", bytes).c_str());
    allocs.push_back(p);
    return p;
  }

  void clear_graphs() {
    for (auto &kv : graphs)
      if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    graphs.clear();
  }

  ~mqb_model() {
    if (dev >= 0) cudaSetDevice(dev);
    if (stream) cudaStreamSynchronize(stream);
    clear_graphs();
    picker.reset();
    if (blas) cublasDestroy(blas);
    for (void *p : allocs) cudaFree(p);
    if (meta_h) cudaFreeHost(meta_h);
    if (ptile_h) cudaFreeHost(ptile_h);
    if (keys_h) cudaFreeHost(keys_h);
    if (samp_temp_h) cudaFreeHost(samp_temp_h);
    if (samp_key_h) cudaFreeHost(samp_key_h);
    fstate.reset();
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace mqcuda {

// Defined in backend.cu, for the families' files: cfg_from_hparams resolves a family's Cfg
// (configure included); rope_setup makes RoPE's frequencies and table (load hooks call it).
Cfg cfg_from_hparams(const std::string &family, const mqb_hparam *hp, int n);
Cfg cfg_from_hparams(const CudaFamily &fam, const mqb_hparam *hp, int n);
void rope_setup(mqb_model &m);
// A pipeline's text encoder is the shared decoder: open_decoder opens m with the hooks of fam
// (which need not be registered: a pipeline's own loader, its tensor prefix and faults), and
// serve false skips what serving needs (warm-up, graphs); hidden_states then runs a prompt and
// leaves the residual stream after the last loaded layer (n x hidden fp32) in a device buffer.
void open_decoder(mqb_model &m, const CudaFamily &fam, const mqb_model_params *p, bool serve);
void hidden_states(mqb_model &m, const int32_t *ids, int32_t n, float *out);

}  // namespace mqcuda
