// backend.cu: the CUDA device backend (libmodelqual_cuda.so) behind native/include/mq_backend.h:
// its core, which names no family.
//
// Why this shape: the CPU runtime dlopen()s this library only when an engine is opened with device
// "cuda", so the CPU build never needs CUDA. The runtime keeps scheduling, top-k/top-p sampling and
// stop rules; the library owns the weights (converted from the bundle's stored precision to the
// compute precision at load), the KV cache of every slot, the forward pass and the token choice of
// greedy and plain temperature requests (argmax, or Gumbel-max sampling fused into the same
// reduction: mqb_forward_sampled). It keeps one path per step shape, the fastest measured on the
// H200; the experiments that chose it and their journal live in lab/cuda.
//
// Layout (as ggml-cuda and the CPU runtime):
//   backend.cu        this file: the C ABI, device and stream setup, slots, the KV cache, chunked
//                     prefill, CUDA graphs, the decode step driver and the family registry
//   decoder.cuh       the shared decoder's forward pass (run_tokens), shaped by Cfg
//   model.cuh         mqb_model, Cfg, CudaFamily and MQB_REGISTER_FAMILY
//   launch.cuh        kernel launches (programmatic dependent launch, clusters)
//   weights.cuh       tensors by name and their upload
//   env.cuh           the environment: Knobs and MODELQUAL_FAULTS
//   ops/*.cuh         the kernels, one op (or a small set) a file: embed, prep (norms, activations,
//                     bias), gemv, tile (tensor-core products of few rows), linear (which product
//                     runs where), rotary (q/k norm, RoPE, K/V append), attention, decode_attn,
//                     prefill_attn, argmax (and sampling), vision (a vision tower's kernels),
//                     image (a diffusion pipeline's kernels)
//   native/models/<family>.cu   each family's GPU model: it registers itself (MQB_REGISTER_FAMILY),
//                     names its tensors, sets the decoder's shape and hooks, and composes the ops
//
// Numerics: weights and GEMM inputs in the chosen precision T, every product accumulated in fp32
// (cuBLAS CUBLAS_COMPUTE_32F, and fmaf in our kernels); the residual stream, norms, RoPE, softmax
// and logits stay fp32. The KV cache is stored in T.
//
// A decode step (every entry appends one token) runs as a CUDA graph captured per batch bucket
// (1, 2, 4, 8, ...); the kernels use programmatic dependent launch on Hopper so a kernel's start
// overlaps the previous kernel's tail. Settings: the few environment knobs (env.cuh). The lab
// (lab/cuda) compiles its debug entry points into its own builds of this library.
//
// Thread safety: one model is driven by one thread at a time (the engine's worker).
#include "decoder.cuh"
#include "env.cuh"
#include "weights.cuh"

namespace mqcuda {

// registry holds the families registered at static initialisation (MQB_REGISTER_FAMILY).
std::vector<CudaFamily> &registry() {
  static std::vector<CudaFamily> r;
  return r;
}

bool register_family(const CudaFamily &f) {
  registry().push_back(f);
  return true;
}

const CudaFamily *find_family(const std::string &name) {
  for (const CudaFamily &f : registry())
    if (name == f.name) return &f;
  return nullptr;
}

// known_families: the registered names, for messages.
std::string known_families(bool text) {
  std::string s;
  for (const CudaFamily &f : registry())
    if ((f.load != nullptr) == text) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// text_family: the registered family name runs through the shared decoder, or Fail.
const CudaFamily *text_family(const std::string &name) {
  const CudaFamily *f = find_family(name);
  if (!f || !f->configure || !f->load)
    throw Fail(fmt("cuda backend: family %s is not supported; known: %s", name.c_str(), known_families(true).c_str()));
  return f;
}

// cfg_from_hparams reads the hyper-parameters the runtime's family resolve step produced (Go
// parses config.json once; the family file applies transformers' defaults and refuses what it
// does not implement), so this backend never parses JSON; the family's configure hook sets the
// decoder's shape and reads its own.
Cfg cfg_from_hparams(const std::string &family, const mqb_hparam *hp, int n) {
  return cfg_from_hparams(*text_family(family), hp, n);
}

Cfg cfg_from_hparams(const CudaFamily &fam, const mqb_hparam *hp, int n) {
  const CudaFamily *f = &fam;
  const std::string family = fam.name;
  const HParams h{hp, n, family};
  Cfg g;
  g.family = family;
  g.V = h.pos("vocab_size");
  g.H = h.pos("hidden_size");
  g.L = h.pos("num_layers");
  g.nh = h.pos("num_heads");
  g.nkv = h.pos("num_kv_heads");
  g.D = h.pos("head_dim");
  g.I = h.pos("intermediate_size");
  g.maxpos = h.pos("max_positions");
  g.eps = h.num("norm_eps");
  g.theta = h.num("rope_theta");
  g.tied = h.num("tie_word_embeddings") != 0;
  g.attn_bias = h.num("attention_bias") != 0;
  g.inv_layer_scale = h.num("scale_attn_by_inverse_layer_idx") != 0;
  if (g.nh % g.nkv != 0)
    throw Fail(fmt("cuda backend: num_heads %d is not a multiple of num_kv_heads %d", g.nh, g.nkv));
  f->configure(g, h);
  return g;
}

// rope_setup makes RoPE's inverse frequencies (theta, head_dim) and the (cos, sin) table of every
// position the cache holds (head_pre): 2 MB at 4,096 positions of head_dim 128; with token_rope,
// Tcap rows more for a chunk's per-token rows (rope_rows). Families with rotary positions call it
// from their load hook.
void rope_setup(mqb_model &m) {
  const Cfg &c = m.c;
  const int64_t D = c.D;
  std::vector<float> inv(D / 2);
  for (int64_t j = 0; j < D / 2; ++j)
    inv[j] = 1.0f / powf((float)c.theta, (float)(2 * j) / (float)D);
  if (!c.inv_freq.empty()) {
    if ((int64_t)c.inv_freq.size() != D / 2)
      throw Fail(fmt("cuda backend: %zu rotary frequencies for head_dim %d", c.inv_freq.size(), (int)D));
    inv = c.inv_freq;
  }
  m.inv_freq = static_cast<float *>(m.dmalloc(inv.size() * sizeof(float)));
  ck(cudaMemcpy(m.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice), "inv_freq upload");
  const int half = (int)(D / 2);
  m.rope_tab = static_cast<float2 *>(
      m.dmalloc(sizeof(float2) * (size_t)(m.max_ctx + (c.token_rope ? m.Tcap : 0)) * half));
  launch(m, rope_table_kernel, dim3(std::min((m.max_ctx * half + 255) / 256, 1024)), dim3(256), 0,
         (const float *)m.inv_freq, half, m.max_ctx, m.rope_tab);
  ck(cudaStreamSynchronize(m.stream), "rope table");
}

// chunk_begin asks the family whether the chunk of Tn tokens in meta_h has its own rows.
bool chunk_begin(mqb_model &m, int Tn) { return m.fam->chunk_begin && m.fam->chunk_begin(m, Tn); }

// RowsOff clears mqb_model::rows_on when the chunk ends, also when it throws.
struct RowsOff {
  bool &on;
  ~RowsOff() { on = false; }
};

}  // namespace mqcuda

namespace mqcuda {

// set_kernel_attrs lets the attention kernels use more than 48 KB of shared memory when the
// head shape needs it (large head_dim and many query heads per KV head).
template <typename T>
void set_kernel_attrs(int gm, size_t att_bytes) {
  if (att_bytes <= 48 * 1024) return;
  launch_gm(gm, [&](auto g) {
    for (auto k : {attention_kernel<T, decltype(g)::value, false>, attention_kernel<T, decltype(g)::value, true>})
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_bytes),
         "cudaFuncSetAttribute(attention)");
    constexpr int G = decltype(g)::value;
    for (auto k : {decode_attn_kernel<T, G, false>, decode_attn_kernel<T, G, true>, decode_attn_kernel<T, G, true, true>,
                   decode_attn_kernel<T, G, true, true, 4>})
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_bytes),
         "cudaFuncSetAttribute(decode attention)");
  });
}

