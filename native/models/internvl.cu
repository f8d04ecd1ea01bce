// models/internvl.cu: InternVLForConditionalGeneration on CUDA (owner: internvl family), the GPU
// side of models/internvl.cc.
//
// Why here and not a second backend: InternVL's language model is the Qwen3 decoder the core
// already runs (qwen3.cuh's loader; text_config qwen2 as its variant: q/k/v biases, no o_proj
// bias, no q/k norms), with plain 1-D positions. What the family adds is an image encoder run
// once per request and one decoder hook, so this file holds only:
//   - InternViT (transformers 5.17's InternVLVisionModel), every 448-pixel tile on its own:
//     the Conv2d patch embedding as a product of the tile's patches (vit_patches_kernel), the CLS
//     token in front and the absolute positions added (the tile is the trained size: no
//     interpolation), then per block: LayerNorm or RMSNorm (norm_type) -> fused q/k/v (biases when
//     attention_bias) -> RMSNorm of q and k over the full width (use_qk_norm, eps 1e-6) ->
//     bidirectional attention over the tile's patches and CLS (scale head_dim^-0.5) ->
//     projection_layer, times lambda_1, residual; norm -> fc1, exact GELU, fc2, times lambda_2,
//     residual. The first vision_run_layers blocks run (vision_feature_layer), then the final
//     LayerNorm where the config has one at that layer; the CLS token is dropped and pixel
//     shuffle 0.5 (shuffle_kernel) makes a quarter as many tokens, four times as wide; the
//     projector LayerNorm (eps 1e-5) -> linear_1 -> exact GELU -> linear_2 into the text width.
//     Tiles run up to kTileGroup at a time (each tile's attention is its own launch). Products
//     through cuBLAS (ops/vit.cuh: the weights at the compute precision, fp32 accumulation); the
//     residual stream, norms, softmax and the embeddings fp32.
//   - one decoder hook (embed_rows): the prompt's <IMG_CONTEXT> tokens take the image's
//     embeddings in order (the tiles, then the thumbnail; several images stacked tile after tile,
//     as the runtime hands them: server/vision's Stacking processors).
// The image contract follows native/models/internvl.cc (the CPU family, which transformers'
// goldens test): grid (tiles, side, side) with pixel_values [tiles, 3, image_size, image_size],
// and exactly tiles * image_seq_length image tokens anywhere in the prompt.
//
// Faults (MODELQUAL_FAULTS; the CPU runtime's names): internvl.shuffle_transposed swaps pixel
// shuffle's row and column offsets, internvl.drop_layer_scale skips lambda_1/lambda_2;
// internvl.drop_q_norm and internvl.rope_theta_x10 are the decoder's (qwen3.cu).
#include "../cuda/ops/vit.cuh"
#include "qwen3.cuh"

#include <mutex>

