// flux.cu: the FLUX.1 text-to-image pipeline (dev and schnell) on CUDA (owner: flux family), the
// device side of `--device cuda` for task "image" (ABI: mqb_image_* in include/mq_backend.h).
//
// The same pipeline as models/flux.cc (read that file for what each stage computes and where in
// diffusers and transformers it comes from); this file only decides how it runs on the GPU, on
// the shared pieces of diffusion_cuda.cuh (weights, products, attention, the AutoencoderKL
// decoder), as models/zimage.cu does:
//  - it is diffusers' FluxPipeline as run in bf16, the reference of this pipeline: the seed's
//    noise is torch's bf16 stream (the runtime's torch_randn_bf16: FluxPipeline draws latents in
//    the text encoder's dtype), the step's timestep and guidance reach the model rounded to bf16
//    at each of the pipeline's casts (timestep.to(bf16) / 1000, then * 1000 in the model: 826.06
//    arrives as 828, guidance 3.5 as 3504), and the latents between steps are bf16 (euler_k). On
//    dev these roundings move the image 24 dB from the fp32 pipeline's, in diffusers as here;
//  - every matrix in bf16 (an fp32 bundle is rounded to bf16), products on cuBLAS with fp32
//    accumulation; residual streams, norms, RoPE and softmax in fp32 (diffusers' bf16 run keeps
//    everything in bf16);
//  - fused weights: q|k|v (CLIP, T5, every attention of the transformer), wi_0|wi_1 (T5's gated
//    GELU), and every block's modulation linear plus norm_out's in one matrix, one product per
//    forward;
//  - fused epilogues: biases in the products (Pipeline::product); the GELU-tanh feed-forwards
//    (double blocks' ff and ff_context, single blocks' proj_mlp) have the GELU in the product's
//    epilogue and bf16 out, the single block's MLP straight into the [attention | MLP] rows that
//    proj_out reads, beside the attention's; each gated residual runs with the LayerNorm and
//    modulation that follow it (the next block's opening norm, or norm_out) in one kernel;
//  - a step's transformer forward is one CUDA graph per branch (Pipeline::step_graph), its
//    timestep and guidance read from a device buffer;
//  - CLIP and the transformer's attentions go through Pipeline::attention; T5's, which adds its
//    relative position bias to the scores, is the same batched GEMM -> softmax -> GEMM with the
//    bias table (per sequence length, from the first block's buckets) added in between;
//  - the host draws nothing: the runtime hands over the initial noise (torch_randn_bf16) and
//    the sigmas (diffusion::flow_match_sigmas, as on CPU); packing, true CFG and the Euler step
//    run on the GPU.
// Faults (MODELQUAL_FAULTS), the CPU pipeline's names: flux.swap_text_image_ids (rotary table
// from [image ids, text ids] against the [text, image] rows), flux.drop_pooled (CLIP's pooled
// output zeroed).
//
// Thread safety: one model is driven by one thread at a time (the engine's worker).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "mq_backend.h"

#include "../cuda/env.cuh"
#include "../cuda/model.cuh"
#include "diffusion_cuda.cuh"

namespace mqflux {

using namespace mqcuda::img;

// ---- kernels -----------------------------------------------------------------------------------

enum Act { kNone = 0, kGeluTanh = 1, kQuickGelu = 2, kGeluErf = 3 };

// act_k: y[r, i] (row stride ldy, bf16) = act(x[r, i]) (row stride ldx) for rows of N.
static __global__ void act_k(const float *x, int ldx, int N, bf16 *y, int ldy, size_t n, int act) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const unsigned r = (unsigned)e / (unsigned)N, i = (unsigned)e - r * (unsigned)N;
    float v = x[(size_t)r * ldx + i];
    if (act == kGeluTanh) v = gelu_tanh_d(v);
    else if (act == kQuickGelu) v = v / (1.0f + expf(-1.702f * v));
    else if (act == kGeluErf) v = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    y[(size_t)r * ldy + i] = __float2bfloat16(v);
  }
}

// geglu_k: y[r, i] = gelu_tanh(g[r, i]) * g[r, F + i] for g [rows, 2F] (T5 v1.1's wi_0 | wi_1).
static __global__ void geglu_k(const float *g, int F, size_t n, bf16 *y) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const unsigned r = (unsigned)e / (unsigned)F, i = (unsigned)e - r * (unsigned)F;
    y[e] = __float2bfloat16(gelu_tanh_d(g[(size_t)r * 2 * F + i]) * g[(size_t)r * 2 * F + F + i]);
  }
}

// ln_k: one row of x [., D] per block: LayerNorm (eps; affine g, b when given), then
// y * (1 + scale) + shift when scale is given; to bf16 yb and/or fp32 yf.
static __global__ void ln_k(const float *x, int D, const float *g, const float *b, float eps, const float *shift, const float *scale,
                            bf16 *yb, float *yf) {
  __shared__ float sh[32];
  const float *xr = x + (size_t)blockIdx.x * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
  const float mean = mqcuda::img::block_sum(s, sh) / D;
  float v = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = 1.0f / sqrtf(mqcuda::img::block_sum(v, sh) / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float y = (xr[i] - mean) * inv;
    if (g) y = y * g[i] + b[i];
    if (scale) y = y * (1.0f + scale[i]) + shift[i];
    if (yb) yb[(size_t)blockIdx.x * D + i] = __float2bfloat16(y);
    if (yf) yf[(size_t)blockIdx.x * D + i] = y;
  }
}

