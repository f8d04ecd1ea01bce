// emu_internvl: runs native/models/internvl.cu through the CPU emulation of the CUDA backend
// (native/cuda/host_test/emu_cuda.h: no GPU, no nvcc) and compares it with a double-precision
// InternVL written here from transformers 5.17's modeling_internvl (InternViT per tile, CLS
// dropped, pixel shuffle 0.5, projector, Qwen3 / Qwen2 decoder with the image rows in place of
// <IMG_CONTEXT>): each tile's projected image tokens, the logits of a prompt holding two stacked
// images (three tiles, two runs of image tokens with text between) after prefill, and after one
// decode step. Two configurations: (a) LayerNorm, no attention bias, final LayerNorm, qwen3 text;
// (b) RMSNorm, use_qk_norm, attention_bias, vision_feature_layer -2 (one of two blocks run, no
// final norm), qwen2 text (q/k/v biases, no o_proj bias, no q/k norms). A planted defect
// (internvl.shuffle_transposed, internvl.drop_layer_scale) must move the logits. The tower's
// device time (mqb_vision_ns) must be set after the prefill and cleared by the slot's reset.
// Build and run: sh run_emu.sh (fp32 against the reference; bf16 within a looser bound).
#include "../../native/cuda/host_test/emu_cuda.h"
#include "../../native/models/internvl.cu"

using Vec = std::vector<double>;
static const int V = 300, H = 64, L = 2, NH = 4, NKV = 2, D = 16, I = 96;       // text
static const int VH = 32, VHEADS = 2, VI = 64, DEPTH = 2, P = 14, IMG = 56;  // vision: 4x4 patches
static const int SIDE = IMG / P, NP = SIDE * SIDE + 1, SEQ = (SIDE / 2) * (SIDE / 2), IMG_TOK = 290;

struct Cfg2 {
  bool rms, qk, bias, qwen2;
  int run;  // vision blocks run (vision_feature_layer)
  bool final_ln;
};

struct W {
  std::vector<std::string> names;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<mqb_tensor> t;
  std::map<std::string, size_t> by;
  std::mt19937 rng{7};
  void add(const std::string &n, std::vector<int64_t> s, float c, float sp) {
    int64_t k = 1;
    for (auto x : s) k *= x;
    std::uniform_real_distribution<float> u(-sp, sp);
    std::vector<float> d(k);
    for (auto &x : d) x = c + u(rng);
    by[n] = names.size();
    names.push_back(n), data.push_back(d), shapes.push_back(s);
  }
  void finish() {
    for (size_t i = 0; i < names.size(); ++i) {
      mqb_tensor x{};
      x.name = names[i].c_str();
      x.data = data[i].data();
      x.ndim = (int)shapes[i].size();
      for (int d = 0; d < x.ndim; ++d) x.shape[d] = shapes[i][d];
      t.push_back(x);
    }
  }
  const float *w(const std::string &n) const {
    auto it = by.find(n);
    return it == by.end() ? nullptr : data[it->second].data();
  }
};

static Vec mv(const float *Wt, const Vec &x, int N, int K, const float *b = nullptr) {
  Vec y(N, 0);
  for (int n = 0; n < N; ++n) {
    double s = b ? b[n] : 0;
    for (int k = 0; k < K; ++k) s += (double)Wt[(size_t)n * K + k] * x[k];
    y[n] = s;
  }
  return y;
}
static Vec rmsn(const Vec &x, const float *w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1 / sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}
static Vec lnorm(const Vec &x, const float *w, const float *b, double eps) {
  double mu = 0, var = 0;
  for (double v : x) mu += v;
  mu /= x.size();
  for (double v : x) var += (v - mu) * (v - mu);
  const double r = 1 / sqrt(var / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mu) * r * w[i] + b[i];
  return y;
}
static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