// tile_setup turns the tile kernel's products on for a bf16/fp16 model: the workspace holds the
// partials of any K split of the layers' products (one per 32 columns, more than tile_cfg
// makes), and the kernel may use the shared memory of the widest K range.
template <typename T>
void tile_setup(mqb_model &m) {
  if constexpr (!std::is_same<T, float>::value) {
    const Cfg &c = m.c;
    const int QKV = (c.nh + 2 * c.nkv) * c.D, MLP = c.mlp_width(), AO = c.nh * c.D;
    const int shapes[4][2] = {{QKV, c.H}, {c.H, AO}, {MLP, c.H}, {c.H, c.I}};  // N, K of qkv, o, up, down
    size_t ws = 0;
    for (const auto &nk : shapes) {
      m.sk_max_n = std::max(m.sk_max_n, nk[0]);
      ws = std::max(ws, (size_t)(nk[1] / 32) * sk::MAXB * nk[0]);
    }
    m.sk_ws_floats = ws;
    m.sk_ws = static_cast<float *>(m.dmalloc(sizeof(float) * ws));
    const int nc = (m.sk_max_n + 15) / 16;
    m.sk_cnt = static_cast<unsigned int *>(m.dmalloc(sizeof(unsigned int) * nc));
    ck(cudaMemset(m.sk_cnt, 0, sizeof(unsigned int) * nc), "cudaMemset(sk_cnt)");
    const size_t tsmem = sk::tile_smem_bytes(4, sk::TKR_MAX);
    for (int nb = 1; nb <= 4; ++nb)
      by_octets(nb, [&](auto o) {
        ck(cudaFuncSetAttribute(sk::tile_kernel<T, decltype(o)::value>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)tsmem),
           "cudaFuncSetAttribute(tile)");
      });
    m.sk_on = true;
  }
}

// CHUNK_GRAPH_MAX is the largest prefill or mixed chunk that runs as a graph (run_chunk). On the
// H200 (lab/cuda/NOTES.md) a graph saved 0.35-0.45 ms of launches a chunk: 21 % of a 128-token
// prompt's 2.1 ms, 12 % of a prompt beside 26 decodes, 4-8 % of 1,024-4,096 prompt tokens; where
// padding to a coarse bucket added a third to the tokens it lost 5 %.
constexpr int CHUNK_GRAPH_MAX = 512;

// chunk_bucket is the token count a graphed chunk of Tn <= CHUNK_GRAPH_MAX tokens runs at: 16,
// 32, 48 or 64, then a multiple of 64 (at most 63 tokens of padding).
int chunk_bucket(int Tn) { return Tn <= 64 ? (Tn + 15) / 16 * 16 : (Tn + 63) / 64 * 64; }

void decode_step(mqb_model &m, int n, const int32_t *slots, const int32_t *tokens, const int32_t *start_pos,
                 const float *temp, const uint64_t *rkey, float *logits_out, int32_t *argmax_out);
void run_graphed(mqb_model &m, GraphEntry *&ge, const std::function<void()> &body);
void run_chunk(mqb_model &m, int Tn, int R, bool want_keys, float *logits_out, int32_t *argmax_out,
               const std::vector<int> &row_entry);