namespace mqcuda {
namespace internvl {
namespace {

constexpr int kTileGroup = 16;  // tiles encoded together (activations ~17 MB a tile at width 1024)

// shuffle_kernel: the CLS token dropped and pixel shuffle 0.5 of each tile's side x side patch
// grid: x [tiles][1 + side^2][C] -> y [tiles][(side/2)^2][4C], token (r, c) holding patch
// (2r + j, 2c + k) at channels (2j + k) * C (transformers' reshape/permute pair); transposed
// (fault internvl.shuffle_transposed) swaps j and k in the patch's offsets. One block a token.
static __global__ void shuffle_kernel(const float *__restrict__ x, int side, int C, int transposed,
                                      float *__restrict__ y) {
  pdl_wait();
  pdl_trigger();
  const int half = side / 2, per = half * half, tok = blockIdx.x, tile = tok / per, r = (tok % per) / half,
            c = tok % half;
  const float *xt = x + (size_t)tile * (1 + side * side) * C;
  float *o = y + (size_t)tok * 4 * C;
  for (int e = threadIdx.x; e < 4 * C; e += blockDim.x) {
    const int q = e / C, ch = e % C, j = q / 2, k = q % 2;
    const int pr = 2 * r + (transposed ? k : j), pc = 2 * c + (transposed ? j : k);
    o[e] = xt[(size_t)(1 + pr * side + pc) * C + ch];
  }
}

// embed_kernel: x [tiles][1 + P][C] from the patch embeddings pe [tiles][P][C]: row 0 of a tile
// the CLS token, then its patches; the absolute positions pos [1 + P][C] added. One block a row.
static __global__ void embed_kernel(const float *__restrict__ pe, int P, int C, const float *__restrict__ cls,
                                    const float *__restrict__ pos, float *__restrict__ x) {
  pdl_wait();
  pdl_trigger();
  const int row = blockIdx.x, tile = row / (P + 1), i = row % (P + 1);
  const float *src = i == 0 ? cls : pe + ((size_t)tile * P + i - 1) * C;
  float *o = x + (size_t)row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[c] + pos[(size_t)i * C + c];
}

struct Block {
  float *n1w = nullptr, *n1b = nullptr, *n2w = nullptr, *n2b = nullptr;  // biases NULL with RMSNorm
  void *qkv_w = nullptr, *proj_w = nullptr, *fc1_w = nullptr, *fc2_w = nullptr;  // T, [out, in]
  float *qkv_b = nullptr, *proj_b = nullptr, *fc1_b = nullptr, *fc2_b = nullptr;
  float *qn = nullptr, *kn = nullptr, *l1 = nullptr, *l2 = nullptr;
};

// SlotImage: one KV slot's image (its tiles stacked) and where its tokens sit in the prompt.
struct SlotImage {
  bool live = false, encoded = false;
  std::vector<float> pixels;   // [tiles, 3, image, image]
  int tiles = 0, prompt_len = 0;
  std::vector<int> img_index;  // per prompt position: image token index or -1
  float *dev = nullptr;        // [tiles * seq][E]: the projected image tokens
  size_t dev_bytes = 0;
};

struct Vis {
  int vh = 0, depth = 0, run = 0, heads = 0, vi = 0, p = 0, image = 0, side = 0, seq = 0, image_token = 0;
  float eps = 1e-6f;
  bool rms = false, qk_norm = false, bias = false, final_ln = false, qwen2 = false;
  bool transposed = false, no_scale = false;  // faults
  void *pe_w = nullptr, *p1_w = nullptr, *p2_w = nullptr;
  float *pe_b = nullptr, *cls = nullptr, *pos = nullptr, *fln_w = nullptr, *fln_b = nullptr;
  float *pln_w = nullptr, *pln_b = nullptr, *p1_b = nullptr, *p2_b = nullptr;
  std::vector<Block> blocks;
  std::mutex mu;  // slot: set_image may run beside a step
  std::vector<SlotImage> slot;  // per KV slot (the scratch slot's last)
  TowerTimes times;             // per KV slot: the tower's device time (mqb_vision_ns)
  const float **src = nullptr;  // device [Tcap]: the chunk's image rows (NULL: a text token)
  std::vector<const float *> src_h;
  VitBuffers ws;
  ~Vis() {
    for (auto &s : slot)
      if (s.dev) cudaFree(s.dev);
  }
};

inline Vis &vis(mqb_model &m) { return *static_cast<Vis *>(m.fstate.get()); }

// open reads the tower's hyper-parameters (the runtime's resolve_internvl names them) and
// allocates the per-slot and per-chunk state.
void open(mqb_model &m, const mqb_model_params *p) {
  const HParams h{p->hparams, p->n_hparams, "internvl"};
  m.fstate = std::make_shared<Vis>();
  Vis &v = vis(m);
  v.vh = h.pos("vision_hidden_size");
  v.depth = h.pos("vision_num_layers");
  v.heads = h.pos("vision_num_heads");
  v.vi = h.pos("vision_intermediate_size");
  v.p = h.pos("vision_patch_size");
  v.image = h.pos("vision_image_size");
  v.run = (int)h.num("vision_run_layers");
  v.eps = (float)h.num("vision_layer_norm_eps");
  v.rms = h.num("vision_rms_norm") != 0;
  v.qk_norm = h.num("vision_qk_norm") != 0;
  v.bias = h.num("vision_attention_bias") != 0;
  v.final_ln = h.num("vision_final_layernorm") != 0;
  v.qwen2 = h.num("text_qwen2") != 0;
  v.image_token = (int)h.num("image_token_id");
  v.side = v.image / v.p;
  v.seq = (v.side / 2) * (v.side / 2);
  v.transposed = fault("internvl.shuffle_transposed");
  v.no_scale = fault("internvl.drop_layer_scale");
  const int hd = v.vh / v.heads;
  if (v.vh % v.heads || hd > 128)
    throw Fail(fmt("cuda backend: internvl: vision head_dim %d (hidden %d over %d heads) must divide evenly and be at "
                   "most 128",
                   hd, v.vh, v.heads));
  if (v.image % v.p || v.side % 2)
    throw Fail(fmt("cuda backend: internvl: image_size %d / patch_size %d must be an even integer", v.image, v.p));
  if (v.run < 0 || v.run > v.depth)
    throw Fail(fmt("cuda backend: internvl: vision_run_layers %d outside [0, %d]", v.run, v.depth));
  v.slot.resize(m.slots);
  v.times.resize(m.slots);
  v.src = static_cast<const float **>(m.dmalloc(sizeof(float *) * m.Tcap));
}

// configure: the Qwen3 decoder (q/k/v biases for qwen2 come with attention_bias, which the
// runtime's resolve sets for it).
void configure(Cfg &c, const HParams &) { qwen3::configure(c, "internvl"); }

// load_tower reads InternViT and the projector ("model.vision_tower.", "model.multi_modal_projector."
// less the "model." TensorMap strips).
void load_tower(mqb_model &m, const TensorMap &tm) {
  Vis &v = vis(m);
  const int64_t vh = v.vh, vi = v.vi, P = (int64_t)v.side * v.side, K = 3LL * v.p * v.p, M = 4 * vh, E = m.c.H;
  const std::string pre = "vision_tower.";
  const mqb_tensor *pw = tm.need(pre + "embeddings.patch_embeddings.projection.weight", {vh, 3, v.p, v.p});
  mqb_tensor flat = *pw;  // the Conv2d weight [vh, 3, p, p], row by row the linear map of a patch
  flat.ndim = 2;
  flat.shape[0] = vh;
  flat.shape[1] = K;
  v.pe_w = upload_matrix(m, {{&flat, vh, false}}, K);
  v.pe_b = upload_f32(m, {tm.need(pre + "embeddings.patch_embeddings.projection.bias", {vh})});
  v.cls = upload_f32(m, {tm.need(pre + "embeddings.cls_token", {1, 1, vh})});
  v.pos = upload_f32(m, {tm.need(pre + "embeddings.position_embeddings", {1, P + 1, vh})});
  for (int l = 0; l < v.depth; ++l) {
    const std::string b = fmt("%sencoder.layer.%d.", pre.c_str(), l);
    Block B;
    B.n1w = upload_f32(m, {tm.need(b + "layernorm_before.weight", {vh})});
    B.n2w = upload_f32(m, {tm.need(b + "layernorm_after.weight", {vh})});
    if (!v.rms) {
      B.n1b = upload_f32(m, {tm.need(b + "layernorm_before.bias", {vh})});
      B.n2b = upload_f32(m, {tm.need(b + "layernorm_after.bias", {vh})});
    }
    const std::string a = b + "attention.";
    B.qkv_w = upload_matrix(m,
                            {{tm.need(a + "q_proj.weight", {vh, vh}), vh, false},
                             {tm.need(a + "k_proj.weight", {vh, vh}), vh, false},
                             {tm.need(a + "v_proj.weight", {vh, vh}), vh, false}},
                            vh);
    if (v.bias)
      B.qkv_b = upload_f32(m, {tm.need(a + "q_proj.bias", {vh}), tm.need(a + "k_proj.bias", {vh}),
                               tm.need(a + "v_proj.bias", {vh})});
    if (v.qk_norm) {
      B.qn = upload_f32(m, {tm.need(a + "q_norm.weight", {vh})});
      B.kn = upload_f32(m, {tm.need(a + "k_norm.weight", {vh})});
    }
    B.proj_w = upload_matrix(m, {{tm.need(a + "projection_layer.weight", {vh, vh}), vh, false}}, vh);
    B.proj_b = upload_f32(m, {tm.need(a + "projection_layer.bias", {vh})});
    B.l1 = upload_f32(m, {tm.need(b + "lambda_1", {vh})});
    B.l2 = upload_f32(m, {tm.need(b + "lambda_2", {vh})});
    B.fc1_w = upload_matrix(m, {{tm.need(b + "mlp.fc1.weight", {vi, vh}), vi, false}}, vh);
    B.fc1_b = upload_f32(m, {tm.need(b + "mlp.fc1.bias", {vi})});
    B.fc2_w = upload_matrix(m, {{tm.need(b + "mlp.fc2.weight", {vh, vi}), vh, false}}, vi);
    B.fc2_b = upload_f32(m, {tm.need(b + "mlp.fc2.bias", {vh})});
    v.blocks.push_back(B);
  }
  if (v.final_ln) {
    v.fln_w = upload_f32(m, {tm.need(pre + "layernorm.weight", {vh})});
    v.fln_b = upload_f32(m, {tm.need(pre + "layernorm.bias", {vh})});
  }
  const std::string pj = "multi_modal_projector.";
  v.pln_w = upload_f32(m, {tm.need(pj + "layer_norm.weight", {M})});
  v.pln_b = upload_f32(m, {tm.need(pj + "layer_norm.bias", {M})});
  v.p1_w = upload_matrix(m, {{tm.need(pj + "linear_1.weight", {E, M}), E, false}}, M);
  v.p1_b = upload_f32(m, {tm.need(pj + "linear_1.bias", {E})});
  v.p2_w = upload_matrix(m, {{tm.need(pj + "linear_2.weight", {E, E}), E, false}}, E);
  v.p2_b = upload_f32(m, {tm.need(pj + "linear_2.bias", {E})});
}

void load(mqb_model &m, const TensorMap &tm) {
  qwen3::DecoderOptions o{"language_model.", "internvl"};
  if (vis(m).qwen2) {  // Qwen2: q/k/v biases (attention_bias), no o_proj bias, no q/k norms
    o.qk_norm = false;
    o.o_proj_bias = false;
  }
  qwen3::load_decoder(m, tm, o);
  load_tower(m, tm);
}

// norm runs the tower's norm (LayerNorm or RMSNorm) over N rows of x into T.
template <typename T>
void norm(mqb_model &m, const float *x, int N, const float *w, const float *b, T *y) {
  const Vis &v = vis(m);
  if (v.rms) launch(m, vit_rms_kernel<T>, dim3(N), dim3(256), 0, x, v.vh, w, v.eps, y);
  else launch(m, vis_ln_kernel<T>, dim3(N), dim3(256), 0, x, v.vh, w, b, v.eps, y);
}

// encode_tiles runs InternViT and the projector over G tiles' pixels px (host, [G, 3, image,
// image]) into out [G * seq][E] (device).
template <typename T>
void encode_tiles(mqb_model &m, const float *px, int G, float *out) {
  Vis &v = vis(m);
  const int P = v.side * v.side, Np = P + 1, N = G * Np, K = 3 * v.p * v.p, vh = v.vh, hd = vh / v.heads;
  const int R = G * v.seq, M = 4 * vh, E = m.c.H;
  const size_t pix = (size_t)G * 3 * v.image * v.image;
  const size_t wide = std::max({(size_t)K, (size_t)v.vi, (size_t)E, (size_t)vh});
  float *dpx = static_cast<float *>(v.ws.get(0, sizeof(float) * pix));
  T *xin = static_cast<T *>(v.ws.get(1, sizeof(T) * std::max((size_t)N * wide, (size_t)R * M)));
  float *x = static_cast<float *>(v.ws.get(2, sizeof(float) * (size_t)N * vh));
  float *big = static_cast<float *>(
      v.ws.get(3, sizeof(float) * std::max((size_t)N * std::max(3 * vh, v.vi), (size_t)R * E)));
  float *tmp = static_cast<float *>(v.ws.get(4, sizeof(float) * (size_t)N * vh));
  ck(cudaMemcpyAsync(dpx, px, sizeof(float) * pix, cudaMemcpyHostToDevice, m.stream), "image upload");
  launch(m, vit_patches_kernel<T>, dim3(G * P), dim3(256), 0, (const float *)dpx, v.side, v.p, xin);
  vis_linear<T>(m, "v.patch", xin, G * P, K, v.pe_w, vh, v.pe_b, tmp, false);
  launch(m, embed_kernel, dim3(N), dim3(256), 0, (const float *)tmp, P, vh, (const float *)v.cls, (const float *)v.pos, x);
  const float scale = 1.0f / std::sqrt((float)hd);
  // the bf16 rows of flash attention (vit_attention)
  __nv_bfloat16 *qkv16 = std::is_same<T, __nv_bfloat16>::value
                             ? static_cast<__nv_bfloat16 *>(v.ws.get(5, sizeof(__nv_bfloat16) * (size_t)N * 3 * vh))
                             : nullptr;
  for (int l = 0; l < v.run; ++l) {
    const Block &B = v.blocks[l];
    norm<T>(m, x, N, B.n1w, B.n1b, xin);
    vis_linear<T>(m, "v.qkv", xin, N, vh, B.qkv_w, 3 * vh, B.qkv_b, big, false);
    if (B.qn) {
      launch(m, vit_rms_inplace_kernel, dim3(N), dim3(256), 0, big, 3 * vh, vh, (const float *)B.qn, 1e-6f);
      launch(m, vit_rms_inplace_kernel, dim3(N), dim3(256), 0, big + vh, 3 * vh, vh, (const float *)B.kn, 1e-6f);
    }
    vit_attention<T>(m, big, G, Np, v.heads, hd, scale, qkv16, tmp, xin);  // within each tile
    vis_linear<T>(m, "v.proj", xin, N, vh, B.proj_w, vh, nullptr, tmp, false);
    vit_scale_add(m, x, tmp, B.proj_b, v.no_scale ? nullptr : B.l1, vh, N);
    norm<T>(m, x, N, B.n2w, B.n2b, xin);
    vis_linear<T>(m, "v.fc1", xin, N, vh, B.fc1_w, v.vi, B.fc1_b, big, false);
    vis_act<T>(m, big, (size_t)N * v.vi, 2, xin);
    vis_linear<T>(m, "v.fc2", xin, N, v.vi, B.fc2_w, vh, nullptr, tmp, false);
    vit_scale_add(m, x, tmp, B.fc2_b, v.no_scale ? nullptr : B.l2, vh, N);
  }
  const float *feat = x;  // the tower's output features [N][vh]
  if (v.final_ln) {
    launch(m, vis_ln_kernel<float>, dim3(N), dim3(256), 0, (const float *)x, vh, (const float *)v.fln_w,
           (const float *)v.fln_b, v.eps, tmp);
    feat = tmp;
  }
  float *sh = feat == x ? tmp : x;  // [R][4 vh]: R * 4 vh = G * P * vh values fit either
  launch(m, shuffle_kernel, dim3(R), dim3(256), 0, feat, v.side, vh, v.transposed ? 1 : 0, sh);
  launch(m, vis_ln_kernel<T>, dim3(R), dim3(256), 0, (const float *)sh, M, (const float *)v.pln_w,
         (const float *)v.pln_b, 1e-5f, xin);
  vis_linear<T>(m, "v.proj1", xin, R, M, v.p1_w, E, v.p1_b, big, false);
  vis_act<T>(m, big, (size_t)R * E, 2, xin);
  vis_linear<T>(m, "v.proj2", xin, R, E, v.p2_w, E, v.p2_b, out, false);
}

// encode runs the tower over every tile of im, kTileGroup at a time, into im.dev.
template <typename T>
void encode(mqb_model &m, SlotImage &im) {
  const Vis &v = vis(m);
  const size_t per = (size_t)v.seq * m.c.H, need = sizeof(float) * im.tiles * per;
  if (im.dev_bytes < need) {
    if (im.dev) ck(cudaFree(im.dev), "cudaFree");
    im.dev = nullptr;
    ck(cudaMalloc(reinterpret_cast<void **>(&im.dev), need), "cudaMalloc (image embeddings)");
    im.dev_bytes = need;
  }
  const size_t tile_px = (size_t)3 * v.image * v.image;
  for (int t0 = 0; t0 < im.tiles; t0 += kTileGroup) {
    const int G = std::min(kTileGroup, im.tiles - t0);
    encode_tiles<T>(m, im.pixels.data() + t0 * tile_px, G, im.dev + t0 * per);
  }
  ck(cudaGetLastError(), "vision tower");
  im.encoded = true;
}

void encode_dispatch(mqb_model &m, SlotImage &im) {
  switch (m.dt) {
    case DT_BF16: encode<__nv_bfloat16>(m, im); break;
    case DT_F16: encode<__half>(m, im); break;
    default: encode<float>(m, im); break;
  }
}

// set_image checks an image against its prompt as internvl.cc does and stores it for slot (host
// side only: the tower runs in the first forward step that reaches the image).
// A list of several images (mqb_set_images) is their tiles stacked, as the runtime's Stacking
// processor hands them in one grid.
void set_image(mqb_model &m, int slot, const float *pixels, int64_t n_pixels, const int32_t *grids, int n_images,
               const int32_t *prompt, int n) {
  const Vis &v = vis(m);
  if (slot < 0 || slot > m.max_batch) throw Fail(fmt("cuda backend: image slot %d outside [0, %d]", slot, m.max_batch));
  if (!pixels || !prompt || n <= 0) throw Fail("cuda backend: set_image: NULL argument");
  int gt = 0;
  for (int k = 0; k < n_images; ++k) {
    const int t = grids[3 * k], gh = grids[3 * k + 1], gw = grids[3 * k + 2];
    if (t < 1 || gh != v.side || gw != v.side)
      throw Fail(fmt("image%s: grid (%d, %d, %d) must be (tiles >= 1, %d, %d)",
                     n_images > 1 ? fmt(" %d", k).c_str() : "", t, gh, gw, v.side, v.side));
    gt += t;
  }
  const int64_t want = (int64_t)gt * 3 * v.image * v.image;
  if (n_pixels != want)
    throw Fail(fmt("image: %lld pixel values, %d tiles need %lld", (long long)n_pixels, gt, (long long)want));
  SlotImage S;
  S.img_index.assign(n, -1);
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (prompt[i] == v.image_token) S.img_index[i] = k++;
  if (k != gt * v.seq)
    throw Fail(fmt("prompt holds %d image tokens; %d tiles need %d (image_seq_length %d per tile)", k, gt, gt * v.seq,
                   v.seq));
  S.pixels.assign(pixels, pixels + n_pixels);
  S.tiles = gt, S.prompt_len = n;
  std::lock_guard<std::mutex> g(vis(m).mu);
  SlotImage &dst = vis(m).slot[slot];
  S.dev = dst.dev, S.dev_bytes = dst.dev_bytes;  // the slot's device buffer is reused
  dst = std::move(S);
  dst.live = true;
  vis(m).times.clear(slot);
}

void slot_reset(mqb_model &m, int slot) {
  if (slot < 0 || slot > m.max_batch) return;
  std::lock_guard<std::mutex> g(vis(m).mu);
  SlotImage &s = vis(m).slot[slot];
  s.live = false;
  s.encoded = false;
  s.pixels.clear();
  s.pixels.shrink_to_fit();
  s.img_index.clear();
  vis(m).times.clear(slot);
}

int64_t vision_ns(mqb_model &m, int slot) {
  std::lock_guard<std::mutex> g(vis(m).mu);
  return vis(m).times.elapsed(slot);
}

bool in_prompt(mqb_model &m, int slot, int p) {
  std::lock_guard<std::mutex> g(vis(m).mu);
  const SlotImage &s = vis(m).slot[slot];
  return s.live && p < s.prompt_len;
}

// chunk_begin: whether the chunk of Tn tokens in meta_h holds image tokens; then the tower runs
// where it has not, and each token's image row (NULL: text) is uploaded for embed_rows. Positions
// stay the plain ones (m.rope_rows NULL).
bool chunk_begin(mqb_model &m, int Tn) {
  Vis &v = vis(m);
  std::lock_guard<std::mutex> g(v.mu);
  bool any = false;
  v.src_h.assign(Tn, nullptr);
  for (int t = 0; t < Tn; ++t) {
    const int p = m.meta_h[m.Tcap + t], sl = m.meta_h[2 * m.Tcap + t];
    SlotImage &s = v.slot[sl];
    if (!s.live || p >= s.prompt_len || s.img_index[p] < 0) continue;
    if (!s.encoded) {
      v.times.begin(m, sl);
      encode_dispatch(m, s);
      v.times.end(m, sl);
    }
    v.src_h[t] = s.dev + (size_t)s.img_index[p] * m.c.H;
    any = true;
  }
  if (!any) return false;
  ck(cudaMemcpyAsync(v.src, v.src_h.data(), sizeof(float *) * Tn, cudaMemcpyHostToDevice, m.stream),
     "image rows upload");
  m.rope_rows = nullptr;
  return true;
}

// embed_rows: the image tokens take the image's rows.
void embed_rows(mqb_model &m, int Tn) {
  launch(m, img_rows_kernel, dim3(Tn), dim3(256), 0, m.res, m.c.H, (const float *const *)vis(m).src,
         (const int *)nullptr, -1);
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"internvl"};
  f.configure = configure;
  f.open = open;
  f.load = load;
  f.chunk_begin = chunk_begin;
  f.embed_rows = embed_rows;
  f.in_prompt = in_prompt;
  f.set_image = set_image;
  f.slot_reset = slot_reset;
  f.vision_ns = vision_ns;
  return f;
}());

}  // namespace
}  // namespace internvl
}  // namespace mqcuda