// tower: one tile's pixels [3, IMG, IMG] -> SEQ projected tokens [SEQ][H].
static std::vector<Vec> tower(const W &o, const Cfg2 &c, const float *px) {
  const std::string v = "model.vision_tower.";
  std::vector<Vec> x(NP);
  x[0] = Vec(o.w(v + "embeddings.cls_token"), o.w(v + "embeddings.cls_token") + VH);
  for (int py = 0; py < SIDE; ++py)
    for (int pxi = 0; pxi < SIDE; ++pxi) {
      Vec patch(3 * P * P);
      for (int ch = 0; ch < 3; ++ch)
        for (int ky = 0; ky < P; ++ky)
          for (int kx = 0; kx < P; ++kx)
            patch[(ch * P + ky) * P + kx] = px[((size_t)ch * IMG + py * P + ky) * IMG + pxi * P + kx];
      x[1 + py * SIDE + pxi] = mv(o.w(v + "embeddings.patch_embeddings.projection.weight"), patch, VH, 3 * P * P,
                                  o.w(v + "embeddings.patch_embeddings.projection.bias"));
    }
  const float *pos = o.w(v + "embeddings.position_embeddings");
  for (int i = 0; i < NP; ++i)
    for (int k = 0; k < VH; ++k) x[i][k] += pos[i * VH + k];
  const int hd = VH / VHEADS;
  for (int l = 0; l < c.run; ++l) {
    const std::string b = v + "encoder.layer." + std::to_string(l) + ".", a = b + "attention.";
    auto nrm = [&](const Vec &z, const char *which) {
      return c.rms ? rmsn(z, o.w(b + which + ".weight"), 1e-6) : lnorm(z, o.w(b + which + ".weight"), o.w(b + which + ".bias"), 1e-6);
    };
    std::vector<Vec> q(NP), k(NP), vv(NP);
    for (int i = 0; i < NP; ++i) {
      Vec h = nrm(x[i], "layernorm_before");
      q[i] = mv(o.w(a + "q_proj.weight"), h, VH, VH, o.w(a + "q_proj.bias"));
      k[i] = mv(o.w(a + "k_proj.weight"), h, VH, VH, o.w(a + "k_proj.bias"));
      vv[i] = mv(o.w(a + "v_proj.weight"), h, VH, VH, o.w(a + "v_proj.bias"));
      if (c.qk) {
        q[i] = rmsn(q[i], o.w(a + "q_norm.weight"), 1e-6);
        k[i] = rmsn(k[i], o.w(a + "k_norm.weight"), 1e-6);
      }
    }
    for (int i = 0; i < NP; ++i) {
      Vec att(VH, 0);
      for (int hh = 0; hh < VHEADS; ++hh) {
        Vec s(NP);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < NP; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += q[i][hh * hd + e] * k[j][hh * hd + e];
          s[j] = d / sqrt((double)hd), mx = std::max(mx, s[j]);
        }
        for (auto &e : s) sum += (e = exp(e - mx));
        for (int j = 0; j < NP; ++j)
          for (int e = 0; e < hd; ++e) att[hh * hd + e] += s[j] / sum * vv[j][hh * hd + e];
      }
      Vec pr = mv(o.w(a + "projection_layer.weight"), att, VH, VH, o.w(a + "projection_layer.bias"));
      for (int e = 0; e < VH; ++e) x[i][e] += o.w(b + "lambda_1")[e] * pr[e];
      Vec h2 = nrm(x[i], "layernorm_after");
      Vec f = mv(o.w(b + "mlp.fc1.weight"), h2, VI, VH, o.w(b + "mlp.fc1.bias"));
      for (auto &z : f) z = gelu(z);
      Vec f2 = mv(o.w(b + "mlp.fc2.weight"), f, VH, VI, o.w(b + "mlp.fc2.bias"));
      for (int e = 0; e < VH; ++e) x[i][e] += o.w(b + "lambda_2")[e] * f2[e];
    }
  }
  if (c.final_ln)
    for (auto &z : x) z = lnorm(z, o.w(v + "layernorm.weight"), o.w(v + "layernorm.bias"), 1e-6);
  // transformers' pixel_shuffle, literally: [h, w, C] -> view [h, w/2, 2C] -> permute -> view
  // [w/2, h/2, 4C] -> permute -> [h/2, w/2, 4C]
  const int half = SIDE / 2;
  std::vector<double> a1((size_t)SIDE * SIDE * VH);
  for (int r = 0; r < SIDE; ++r)
    for (int cc = 0; cc < SIDE; ++cc)
      for (int e = 0; e < VH; ++e) a1[((size_t)r * SIDE + cc) * VH + e] = x[1 + r * SIDE + cc][e];
  // a1 as [SIDE][half][2VH]; permute to [half][SIDE][2VH]
  std::vector<double> a2(a1.size());
  for (int r = 0; r < SIDE; ++r)
    for (int c2 = 0; c2 < half; ++c2)
      for (int e = 0; e < 2 * VH; ++e) a2[((size_t)c2 * SIDE + r) * 2 * VH + e] = a1[((size_t)r * half + c2) * 2 * VH + e];
  // a2 as [half][half][4VH] (c2, r2); permute to [r2][c2]
  std::vector<Vec> sh(SEQ, Vec(4 * VH));
  for (int c2 = 0; c2 < half; ++c2)
    for (int r2 = 0; r2 < half; ++r2)
      for (int e = 0; e < 4 * VH; ++e) sh[r2 * half + c2][e] = a2[((size_t)c2 * half + r2) * 4 * VH + e];
  const std::string pj = "model.multi_modal_projector.";
  std::vector<Vec> out(SEQ);
  for (int t = 0; t < SEQ; ++t) {
    Vec z = lnorm(sh[t], o.w(pj + "layer_norm.weight"), o.w(pj + "layer_norm.bias"), 1e-5);
    z = mv(o.w(pj + "linear_1.weight"), z, H, 4 * VH, o.w(pj + "linear_1.bias"));
    for (auto &e : z) e = gelu(e);
    out[t] = mv(o.w(pj + "linear_2.weight"), z, H, H, o.w(pj + "linear_2.bias"));
  }
  return out;
}