// warm_up runs, while the model loads, what a server's first requests would otherwise pay for.
// On a freshly opened Qwen3-0.6B-shaped model (H200, mqb_bench.py coldstart) the first
// 128-token prompt took 16.5 ms against 2.3 warm, the first call of 31 prompts beside a decode
// 33.0 against 15.0 (the kernels' modules loaded and cuBLAS's heuristics asked at first use),
// and the first decode step of 32 sequences 4.5 against 1.4 (its graph captured): a served burst
// of 32 requests waited for all of it. So, with warm (MQB_WARMUP, default 1):
// - one prompt of every power-of-two length up to Tcap, then a chunk of up to Tcap tokens made
//   of one decode entry and max_batch - 1 prompts (what a burst of requests beside a running
//   one makes), all on the scratch slot, token 0 at every position so their K/V rows agree;
// - every graph bucket's decode step, eagerly (blas_pick tunes its cuBLAS products) and again
//   to capture its graph, once for each number of attention splits the bucket can take over
//   max_context (attn_splits: up to 16 at one sequence), so no graph is captured mid-request
//   (steps that hand out logits share these graphs, see graph_key);
// - with mixed_graphs, every graphed prefill or mixed chunk bucket (run_chunk: up to
//   CHUNK_GRAPH_MAX tokens, a power of two of rows up to max_batch), eagerly and captured.
// With warm 0 only the eager decode steps run, and only with blas_tune (the CPU emulation's
// default: an emulated launch takes about half a second, and its tuning checks need only these
// steps).
void warm_up(mqb_model &m) {
  struct Warming {
    bool &on;
    explicit Warming(bool &f) : on(f) { on = true; }
    ~Warming() { on = false; }
  } warming(m.warming);
  if (m.warm) {
    std::vector<int> row_entry;
    // chunk runs one chunk of the given entries (token count, first position), each a
    // sequence on the scratch slot with its own row.
    auto chunk = [&](const std::vector<std::pair<int, int>> &entries) {
      int Tn = 0, rows = 0;
      for (const auto &[n, start] : entries) {
        for (int j = 0; j < n; ++j, ++Tn) {
          m.meta_h[Tn] = 0;
          m.meta_h[m.Tcap + Tn] = start + j;
          m.meta_h[2 * m.Tcap + Tn] = m.scratch;
        }
        m.meta_h[3 * m.Tcap + rows] = Tn - 1;
        set_samp(m, rows++, -1, nullptr, nullptr);
      }
      row_entry.assign(rows, 0);
      run_chunk(m, Tn, rows, true, nullptr, nullptr, row_entry);
    };
    const int top = std::min(m.Tcap, m.max_ctx);
    for (int Tn = 2;; Tn *= 2) {
      chunk({{std::min(Tn, top), 0}});
      if (Tn >= top) break;
    }
    const int R = std::min(m.max_batch, m.Rcap) - 1;  // a burst of prompts beside a decode
    if (R > 0 && top > R) {
      std::vector<std::pair<int, int>> burst(R + 1, {(top - 1) / R, 0});
      burst[0] = {1, 1};  // the decode entry: one token at position 1
      chunk(burst);
    }
    // Every graphed chunk bucket (run_chunk): Tg tokens in rows prompts, all of one token but
    // the last (so the tiles fit the graph's grid), eagerly, then captured.
    for (int Tg = 16; m.use_graphs && m.mixed_graphs && Tg <= std::min({CHUNK_GRAPH_MAX, m.Tcap, m.max_ctx});
         Tg = chunk_bucket(Tg + 1))
      for (int rows = 1; rows <= std::min(m.max_batch, Tg); rows *= 2) {
        std::vector<std::pair<int, int>> entries(rows, {1, 0});
        entries.back().first = Tg - (rows - 1);
        for (int k = 0; k < 2; ++k) chunk(entries);
      }
  }
  std::vector<int> bs;
  for (int n = 1; n <= m.max_batch; ++n)
    if (bs.empty() || bucket_for(m, n) != bs.back()) bs.push_back(bucket_for(m, n));
  for (int b : bs) {
    if (!m.warm && !m.blas_tune) break;
    std::vector<int> at = {1};  // the first context length at which each split count appears
    for (int nmax = 2, last = attn_splits(m, b, 1); m.warm && nmax <= m.max_ctx; ++nmax) {
      const int s = attn_splits(m, b, nmax);
      if (s != last) at.push_back(nmax);
      last = s;
    }
    const std::vector<int32_t> slots(b, m.scratch), zeros(b, 0);
    for (int nmax : at) {
      const std::vector<int32_t> pos(b, nmax - 1);
      for (int k = 0; k < (m.warm && m.use_graphs ? 2 : 1); ++k)  // eager (tunes), then captured
        decode_step(m, b, slots.data(), zeros.data(), pos.data(), nullptr, nullptr, nullptr, nullptr);
    }
  }
}

// kv_rows_for: the KV cache's rows a slot. Without a sliding window every position of the
// context (max_ctx). With a window W a query at p reads keys p - W < k <= p only (window_lo), so
// a slot keeps a ring (kv_row: position p in row p mod rows) that is sized for the worst chunk: a
// chunk appends up to Tcap positions of one slot (forward, logits_all and hidden_states cut at
// Tcap; a graph's padding is at most Tcap on the scratch slot) before its first query reads back
// to that query's window start, so the oldest key still read, p0 - W + 1, must not share a row
// with the newest written, p0 + Tcap - 1: rows >= W + Tcap - 1. Like vLLM's sliding-window block
// release (blocks wholly before p - W + 1 go back to the pool) this bounds a long sequence's
// cache by the window, not by its length; here the bound is fixed per slot at open, so the
// memory of max_batch sequences of any length is allocated once: for a 4,096-token window with
// the default 2,048-token chunks, 6,143 rows a slot instead of a 32,768-token context's.
int kv_rows_for(int window, int Tcap, int max_ctx) {
  return window > 0 ? std::min(max_ctx, window + Tcap - 1) : max_ctx;
}

void open_model(mqb_model &m, const mqb_model_params *p) {
  if (!p) throw Fail("cuda backend: params is NULL");
  if (p->abi_version != MQB_ABI_VERSION)
    throw Fail(fmt("cuda backend: ABI version %d requested, this library implements %d; rebuild with make cuda",
                   p->abi_version, MQB_ABI_VERSION));
  open_decoder(m, *text_family(p->family ? p->family : ""), p, true);
}