// gate_add_ln_k: one row per block: the gated residual x += gate * t, then ln_k's modulated
// LayerNorm (no affine) of the new x to bf16 yb, in one pass: the same arithmetic as the two
// kernels it replaces.
static __global__ void gate_add_ln_k(float *x, const float *t, const float *gate, int D, float eps, const float *shift, const float *scale,
                                     bf16 *yb) {
  __shared__ float sh[32];
  float *xr = x + (size_t)blockIdx.x * D;
  const float *tr = t + (size_t)blockIdx.x * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    xr[i] += gate[i] * tr[i];
    s += xr[i];
  }
  const float mean = mqcuda::img::block_sum(s, sh) / D;
  float v = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = 1.0f / sqrtf(mqcuda::img::block_sum(v, sh) / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float y = (xr[i] - mean) * inv;
    y = y * (1.0f + scale[i]) + shift[i];
    yb[(size_t)blockIdx.x * D + i] = __float2bfloat16(y);
  }
}


// embed_k: x[r, i] = table[ids[r], i] (+ pos[r, i]), bf16 tables, fp32 rows.
static __global__ void embed_k(const bf16 *table, const int *ids, const bf16 *pos, int D, size_t n, float *x) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const unsigned r = (unsigned)e / (unsigned)D, i = (unsigned)e - r * (unsigned)D;
    float v = __bfloat162float(table[(size_t)ids[r] * D + i]);
    if (pos) v += __bfloat162float(pos[e]);
    x[e] = v;
  }
}

// pack_k: latents [C, h, w] -> [(h/2)*(w/2), 4C], feature c*4 + ph*2 + pw (_pack_latents);
// unpack_k the inverse.
static __global__ void pack_k(const float *lat, int C, int h, int w, float *out) {
  const int wp = w / 2, F = 4 * C, n = (h / 2) * wp * F;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    const int tok = e / F, f = e % F, c = f / 4, ph = (f % 4) / 2, pw = f % 2, y = tok / wp, x = tok % wp;
    out[e] = lat[((size_t)c * h + 2 * y + ph) * w + 2 * x + pw];
  }
}
static __global__ void unpack_k(const float *p, int C, int h, int w, float *lat) {
  const int wp = w / 2, F = 4 * C, n = (h / 2) * wp * F;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    const int tok = e / F, f = e % F, c = f / 4, ph = (f % 4) / 2, pw = f % 2, y = tok / wp, x = tok % wp;
    lat[((size_t)c * h + 2 * y + ph) * w + 2 * x + pw] = p[e];
  }
}

// bf16r: x as a bf16 tensor holds it (rounded to nearest even); on the host too (the step's
// timestep and guidance).
static __host__ __device__ inline float bf16r(float x) { return __bfloat162float(__float2bfloat16(x)); }

// euler_k: the scheduler's step as diffusers' bf16 pipeline takes it: the model's outputs are
// bf16, true CFG's v = neg + s * (pos - neg) rounds each operation to bf16, dt * v is a bf16
// product (dt rounded to bf16), added to the bf16 latents in fp32 and stored back as bf16.
static __global__ void euler_k(float *x, const float *pos, const float *neg, float s, float dt, int n, bool cfg) {
  const float dtb = bf16r(dt);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float p = bf16r(pos[i]);
    float v = p;
    if (cfg) {
      const float q = bf16r(neg[i]);
      v = bf16r(q + bf16r(s * bf16r(p - q)));
    }
    x[i] = bf16r(x[i] + bf16r(dtb * v));
  }
}

// round_k: x rounded to bf16 in place (the initial latents, a bf16 tensor in diffusers).
static __global__ void round_k(float *x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = bf16r(x[i]);
}

// ---- the model ---------------------------------------------------------------------------------

struct ClipLayer {
  Lin qkv, o, fc1, fc2;
  float *ln1g, *ln1b, *ln2g, *ln2b;
};
struct T5Block {
  Lin qkv, o, wi, wo;
  float *ln0, *ln1;
};
struct Double {
  Lin qkv, cqkv, out, cout, ff1, ff2, cff1, cff2;
  float *nq, *nk, *ncq, *nck;
  size_t mod, cmod;  // offsets of norm1's and norm1_context's 6D in the modulation vector
};
struct Single {
  Lin qkv, mlp, out;  // q|k|v [3D, D]; proj_mlp [4D, D]; proj_out [D, 5D]
  float *nq, *nk;
  size_t mod;  // offset of norm's 3D
};

class Model : public Pipeline {
 public:
  Model(const mqb_model_params *p) : Pipeline(p, "flux cuda") {
    swap_ids_ = mqcuda::fault("flux.swap_text_image_ids");
    drop_pooled_ = mqcuda::fault("flux.drop_pooled");
    load();
    opened();
  }

  void generate(const mqb_image_args *a);

 private:
  void load();
  void clip_pooled(const int32_t *ids, int n, float *out);
  void t5_encode(const int32_t *ids, int n, float *out);
  const float *t5_bias(int n);
  int t5_bucket(int rel) const;
  void rope_tables(int T, int hp2, int wp2);
  void forward(const float *packed, int N, int hp2, int wp2, const float *txt, int T, const float *pooled, const float *tg, float *out);