// logits of every position of ids, the image tokens taking img rows in order.
static std::vector<Vec> ref(const W &o, const Cfg2 &c, const std::vector<int> &ids, const std::vector<Vec> &img) {
  const int n = ids.size(), G = NH / NKV;
  const std::string tp = "model.language_model.";
  const float *emb = o.w(tp + "embed_tokens.weight");
  std::vector<Vec> x(n);
  for (int t = 0, k = 0; t < n; ++t)
    x[t] = ids[t] == IMG_TOK ? img[k++] : Vec(emb + (size_t)ids[t] * H, emb + (size_t)(ids[t] + 1) * H);
  for (int l = 0; l < L; ++l) {
    const std::string p = tp + "layers." + std::to_string(l) + ".", a = p + "self_attn.";
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      Vec h = rmsn(x[t], o.w(p + "input_layernorm.weight"), 1e-6);
      q[t] = mv(o.w(a + "q_proj.weight"), h, NH * D, H, o.w(a + "q_proj.bias"));
      k[t] = mv(o.w(a + "k_proj.weight"), h, NKV * D, H, o.w(a + "k_proj.bias"));
      v[t] = mv(o.w(a + "v_proj.weight"), h, NKV * D, H, o.w(a + "v_proj.bias"));
      auto rot = [&](Vec &z, int heads, const float *nw) {
        for (int hh = 0; hh < heads; ++hh) {
          Vec seg(z.begin() + hh * D, z.begin() + (hh + 1) * D), out(D);
          if (nw) seg = rmsn(seg, nw, 1e-6);
          for (int i = 0; i < D; ++i) {
            const int j = i % (D / 2);
            const double ang = t / pow(1e6, 2.0 * j / D);
            const double r = i < D / 2 ? -seg[i + D / 2] : seg[i - D / 2];
            out[i] = seg[i] * cos(ang) + r * sin(ang);
          }
          std::copy(out.begin(), out.end(), z.begin() + hh * D);
        }
      };
      rot(q[t], NH, c.qwen2 ? nullptr : o.w(a + "q_norm.weight"));
      rot(k[t], NKV, c.qwen2 ? nullptr : o.w(a + "k_norm.weight"));
    }
    for (int t = 0; t < n; ++t) {
      Vec at(NH * D, 0);
      for (int hh = 0; hh < NH; ++hh) {
        const int g = hh / G;
        Vec s(t + 1);
        double mx = -1e300, sum = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][hh * D + i] * k[u][g * D + i];
          s[u] = d / sqrt((double)D), mx = std::max(mx, s[u]);
        }
        for (auto &e : s) sum += (e = exp(e - mx));
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < D; ++i) at[hh * D + i] += s[u] / sum * v[u][g * D + i];
      }
      Vec ao = mv(o.w(a + "o_proj.weight"), at, H, NH * D, o.w(a + "o_proj.bias"));
      for (int i = 0; i < H; ++i) x[t][i] += ao[i];
      Vec h2 = rmsn(x[t], o.w(p + "post_attention_layernorm.weight"), 1e-6);
      Vec gt = mv(o.w(p + "mlp.gate_proj.weight"), h2, I, H), up = mv(o.w(p + "mlp.up_proj.weight"), h2, I, H), act(I);
      for (int i = 0; i < I; ++i) act[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
      Vec y = mv(o.w(p + "mlp.down_proj.weight"), act, H, I);
      for (int i = 0; i < H; ++i) x[t][i] += y[i];
    }
  }
  std::vector<Vec> out(n);
  for (int t = 0; t < n; ++t) out[t] = mv(emb, rmsn(x[t], o.w(tp + "norm.weight"), 1e-6), V, H);
  return out;
}

