// models/qwen3vl.cu: Qwen3VLForConditionalGeneration on CUDA (owner: qwen3vl family), the GPU side
// of models/qwen3vl.cc.
//
// Why here and not a second backend: Qwen3-VL's language model is the Qwen3 decoder that
// the core already runs (decoder.cuh: run_tokens; qwen3.cu names its tensors); what the family adds is an image encoder that runs once
// per request, three hooks into that decoder and 3-axis rotary positions. So the decoder is
// reused as it is (prefill chunks, decode graphs, sampling), and this file holds only:
//   - the vision tower (transformers 5.17's Qwen3VLVisionModel): patch embedding (Conv3d with
//     kernel = stride = [temporal 2, 16, 16], a linear map of the processor's flattened patches)
//     plus learned positions bilinearly interpolated on the host (fast_pos_embed_interpolate),
//     blocks (LayerNorm, fused qkv, 2-D rotary over head_dim/2 by (row, column), full
//     bidirectional attention over the image's patches, proj; LayerNorm, fc1,
//     gelu_pytorch_tanh, fc2), the 2x2 merger (LayerNorm per patch, four patches side by side,
//     fc1, exact GELU, fc2) and the DeepStack mergers (LayerNorm over the four patches) after the
//     blocks in deepstack_visual_indexes. Products through gemm() (cuBLAS, the weights at the
//     compute precision, fp32 accumulation); the residual stream, norms, rotary and softmax fp32.
//   - the decoder hooks (CudaFamily: chunk_begin, embed_rows, after_layer): image rows replace the placeholder tokens' embeddings,
//     DeepStack feature k is added to those rows after decoder layer k, and the rotary rows of
//     image tokens are made per token from their (t, h, w) positions (interleaved M-RoPE) in the
//     rows past max_ctx of mqb_model::rope_tab; later tokens rotate at position + rope delta
//     (get_rope_index), per slot (mqb_model::rope_delta), in decode graphs too.
// One or more images per sequence (mqb_set_images), each on its own grid: each image runs the
// tower alone (attention within the image, as transformers' cu_seqlens), its merged tokens and
// DeepStack features land at its placeholder run. The positions and the image-token checks are
// native/models/qwen3vl_layout.h, the CPU family's own function (transformers' goldens test it);
// the GPU parity gate (families/qwen3vl, label gpu) and lab/qwen3vl's emulation harness (this
// file against the CPU model) test this one. The tower's device time per slot is two events
// around the encode (TowerTimes, mqb_vision_ns).
//
// Faults (MODELQUAL_FAULTS; the CPU runtime's names): qwen3vl.drop_deepstack skips the DeepStack
// additions, qwen3vl.flat_rope and qwen3vl.shared_image_start move image positions (the layout's),
// qwen3vl.rope_theta_x10 and qwen3vl.drop_q_norm are the decoder's (qwen3.cu).
#include "../cuda/ops/linear.cuh"
#include "../cuda/ops/vision.cuh"
#include "../cuda/ops/vit.cuh"  // vis_linear, vis_act (shared with the other vision towers)
#include "qwen3.cuh"
#include "qwen3vl_layout.h"

#include <mutex>