void open_decoder(mqb_model &m, const CudaFamily &fam, const mqb_model_params *p, bool serve) {
  m.fam = &fam;
  m.c = cfg_from_hparams(fam, p->hparams, p->n_hparams);
  const std::string prec = p->precision ? p->precision : "bf16";
  if (prec == "bf16") m.dt = DT_BF16;
  else if (prec == "fp16") m.dt = DT_F16;
  else if (prec == "fp32") m.dt = DT_F32;
  else throw Fail(fmt("cuda backend: precision %s is not supported; use bf16, fp16 or fp32", prec.c_str()));
  if (p->max_batch <= 0 || p->max_context <= 0)
    throw Fail(fmt("cuda backend: max_batch %d and max_context %d must be positive", p->max_batch, p->max_context));
  if (p->max_context > m.c.maxpos)
    throw Fail(fmt("cuda backend: max_context %d exceeds the model's %d positions", p->max_context, m.c.maxpos));
  const Cfg &c = m.c;
  const int CH = m.dt == DT_F32 ? 4 : 8;
  const int G = c.nh / c.nkv;
  if (G > MAXG) throw Fail(fmt("cuda backend: %d query heads per KV head is more than the supported %d", G, MAXG));
  if (c.D % CH != 0 || c.D / CH > ATT_THREADS)
    throw Fail(fmt("cuda backend: head_dim %d must be a multiple of %d and at most %d", c.D, CH, ATT_THREADS * CH));
  if (c.H % CH != 0 || c.I % CH != 0 || (c.nh * c.D) % CH != 0)
    throw Fail(fmt("cuda backend: hidden %d, intermediate %d and heads*head_dim %d must be multiples of %d", c.H,
                   c.I, c.nh * c.D, CH));

  m.dev = p->device_index;
  ck(cudaSetDevice(m.dev), fmt("cudaSetDevice(%d)", m.dev).c_str());
  ck(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, m.dev), "cudaDeviceGetAttribute");
  int major = 0;
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, m.dev), "cudaDeviceGetAttribute");
  m.max_batch = p->max_batch;
  m.max_ctx = p->max_context;
  m.slots = m.max_batch + 1;  // the last one is the scratch slot (logits_all, graph padding)
  m.scratch = m.max_batch;
  // Prefill and mixed steps run in chunks of at most Tcap tokens (MQB_TCAP, default 2048): 8 or
  // 32 prompts of 128 tokens prefill in 7-10 % less time than in chunks of 512, whose
  // every chunk reads all the weights again; 4,096 measured the same as 2,048.
  const Knobs kn = knobs();
  m.Tcap = std::max(m.max_batch, std::max(64, kn.tcap));
  m.Rcap = std::max(64, m.max_batch);
  m.use_graphs = kn.graphs && serve;
  m.mixed_graphs = kn.graphs;
  m.use_pdl = major >= 9;
  m.attn_split = 0;
  m.fused_attn = 1;
  const size_t es = dt_size(m.dt);
  const int Kmax = std::max(std::max(c.H, c.I), c.nh * c.D);
  int gb = 4;
  while (gb > 0 && (size_t)gb * Kmax * es > 48 * 1024) --gb;
  m.gemv_max_b = std::max(0, gb);

  ck(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ckb(cublasCreate(&m.blas), "cublasCreate");
  ckb(cublasSetStream(m.blas, m.stream), "cublasSetStream");
  const size_t ws = 64u << 20;
  m.blas_ws = m.dmalloc(ws);
  ckb(cublasSetWorkspace(m.blas, m.blas_ws, ws), "cublasSetWorkspace");
  ckb(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  m.blas_tune = kn.blas_tune;
  m.warm = kn.warmup && serve;
  m.blas_log = kn.blas_log;
  m.picker.reset(new blaspick::Picker(m.blas, m.stream, m.blas_ws, ws));

  m.layers.resize(c.L);
  if (m.fam->open) m.fam->open(m, p);
  m.fam->load(m, TensorMap(p->tensors, p->n_tensors));

  // KV cache: one allocation for all layers, kv_rows rows a slot.
  m.kv_rows = kv_rows_for(c.window, m.Tcap, m.max_ctx);
  const size_t per = (size_t)m.slots * m.kv_rows * c.nkv * c.D * es;
  unsigned char *kv = static_cast<unsigned char *>(m.dmalloc(per * 2 * c.L));
  for (int l = 0; l < c.L; ++l) {
    m.layers[l].kc = kv + per * (2 * l);
    m.layers[l].vc = kv + per * (2 * l + 1);
  }
  ck(cudaMemset(kv, 0, per * 2 * c.L), "cudaMemset(kv)");

  const int QKV = (c.nh + 2 * c.nkv) * c.D;
  const int MLP = c.mlp_width();
  m.res = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * c.H));
  m.qkv = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * QKV));
  m.qbuf = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * c.nh * c.D));
  m.mlp = static_cast<float *>(m.dmalloc(sizeof(float) * m.Tcap * MLP));
  m.attn = m.dmalloc(es * m.Tcap * c.nh * c.D);
  m.xbuf = m.dmalloc(es * (size_t)m.Tcap * Kmax);
  m.logits = static_cast<float *>(m.dmalloc(sizeof(float) * (size_t)m.Rcap * c.V));
  m.keys = static_cast<unsigned long long *>(m.dmalloc(sizeof(unsigned long long) * m.Rcap));
  m.part_acc = static_cast<float *>(m.dmalloc(sizeof(float) * ATT_SPLIT_MAX_T * c.nkv * ATT_SPLIT_MAX * G * c.D));
  m.part_ml = static_cast<float *>(m.dmalloc(sizeof(float) * ATT_SPLIT_MAX_T * c.nkv * ATT_SPLIT_MAX * G * 2));
  m.att_cnt = static_cast<unsigned int *>(m.dmalloc(sizeof(unsigned int) * ATT_SPLIT_MAX_T * c.nkv));
  ck(cudaMemset(m.att_cnt, 0, sizeof(unsigned int) * ATT_SPLIT_MAX_T * c.nkv), "cudaMemset(att_cnt)");
  m.meta = static_cast<int *>(m.dmalloc(sizeof(int) * m.meta_count()));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.meta_h), sizeof(int) * m.meta_count()), "cudaMallocHost");
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.keys_h), sizeof(unsigned long long) * m.Rcap), "cudaMallocHost");
  m.samp_temp = static_cast<float *>(m.dmalloc(sizeof(float) * m.Rcap));
  m.samp_key = static_cast<unsigned long long *>(m.dmalloc(sizeof(unsigned long long) * m.Rcap));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.samp_temp_h), sizeof(float) * m.Rcap), "cudaMallocHost");
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.samp_key_h), sizeof(unsigned long long) * m.Rcap), "cudaMallocHost");
  memset(m.samp_temp_h, 0, sizeof(float) * m.Rcap);
  memset(m.samp_key_h, 0, sizeof(unsigned long long) * m.Rcap);
  memset(m.meta_h, 0, sizeof(int) * m.meta_count());
  m.ptile = static_cast<pa::Tile *>(m.dmalloc((sizeof(pa::Tile) + sizeof(int)) * m.Tcap));
  ck(cudaMallocHost(reinterpret_cast<void **>(&m.ptile_h), (sizeof(pa::Tile) + sizeof(int)) * m.Tcap),
     "cudaMallocHost");

  const int gm = gm_for(G);
  // The decode attention's park (attn_push) where it fits beside attn_smem in one block (sm_90:
  // all of an SM's 227 KB, sk::SMEM_SM).
  const size_t park = sizeof(float) * ATT_CLUSTER_MAX * attn_park(gm, c.D);
  m.attn_park_fits = attn_smem(gm, c.D) + park <= sk::SMEM_SM;
  const size_t ab = attn_smem(gm, c.D) + (m.attn_park_fits ? park : 0);
  switch (m.dt) {
    case DT_BF16: set_kernel_attrs<__nv_bfloat16>(gm, ab); tile_setup<__nv_bfloat16>(m); break;
    case DT_F16: set_kernel_attrs<__half>(gm, ab); tile_setup<__half>(m); break;
    default: set_kernel_attrs<float>(gm, ab); break;
  }
  ck(cudaDeviceSynchronize(), "load");
  if (serve) warm_up(m);
}