static int failures = 0;
static void check(bool ok, const std::string &what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) failures++;
}

static W weights(const Cfg2 &c) {
  W o;
  const std::string tp = "model.language_model.";
  o.add(tp + "embed_tokens.weight", {V, H}, 0, 0.5f);
  for (int l = 0; l < L; ++l) {
    const std::string p = tp + "layers." + std::to_string(l) + ".", a = p + "self_attn.";
    o.add(p + "input_layernorm.weight", {H}, 1, 0.3f);
    o.add(p + "post_attention_layernorm.weight", {H}, 1, 0.3f);
    o.add(a + "q_proj.weight", {NH * D, H}, 0, 0.25f);
    o.add(a + "k_proj.weight", {NKV * D, H}, 0, 0.25f);
    o.add(a + "v_proj.weight", {NKV * D, H}, 0, 0.25f);
    o.add(a + "o_proj.weight", {H, NH * D}, 0, 0.1f);
    if (c.qwen2) {
      o.add(a + "q_proj.bias", {NH * D}, 0, 0.3f);
      o.add(a + "k_proj.bias", {NKV * D}, 0, 0.3f);
      o.add(a + "v_proj.bias", {NKV * D}, 0, 0.3f);
    } else {
      o.add(a + "q_norm.weight", {D}, 1, 0.3f);
      o.add(a + "k_norm.weight", {D}, 1, 0.3f);
    }
    o.add(p + "mlp.gate_proj.weight", {I, H}, 0, 0.2f);
    o.add(p + "mlp.up_proj.weight", {I, H}, 0, 0.2f);
    o.add(p + "mlp.down_proj.weight", {H, I}, 0, 0.1f);
  }
  o.add(tp + "norm.weight", {H}, 1, 0.3f);
  const std::string v = "model.vision_tower.";
  o.add(v + "embeddings.cls_token", {1, 1, VH}, 0, 0.5f);
  o.add(v + "embeddings.patch_embeddings.projection.weight", {VH, 3, P, P}, 0, 0.05f);
  o.add(v + "embeddings.patch_embeddings.projection.bias", {VH}, 0, 0.1f);
  o.add(v + "embeddings.position_embeddings", {1, NP, VH}, 0, 0.3f);
  for (int l = 0; l < DEPTH; ++l) {
    const std::string b = v + "encoder.layer." + std::to_string(l) + ".", a = b + "attention.";
    for (const char *nm : {"layernorm_before", "layernorm_after"}) {
      o.add(b + nm + ".weight", {VH}, 1, 0.2f);
      if (!c.rms) o.add(b + nm + ".bias", {VH}, 0, 0.2f);
    }
    for (const char *pr : {"q_proj", "k_proj", "v_proj"}) {
      o.add(a + pr + ".weight", {VH, VH}, 0, 0.3f);
      if (c.bias) o.add(a + pr + ".bias", {VH}, 0, 0.2f);
    }
    if (c.qk) {
      o.add(a + "q_norm.weight", {VH}, 1, 0.3f);
      o.add(a + "k_norm.weight", {VH}, 1, 0.3f);
    }
    o.add(a + "projection_layer.weight", {VH, VH}, 0, 0.3f);
    o.add(a + "projection_layer.bias", {VH}, 0, 0.2f);
    o.add(b + "lambda_1", {VH}, 0.5f, 0.4f);
    o.add(b + "lambda_2", {VH}, 0.5f, 0.4f);
    o.add(b + "mlp.fc1.weight", {VI, VH}, 0, 0.3f);
    o.add(b + "mlp.fc1.bias", {VI}, 0, 0.2f);
    o.add(b + "mlp.fc2.weight", {VH, VI}, 0, 0.2f);
    o.add(b + "mlp.fc2.bias", {VH}, 0, 0.2f);
  }
  if (c.final_ln) {
    o.add(v + "layernorm.weight", {VH}, 1, 0.2f);
    o.add(v + "layernorm.bias", {VH}, 0, 0.2f);
  }
  const std::string pj = "model.multi_modal_projector.";
  o.add(pj + "layer_norm.weight", {4 * VH}, 1, 0.2f);
  o.add(pj + "layer_norm.bias", {4 * VH}, 0, 0.2f);
  o.add(pj + "linear_1.weight", {H, 4 * VH}, 0, 0.2f);
  o.add(pj + "linear_1.bias", {H}, 0, 0.2f);
  o.add(pj + "linear_2.weight", {H, H}, 0, 0.2f);
  o.add(pj + "linear_2.bias", {H}, 0, 0.2f);
  o.finish();
  return o;
}