namespace mqcuda {
namespace qwen3vl {
namespace {

// The vision tower's weights, the per-slot images and the chunk's image rows (m.fstate).
struct VisBlock {
  void *qkv_w = nullptr, *proj_w = nullptr, *fc1_w = nullptr, *fc2_w = nullptr;  // T, [out, in]
  float *qkv_b = nullptr, *proj_b = nullptr, *fc1_b = nullptr, *fc2_b = nullptr;
  float *n1w = nullptr, *n1b = nullptr, *n2w = nullptr, *n2b = nullptr;
};
struct VisMerger {
  float *nw = nullptr, *nb = nullptr, *fc1_b = nullptr, *fc2_b = nullptr;
  void *fc1_w = nullptr, *fc2_w = nullptr;
  bool post = false;  // LayerNorm over the four merged patches (DeepStack) rather than per patch
};
struct SlotImage {
  bool live = false, encoded = false;
  std::vector<float> pixels;             // the processor's patches, image after image [gh * gw, 3 * tp * p * p]
  std::vector<qwen3vl_layout::Grid> grids;  // per image
  std::vector<int> first;                // per image: its first merged token (first[images]: n_img)
  int n_img = 0, prompt_len = 0, delta = 0;
  std::vector<int32_t> pos3;             // per prompt position: (t, h, w)
  std::vector<int> img_index;            // per prompt position: image token index (over all images) or -1
  float *dev = nullptr;                  // [1 + deepstack][n_img][E]: embeddings, DeepStack features
  size_t dev_bytes = 0;
};
struct Vis {
  int vh = 0, depth = 0, heads = 0, vi = 0, p = 0, tp = 0, merge = 0, npos = 0, side = 0, image_token = 0;
  int s1 = 0, s2 = 0;                    // mrope_section h, w
  std::vector<int> deep;                 // deepstack_visual_indexes
  bool drop_deepstack = false;           // fault qwen3vl.drop_deepstack
  qwen3vl_layout::Options faults;        // qwen3vl.flat_rope, qwen3vl.shared_image_start
  void *pe_w = nullptr;
  float *pe_b = nullptr, *pos = nullptr;
  std::vector<VisBlock> blocks;
  VisMerger merger;
  std::vector<VisMerger> deep_mergers;
  std::vector<float> vinv;               // the vision rotary's inverse frequencies
  std::mutex mu;                         // slot and sdelta_h: set_image may run beside a step
  std::vector<SlotImage> slot;           // per KV slot (the scratch slot's last)
  TowerTimes times;                      // per KV slot: the tower's device time (mqb_vision_ns)
  std::vector<int> sdelta_h;             // per slot: rope delta (get_rope_index), mirrored in sdelta
  bool sdelta_dirty = false;
  int *sdelta = nullptr;                 // device [slots]
  // the chunk being run (vis_chunk_begin): per token the image row (NULL: none), its DeepStack
  // stride, its rotary row, its (t, h, w); device arrays of Tcap, host staging
  const float **src = nullptr;
  int *stride = nullptr, *rrow = nullptr, *pos3 = nullptr;
  std::vector<const float *> src_h;
  std::vector<int> stride_h, rrow_h, pos3_h;
  std::pair<void *, size_t> ws[8] = {};  // the tower's activations (vis_buf)
  ~Vis() {
    for (auto &s : slot)
      if (s.dev) cudaFree(s.dev);
    for (auto &b : ws)
      if (b.first) cudaFree(b.first);
  }
};

inline Vis &vis(mqb_model &m) { return *static_cast<Vis *>(m.fstate.get()); }


// vis_buf returns workspace i of at least bytes (grown, never shrunk; the vision tower's
// activations are sized by the largest image seen).
inline void *vis_buf(mqb_model &m, int i, size_t bytes) {
  auto &b = vis(m).ws[i];
  if (b.second < bytes) {
    if (b.first) ck(cudaFree(b.first), "cudaFree");
    b.first = nullptr;
    ck(cudaMalloc(&b.first, bytes), fmt("cudaMalloc of %zu bytes (vision)", bytes).c_str());
    b.second = bytes;
  }
  return b.first;
}

// vis_load reads the vision tower's tensors ("model.visual." less the "model." TensorMap strips).
void vis_load(mqb_model &m, const TensorMap &tm) {
  Vis &v = vis(m);
  const int64_t vh = v.vh, M = (int64_t)v.vh * v.merge * v.merge, K = 3LL * v.tp * v.p * v.p, E = m.c.H;
  const std::string pre = "visual.";
  const mqb_tensor *pw = tm.need(pre + "patch_embed.proj.weight", {vh, 3, v.tp, (int64_t)v.p * v.p});
  // The Conv3d weight [vh, 3, tp, p, p] (stored [vh, 3, tp, p*p]) is, row by row, the linear map
  // of a flattened patch.
  mqb_tensor flat = *pw;
  flat.ndim = 2;
  flat.shape[0] = vh;
  flat.shape[1] = K;
  v.pe_w = upload_matrix(m, {{&flat, vh, false}}, K);
  v.pe_b = upload_f32(m, {tm.need(pre + "patch_embed.proj.bias", {vh})});
  v.pos = upload_f32(m, {tm.need(pre + "pos_embed.weight", {(int64_t)v.npos, vh})});
  for (int l = 0; l < v.depth; ++l) {
    const std::string b = fmt("%sblocks.%d.", pre.c_str(), l);
    VisBlock B;
    B.n1w = upload_f32(m, {tm.need(b + "norm1.weight", {vh})});
    B.n1b = upload_f32(m, {tm.need(b + "norm1.bias", {vh})});
    B.n2w = upload_f32(m, {tm.need(b + "norm2.weight", {vh})});
    B.n2b = upload_f32(m, {tm.need(b + "norm2.bias", {vh})});
    B.qkv_w = upload_matrix(m, {{tm.need(b + "attn.qkv.weight", {3 * vh, vh}), 3 * vh, false}}, vh);
    B.qkv_b = upload_f32(m, {tm.need(b + "attn.qkv.bias", {3 * vh})});
    B.proj_w = upload_matrix(m, {{tm.need(b + "attn.proj.weight", {vh, vh}), vh, false}}, vh);
    B.proj_b = upload_f32(m, {tm.need(b + "attn.proj.bias", {vh})});
    B.fc1_w = upload_matrix(m, {{tm.need(b + "mlp.linear_fc1.weight", {(int64_t)v.vi, vh}), v.vi, false}}, vh);
    B.fc1_b = upload_f32(m, {tm.need(b + "mlp.linear_fc1.bias", {(int64_t)v.vi})});
    B.fc2_w = upload_matrix(m, {{tm.need(b + "mlp.linear_fc2.weight", {vh, (int64_t)v.vi}), vh, false}}, v.vi);
    B.fc2_b = upload_f32(m, {tm.need(b + "mlp.linear_fc2.bias", {vh})});
    v.blocks.push_back(B);
  }
  auto merger = [&](const std::string &p, int64_t nwidth) {
    VisMerger g;
    g.nw = upload_f32(m, {tm.need(p + "norm.weight", {nwidth})});
    g.nb = upload_f32(m, {tm.need(p + "norm.bias", {nwidth})});
    g.fc1_w = upload_matrix(m, {{tm.need(p + "linear_fc1.weight", {M, M}), M, false}}, M);
    g.fc1_b = upload_f32(m, {tm.need(p + "linear_fc1.bias", {M})});
    g.fc2_w = upload_matrix(m, {{tm.need(p + "linear_fc2.weight", {E, M}), E, false}}, M);
    g.fc2_b = upload_f32(m, {tm.need(p + "linear_fc2.bias", {E})});
    g.post = nwidth == M;
    return g;
  };
  v.merger = merger(pre + "merger.", vh);
  for (size_t k = 0; k < v.deep.size(); ++k) v.deep_mergers.push_back(merger(fmt("%sdeepstack_merger_list.%zu.", pre.c_str(), k), M));
  const int hd = v.vh / v.heads, dim = hd / 2;
  for (int j = 0; j < dim / 2; ++j) v.vinv.push_back((float)(1.0 / std::pow(10000.0, (double)(float)(2 * j) / dim)));
}

// vis_merge runs merger g over x [N, vh] (N a multiple of 4, each 2x2 block's patches
// consecutive) into out [N / 4, E].
template <typename T>
void vis_merge(mqb_model &m, const VisMerger &g, const float *x, int N, float *out) {
  const Vis &v = vis(m);
  const int M = v.vh * v.merge * v.merge, R = N / (v.merge * v.merge);
  T *xt = static_cast<T *>(vis_buf(m, 5, sizeof(T) * (size_t)N * v.vh));
  float *mu = static_cast<float *>(vis_buf(m, 6, sizeof(float) * (size_t)R * M));
  if (g.post) launch(m, vis_ln_kernel<T>, dim3(R), dim3(256), 0, x, M, (const float *)g.nw, (const float *)g.nb, 1e-6f, xt);
  else launch(m, vis_ln_kernel<T>, dim3(N), dim3(256), 0, x, v.vh, (const float *)g.nw, (const float *)g.nb, 1e-6f, xt);
  vis_linear<T>(m, "v.merger_fc1", xt, R, M, g.fc1_w, M, g.fc1_b, mu, false);
  vis_act<T>(m, mu, (size_t)R * M, 2, xt);
  vis_linear<T>(m, "v.merger_fc2", xt, R, M, g.fc2_w, m.c.H, g.fc2_b, out, false);
}

// vis_encode_one runs the vision tower over one image (gh x gw patches at pixels) into out:
// its merged embeddings at out, DeepStack feature k at out + (1 + k) * level floats. Each image
// runs alone, so attention stays within it, as Qwen3VLVisionModel's cu_seqlens keep it; every
// other step of the tower is per patch or per merged 2x2 block, which never straddles images.
template <typename T>
void vis_encode_one(mqb_model &m, const float *pixels, int gh, int gw, float *out, size_t level) {
  const Vis &v = vis(m);
  const int N = gh * gw, K = 3 * v.tp * v.p * v.p, vh = v.vh, mg = v.merge;
  const int hd = vh / v.heads, half = hd / 2, quarter = hd / 4;
  // Host: the patches in T, the interpolated positions' corners and weights, the 2-D rotary.
  std::vector<unsigned char> px((size_t)N * K * sizeof(T));
  for (size_t i = 0; i < (size_t)N * K; ++i) {
    if (std::is_same<T, float>::value) memcpy(px.data() + i * 4, &pixels[i], 4);
    else {
      uint16_t h = std::is_same<T, __nv_bfloat16>::value ? f2bf(pixels[i]) : f2h(pixels[i]);
      memcpy(px.data() + i * 2, &h, 2);
    }
  }
  auto lin = [&](int n) {  // torch.linspace(0, side - 1, n) in float32
    std::vector<float> r(n, 0.f);
    if (n == 1) return r;
    const float end = (float)(v.side - 1), step = end / (float)(n - 1);
    for (int i = 0; i < n; ++i) r[i] = i < n / 2 ? step * (float)i : end - step * (float)(n - 1 - i);
    return r;
  };
  const std::vector<float> hs = lin(gh), ws = lin(gw);
  std::vector<int> idx((size_t)N * 4);
  std::vector<float> wt((size_t)N * 4);
  std::vector<float2> cs((size_t)N * half);
  for (int i = 0, bh = 0; bh < gh / mg; ++bh)
    for (int bw = 0; bw < gw / mg; ++bw)
      for (int mh = 0; mh < mg; ++mh)
        for (int mw = 0; mw < mg; ++mw, ++i) {
          const int r = bh * mg + mh, c = bw * mg + mw;
          const float hv = hs[r], wv = ws[c];
          const int hf = (int)hv, wf = (int)wv, hc = std::min(hf + 1, v.side - 1), wc = std::min(wf + 1, v.side - 1);
          const float dh = hv - (float)hf, dw = wv - (float)wf;
          const float w4[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
          const int i4[4] = {hf * v.side + wf, hf * v.side + wc, hc * v.side + wf, hc * v.side + wc};
          for (int q = 0; q < 4; ++q) idx[(size_t)i * 4 + q] = i4[q], wt[(size_t)i * 4 + q] = w4[q];
          for (int j = 0; j < half; ++j) {
            const float ang = j < quarter ? (float)r * v.vinv[j] : (float)c * v.vinv[j - quarter];
            cs[(size_t)i * half + j] = make_float2((float)std::cos((double)ang), (float)std::sin((double)ang));
          }
        }
  const int W = std::max(std::max(K, v.vi), vh * mg * mg);
  T *xin = static_cast<T *>(vis_buf(m, 0, sizeof(T) * (size_t)N * W));
  float *x = static_cast<float *>(vis_buf(m, 1, sizeof(float) * (size_t)N * vh));
  float *qkv = static_cast<float *>(vis_buf(m, 2, sizeof(float) * (size_t)N * std::max(3 * vh, v.vi)));
  float *att = static_cast<float *>(vis_buf(m, 3, sizeof(float) * (size_t)N * vh));
  unsigned char *aux = static_cast<unsigned char *>(
      vis_buf(m, 4, (size_t)N * (4 * sizeof(int) + 4 * sizeof(float) + half * sizeof(float2))));
  int *d_idx = reinterpret_cast<int *>(aux);
  float *d_wt = reinterpret_cast<float *>(aux + (size_t)N * 4 * sizeof(int));
  float2 *d_cs = reinterpret_cast<float2 *>(aux + (size_t)N * 4 * (sizeof(int) + sizeof(float)));
  ck(cudaMemcpyAsync(xin, px.data(), px.size(), cudaMemcpyHostToDevice, m.stream), "image upload");
  ck(cudaMemcpyAsync(d_idx, idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice, m.stream), "image upload");
  ck(cudaMemcpyAsync(d_wt, wt.data(), wt.size() * sizeof(float), cudaMemcpyHostToDevice, m.stream), "image upload");
  ck(cudaMemcpyAsync(d_cs, cs.data(), cs.size() * sizeof(float2), cudaMemcpyHostToDevice, m.stream), "image upload");
  vis_linear<T>(m, "v.patch", xin, N, K, v.pe_w, vh, v.pe_b, x, false);
  launch(m, vis_pos_kernel, dim3(N), dim3(256), 0, x, vh, (const float *)v.pos, (const int *)d_idx, (const float *)d_wt);
  const float scale = 1.0f / std::sqrt((float)hd);
  // the bf16 rows of flash attention (vit_attention)
  __nv_bfloat16 *qkv16 = std::is_same<T, __nv_bfloat16>::value
                             ? static_cast<__nv_bfloat16 *>(vis_buf(m, 7, sizeof(__nv_bfloat16) * (size_t)N * 3 * vh))
                             : nullptr;
  for (int l = 0; l < v.depth; ++l) {
    const VisBlock &B = v.blocks[l];
    launch(m, vis_ln_kernel<T>, dim3(N), dim3(256), 0, (const float *)x, vh, (const float *)B.n1w, (const float *)B.n1b,
           1e-6f, xin);
    vis_linear<T>(m, "v.qkv", xin, N, vh, B.qkv_w, 3 * vh, B.qkv_b, qkv, false);
    launch(m, vis_rope_kernel, dim3(N), dim3(256), 0, qkv, v.heads, hd, (const float2 *)d_cs);
    vit_attention<T>(m, qkv, 1, N, v.heads, hd, scale, qkv16, att, xin);
    vis_linear<T>(m, "v.proj", xin, N, vh, B.proj_w, vh, B.proj_b, x, true);
    launch(m, vis_ln_kernel<T>, dim3(N), dim3(256), 0, (const float *)x, vh, (const float *)B.n2w, (const float *)B.n2b,
           1e-6f, xin);
    vis_linear<T>(m, "v.fc1", xin, N, vh, B.fc1_w, v.vi, B.fc1_b, qkv, false);
    vis_act<T>(m, qkv, (size_t)N * v.vi, 1, xin);
    vis_linear<T>(m, "v.fc2", xin, N, v.vi, B.fc2_w, vh, B.fc2_b, x, true);
    for (size_t k = 0; k < v.deep.size(); ++k)
      if (v.deep[k] == l) vis_merge<T>(m, v.deep_mergers[k], x, N, out + (1 + k) * level);
  }
  vis_merge<T>(m, v.merger, x, N, out);
}

// vis_encode runs the vision tower over every image of im into im.dev: [1 + deepstack][tokens][E]
// fp32 (the merged embeddings of all images, image after image, then each DeepStack feature).
template <typename T>
void vis_encode(mqb_model &m, SlotImage &im) {
  const Vis &v = vis(m);
  const int E = m.c.H;
  const size_t level = (size_t)im.n_img * E, need = sizeof(float) * (1 + v.deep.size()) * level;
  if (im.dev_bytes < need) {
    if (im.dev) ck(cudaFree(im.dev), "cudaFree");
    im.dev = nullptr;
    ck(cudaMalloc(reinterpret_cast<void **>(&im.dev), need), "cudaMalloc (image embeddings)");
    im.dev_bytes = need;
  }
  size_t off = 0;
  for (size_t k = 0; k < im.grids.size(); ++k) {
    const qwen3vl_layout::Grid &g = im.grids[k];
    vis_encode_one<T>(m, im.pixels.data() + off, g.h, g.w, im.dev + (size_t)im.first[k] * E, level);
    off += (size_t)g.count;
  }
  ck(cudaGetLastError(), "vision tower");
  im.encoded = true;
}

void vis_encode_dispatch(mqb_model &m, SlotImage &im) {
  switch (m.dt) {
    case DT_BF16: vis_encode<__nv_bfloat16>(m, im); break;
    case DT_F16: vis_encode<__half>(m, im); break;
    default: vis_encode<float>(m, im); break;
  }
}

// vis_open reads the tower's hyper-parameters (the runtime's qwen3vl resolve step names them)
// and allocates the per-slot and per-chunk state.
void vis_open(mqb_model &m, const mqb_model_params *p) {
  auto num = [&](const std::string &k) -> int {
    for (int i = 0; i < p->n_hparams; ++i)
      if (p->hparams[i].key && k == p->hparams[i].key && !p->hparams[i].str) return (int)p->hparams[i].value;
    throw Fail(fmt("cuda backend: hyper-parameter %s is missing; the runtime's qwen3vl resolve step must set it", k.c_str()));
  };
  m.fstate = std::make_shared<Vis>();
  Vis &v = vis(m);
  v.vh = num("vision_hidden_size");
  v.depth = num("vision_depth");
  v.heads = num("vision_num_heads");
  v.vi = num("vision_intermediate_size");
  v.p = num("vision_patch_size");
  v.tp = num("vision_temporal_patch_size");
  v.merge = num("vision_merge_size");
  v.npos = num("vision_num_position_embeddings");
  v.side = (int)std::lround(std::sqrt((double)v.npos));
  v.image_token = num("image_token_id");
  for (int k = 0, n = num("vision_deepstack_count"); k < n; ++k) v.deep.push_back(num(fmt("vision_deepstack_%d", k)));
  v.s1 = num("mrope_section_h");
  v.s2 = num("mrope_section_w");
  v.drop_deepstack = fault("qwen3vl.drop_deepstack");
  v.faults.flat_rope = fault("qwen3vl.flat_rope");
  v.faults.shared_start = fault("qwen3vl.shared_image_start");
  const int hd = v.vh / v.heads;
  if (v.vh % v.heads || hd % 4 || hd > 128)
    throw Fail(fmt("cuda backend: vision head_dim %d must be a multiple of 4 and at most 128", hd));
  if ((int)v.deep.size() > m.c.L) throw Fail("cuda backend: more DeepStack features than decoder layers");
  v.slot.resize(m.slots);
  v.times.resize(m.slots);
  v.sdelta_h.assign(m.slots, 0);
  v.sdelta = static_cast<int *>(m.dmalloc(sizeof(int) * m.slots));
  ck(cudaMemset(v.sdelta, 0, sizeof(int) * m.slots), "cudaMemset(sdelta)");
  v.src = static_cast<const float **>(m.dmalloc(sizeof(float *) * m.Tcap));
  v.stride = static_cast<int *>(m.dmalloc(sizeof(int) * m.Tcap));
  v.rrow = static_cast<int *>(m.dmalloc(sizeof(int) * m.Tcap));
  v.pos3 = static_cast<int *>(m.dmalloc(sizeof(int) * 3 * m.Tcap));
}

// vis_in_prompt: slot holds an image whose prompt reaches past position p (forward then runs
// the step as a prefill chunk, where the image rows are made).
bool vis_in_prompt(mqb_model &m, int slot, int p) {
  std::lock_guard<std::mutex> g(vis(m).mu);
  const SlotImage &s = vis(m).slot[slot];
  return s.live && p < s.prompt_len;
}

// set_image lays slot's images out in its prompt with qwen3vl_layout::layout, the CPU model's own
// function (get_rope_index's positions for one or more images, each image's tokens at its
// placeholder run), and stores them (host side only: the tower runs in the first forward step
// that reaches an image, on the thread driving the model).
void set_image(mqb_model &m, int slot, const float *pixels, int64_t n_pixels, const int32_t *grids, int n_images,
               const int32_t *prompt, int n) {
  const Vis &v = vis(m);
  if (slot < 0 || slot > m.max_batch) throw Fail(fmt("cuda backend: image slot %d outside [0, %d]", slot, m.max_batch));
  if (!pixels || !prompt || n <= 0) throw Fail("cuda backend: set_image: NULL argument");
  const int64_t patch = 3LL * v.tp * v.p * v.p;
  std::vector<qwen3vl_layout::Grid> gs(n_images);
  int64_t total = 0;
  for (int k = 0; k < n_images; ++k) {
    gs[k].t = grids[3 * k], gs[k].h = grids[3 * k + 1], gs[k].w = grids[3 * k + 2];
    gs[k].count = (int64_t)std::max(gs[k].t, 0) * std::max(gs[k].h, 0) * std::max(gs[k].w, 0) * patch;
    total += gs[k].count;
  }
  if (n_pixels != total)
    throw Fail(fmt("image: %lld pixel values, the grid%s need%s %lld", (long long)n_pixels, n_images > 1 ? "s" : "",
                   n_images > 1 ? "" : "s", (long long)total));
  qwen3vl_layout::Layout L = qwen3vl_layout::layout(prompt, n, v.image_token, v.merge, patch, gs, v.faults);
  SlotImage S;
  S.pos3 = std::move(L.pos3);
  S.img_index = std::move(L.img_index);
  S.first = std::move(L.first);
  S.grids = std::move(gs);
  S.pixels.assign(pixels, pixels + n_pixels);
  S.n_img = S.first.back(), S.prompt_len = n, S.delta = L.delta;
  std::lock_guard<std::mutex> g(vis(m).mu);
  SlotImage &dst = vis(m).slot[slot];
  S.dev = dst.dev, S.dev_bytes = dst.dev_bytes;  // the slot's device buffer is reused
  dst = std::move(S);
  dst.live = true;
  vis(m).times.clear(slot);
  vis(m).sdelta_h[slot] = dst.delta;
  vis(m).sdelta_dirty = true;
}

void drop_image(mqb_model &m, int slot) {
  if (slot < 0 || slot > m.max_batch) return;
  std::lock_guard<std::mutex> g(vis(m).mu);
  SlotImage &s = vis(m).slot[slot];
  s.live = false;
  s.encoded = false;
  s.pixels.clear();
  s.pixels.shrink_to_fit();
  vis(m).times.clear(slot);
  if (vis(m).sdelta_h[slot] != 0) {
    vis(m).sdelta_h[slot] = 0;
    vis(m).sdelta_dirty = true;
  }
}

// vis_chunk_begin is called with the meta of a chunk of Tn tokens filled (token, position, slot):
// when a token is a prompt token of a slot with an image, it runs the tower where it has not run,
// fills the chunk's per-token image rows, rotary rows and positions, uploads them and returns
// true (the chunk then runs eagerly: its launches differ from a graph's); else false. It also
// uploads the per-slot rope deltas when they changed.
bool vis_chunk_begin(mqb_model &m, int Tn) {
  Vis &v = vis(m);
  std::lock_guard<std::mutex> g(v.mu);
  if (v.sdelta_dirty) {
    ck(cudaMemcpyAsync(v.sdelta, v.sdelta_h.data(), sizeof(int) * v.sdelta_h.size(), cudaMemcpyHostToDevice, m.stream),
       "rope delta upload");
    ck(cudaStreamSynchronize(m.stream), "rope delta upload");  // the host vector may change after
    v.sdelta_dirty = false;
  }
  bool any = false;
  for (int t = 0; t < Tn && !any; ++t) {
    const SlotImage &s = v.slot[m.meta_h[2 * m.Tcap + t]];
    any = s.live && m.meta_h[m.Tcap + t] < s.prompt_len;
  }
  if (!any) return false;
  v.src_h.assign(Tn, nullptr);
  v.stride_h.assign(Tn, 0);
  v.rrow_h.resize(Tn);
  v.pos3_h.resize((size_t)3 * Tn);
  for (int t = 0; t < Tn; ++t) {
    const int p = m.meta_h[m.Tcap + t], sl = m.meta_h[2 * m.Tcap + t];
    SlotImage &s = v.slot[sl];
    v.rrow_h[t] = p;
    for (int a = 0; a < 3; ++a) v.pos3_h[(size_t)t * 3 + a] = p;
    if (!s.live) continue;
    if (p >= s.prompt_len) {
      v.rrow_h[t] = p + s.delta;
      continue;
    }
    const int *p3 = &s.pos3[(size_t)p * 3];
    for (int a = 0; a < 3; ++a) v.pos3_h[(size_t)t * 3 + a] = p3[a];
    const int k = s.img_index[p];
    if (k < 0) {
      v.rrow_h[t] = p3[0];  // a text token: all three axes agree
      continue;
    }
    if (!s.encoded) {
      v.times.begin(m, sl);
      vis_encode_dispatch(m, s);
      v.times.end(m, sl);
    }
    v.rrow_h[t] = m.max_ctx + t;
    v.src_h[t] = s.dev + (size_t)k * m.c.H;
    v.stride_h[t] = s.n_img * m.c.H;
  }
  ck(cudaMemcpyAsync(v.src, v.src_h.data(), sizeof(float *) * Tn, cudaMemcpyHostToDevice, m.stream), "image rows upload");
  ck(cudaMemcpyAsync(v.stride, v.stride_h.data(), sizeof(int) * Tn, cudaMemcpyHostToDevice, m.stream), "image rows upload");
  ck(cudaMemcpyAsync(v.rrow, v.rrow_h.data(), sizeof(int) * Tn, cudaMemcpyHostToDevice, m.stream), "image rows upload");
  ck(cudaMemcpyAsync(v.pos3, v.pos3_h.data(), sizeof(int) * 3 * Tn, cudaMemcpyHostToDevice, m.stream), "image rows upload");
  return true;
}

// configure: the Qwen3 decoder, its rotary table with per-token rows for image tokens, and the
// mrope_section checked (t + h + w = head_dim / 2).
void configure(Cfg &c, const HParams &hp) {
  qwen3::configure(c, "qwen3vl");
  c.token_rope = true;
  const int t = (int)hp.num("mrope_section_t"), h = (int)hp.num("mrope_section_h"), w = (int)hp.num("mrope_section_w");
  if (t + h + w != c.D / 2) throw Fail(fmt("cuda backend: mrope_section must sum to head_dim/2 = %d", c.D / 2));
}

void load(mqb_model &m, const TensorMap &tm) {
  qwen3::load_decoder(m, tm, {"language_model.", "qwen3vl"});
  vis_load(m, tm);
  m.rope_delta = vis(m).sdelta;
}

// chunk_begin: vis_chunk_begin, and the chunk's rotary rows for the decoder.
bool chunk_begin(mqb_model &m, int Tn) {
  if (!vis_chunk_begin(m, Tn)) return false;
  m.rope_rows = vis(m).rrow;
  return true;
}

// embed_rows: the image tokens take the image's rows and their own M-RoPE rows.
void embed_rows(mqb_model &m, int Tn) {
  Vis &v = vis(m);
  const Cfg &c = m.c;
  launch(m, img_rows_kernel, dim3(Tn), dim3(256), 0, m.res, c.H, (const float *const *)v.src, (const int *)v.stride, -1);
  launch(m, mrope_rows_kernel, dim3(Tn), dim3(128), 0, m.rope_tab, c.D / 2, m.max_ctx, (const int *)v.rrow,
         (const int *)v.pos3, v.s1, v.s2);
}

// after_layer: DeepStack feature l added to the image tokens' rows after decoder layer l.
void after_layer(mqb_model &m, int l, int Tn) {
  Vis &v = vis(m);
  if (v.drop_deepstack || l >= (int)v.deep.size()) return;
  launch(m, img_rows_kernel, dim3(Tn), dim3(256), 0, m.res, m.c.H, (const float *const *)v.src, (const int *)v.stride, l);
}

bool in_prompt(mqb_model &m, int slot, int p) { return vis_in_prompt(m, slot, p); }

int64_t vision_ns(mqb_model &m, int slot) {
  std::lock_guard<std::mutex> g(vis(m).mu);
  return vis(m).times.elapsed(slot);
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"qwen3vl"};
  f.configure = configure;
  f.open = vis_open;
  f.load = load;
  f.chunk_begin = chunk_begin;
  f.embed_rows = embed_rows;
  f.after_layer = after_layer;
  f.in_prompt = in_prompt;
  f.set_image = set_image;
  f.slot_reset = drop_image;
  f.vision_ns = vision_ns;
  return f;
}());

}  // namespace
}  // namespace qwen3vl
}  // namespace mqcuda
