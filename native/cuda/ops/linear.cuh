// linear.cuh: the products of a layer (out = prep(x) W^T + bias): the choice between the fused
// GEMV, the tile kernel (with the RMSNorm and SwiGLU fused) and cuBLAS
// (blas_pick's tuned algorithm), and the attention launches' shared rules (splits, tiles).
#pragma once
#include "../launch.cuh"
#include "gemv.cuh"

namespace mqcuda {

template <typename T>
cudaDataType_t cuda_type();
template <>
inline cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <>
inline cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
inline cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

// shape_time is the rough time (us) of a product launch that tile_cfg ranks shapes
// by: the weights (weight_bytes) stream at DRAM speed over the whole GPU, the busiest SM pulls its
// blocks' weights and staged input (sm_bytes) at one SM's share of L2 bandwidth, and a K split over
// Z blocks adds the partials' round trips through L2 (write, count, then ceil(Z / ZU) loads).
inline double shape_time(double weight_bytes, double sm_bytes, int Z) {
  constexpr double dram = 4.0e6, sm_bw = 1.0e5, lat = 0.7;  // bytes/us, bytes/us per SM, us
  double t = std::max(weight_bytes / dram, sm_bytes / sm_bw);
  if (Z > 1) t += lat * (2 + (Z + sk::ZU - 1) / sk::ZU);
  return t;
}

// split_fits: the partials of a K split over Z blocks fit the workspace (always, for the shapes
// tile_setup sized it for; a debug-forced shape that does not is skipped).
inline bool split_fits(const mqb_model &m, int Z, int N) { return Z == 1 || (size_t)Z * sk::MAXB * N <= m.sk_ws_floats; }

// tile_cfg chooses sk::tile_kernel's launch shape for B rows through W [N, K] by shape_time, with
// two blocks per SM where shared memory allows. rms: the input rows are normalized while staged
// (sk::TileFuse::xr: every block reads its rows' K fp32 values); swiglu: W is [gate; up] and a
// block takes 8 RT rows of each half. Z = 0: no shape fits.
inline sk::TCfg tile_cfg(const mqb_model &m, int N, int K, int B, bool rms = false, bool swiglu = false) {
  sk::TCfg best;
  double best_t = 0;
  if (N % 16 != 0 || (rms && (K % 4 != 0 || K > sk::RMS_KMAX))) return best;
  const int nb = (B + 7) / 8;
  for (int RT : {8, 4, 2}) {
    if (m.tile_rt && RT != m.tile_rt) continue;
    const int KS = sk::WARPS / RT, KC = 64 * KS;
    if (K % KC || (swiglu && (N / 2) % (8 * RT) != 0)) continue;
    for (int Z = 1; Z <= K / KC; ++Z) {
      if ((m.tile_z && Z != m.tile_z) || K % Z || (K / Z) % KC || K / Z > sk::TKR_MAX || !split_fits(m, Z, N))
        continue;
      sk::TCfg c;
      c.RT = RT;
      c.KS = KS;
      c.Z = Z;
      c.Kr = K / Z;
      const int per_sm = std::max(1, std::min(2, (int)(sk::SMEM_SM / sk::tile_smem_bytes(nb, c.Kr))));
      const int rounds = (c.blocks(N) + m.sms * per_sm - 1) / (m.sms * per_sm);
      const double block_bytes = (double)RT * 16 * c.Kr * 2 + (double)nb * 8 * (rms ? K * 4 : c.Kr * 2);
      const double t = shape_time((double)N * K * 2, block_bytes * per_sm * rounds, Z);
      if (!best.Z || t < best_t * 0.999) {
        best = c;
        best_t = t;
      }
    }
  }
  return best;
}

// by_octets calls f with std::integral_constant<int, nb> (1..4: octets of input rows), the NB
// template argument of the tensor-core product kernels.
template <typename F>
void by_octets(int nb, const F &f) {
  switch (nb) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// tile_map describes W [N, K] to the copy engine for sk::tile_kernel: boxes of rows x 64 elements
// (128 bytes: the 128-byte swizzle's width), rows past N read as zero. Made once per matrix and
// box height. The CPU emulation's TmaMap is the matrix itself.
#ifndef MQB_HOST_TEST
template <typename T>
const sk::TmaMap &tile_map(mqb_model &m, const T *W, int N, int K, int rows) {
  const auto key = std::make_tuple(static_cast<const void *>(W), N, K, rows);
  const auto it = m.tmaps.find(key);
  if (it != m.tmaps.end()) return it->second;
  CUtensorMap tm;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N};
  const cuuint64_t strides[1] = {(cuuint64_t)K * sizeof(T)};
  const cuuint32_t box[2] = {64, (cuuint32_t)rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = cuTensorMapEncodeTiled(
      &tm, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<T *>(W), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw Fail(fmt("cuTensorMapEncodeTiled failed (error %d) for a %d x %d weight", (int)r, N, K));
  return m.tmaps.emplace(key, tm).first->second;
}
#else
template <typename T>
sk::TmaMap tile_map(mqb_model &, const T *W, int N, int K, int rows) {
  return sk::TmaMap{W, K, N, rows};
}
#endif

// tile_launch launches sk::tile_kernel in shape c (with act, its boxes are half as high: a gate
// box and an up box per K slice).
template <typename T>
void tile_launch(mqb_model &m, const sk::TCfg &c, const T *W, int N, int K, const T *X, int B, float *out, int acc,
                 const sk::TileFuse<T> &f0) {
  const int nb = (B + 7) / 8;
  sk::TileFuse<T> f = f0;
  const auto &tm = tile_map(m, W, N, K, (f.act ? 8 : 16) * c.RT);
  const int clz = cluster_of(m.tile_cluster, c.Z);  // a row block's Z splits
  // tile_push: the park for the pushed partials, where it fits without costing a block per SM
  // (tile_cfg's choice assumed tile_smem_bytes) within the kernels' shared-memory attribute.
  const size_t base = sk::tile_smem_bytes(nb, c.Kr), park = sk::tile_park_bytes(nb, c.RT, c.Z);
  const bool push = clz > 1 && m.tile_push && base + park <= sk::tile_smem_bytes(4, sk::TKR_MAX) &&
                    sk::SMEM_SM / (base + park) >= std::min<size_t>(2, sk::SMEM_SM / base);
  auto go = [&](auto kernel) {
    launch_cl(m, dim3(1, clz, 1), kernel, dim3(c.row_blocks(N), c.Z), dim3(sk::THREADS), base + (push ? park : 0), tm,
              N, K, X, B, out, acc, c.RT, c.KS, c.Kr, m.tile_pre, push ? 2 : clz > 1 ? 1 : 0, m.sk_ws, m.sk_cnt, f);
  };
  by_octets(nb, [&](auto o) { go(sk::tile_kernel<T, decltype(o)::value>); });
}

// tile_shape: sk::tile_kernel's launch shape for a product of B rows through W [N, K] where the
// tile kernel takes it (bf16/fp16 weights, on, within tile_max_b rows, a layer's shape that
// tile_cfg fits); Z = 0 where it does not.
inline sk::TCfg tile_shape(const mqb_model &m, int B, int N, int K) {
  if (!m.sk_on || B > m.tile_max_b || N > m.sk_max_n) return sk::TCfg{};
  return tile_cfg(m, N, K, B);
}

// tile_linear runs out (+)= X W^T through the tile kernel where it applies (tile_shape); false:
// the caller uses cuBLAS.
template <typename T>
bool tile_linear(mqb_model &m, const T *X, int B, int K, const T *W, int N, float *out, bool accumulate) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    const sk::TCfg c = tile_shape(m, B, N, K);
    if (!c.Z) return false;
    tile_launch<T>(m, c, W, N, K, X, B, out, accumulate ? 1 : 0, sk::TileFuse<T>{});
    return true;
  }
}

// tile_fused runs a product whose input rows are the RMSNorm of the fp32 residual (qkv, gate/up)
// through sk::tile_kernel with the norm made while the rows are staged, for the decode batches
// of up to fuse_max_b rows: no prep kernel. With act, W is [gate; up] and the kernel
// writes silu(gate) * up into act [B, N / 2] (T) instead of out, which makes the down
// projection's input: no SwiGLU prep either. false: it does not apply (the caller runs the
// product unfused).
template <typename T>
bool tile_fused(mqb_model &m, const std::string &role, const PrepArgs<T> &a, int B, int K, const T *W, int N,
                float *out, T *act) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    if (!m.sk_on || B > m.fuse_max_b || N > m.sk_max_n || a.mode != PREP_RMS || a.rows ||
        a.ld != K)
      return false;
    const sk::TCfg c = tile_cfg(m, N, K, B, true, act != nullptr);
    if (!c.Z) return false;
    sk::TileFuse<T> f;
    f.xr = a.src;
    f.nw = a.w;
    f.eps = a.eps;
    f.act = act;
    f.compact = B <= m.rms_compact_b && K <= 4 * sk::THREADS ? 1 : 0;
    tile_launch<T>(m, c, W, N, K, nullptr, B, out, 0, f);
    return true;
  }
}