static mqb_model *open_model(const W &o, const Cfg2 &c, const char *prec) {
  std::vector<mqb_hparam> hp = {
      {"vocab_size", V, nullptr}, {"hidden_size", H, nullptr}, {"intermediate_size", I, nullptr},
      {"num_layers", L, nullptr}, {"num_heads", NH, nullptr}, {"num_kv_heads", NKV, nullptr}, {"head_dim", D, nullptr},
      {"max_positions", 512, nullptr}, {"norm_eps", 1e-6, nullptr}, {"tie_word_embeddings", 1, nullptr},
      {"rope_theta", 1e6, nullptr}, {"attention_bias", c.qwen2 ? 1. : 0., nullptr},
      {"scale_attn_by_inverse_layer_idx", 0, nullptr}, {"text_qwen2", c.qwen2 ? 1. : 0., nullptr},
      {"vision_hidden_size", VH, nullptr}, {"vision_num_layers", DEPTH, nullptr}, {"vision_num_heads", VHEADS, nullptr},
      {"vision_intermediate_size", VI, nullptr}, {"vision_patch_size", P, nullptr}, {"vision_image_size", IMG, nullptr},
      {"vision_layer_norm_eps", 1e-6, nullptr}, {"vision_rms_norm", c.rms ? 1. : 0., nullptr},
      {"vision_qk_norm", c.qk ? 1. : 0., nullptr}, {"vision_attention_bias", c.bias ? 1. : 0., nullptr},
      {"vision_run_layers", (double)c.run, nullptr}, {"vision_final_layernorm", c.final_ln ? 1. : 0., nullptr},
      {"image_token_id", IMG_TOK, nullptr}};
  mqb_model_params p{};
  p.abi_version = MQB_ABI_VERSION;
  p.family = "internvl";
  p.hparams = hp.data();
  p.n_hparams = (int)hp.size();
  p.precision = prec;
  p.max_batch = 2;
  p.max_context = 128;
  p.tensors = o.t.data();
  p.n_tensors = (int)o.t.size();
  mqb_model *m = nullptr;
  char err[512];
  if (mqb_model_open(&p, &m, err, sizeof err)) {
    printf("FAIL open: %s\n", err);
    exit(1);
  }
  return m;
}