// chunk_graph_key names a graphed prefill or mixed chunk's graph (run_chunk): negative, apart
// from the decode steps' keys.
int chunk_graph_key(const mqb_model &m, int Tg, int Rg, bool keys) {
  return -1 - ((Tg * (m.Rcap + 1) + Rg) * 2 + (keys ? 1 : 0));
}

// run_chunk: uploads the meta already in meta_h, runs, and copies back keys/logits of R rows.
// With graphs and mixed_graphs (on unless MQB_GRAPHS=0) a chunk of up to CHUNK_GRAPH_MAX
// tokens runs as the graph of its bucket (chunk_bucket tokens, a power of two of rows): a served
// point's prefill and mixed steps (prompts beside running decodes) otherwise launch their ~300
// kernels one by one. warm_up captures every bucket's graph at load. The padding
// tokens are a sequence of their own on the scratch slot from position 0, the padding rows
// repeat the last token's; neither is read back.
void run_chunk(mqb_model &m, int Tn, int R, bool want_keys, float *logits_out, int32_t *argmax_out,
               const std::vector<int> &row_entry) {
  GraphEntry *ge = nullptr;
  const int Tg = chunk_bucket(Tn);
  int Rg = 1;
  while (Rg < R) Rg *= 2;
  Rg = std::min(Rg, m.Rcap);
  // Tiles of at most pa::BQ tokens, one sequence each: at most Tg / BQ + one more per entry
  // (R rows, a prompt continued in the next chunk, the padding); one-token tiles at most one
  // per entry.
  const bool ones = ones_apart(m, Rg);
  const TileGrid G{std::min(Tg, Tg / pa::BQ + Rg + 2), ones ? std::min(Tg, Rg + 2) : 0};
  m.rows_on = chunk_begin(m, Tn);  // a chunk with the family's own rows runs eagerly
  RowsOff rows_off{m.rows_on};
  if (m.use_graphs && m.mixed_graphs && !m.rows_on && Tg <= std::min(CHUNK_GRAPH_MAX, m.Tcap) &&
      Tg - Tn <= m.max_ctx) {
    for (int j = Tn; j < Tg; ++j) {
      m.meta_h[j] = 0;
      m.meta_h[m.Tcap + j] = j - Tn;
      m.meta_h[2 * m.Tcap + j] = m.scratch;
    }
    for (int r = R; r < Rg; ++r) {
      m.meta_h[3 * m.Tcap + r] = Tg - 1;
      set_samp(m, r, -1, nullptr, nullptr);
    }
    if (prefill_tiles(m, Tg, ones, G) == G) ge = &m.graphs[chunk_graph_key(m, Tg, Rg, want_keys)];
  }
  m.n_real_h() = Tn;
  upload_meta(m);
  if (ge) run_graphed(m, ge, [&] { run_dispatch(m, Tg, Rg, want_keys, false, &G); });
  else run_dispatch(m, Tn, R, want_keys, false);
  ck(cudaGetLastError(), "forward");
  if (want_keys)
    ck(cudaMemcpyAsync(m.keys_h, m.keys, sizeof(unsigned long long) * R, cudaMemcpyDeviceToHost, m.stream),
       "argmax download");
  ck(cudaStreamSynchronize(m.stream), "forward");
  if (ge) ge->warmed = true;
  const size_t V = m.c.V;
  for (int r = 0; r < R; ++r) {
    const int e = row_entry[r];
    if (argmax_out) argmax_out[e] = decode_key(m.keys_h[r]);
    if (logits_out)
      ck(cudaMemcpy(logits_out + (size_t)e * V, m.logits + (size_t)r * V, sizeof(float) * V, cudaMemcpyDeviceToHost),
         "logits download");
  }
}