int bucket_for(const mqb_model &m, int n);

// layer_weights: W and the same product's weights in every other layer (W alone where it is not
// a layer's, the LM head's), which blas_pick cycles through so that each timed call reads its
// weights from DRAM.
inline std::vector<const void *> layer_weights(const mqb_model &m, const void *W) {
  for (void *Layer::*f : {&Layer::w_qkv, &Layer::w_o, &Layer::w_up, &Layer::w_down}) {
    std::vector<const void *> ws;
    bool has = false;
    for (const Layer &ly : m.layers) {
      if (ly.*f) ws.push_back(ly.*f);  // a layer whose family replaces the MLP (CudaFamily::ffn) has none
      has = has || ly.*f == W;
    }
    if (has) return ws;
  }
  return {W};
}

// gemm: out[B, N] (+)= X[B, K] · W[N, K]^T on cuBLAS (fp32 out): a decode bucket's shape with
// the algorithm blas_pick chose for it (mqb_model::blas_tune), any other with cublasGemmEx's
// default. cuBLAS launches its kernels itself, so in a captured graph the edge into one is plain,
// not programmatic like the edges into ours, and it must stay so: cuBLAS's kernels do not wait for
// the kernel before them (lab/cuda/NOTES.md made those edges programmatic: batch 32 decoded 9 %
// faster and parity failed, max|d| 1.05, graph != eager).
template <typename T>
void gemm(mqb_model &m, const std::string &r, const T *W, const T *X, int B, int K, int N, float *out, bool acc) {
  const blaspick::Shape s{cuda_type<T>(), N, K, B, acc};
  const blaspick::Plan *p = nullptr;
  if (m.blas_tune && m.tune_here && B == bucket_for(m, B)) {
    p = m.picker->find(s);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (!p) ck(cudaStreamIsCapturing(m.stream, &cap), "cudaStreamIsCapturing");  // asked only before a tuning
    if (!p && cap == cudaStreamCaptureStatusNone) {  // a capture follows the bucket's eager step
      p = m.picker->tune(s, layer_weights(m, W));
      if (m.blas_log) fprintf(stderr, "cuda backend: blas %s %s\n", r.c_str(), p->what.c_str());
    }
  }
  m.picker->run(s, p, W, X, out);
}