static void run(const char *name, const Cfg2 &c, const char *prec, double tol) {
  const W o = weights(c);
  const int tiles = 3;
  std::vector<float> px((size_t)tiles * 3 * IMG * IMG);
  std::mt19937 r(3);
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto &x : px) x = u(r);
  // two stacked images: 2 tiles, then 1, their image-token runs apart
  std::vector<int> ids = {5, 17, 33};
  for (int k = 0; k < 2 * SEQ; ++k) ids.push_back(IMG_TOK);
  ids.insert(ids.end(), {44, 9});
  for (int k = 0; k < SEQ; ++k) ids.push_back(IMG_TOK);
  ids.insert(ids.end(), {71, 2, 250});
  std::vector<Vec> img;
  for (int t = 0; t < tiles; ++t)
    for (auto &z : tower(o, c, px.data() + (size_t)t * 3 * IMG * IMG)) img.push_back(z);
  mqb_model *m = open_model(o, c, prec);
  char err[512];
  const int n = (int)ids.size(), slot = 0;
  int rc = mqb_set_image(m, slot, px.data(), (int64_t)px.size(), tiles, SIDE, SIDE, ids.data(), n, err, sizeof err);
  check(rc == 0, std::string(name) + " " + prec + " set_image" + (rc ? std::string(": ") + err : ""));
  std::vector<float> lo(V);
  int am = -1, zero = 0;
  rc = mqb_forward(m, 1, &slot, &n, ids.data(), &zero, lo.data(), &am, err, sizeof err);
  check(rc == 0, std::string(name) + " " + prec + " prefill" + (rc ? std::string(": ") + err : ""));
  // the tower's device time (mqb_vision_ns): two events around the encode, on the emulated clock
  const int64_t vns = mqb_vision_ns(m, slot);
  check(vns > 0 && mqb_vision_ns(m, 1) == 0,
        std::string(name) + " " + prec + " vision_ns " + std::to_string(vns) + " after prefill (> 0), slot 1's 0");
  // the tower's output as the decoder took it
  auto &vs = mqcuda::internvl::vis(*m);
  std::vector<float> dev((size_t)tiles * SEQ * H);
  cudaMemcpy(dev.data(), vs.slot[slot].dev, dev.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double dimg = 0, scale = 0;
  for (size_t t = 0; t < img.size(); ++t)
    for (int e = 0; e < H; ++e) {
      dimg = std::max(dimg, std::fabs(img[t][e] - dev[t * H + e]));
      scale = std::max(scale, std::fabs(img[t][e]));
    }
  check(dimg < tol * std::max(1.0, scale), std::string(name) + " " + prec + " image tokens (3 tiles) max|d| " +
                                               std::to_string(dimg) + " (max |x| " + std::to_string(scale) + ")");
  std::vector<Vec> want = ref(o, c, ids, img);
  double d = 0;
  for (int k = 0; k < V; ++k) d = std::max(d, std::fabs(want[n - 1][k] - lo[k]));
  check(d < tol * 10, std::string(name) + " " + prec + " prefill logits max|d| " + std::to_string(d));
  const double clean = d;  // a planted defect must move the logits far past this
  // one decode step (the image stays in the KV cache)
  ids.push_back(am);
  const int one = 1, pos = n;
  rc = mqb_forward(m, 1, &slot, &one, &ids[n], &pos, lo.data(), &am, err, sizeof err);
  want = ref(o, c, ids, img);
  d = 0;
  for (int k = 0; k < V; ++k) d = std::max(d, std::fabs(want[n][k] - lo[k]));
  check(rc == 0 && d < tol * 10, std::string(name) + " " + prec + " decode step logits max|d| " + std::to_string(d));
  // several images as a list (mqb_set_images) are their tiles stacked: the same logits
  {
    const int32_t grids[6] = {2, SIDE, SIDE, 1, SIDE, SIDE};
    std::vector<float> l2(V);
    const std::vector<int> prompt(ids.begin(), ids.begin() + n);
    mqb_slot_reset(m, 1);
    rc = mqb_set_images(m, 1, px.data(), (int64_t)px.size(), grids, 2, prompt.data(), n, err, sizeof err);
    int am2 = -1, one_slot = 1;
    if (rc == 0) rc = mqb_forward(m, 1, &one_slot, &n, prompt.data(), &zero, l2.data(), &am2, err, sizeof err);
    double dl = 0;
    for (int k = 0; k < V; ++k) dl = std::max(dl, std::fabs(want[n - 1][k] - l2[k]));
    check(rc == 0 && dl < tol * 10, std::string(name) + " " + prec + " two images as a list: logits max|d| " +
                                        std::to_string(dl) + (rc ? std::string(": ") + err : ""));
    mqb_slot_reset(m, 1);
    check(mqb_vision_ns(m, 1) == 0, std::string(name) + " " + prec + " vision_ns 0 after the slot's reset");
  }
  // refusals: a prompt with a tile's tokens short, a grid of the wrong side
  rc = mqb_set_image(m, 1, px.data(), (int64_t)px.size(), tiles, SIDE, SIDE, ids.data(), n - 4, err, sizeof err);
  check(rc != 0 && strstr(err, "image tokens"), std::string(name) + " refuses a prompt without every tile's tokens: " + err);
  rc = mqb_set_image(m, 1, px.data(), (int64_t)px.size(), tiles, SIDE + 2, SIDE, ids.data(), n, err, sizeof err);
  check(rc != 0 && strstr(err, "grid"), std::string(name) + " refuses a grid of the wrong side: " + err);
  mqb_model_close(m);
  // planted defects move the logits
  const std::vector<int> prompt(ids.begin(), ids.begin() + n);
  for (const char *f : {"internvl.shuffle_transposed", "internvl.drop_layer_scale"}) {
    setenv("MODELQUAL_FAULTS", f, 1);
    mqb_model *mf = open_model(o, c, prec);
    std::vector<float> lf(V);
    mqb_set_image(mf, slot, px.data(), (int64_t)px.size(), tiles, SIDE, SIDE, prompt.data(), n, err, sizeof err);
    mqb_forward(mf, 1, &slot, &n, prompt.data(), &zero, lf.data(), &am, err, sizeof err);
    double df = 0;
    for (int k = 0; k < V; ++k) df = std::max(df, std::fabs(want[n - 1][k] - lf[k]));
    const double bound = std::max(0.1, 20 * clean);
    check(df > bound, std::string(name) + " " + prec + " fault " + f + " moves the logits by " + std::to_string(df) +
                          " (more than " + std::to_string(bound) + ", 20x the clean model's)");
    mqb_model_close(mf);
    unsetenv("MODELQUAL_FAULTS");
  }
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const Cfg2 a{false, false, false, false, DEPTH, true};  // LayerNorm, qwen3 text, final norm
  const Cfg2 b{true, true, true, true, DEPTH - 1, false};  // RMSNorm, q/k norm, biases, layer -2, qwen2
  const char *only = getenv("EMU_PREC");
  for (const char *prec : {"fp32", "bf16"}) {
    if (only && strcmp(only, prec)) continue;
    const double tol = strcmp(prec, "fp32") == 0 ? 2e-4 : 0.06;
    run("a (layer_norm, qwen3)", a, prec, tol);
    run("b (rms_norm, qk_norm, bias, layer -2, qwen2)", b, prec, tol);
  }
  printf("%s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