int bucket_for(const mqb_model &m, int n) {
  int b = 1;
  while (b < n) b *= 2;
  return std::min(b, m.max_batch);
}

// graph_key names a decode step's graph in mqb_model::graphs: a graph bakes in the batch bucket,
// and the attention splits. A step that hands out logits (a top-k or top-p request's, sampled on
// the host) is the same graph as a greedy one, and shares it, so such a request neither waits
// for a capture nor adds a graph (decode_step).
int graph_key(int b, int splits) { return b * (ATT_SPLIT_MAX + 1) + splits; }

// run_graphed runs body (a step's launches on m.stream) through the graph in *ge: eagerly until
// the caller has marked it warmed (after the first run: modules load, cuBLAS asks its
// heuristics), then captured and instantiated once, then replayed. ge NULL runs body eagerly. A capture that fails
// (a driver without PDL-in-graph support, say) must not fail the request: graphs are switched
// off for this model, said on stderr, *ge is set to NULL and body runs eagerly.
void run_graphed(mqb_model &m, GraphEntry *&ge, const std::function<void()> &body) {
  if (ge && ge->warmed && !ge->exec) {
    std::string why;
    ck(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      body();
    } catch (const std::exception &e) {
      why = e.what();
    }
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(m.stream, &g);
    if (e != cudaSuccess && why.empty()) why = fmt("cudaStreamEndCapture: %s", cudaGetErrorString(e));
    if (why.empty()) {
#if defined(CUDART_VERSION) && CUDART_VERSION < 12000  // CUDA 11's signature (compile checks with nvcc 11.8)
      e = cudaGraphInstantiate(&ge->exec, g, nullptr, nullptr, 0);
#else
      e = cudaGraphInstantiate(&ge->exec, g, 0);
#endif
      if (e != cudaSuccess) {
        why = fmt("cudaGraphInstantiate: %s", cudaGetErrorString(e));
        ge->exec = nullptr;
      }
    }
    if (g) cudaGraphDestroy(g);
    if (!why.empty()) {
      (void)cudaGetLastError();
      fprintf(stderr, "cuda backend: CUDA graphs disabled, running eagerly: %s\n", why.c_str());
      m.clear_graphs();
      m.use_graphs = false;
      ge = nullptr;
    }
  }
  if (ge && ge->exec) {
    ck(cudaGraphLaunch(ge->exec, m.stream), "cudaGraphLaunch");
    return;
  }
  body();
  ck(cudaGetLastError(), "forward");
}

void decode_step(mqb_model &m, int n, const int32_t *slots, const int32_t *tokens, const int32_t *start_pos,
                 const float *temp, const uint64_t *rkey, float *logits_out, int32_t *argmax_out) {
  struct Tuning {  // mqb_model::tune_here for this step only, also when it throws
    bool &on;
    explicit Tuning(bool &f) : on(f) { on = true; }
    ~Tuning() { on = false; }
  } tuning(m.tune_here);
  const bool graphs = m.use_graphs;
  const int b = graphs ? std::max(n, bucket_for(m, n)) : n;
  int nmax = 1;
  for (int i = 0; i < n; ++i) nmax = std::max(nmax, start_pos[i] + 1);
  m.step_splits = attn_splits(m, b, nmax);
  for (int i = 0; i < b; ++i) {
    const bool real = i < n;
    m.meta_h[i] = real ? tokens[i] : 0;
    m.meta_h[m.Tcap + i] = real ? start_pos[i] : 0;
    m.meta_h[2 * m.Tcap + i] = real ? slots[i] : m.scratch;
    m.meta_h[3 * m.Tcap + i] = i;
    set_samp(m, i, real ? i : -1, temp, rkey);
  }
  if (chunk_begin(m, b)) throw Fail("cuda backend: a decode step reached an image prompt");  // forward routes those
  m.n_real_h() = n;
  upload_meta(m);
  GraphEntry *ge = graphs ? &m.graphs[graph_key(b, m.step_splits)] : nullptr;
  run_graphed(m, ge, [&] { step_dispatch(m, b, logits_out != nullptr); });
  ck(cudaMemcpyAsync(m.keys_h, m.keys, sizeof(unsigned long long) * n, cudaMemcpyDeviceToHost, m.stream),
     "argmax download");
  if (logits_out)
    ck(cudaMemcpyAsync(logits_out, m.logits, sizeof(float) * (size_t)n * m.c.V, cudaMemcpyDeviceToHost, m.stream),
       "logits download");
  ck(cudaStreamSynchronize(m.stream), "decode step");
  if (ge) ge->warmed = true;
  if (argmax_out)
    for (int i = 0; i < n; ++i) argmax_out[i] = decode_key(m.keys_h[i]);
}