// linear: out[B, N] (+)= prep(a)[B, K] · W[N, K]^T + bias, fp32 out. bf16/fp16 layer products of
// up to tile_max_b rows run on the tile kernel (tile.cuh): with the RMSNorm fused
// (tile_fused), or with an input that needs no prep (tile_linear); other products of small B
// use the fused GEMV kernel; larger B makes the T input with prep_kernel and runs the tile kernel
// or cuBLAS.
template <typename T>
void linear(mqb_model &m, const char *role, const PrepArgs<T> &a0, int B, int K, const void *Wv, int N,
            const float *bias, float *out, bool accumulate, unsigned long long *keys, Samp samp = Samp{}) {
  if (B <= 0) return;  // a prefill chunk that ends no entry has no logits rows
  const std::string r = role;
  const T *W = static_cast<const T *>(Wv);
  PrepArgs<T> a = a0;
  if (!bias && !keys && !accumulate && tile_fused<T>(m, r, a, B, K, W, N, out, nullptr)) return;
  const bool plain = a.mode == PREP_PLAIN && !a.rows && a.ld == K;  // the input rows as they are
  // The GEMV takes small batches where it fuses something (the input's prep, a bias, the argmax);
  // a layer's product with none of them goes to the tile kernel, which beats it at 1-4 rows on the
  // H200 (batch 1 937 against 895 tok/s, 4 3,804 against 1,836: lab/cuda/NOTES.md).
  if (B <= m.gemv_max_b && !(plain && !bias && !keys && tile_shape(m, B, N, K).Z)) {
    const int blocks = std::max(1, std::min((N + 7) / 8, m.sms * 4));
    const size_t smem = (size_t)B * K * sizeof(T);
    const int acc = accumulate ? 1 : 0;
    switch (B) {
      case 1: launch(m, gemv_kernel<T, 1>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      case 2: launch(m, gemv_kernel<T, 2>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      case 3: launch(m, gemv_kernel<T, 3>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
      default: launch(m, gemv_kernel<T, 4>, dim3(blocks), dim3(256), smem, a, K, W, N, bias, out, acc, keys, samp); break;
    }
    return;
  }
  const T *X;
  if (plain) {
    X = a.srcT;
  } else {
    const bool norm = a.mode == PREP_RMS || a.mode == PREP_LN;
    // prep_vec4's rows: K, the stride and the base 4-float aligned, no row list.
    const bool v4 = m.prep_vec && (a.mode == PREP_SWIGLU || a.mode == PREP_GELU) && K % 4 == 0 &&
                    a.ld % 4 == 0 && !a.rows && reinterpret_cast<uintptr_t>(a.src) % 16 == 0;
    const int blocks = norm ? B
                       : (int)std::min<int64_t>(((int64_t)B * (v4 ? K / 4 : K) + 255) / 256, (int64_t)m.sms * 8);
    // One instance per mode: a kernel's code is fetched cold at each launch of a layer's chain,
    // so no launch carries another mode's (on the H200 batch 32 0.6 % faster; lab/cuda/NOTES.md).
    auto k = a.mode == PREP_RMS      ? (m.pre_params ? prep_kernel<T, PREP_RMS, true> : prep_kernel<T, PREP_RMS>)
             : a.mode == PREP_LN     ? prep_kernel<T, PREP_LN>
             : a.mode == PREP_SWIGLU ? (v4 ? prep_kernel<T, PREP_SWIGLU, false, true> : prep_kernel<T, PREP_SWIGLU>)
             : a.mode == PREP_GELU   ? (v4 ? prep_kernel<T, PREP_GELU, false, true> : prep_kernel<T, PREP_GELU>)
                                     : prep_kernel<T, PREP_PLAIN>;
    launch(m, k, dim3(blocks), dim3(256), 0, a, B, K, static_cast<T *>(m.xbuf));
    X = static_cast<const T *>(m.xbuf);
  }
  if (!tile_linear<T>(m, X, B, K, W, N, out, accumulate)) gemm<T>(m, r, W, X, B, K, N, out, accumulate);
  if (bias) {
    const int total = B * N;
    launch(m, add_bias_kernel, dim3(std::min((total + 255) / 256, m.sms * 8)), dim3(256), 0, out, bias, N, total);
  }
  if (keys) launch(m, argmax_kernel, dim3(std::max(1, std::min(64, (N + 4095) / 4096)), B), dim3(256), 0,
                   (const float *)out, N, keys, samp);
}

template <typename T>
PrepArgs<T> prep(int mode, const float *src, const T *srcT, int ld, const int *rows, const float *w,
                 const float *bb, float eps) {
  PrepArgs<T> a;
  a.mode = mode;
  a.src = src;
  a.srcT = srcT;
  a.ld = ld;
  a.rows = rows;
  a.w = w;
  a.bb = bb;
  a.eps = eps;
  return a;
}


// gm_for: the attention kernels' compile-time bound on query heads per KV head (1, 2, 4 or 8).
inline int gm_for(int G) { return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8; }

// launch_gm launches kern<GM> for the runtime bound gm (a generic lambda per kernel family).
template <typename F>
void launch_gm(int gm, const F &f) {
  switch (gm) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    default: f(std::integral_constant<int, 8>()); break;
  }
}

// flash_only: this model's attention steps with flash asked for go through attend_flash alone
// (flash_fits), so the attention kernels' instance without attend runs them: dead code too is
// fetched at each launch (on the H200 batch 1 4-5 % faster so; lab/cuda/NOTES.md).
template <typename T>
bool flash_only(const mqb_model &m, int D) {
  return flash_fits<T>(m.attn_flash, D);
}

// attn_splits: how many position splits decode_attn_kernel uses for a decode step of Tn tokens
// whose longest context is nmax positions (at most the sliding window's, Cfg::window, which is
// all a token reads): "attn_split" when set, else the more
// of two rules, in (token, KV head, split) blocks that fit the SMs:
//  - long contexts: splits of at least ATT_SPLIT_MIN_POS positions (lab/cuda/NOTES.md: 16 splits of
//    ~20 positions at batch 1 cost more in partials and the merge than they save);
//  - few items (a batch of 1-4 sequences): ATT_FEW_SPLITS, up to ATT_FEW_BLOCKS blocks in all,
//    of at least ATT_FEW_POS positions each. On the H200 (positions 32-332) 4 splits
//    made batch 1 5-6 % and batch 2 3 % faster (8 splits at batch 1 as 4; splits growing with
//    the positions, one per 64, 2 % slower than 4), while batch 8 lost 16 % with 4 and 1-2 % with 2.
inline int attn_splits(const mqb_model &m, int Tn, int nmax) {
  if (Tn > ATT_SPLIT_MAX_T) return 1;
  if (m.attn_split > 0) return m.attn_split;
  if (m.c.window > 0) nmax = std::min(nmax, m.c.window);
  const int items = std::max(1, Tn * m.c.nkv);
  const int fill = m.sms / items;
  const int len = (nmax + ATT_SPLIT_MIN_POS - 1) / ATT_SPLIT_MIN_POS;
  const int few =
      std::min(std::min(ATT_FEW_SPLITS, ATT_FEW_BLOCKS / items), (nmax + ATT_FEW_POS - 1) / ATT_FEW_POS);
  return std::max(1, std::min(ATT_SPLIT_MAX, std::min(fill, std::max(len, few))));
}

// TileGrid: a prefill or mixed chunk's attention grids (prefill_tiles): multi tiles through
// prefill_attn_kernel, one-token tiles (with prefill_one) through attention_kernel. A graphed
// chunk's are fixed sizes, the entries past the chunk's empty (run_chunk).
struct TileGrid {
  int multi = 0, one = 0;
  bool operator==(const TileGrid &o) const { return multi == o.multi && one == o.one; }
};

// ones_apart: whether a chunk of R rows sends its one-token tiles to attention_kernel (prefill_one).
inline bool ones_apart(const mqb_model &m, int R) { return m.prefill_one > 0 && R >= m.prefill_one; }

// prefill_tiles cuts the Tn tokens of the chunk in meta_h into pa::Tiles (runs of up to pa::BQ
// tokens of one slot at consecutive positions); with apart a run of one token is listed apart, by
// its token index, after the tiles. Pads both lists to pad (empty tiles, token -1), uploads them
// to m.ptile and returns their lengths.
inline TileGrid prefill_tiles(mqb_model &m, int Tn, bool apart, TileGrid pad = {}) {
  const int *pos = m.meta_h + m.Tcap, *slot = m.meta_h + 2 * m.Tcap;
  std::vector<int> &ones = m.ones_h;
  ones.clear();
  int n = 0;
  for (int i = 0; i < Tn;) {
    int k = 1;
    while (i + k < Tn && k < pa::BQ && slot[i + k] == slot[i] && pos[i + k] == pos[i] + k) ++k;
    if (k == 1 && apart) ones.push_back(i);
    else m.ptile_h[n++] = pa::Tile{i, k};
    i += k;
  }
  // A graphed chunk's launch has a fixed grid (run_chunk): the tiles past the chunk's are
  // empty, and their blocks return at once.
  while (n < pad.multi) m.ptile_h[n++] = pa::Tile{0, 0};
  while ((int)ones.size() < pad.one) ones.push_back(-1);
  std::memcpy(reinterpret_cast<int *>(m.ptile_h + n), ones.data(), sizeof(int) * ones.size());
  ck(cudaMemcpyAsync(m.ptile, m.ptile_h, sizeof(pa::Tile) * n + sizeof(int) * ones.size(), cudaMemcpyHostToDevice,
                     m.stream),
     "tile upload");
  return TileGrid{n, (int)ones.size()};
}

// prefill_attention launches pa::prefill_attn_kernel over the chunk's ntiles tiles (m.ptile) for
// layer ly's query heads (bf16/fp16 only; run_tokens checks pa::supported(D) first).

}  // namespace mqcuda