  bool swap_ids_ = false, drop_pooled_ = false;
  // CLIP
  int cD_, cH_, cI_, cmaxpos_, cvocab_, ceos_;
  float ceps_;
  bool quick_;
  Lin ctok_, cpos_;
  std::vector<ClipLayer> clip_;
  float *cfg_, *cfb_;
  // T5
  int tD_, tH_, tkv_, tff_, tvocab_, tbuckets_, tmaxdist_;
  float teps_;
  Lin temb_;
  std::vector<T5Block> t5_;
  float *tfinal_;
  std::vector<float> trel_;  // relative_attention_bias [buckets, H], host
  std::map<int, float *> tbias_;  // [H, n, n] per n
  // transformer
  int H_, hd_, D_, C_, joint_, pooledD_, axes_[3];
  bool guidance_;
  Lin x_emb_, ctx_emb_, t1_, t2_, g1_, g2_, p1_, p2_, mods_, proj_out_;
  size_t out_mod_ = 0;
  std::vector<Double> double_;
  std::vector<Single> single_;
  std::map<std::tuple<int, int, int>, std::pair<float *, float *>> rope_cache_;
  float *cosv_ = nullptr, *sinv_ = nullptr;
};

void Model::load() {
  // CLIPTextModel.
  cD_ = hi("clip.hidden_size"), cH_ = hi("clip.num_heads"), cI_ = hi("clip.intermediate_size");
  cmaxpos_ = hi("clip.max_positions"), cvocab_ = hi("clip.vocab_size"), ceos_ = hi("clip.eos_token_id");
  ceps_ = (float)hv("clip.layer_norm_eps"), quick_ = hv("clip.quick_gelu") != 0;
  const std::string c = "text_encoder.text_model.";
  ctok_ = mat({c + "embeddings.token_embedding.weight"}, {cvocab_}, cD_);
  cpos_ = mat({c + "embeddings.position_embedding.weight"}, {cmaxpos_}, cD_);
  for (int l = 0; l < hi("clip.num_layers"); l++) {
    const std::string q = c + "encoder.layers." + std::to_string(l) + ".";
    ClipLayer L;
    const std::string a = q + "self_attn.";
    L.qkv = mat({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, {cD_, cD_, cD_}, cD_,
                {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
    L.o = mat1(a + "out_proj", cD_, cD_, true);
    L.ln1g = f32(q + "layer_norm1.weight", cD_), L.ln1b = f32(q + "layer_norm1.bias", cD_);
    L.ln2g = f32(q + "layer_norm2.weight", cD_), L.ln2b = f32(q + "layer_norm2.bias", cD_);
    L.fc1 = mat1(q + "mlp.fc1", cI_, cD_, true);
    L.fc2 = mat1(q + "mlp.fc2", cD_, cI_, true);
    clip_.push_back(L);
  }
  cfg_ = f32(c + "final_layer_norm.weight", cD_), cfb_ = f32(c + "final_layer_norm.bias", cD_);

  // T5EncoderModel.
  tD_ = hi("t5.d_model"), tH_ = hi("t5.num_heads"), tkv_ = hi("t5.d_kv"), tff_ = hi("t5.d_ff"), tvocab_ = hi("t5.vocab_size");
  tbuckets_ = hi("t5.num_buckets"), tmaxdist_ = hi("t5.max_distance"), teps_ = (float)hv("t5.layer_norm_eps");
  const std::string e = "text_encoder_2.";
  const int inner = tH_ * tkv_;
  temb_ = mat({e + "shared.weight"}, {tvocab_}, tD_);
  for (int l = 0; l < hi("t5.num_layers"); l++) {
    const std::string b = e + "encoder.block." + std::to_string(l) + ".layer.";
    T5Block B;
    B.qkv = mat({b + "0.SelfAttention.q.weight", b + "0.SelfAttention.k.weight", b + "0.SelfAttention.v.weight"}, {inner, inner, inner}, tD_);
    B.o = mat({b + "0.SelfAttention.o.weight"}, {tD_}, inner);
    B.ln0 = f32(b + "0.layer_norm.weight", tD_);
    B.wi = mat({b + "1.DenseReluDense.wi_0.weight", b + "1.DenseReluDense.wi_1.weight"}, {tff_, tff_}, tD_);
    B.wo = mat({b + "1.DenseReluDense.wo.weight"}, {tD_}, tff_);
    B.ln1 = f32(b + "1.layer_norm.weight", tD_);
    if (l == 0) {
      const mqb_tensor *r = tensor(b + "0.SelfAttention.relative_attention_bias.weight", (int64_t)tbuckets_ * tH_);
      trel_.resize((size_t)tbuckets_ * tH_);
      for (size_t i = 0; i < trel_.size(); i++) trel_[i] = elem(r, (int64_t)i);
    }
    t5_.push_back(B);
  }
  tfinal_ = f32(e + "encoder.final_layer_norm.weight", tD_);

  // FluxTransformer2DModel.
  const std::string t = "transformer.";
  H_ = hi(t + "num_heads"), hd_ = hi(t + "head_dim"), D_ = H_ * hd_, C_ = hi(t + "in_channels");
  joint_ = hi(t + "joint_attention_dim"), pooledD_ = hi(t + "pooled_projection_dim");
  guidance_ = hv(t + "guidance_embeds") != 0;
  if (hd_ > 512) throw Fail("flux cuda: head_dim above 512 is not implemented");
  const int D = D_;
  x_emb_ = mat1(t + "x_embedder", D, C_, true);
  ctx_emb_ = mat1(t + "context_embedder", D, joint_, true);
  t1_ = mat1(t + "time_text_embed.timestep_embedder.linear_1", D, 256, true);
  t2_ = mat1(t + "time_text_embed.timestep_embedder.linear_2", D, D, true);
  if (guidance_) {
    g1_ = mat1(t + "time_text_embed.guidance_embedder.linear_1", D, 256, true);
    g2_ = mat1(t + "time_text_embed.guidance_embedder.linear_2", D, D, true);
  }
  p1_ = mat1(t + "time_text_embed.text_embedder.linear_1", D, pooledD_, true);
  p2_ = mat1(t + "time_text_embed.text_embedder.linear_2", D, D, true);
  std::vector<std::string> mw, mb;  // every modulation linear, one matrix
  std::vector<int> mr;
  size_t moff = 0;
  auto modlin = [&](const std::string &name, int rows) {
    mw.push_back(name + ".weight"), mb.push_back(name + ".bias"), mr.push_back(rows);
    const size_t o = moff;
    moff += rows;
    return o;
  };
  for (int i = 0; i < hi(t + "num_layers"); i++) {
    const std::string p = t + "transformer_blocks." + std::to_string(i) + ".";
    const std::string a = p + "attn.";
    Double b;
    b.mod = modlin(p + "norm1.linear", 6 * D);
    b.cmod = modlin(p + "norm1_context.linear", 6 * D);
    b.qkv = mat({a + "to_q.weight", a + "to_k.weight", a + "to_v.weight"}, {D, D, D}, D, {a + "to_q.bias", a + "to_k.bias", a + "to_v.bias"});
    b.cqkv = mat({a + "add_q_proj.weight", a + "add_k_proj.weight", a + "add_v_proj.weight"}, {D, D, D}, D,
                 {a + "add_q_proj.bias", a + "add_k_proj.bias", a + "add_v_proj.bias"});
    b.out = mat1(a + "to_out.0", D, D, true);
    b.cout = mat1(a + "to_add_out", D, D, true);
    b.nq = f32(a + "norm_q.weight", hd_), b.nk = f32(a + "norm_k.weight", hd_);
    b.ncq = f32(a + "norm_added_q.weight", hd_), b.nck = f32(a + "norm_added_k.weight", hd_);
    b.ff1 = mat1(p + "ff.net.0.proj", 4 * D, D, true), b.ff2 = mat1(p + "ff.net.2", D, 4 * D, true);
    b.cff1 = mat1(p + "ff_context.net.0.proj", 4 * D, D, true), b.cff2 = mat1(p + "ff_context.net.2", D, 4 * D, true);
    double_.push_back(b);
  }
  for (int i = 0; i < hi(t + "num_single_layers"); i++) {
    const std::string p = t + "single_transformer_blocks." + std::to_string(i) + ".";
    const std::string a = p + "attn.";
    Single b;
    b.mod = modlin(p + "norm.linear", 3 * D);
    b.qkv = mat({a + "to_q.weight", a + "to_k.weight", a + "to_v.weight"}, {D, D, D}, D, {a + "to_q.bias", a + "to_k.bias", a + "to_v.bias"});
    b.mlp = mat1(p + "proj_mlp", 4 * D, D, true);
    b.out = mat1(p + "proj_out", D, 5 * D, true);
    b.nq = f32(a + "norm_q.weight", hd_), b.nk = f32(a + "norm_k.weight", hd_);
    single_.push_back(b);
  }
  out_mod_ = modlin(t + "norm_out.linear", 2 * D);
  mods_ = mat(mw, mr, D, mb);
  proj_out_ = mat1(t + "proj_out", C_, D, true);
  int sum = 0;
  for (int a = 0; a < 3; a++) sum += (axes_[a] = hi(t + "axes_dims_rope." + std::to_string(a)));
  if (sum != hd_) throw Fail("flux cuda: transformer axes_dims_rope do not sum to the head dim");

  load_vae();
  if (C_ != 4 * latent_) throw Fail("flux cuda: transformer.in_channels is not 4 x vae.latent_channels (2x2 packing)");
}

// clip_pooled: CLIPTextModel's pooler_output [cD] (fp32, device) for ids [n] (host).
void Model::clip_pooled(const int32_t *ids, int n, float *out) {
  const int D = cD_, hd = D / cH_;
  int *dids = buf<int>("c_ids", n);
  ck(cudaMemcpyAsync(dids, ids, 4 * (size_t)n, cudaMemcpyHostToDevice, st_), "ids");
  float *x = buf<float>("c_x", (size_t)n * D), *t = buf<float>("c_t", (size_t)n * D);
  float *f = buf<float>("c_f", (size_t)n * std::max(3 * D, cI_));
  bf16 *a = buf<bf16>("c_a", (size_t)n * std::max(3 * D, cI_)), *o = buf<bf16>("c_o", (size_t)n * D);
  KL(embed_k, grid((size_t)n * D), 256, 0, st_)(ctok_.w, dids, cpos_.w, D, (size_t)n * D, x);
  for (const ClipLayer &L : clip_) {
    KL(ln_k, n, 256, 0, st_)(x, D, L.ln1g, L.ln1b, ceps_, nullptr, nullptr, o, nullptr);
    linear(o, n, L.qkv, f);
    KL(to_bf16_k, grid((size_t)n * 3 * D), 256, 0, st_)(f, a, (size_t)n * 3 * D);
    attention(a, 3 * D, a + D, a + 2 * D, 3 * D, o, D, n, n, cH_, cH_, hd, 1.0f / sqrtf((float)hd), true);
    linear(o, n, L.o, t);
    KL(add_k, grid((size_t)n * D), 256, 0, st_)(x, t, (size_t)n * D);
    KL(ln_k, n, 256, 0, st_)(x, D, L.ln2g, L.ln2b, ceps_, nullptr, nullptr, o, nullptr);
    linear(o, n, L.fc1, f);
    KL(act_k, grid((size_t)n * cI_), 256, 0, st_)(f, cI_, cI_, a, cI_, (size_t)n * cI_, quick_ ? kQuickGelu : kGeluErf);
    linear(a, n, L.fc2, t);
    KL(add_k, grid((size_t)n * D), 256, 0, st_)(x, t, (size_t)n * D);
  }
  // The pooled row: CLIPTextTransformer's choice (the first <|endoftext|>; see models/flux.cc).
  int row = 0;
  const int32_t mx = *std::max_element(ids, ids + n);
  if (mx == 49407) {
    row = (int)(std::max_element(ids, ids + n) - ids);
  } else {
    for (int i = 0; i < n; i++)
      if (ids[i] == ceos_) {
        row = i;
        break;
      }
  }
  KL(ln_k, 1, 256, 0, st_)(x + (size_t)row * D, D, cfg_, cfb_, ceps_, nullptr, nullptr, nullptr, out);
}

// t5_bucket: T5Attention._relative_position_bucket(memory - query, bidirectional=True), the
// logarithmic part in float32 as torch computes it (as models/flux.cc).
int Model::t5_bucket(int rel) const {
  const int nb = tbuckets_ / 2, max_exact = nb / 2;
  const int b = rel > 0 ? nb : 0;
  const int r = std::abs(rel);
  if (r < max_exact) return b + r;
  const float lf = std::log((float)r / (float)max_exact) / (float)std::log((double)tmaxdist_ / max_exact) * (float)(nb - max_exact);
  return b + std::min(max_exact + (int)lf, nb - 1);
}

// t5_bias: the position bias [H, n, n] (query i, key j: bucket(j - i)), kept per length.
const float *Model::t5_bias(int n) {
  float *&d = tbias_[n];
  if (!d) {
    std::vector<float> h((size_t)tH_ * n * n);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        const int bk = t5_bucket(j - i);
        for (int hh = 0; hh < tH_; hh++) h[((size_t)hh * n + i) * n + j] = trel_[(size_t)bk * tH_ + hh];
      }
    d = dalloc<float>(h.size());
    ck(cudaMemcpy(d, h.data(), 4 * h.size(), cudaMemcpyHostToDevice), "t5 bias");
  }
  return d;
}

// t5_encode: T5EncoderModel's last_hidden_state [n, d_model] (fp32, device) for ids [n] (host).
void Model::t5_encode(const int32_t *ids, int n, float *out) {
  const int D = tD_, inner = tH_ * tkv_, hd = tkv_;
  int *dids = buf<int>("t_ids", n);
  ck(cudaMemcpyAsync(dids, ids, 4 * (size_t)n, cudaMemcpyHostToDevice, st_), "ids");
  float *x = buf<float>("t_x", (size_t)n * D), *t = buf<float>("t_t", (size_t)n * D);
  bf16 *a = buf<bf16>("t_a", (size_t)n * std::max(D, inner)), *qkv = buf<bf16>("t_qkv", (size_t)n * 3 * inner);
  float *g = buf<float>("t_g", (size_t)n * 2 * tff_);
  bf16 *u = buf<bf16>("t_u", (size_t)n * tff_);
  float *S = buf<float>("t_s", (size_t)tH_ * n * n);
  bf16 *P = buf<bf16>("t_p", (size_t)tH_ * n * n);
  const float *bias = t5_bias(n);
  KL(embed_k, grid((size_t)n * D), 256, 0, st_)(temb_.w, dids, nullptr, D, (size_t)n * D, x);
  for (const T5Block &B : t5_) {
    KL(rms_k, n, 256, 0, st_)(x, D, B.ln0, nullptr, teps_, nullptr, a);
    gemm(a, D, 0, B.qkv.w, D, 0, true, qkv, true, 3 * inner, 0, n, 3 * inner, D);
    // Unscaled scores plus the position bias, softmax, then the values (per head).
    gemm(qkv, 3 * inner, hd, qkv + inner, 3 * inner, hd, true, S, false, n, (long long)n * n, n, n, hd, tH_);
    KL(add_k, grid((size_t)tH_ * n * n), 256, 0, st_)(S, bias, (size_t)tH_ * n * n);
    KL(softmax_k, tH_ * n, 256, 0, st_)(S, n, 1.0f, n, false, P);
    gemm(P, n, (long long)n * n, qkv + 2 * inner, 3 * inner, hd, false, a, true, inner, hd, n, hd, n, tH_);
    linear(a, n, B.o, t);
    KL(add_k, grid((size_t)n * D), 256, 0, st_)(x, t, (size_t)n * D);
    KL(rms_k, n, 256, 0, st_)(x, D, B.ln1, nullptr, teps_, nullptr, a);
    linear(a, n, B.wi, g);
    KL(geglu_k, grid((size_t)n * tff_), 256, 0, st_)(g, tff_, (size_t)n * tff_, u);
    linear(u, n, B.wo, t);
    KL(add_k, grid((size_t)n * D), 256, 0, st_)(x, t, (size_t)n * D);
  }
  KL(rms_k, n, 256, 0, st_)(x, D, tfinal_, nullptr, teps_, out, nullptr);
}

// rope_tables: FluxPosEmbed's cos and sin per row of [text (ids 0), image (0, y, x)] and per
// frequency (as models/flux.cc: float64 angles, rounded to float32), kept per shape. The fault
// flux.swap_text_image_ids puts the image ids first.
void Model::rope_tables(int T, int hp2, int wp2) {
  auto &e = rope_cache_[std::make_tuple(T, hp2, wp2)];
  if (!e.first) {
    const int N = hp2 * wp2, L = T + N, nf = hd_ / 2;
    std::vector<int> ids((size_t)L * 3, 0);
    const size_t img_row = swap_ids_ ? 0 : (size_t)T;
    for (int r = 0; r < N; r++) ids[(img_row + r) * 3 + 1] = r / wp2, ids[(img_row + r) * 3 + 2] = r % wp2;
    std::vector<float> c((size_t)L * nf), s((size_t)L * nf);
    for (int r = 0; r < L; r++) {
      int f = 0;
      for (int a = 0; a < 3; a++)
        for (int k = 0; k < axes_[a] / 2; k++, f++) {
          const double freq = 1.0 / std::pow(10000.0, (double)(2 * k) / (double)axes_[a]);
          const double ang = (double)(float)ids[(size_t)r * 3 + a] * freq;
          c[(size_t)r * nf + f] = (float)std::cos(ang);
          s[(size_t)r * nf + f] = (float)std::sin(ang);
        }
    }
    e.first = dalloc<float>(c.size());
    e.second = dalloc<float>(s.size());
    ck(cudaMemcpy(e.first, c.data(), 4 * c.size(), cudaMemcpyHostToDevice), "rope");
    ck(cudaMemcpy(e.second, s.data(), 4 * s.size(), cudaMemcpyHostToDevice), "rope");
  }
  cosv_ = e.first, sinv_ = e.second;
}

// forward: the velocity out [N, 4C] (fp32, device) for packed latents [N, 4C], T5 embeddings txt
// [T, joint] and CLIP's pooled [pooled] (device); tg (device) the pipeline's timestep / 1000 and
// the guidance scale (dev), each times 1000 as the model does: written before each step, so a
// captured step replays with the step's values.
void Model::forward(const float *packed, int N, int hp2, int wp2, const float *txt, int T, const float *pooled, const float *tg,
                    float *out) {
  const int D = D_, L = T + N, F = C_;
  // Conditioning: temb = timestep (+ guidance) + pooled text; every modulation vector from SiLU(temb).
  bf16 *fq = buf<bf16>("fq", 256), *hb = buf<bf16>("hb", std::max(D, pooledD_));
  float *h1 = buf<float>("h1", D), *temb = buf<float>("temb", D), *tmp = buf<float>("tmp", D);
  float *mods = buf<float>("mods", mods_.N);
  KL(tfreq_k, 1, 128, 0, st_)(tg, 128, fq);
  linear(fq, 1, t1_, h1);
  KL(silu_bf16_k, grid(D), 256, 0, st_)(h1, hb, (size_t)D);
  linear(hb, 1, t2_, temb);
  if (guidance_) {
    KL(tfreq_k, 1, 128, 0, st_)(tg + 1, 128, fq);
    linear(fq, 1, g1_, h1);
    KL(silu_bf16_k, grid(D), 256, 0, st_)(h1, hb, (size_t)D);
    linear(hb, 1, g2_, tmp);
    KL(add_k, grid(D), 256, 0, st_)(temb, tmp, (size_t)D);
  }
  KL(to_bf16_k, grid(pooledD_), 256, 0, st_)(pooled, hb, (size_t)pooledD_);
  linear(hb, 1, p1_, h1);
  KL(silu_bf16_k, grid(D), 256, 0, st_)(h1, hb, (size_t)D);
  linear(hb, 1, p2_, tmp);
  KL(add_k, grid(D), 256, 0, st_)(temb, tmp, (size_t)D);
  KL(silu_bf16_k, grid(D), 256, 0, st_)(temb, hb, (size_t)D);
  linear(hb, 1, mods_, mods);

  // Streams: seq = [text (T rows), image (N rows)] fp32.
  float *seq = buf<float>("seq", (size_t)L * D);
  float *cs = seq, *xs = seq + (size_t)T * D;
  bf16 *in = buf<bf16>("in", (size_t)std::max((size_t)T * joint_, (size_t)N * F));
  KL(to_bf16_k, grid((size_t)T * joint_), 256, 0, st_)(txt, in, (size_t)T * joint_);
  linear(in, T, ctx_emb_, cs);
  KL(to_bf16_k, grid((size_t)N * F), 256, 0, st_)(packed, in, (size_t)N * F);
  linear(in, N, x_emb_, xs);
  rope_tables(T, hp2, wp2);
  const int nf = hd_ / 2;

  bf16 *a = buf<bf16>("a", (size_t)L * D), *q = buf<bf16>("q", (size_t)L * D), *k = buf<bf16>("k", (size_t)L * D),
       *v = buf<bf16>("v", (size_t)L * D), *o = buf<bf16>("o", (size_t)L * D);
  // q|k|v rows in bf16 with their biases, as diffusers' bf16 Linear layers leave them (and half
  // the bytes qk_k reads); the residual stream and the products into it stay fp32.
  bf16 *f = buf<bf16>("fqkv", (size_t)L * 3 * D);
  float *tt = buf<float>("tt", (size_t)L * D);
  bf16 *m = buf<bf16>("m", (size_t)L * 5 * D);
  const float scale = 1.0f / sqrtf((float)hd_);
  // The norm that opens each block (LayerNorm, then the block's scale and shift), and norm_out
  // (AdaLayerNormContinuous: scale, then shift) on the image rows, run fused with the previous
  // block's last gated residual (gate_add_ln_k); opening(i) is the i-th of them, blocks in order:
  // image rows' {shift, scale} and text rows' (none for norm_out, whose text rows nothing reads).
  const int nd = (int)double_.size(), ns = (int)single_.size();
  const float *mo = mods + out_mod_;
  struct Open {
    const float *xs, *xc, *cs, *cc;  // image shift, scale; text shift, scale (NULL: none)
    bf16 *xo;                        // where the image rows go (the text rows: a)
  };
  auto opening = [&](int i) -> Open {
    if (i < nd) return {mods + double_[i].mod, mods + double_[i].mod + D, mods + double_[i].cmod, mods + double_[i].cmod + D, a + (size_t)T * D};
    if (i < nd + ns) {
      const float *ms = mods + single_[i - nd].mod;
      return {ms, ms + D, ms, ms + D, a + (size_t)T * D};
    }
    return {mo + D, mo, nullptr, nullptr, a};
  };
  // gated: x += gate * t over both streams' rows (gates gx, gc), fused with opening(i).
  auto gated = [&](const float *t, const float *gx, const float *gc, int i) {
    const Open op = opening(i);
    KL(gate_add_ln_k, N, 256, 0, st_)(xs, t + (size_t)T * D, gx, D, 1e-6f, op.xs, op.xc, op.xo);
    if (op.cs) KL(gate_add_ln_k, T, 256, 0, st_)(cs, t, gc, D, 1e-6f, op.cs, op.cc, a);
  };
  {
    const Open op = opening(0);
    KL(ln_k, N, 256, 0, st_)(xs, D, nullptr, nullptr, 1e-6f, op.xs, op.xc, op.xo, nullptr);
    if (op.cs) KL(ln_k, T, 256, 0, st_)(cs, D, nullptr, nullptr, 1e-6f, op.cs, op.cc, a, nullptr);
  }
  for (int i = 0; i < nd; i++) {
    const Double &b = double_[i];
    const float *mx = mods + b.mod, *mc = mods + b.cmod;  // shift, scale, gate (msa), shift, scale, gate (mlp)
    bf16 *ac = a, *ax = a + (size_t)T * D;  // both streams' normed rows (opened by the previous block)
    product(ac, D, T, b.cqkv, f, true, 3 * D, Epi::kBias);
    KL(qk_k, qk_blocks(T, H_, H_), 256, 0, st_)(f, T, 3 * D, H_, H_, hd_, b.ncq, b.nck, 1e-6f, cosv_, sinv_, q, k, v);
    product(ax, D, N, b.qkv, f, true, 3 * D, Epi::kBias);
    const size_t r0 = (size_t)T * D;
    KL(qk_k, qk_blocks(N, H_, H_), 256, 0, st_)(f, N, 3 * D, H_, H_, hd_, b.nq, b.nk, 1e-6f, cosv_ + (size_t)T * nf, sinv_ + (size_t)T * nf,
                                          q + r0, k + r0, v + r0);
    attention(q, D, k, v, D, o, D, L, L, H_, H_, hd_, scale, false);
    linear(o, T, b.cout, tt);
    linear(o + r0, N, b.out, tt + r0);
    // Both streams' feed-forwards (GELU-tanh fused into their first products).
    KL(gate_add_ln_k, N, 256, 0, st_)(xs, tt + r0, mx + 2 * D, D, 1e-6f, mx + 3 * D, mx + 4 * D, ax);
    KL(gate_add_ln_k, T, 256, 0, st_)(cs, tt, mc + 2 * D, D, 1e-6f, mc + 3 * D, mc + 4 * D, ac);
    product(ax, D, N, b.ff1, m + r0 * 4, true, 4 * D, Epi::kGeluTanhBias);
    product(ac, D, T, b.cff1, m, true, 4 * D, Epi::kGeluTanhBias);
    linear(m + r0 * 4, N, b.ff2, tt + r0);
    linear(m, T, b.cff2, tt);
    gated(tt, mx + 5 * D, mc + 5 * D, i + 1);
  }
  for (int i = 0; i < ns; i++) {
    const Single &b = single_[i];
    const float *ms = mods + b.mod;  // shift, scale, gate
    product(a, D, L, b.qkv, f, true, 3 * D, Epi::kBias);  // [L, 3D]: q | k | v
    KL(qk_k, qk_blocks(L, H_, H_), 256, 0, st_)(f, L, 3 * D, H_, H_, hd_, b.nq, b.nk, 1e-6f, cosv_, sinv_, q, k, v);
    // m = [attention (D) | gelu_tanh(mlp) (4D)] per row, proj_out's input: the MLP's product
    // writes its GELU (fused) straight into its columns.
    product(a, D, L, b.mlp, m + D, true, 5 * D, Epi::kGeluTanhBias);
    attention(q, D, k, v, D, m, 5 * D, L, L, H_, H_, hd_, scale, false);
    linear(m, L, b.out, tt);
    gated(tt, ms + 2 * D, ms + 2 * D, nd + i + 1);
  }
  linear(a, N, proj_out_, out);
}

void Model::generate(const mqb_image_args *a) {
  const int s = vae_scale(), h = a->height / s, w = a->width / s, hp2 = h / 2, wp2 = w / 2, N = hp2 * wp2, F = C_;
  const size_t n = (size_t)latent_ * h * w;
  if (!a->prompt_2 || a->n_prompt_2 <= 0 || !a->prompt || a->n_prompt <= 0)
    throw Fail("flux cuda: both prompts' ids are needed (CLIP's in prompt, T5's in prompt_2)");
  const bool cfg = a->true_cfg > 1 && a->negative && a->n_negative > 0 && a->negative_2 && a->n_negative_2 > 0;
  // 1. Text embeddings.
  ck(cudaStreamSynchronize(st_), "encode");  // the embeddings may still be read by the previous request
  float *pooled = buf<float>("pooled", 2 * (size_t)cD_);
  float *pe = buf<float>("pe", (size_t)a->n_prompt_2 * tD_);
  clip_pooled(a->prompt, a->n_prompt, pooled);
  t5_encode(a->prompt_2, a->n_prompt_2, pe);
  float *ne = nullptr;
  if (cfg) {
    ne = buf<float>("ne", (size_t)a->n_negative_2 * tD_);
    clip_pooled(a->negative, a->n_negative, pooled + cD_);
    t5_encode(a->negative_2, a->n_negative_2, ne);
  }
  if (drop_pooled_) ck(cudaMemsetAsync(pooled, 0, 2 * sizeof(float) * cD_, st_), "drop_pooled");
  // 2. Latents (the runtime's torch-identical noise), packed.
  float *lat = buf<float>("lat", n), *packed = buf<float>("packed", (size_t)N * F);
  float *vp = buf<float>("vpos", (size_t)N * F), *vn = buf<float>("vneg", (size_t)N * F);
  ck(cudaMemcpyAsync(lat, a->noise, 4 * n, cudaMemcpyHostToDevice, st_), "noise");
  KL(pack_k, grid(n), 256, 0, st_)(lat, latent_, h, w, packed);
  KL(round_k, grid(n), 256, 0, st_)(packed, (int)n);
  // 3-4. Denoising: every step's (timestep, guidance), times 1000 as the model takes them, uploaded
  // once; before each step its pair is copied to the one slot the (graphed) forwards read.
  std::vector<float> tgs(2 * (size_t)a->steps);
  for (int i = 0; i < a->steps; i++) {
    // diffusers' bf16 pipeline: timestep.to(bf16), / 1000 (a product by the reciprocal on
    // CUDA), then the model's * 1000, each a bf16 result; guidance.to(bf16) * 1000 likewise.
    const float timestep = bf16r(a->sigmas[i] * 1000.0f);
    const float t = bf16r(timestep * (1.0f / 1000.0f));
    tgs[2 * i] = bf16r(t * 1000.0f), tgs[2 * i + 1] = bf16r(bf16r(a->guidance) * 1000.0f);
  }
  float *tgall = buf<float>("tg_all", tgs.size()), *tg = buf<float>("tg", 2);
  ck(cudaMemcpyAsync(tgall, tgs.data(), 4 * tgs.size(), cudaMemcpyHostToDevice, st_), "timesteps");
  auto key = [&](const float *txt, int T, const float *pool, const float *out) {
    char k[160];
    snprintf(k, sizeof k, "%dx%d t%d %p %p %p %p %p", hp2, wp2, T, (const void *)txt, (const void *)pool, (const void *)out,
             (const void *)packed, (const void *)tg);
    return std::string(k);
  };
  for (int i = 0; i < a->steps; i++) {
    ck(cudaMemcpyAsync(tg, tgall + 2 * i, 8, cudaMemcpyDeviceToDevice, st_), "timestep");
    step_graph(key(pe, a->n_prompt_2, pooled, vp), [&] { forward(packed, N, hp2, wp2, pe, a->n_prompt_2, pooled, tg, vp); });
    if (cfg)
      step_graph(key(ne, a->n_negative_2, pooled + cD_, vn),
                 [&] { forward(packed, N, hp2, wp2, ne, a->n_negative_2, pooled + cD_, tg, vn); });
    KL(euler_k, grid(n), 256, 0, st_)(packed, vp, vn, a->true_cfg, a->sigmas[i + 1] - a->sigmas[i], (int)n, cfg);
    if (a->latents) {
      KL(unpack_k, grid(n), 256, 0, st_)(packed, latent_, h, w, lat);
      ck(cudaMemcpyAsync(a->latents + (size_t)(i + 1) * n, lat, 4 * n, cudaMemcpyDeviceToHost, st_), "latents");
    }
  }
  // 5. Decode.
  KL(unpack_k, grid(n), 256, 0, st_)(packed, latent_, h, w, lat);
  float *img = buf<float>("img", (size_t)a->width * a->height * 3);
  decode(lat, h, w, img);
  pixels(img, a);
}

// The pipeline's registration: the core's mqb_image_* entry points open it by family name.
MQB_REGISTER_FAMILY(image_family<Model>("flux"));

}  // namespace mqflux