void forward(mqb_model &m, int n, const int32_t *slots, const int32_t *n_tokens, const int32_t *tokens,
             const int32_t *start_pos, const float *temp, const uint64_t *rkey, float *logits_out,
             int32_t *argmax_out) {
  if (n <= 0) return;
  if (n > m.max_batch) throw Fail(fmt("cuda backend: forward of %d entries exceeds max_batch %d", n, m.max_batch));
  if (!slots || !n_tokens || !tokens || !start_pos) throw Fail("cuda backend: forward: NULL argument");
  std::vector<char> seen(m.max_batch, 0);
  bool decode = true;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= m.max_batch)
      throw Fail(fmt("cuda backend: entry %d: slot %d outside [0, %d)", i, slots[i], m.max_batch));
    if (seen[slots[i]]) throw Fail(fmt("cuda backend: entry %d: slot %d appears twice in one step", i, slots[i]));
    seen[slots[i]] = 1;
    if (n_tokens[i] <= 0) throw Fail(fmt("cuda backend: entry %d: n_tokens %d must be positive", i, n_tokens[i]));
    if (start_pos[i] < 0 || (int64_t)start_pos[i] + n_tokens[i] > m.max_ctx)
      throw Fail(fmt("cuda backend: entry %d: positions %d..%d exceed max_context %d", i, start_pos[i],
                     start_pos[i] + n_tokens[i] - 1, m.max_ctx));
    for (int j = 0; j < n_tokens[i]; ++j) {
      const int tk = tokens[total + j];
      if (tk < 0 || tk >= m.c.V)
        throw Fail(fmt("cuda backend: entry %d: token %d outside the vocabulary of %d", i, tk, m.c.V));
    }
    total += n_tokens[i];
    if (n_tokens[i] != 1 || (m.fam->in_prompt && m.fam->in_prompt(m, slots[i], start_pos[i]))) decode = false;
  }
  if (decode && n <= m.Tcap) {
    decode_step(m, n, slots, tokens, start_pos, temp, rkey, logits_out, argmax_out);
    return;
  }
  // General path (prefill or mixed): pack tokens into chunks of at most Tcap; an entry longer
  // than the room left is continued in the next chunk (its KV cache makes that exact).
  const bool want_keys = argmax_out != nullptr;
  int Tn = 0, R = 0;
  std::vector<int> row_entry;
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    int done = 0;
    while (done < n_tokens[i]) {
      const int take = std::min(n_tokens[i] - done, m.Tcap - Tn);
      for (int j = 0; j < take; ++j) {
        m.meta_h[Tn + j] = tokens[off + done + j];
        m.meta_h[m.Tcap + Tn + j] = start_pos[i] + done + j;
        m.meta_h[2 * m.Tcap + Tn + j] = slots[i];
      }
      Tn += take;
      done += take;
      if (done == n_tokens[i]) {
        m.meta_h[3 * m.Tcap + R] = Tn - 1;
        set_samp(m, R, i, temp, rkey);
        row_entry.push_back(i);
        ++R;
      }
      if (Tn == m.Tcap) {
        run_chunk(m, Tn, R, want_keys, logits_out, argmax_out, row_entry);
        Tn = 0;
        R = 0;
        row_entry.clear();
      }
    }
    off += n_tokens[i];
  }
  if (Tn > 0) run_chunk(m, Tn, R, want_keys, logits_out, argmax_out, row_entry);
}

void logits_all(mqb_model &m, const int32_t *ids, int32_t n, float *out) {
  if (n <= 0) return;
  if (!ids || !out) throw Fail("cuda backend: logits_all: NULL argument");
  if (n > m.max_ctx) throw Fail(fmt("cuda backend: logits_all of %d tokens exceeds max_context %d", n, m.max_ctx));
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= m.c.V)
      throw Fail(fmt("cuda backend: logits_all: token %d at %d outside the vocabulary of %d", ids[i], i, m.c.V));
  const int chunk = std::min(m.Tcap, m.Rcap);
  for (int s = 0; s < n; s += chunk) {
    const int cn = std::min(chunk, n - s);
    for (int j = 0; j < cn; ++j) {
      m.meta_h[j] = ids[s + j];
      m.meta_h[m.Tcap + j] = s + j;
      m.meta_h[2 * m.Tcap + j] = m.scratch;
      m.meta_h[3 * m.Tcap + j] = j;
      set_samp(m, j, -1, nullptr, nullptr);
    }
    m.n_real_h() = cn;
    upload_meta(m);
    m.rows_on = chunk_begin(m, cn);  // the scratch slot's image (mqb_set_image), if any
    RowsOff rows_off{m.rows_on};
    run_dispatch(m, cn, cn, false, false);
    ck(cudaGetLastError(), "logits_all");
    ck(cudaMemcpyAsync(out + (size_t)s * m.c.V, m.logits, sizeof(float) * (size_t)cn * m.c.V,
                       cudaMemcpyDeviceToHost, m.stream),
       "logits download");
    ck(cudaStreamSynchronize(m.stream), "logits_all");
  }
}

// hidden_states: the residual stream after the model's last layer (no final norm) at every
// position of ids, n x hidden fp32 into the device buffer out, on the scratch slot in chunks of
// Tcap tokens; synchronous. A pipeline's text encoder (open_decoder) is this call.
void hidden_states(mqb_model &m, const int32_t *ids, int32_t n, float *out) {
  if (n <= 0) return;
  if (!ids || !out) throw Fail("cuda backend: hidden_states: NULL argument");
  if (n > m.max_ctx) throw Fail(fmt("cuda backend: hidden_states of %d tokens exceeds max_context %d", n, m.max_ctx));
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= m.c.V)
      throw Fail(fmt("cuda backend: hidden_states: token %d at %d outside the vocabulary of %d", ids[i], i, m.c.V));
  for (int s = 0; s < n; s += m.Tcap) {
    const int cn = std::min(m.Tcap, n - s), R = std::min(cn, m.Rcap);
    for (int j = 0; j < cn; ++j) {
      m.meta_h[j] = ids[s + j];
      m.meta_h[m.Tcap + j] = s + j;
      m.meta_h[2 * m.Tcap + j] = m.scratch;
    }
    for (int j = 0; j < R; ++j) {
      m.meta_h[3 * m.Tcap + j] = j;
      set_samp(m, j, -1, nullptr, nullptr);
    }
    m.n_real_h() = cn;
    upload_meta(m);
    m.hidden_out = out + (size_t)s * m.c.H;
    run_dispatch(m, cn, R, false, false);
    m.hidden_out = nullptr;
    ck(cudaGetLastError(), "hidden_states");
  }
  ck(cudaStreamSynchronize(m.stream), "hidden_states");
}

}  // namespace mqcuda


// ---------------------------------------------------------------------------------------------
// C ABI

extern "C" {

int32_t mqb_abi_version(void) { return MQB_ABI_VERSION; }

// mqb_families lists the registered families (MQB_REGISTER_FAMILY in native/models/*.cu).
const char *const *mqb_families(void) {
  static const std::vector<const char *> names = [] {
    std::vector<const char *> v;
    for (const CudaFamily &f : registry()) v.push_back(f.name);
    v.push_back(nullptr);
    return v;
  }();
  return names.data();
}

int mqb_model_open(const mqb_model_params *p, mqb_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "cuda backend: out is NULL");
    return 1;
  }
  *out = nullptr;
  std::unique_ptr<mqb_model> m(new mqb_model());
  m->dev = p ? p->device_index : 0;
  try {
    open_model(*m, p);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  *out = m.release();
  return 0;
}

void mqb_model_close(mqb_model *m) { delete m; }

int32_t mqb_vocab_size(const mqb_model *m) { return m ? m->c.V : 0; }

int mqb_forward(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens, const int32_t *tokens,
                const int32_t *start_pos, float *logits_out, int32_t *argmax_out, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    forward(*m, n, slots, n_tokens, tokens, start_pos, nullptr, nullptr, logits_out, argmax_out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_forward_sampled(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens,
                        const int32_t *tokens, const int32_t *start_pos, const float *temperature,
                        const uint64_t *rng_key, int32_t *token_out, float *logits_out, char *err,
                        size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  if (!token_out || !temperature || !rng_key) {
    set_err(err, errlen, "cuda backend: mqb_forward_sampled: temperature, rng_key and token_out are required");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    forward(*m, n, slots, n_tokens, tokens, start_pos, temperature, rng_key, logits_out, token_out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_logits_all(mqb_model *m, const int32_t *ids, int32_t n, float *out, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    ck(cudaSetDevice(m->dev), "cudaSetDevice");
    logits_all(*m, ids, n, out);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

// The cache needs no clearing: attention reads only positions below the ones a request writes,
// and the runtime restarts a slot at position 0. A family with per-slot state (an image) drops it.
int mqb_routing(mqb_model *m, uint64_t *out, int64_t cap, int32_t *layers, int32_t *experts, char *err,
                size_t errlen) {
  *layers = 0;
  *experts = 0;
  if (!m || !m->fam->routing) return 0;
  try {
    cudaSetDevice(m->dev);
    return m->fam->routing(*m, out, cap, layers, experts);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
}

void mqb_slot_reset(mqb_model *m, int32_t slot) {
  if (m && m->fam->slot_reset) m->fam->slot_reset(*m, slot);
}

int mqb_set_images(mqb_model *m, int32_t slot, const float *pixels, int64_t n_pixels, const int32_t *grids,
                   int32_t n_images, const int32_t *prompt, int32_t n, char *err, size_t errlen) {
  if (!m) {
    set_err(err, errlen, "cuda backend: model is NULL");
    return 1;
  }
  try {
    if (!m->fam->set_image)
      throw Fail(fmt("cuda backend: family %s does not take images", m->c.family.c_str()));
    if (!grids || n_images < 1) throw Fail("cuda backend: set_images: grids and n_images >= 1 are required");
    m->fam->set_image(*m, slot, pixels, n_pixels, grids, n_images, prompt, n);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_set_image(mqb_model *m, int32_t slot, const float *pixels, int64_t n_pixels, int32_t grid_t, int32_t grid_h,
                  int32_t grid_w, const int32_t *prompt, int32_t n, char *err, size_t errlen) {
  const int32_t grid[3] = {grid_t, grid_h, grid_w};
  return mqb_set_images(m, slot, pixels, n_pixels, grid, 1, prompt, n, err, errlen);
}

int64_t mqb_vision_ns(mqb_model *m, int32_t slot) {
  if (!m || !m->fam->vision_ns || slot < 0 || slot > m->max_batch) return 0;
  try {
    cudaSetDevice(m->dev);
    return m->fam->vision_ns(*m, slot);
  } catch (const std::exception &) {
    return 0;  // a time is a report, never a reason to fail the request that asks for it
  }
}

// The image entry points open the registered image family the runtime names (p->family).
struct mqb_image {
  const CudaFamily *fam = nullptr;
  void *im = nullptr;
};

int mqb_image_open(const mqb_model_params *p, mqb_image **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "cuda backend: out is NULL");
    return 1;
  }
  *out = nullptr;
  try {
    if (!p) throw Fail("cuda backend: params is NULL");
    if (p->abi_version != MQB_ABI_VERSION)
      throw Fail(fmt("cuda backend: ABI version %d requested, this library implements %d; rebuild with make cuda",
                     p->abi_version, MQB_ABI_VERSION));
    const std::string name = p->family ? p->family : "";
    const CudaFamily *f = find_family(name);
    if (!f || !f->image_open)
      throw Fail(fmt("cuda backend: family %s has no text-to-image model in this library", name.c_str()));
    std::unique_ptr<mqb_image> m(new mqb_image());
    m->fam = f;
    m->im = f->image_open(p);
    *out = m.release();
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

int mqb_image_generate(mqb_image *m, const mqb_image_args *a, char *err, size_t errlen) {
  if (!m || !a) {
    set_err(err, errlen, "cuda backend: model or args is NULL");
    return 1;
  }
  try {
    m->fam->image_generate(m->im, a);
  } catch (const std::exception &e) {
    set_err(err, errlen, e.what());
    return 1;
  }
  return 0;
}

void mqb_image_close(mqb_image *m) {
  if (!m) return;
  m->fam->image_close(m->im);
  delete m;
}

}  // extern "C"
