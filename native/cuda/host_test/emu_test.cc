// emu_test: runs the CUDA backend (backend.cu and the families' native/models/*.cu) on the CPU,
// without a GPU or nvcc, to test its logic (config and
// tensor handling, chunked prefill, graph bucket padding, argmax, and the kernels' indexing and
// math) against a straightforward double-precision reference of qwen3, gpt2 and llama (with
// Mistral's sliding window: the reference's own mask, keys p - window < k <= p).
//
// How: the stub headers in ../stub declare the CUDA API; emu_cuda.h implements it on host memory.
// A kernel launch runs the kernel body on blockDim.x CPU threads (one per CUDA thread) that walk
// the grid's blocks together; __syncthreads, __syncwarp and warp shuffles are barriers; shared
// memory is function-static. Stream capture records launches and cudaGraphLaunch replays them.
// cuBLAS GemmEx is a plain loop. Build and run: ./run.sh (g++ with C++20).
#include "emu_cuda.h"
#include "../../models/llama.cu"

// ---------------------------------------------------------------------------------------------
// Models and references

// knob sets one of the model's kernel choices between steps (the lab's builds do this through
// lab/cuda/debug_abi.cu; the library itself keeps its defaults), so the test reaches every path.
static void knob(mqb_model *m, const std::string &k, int v) {
  cudaStreamSynchronize(m->stream);
  m->clear_graphs();
  if (k == "graphs") m->use_graphs = v != 0;
  else if (k == "mixed_graphs") m->mixed_graphs = v != 0;
  else if (k == "skinny") m->sk_on = v != 0;
  else if (k == "tile_max_b") m->tile_max_b = v;
  else if (k == "tile_z") m->tile_z = v;
  else if (k == "fuse_max_b") m->fuse_max_b = v;
  else if (k == "attn_split") m->attn_split = v;
  else if (k == "fused_attn") m->fused_attn = v;
  else if (k == "attn_lanes") m->attn_lanes = v != 0;
  else if (k == "attn_flash") m->attn_flash = v != 0;
  else if (k == "prefill_tc") m->prefill_tc = v != 0;
  else if (k == "prefill_one") m->prefill_one = v;
  else if (k == "prep_vec") m->prep_vec = v != 0;
  else if (k == "post_n") m->post_n = v != 0;
  else {
    fprintf(stderr, "emu_test: unknown knob %s\n", k.c_str());
    abort();
  }
}

struct Owned {
  std::vector<std::string> names;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<mqb_tensor> t;
  std::map<std::string, const std::vector<float> *> by;
  std::mt19937 rng{42};
  void add(const std::string &n, std::vector<int64_t> shape, float center, float spread) {
    int64_t c = 1;
    for (auto s : shape) c *= s;
    std::uniform_real_distribution<float> u(-spread, spread);
    std::vector<float> d(c);
    for (auto &x : d) x = center + u(rng);
    names.push_back(n);
    data.push_back(std::move(d));
    shapes.push_back(shape);
  }
  void finish() {
    t.clear();
    for (size_t i = 0; i < names.size(); ++i) {
      mqb_tensor x{};
      x.name = names[i].c_str();
      x.data = data[i].data();
      x.ndim = (int)shapes[i].size();
      for (int d = 0; d < x.ndim; ++d) x.shape[d] = shapes[i][d];
      t.push_back(x);
      by[names[i]] = &data[i];
    }
  }
  const float *w(const std::string &n) const { return by.at(n)->data(); }
};

using Vec = std::vector<double>;
static Vec matvec(const float *W, const Vec &x, int N, int K, bool conv1d) {  // Linear [N,K] or Conv1D [K,N]
  Vec y(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += (double)(conv1d ? W[(size_t)k * N + n] : W[(size_t)n * K + k]) * x[k];
    y[n] = s;
  }
  return y;
}
static Vec rms(const Vec &x, const float *w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double r = 1.0 / sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}
static Vec lnorm(const Vec &x, const float *w, const float *b, double eps) {
  double m = 0, v = 0;
  for (double a : x) m += a;
  m /= x.size();
  for (double a : x) v += (a - m) * (a - m);
  v /= x.size();
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - m) / sqrt(v + eps) * w[i] + b[i];
  return y;
}

// ref_logits: full-sequence logits [n][V] of the reference model in double precision. window
// (0: none): Mistral's sliding window, applied here by its definition (transformers' causal mask
// and sliding_window_overlay: query t sees key u where t - window < u <= t), not through the
// backend's Cfg. The RMSNorm models (qwen3, llama) have q/k norms where the tensors hold them.
static std::vector<Vec> ref_logits(const Owned &o, const Cfg &c, const std::vector<int> &ids, int window = 0) {
  const int n = (int)ids.size(), H = c.H, D = c.D, nh = c.nh, nkv = c.nkv, G = nh / nkv;
  const bool q3 = c.norm == PREP_RMS;
  const bool qk_norm = o.by.count("model.layers.0.self_attn.q_norm.weight") > 0;
  std::vector<Vec> x(n);
  for (int t = 0; t < n; ++t) {
    x[t].resize(H);
    for (int i = 0; i < H; ++i)
      x[t][i] = q3 ? o.w("model.embed_tokens.weight")[(size_t)ids[t] * H + i]
                   : o.w("transformer.wte.weight")[(size_t)ids[t] * H + i] + o.w("transformer.wpe.weight")[(size_t)t * H + i];
  }
  for (int l = 0; l < c.L; ++l) {
    std::vector<Vec> q(n), k(n), v(n);
    const std::string p = q3 ? "model.layers." + std::to_string(l) + "." : "transformer.h." + std::to_string(l) + ".";
    for (int t = 0; t < n; ++t) {
      if (q3) {
        Vec h = rms(x[t], o.w(p + "input_layernorm.weight"), c.eps);
        q[t] = matvec(o.w(p + "self_attn.q_proj.weight"), h, nh * D, H, false);
        k[t] = matvec(o.w(p + "self_attn.k_proj.weight"), h, nkv * D, H, false);
        v[t] = matvec(o.w(p + "self_attn.v_proj.weight"), h, nkv * D, H, false);
        auto headnorm_rope = [&](Vec &z, int heads, const float *nw) {
          for (int hh = 0; hh < heads; ++hh) {
            Vec seg(z.begin() + hh * D, z.begin() + (hh + 1) * D);
            if (nw) seg = rms(seg, nw, c.eps);
            Vec out(D);
            for (int i = 0; i < D; ++i) {
              int j = i % (D / 2);
              double invf = 1.0 / pow(c.theta, 2.0 * j / D), ang = t * invf;
              double rot = i < D / 2 ? -seg[i + D / 2] : seg[i - D / 2];
              out[i] = seg[i] * cos(ang) + rot * sin(ang);
            }
            std::copy(out.begin(), out.end(), z.begin() + hh * D);
          }
        };
        headnorm_rope(q[t], nh, qk_norm ? o.w(p + "self_attn.q_norm.weight") : nullptr);
        headnorm_rope(k[t], nkv, qk_norm ? o.w(p + "self_attn.k_norm.weight") : nullptr);
      } else {
        Vec h = lnorm(x[t], o.w(p + "ln_1.weight"), o.w(p + "ln_1.bias"), c.eps);
        Vec qkv = matvec(o.w(p + "attn.c_attn.weight"), h, 3 * H, H, true);
        for (int i = 0; i < 3 * H; ++i) qkv[i] += o.w(p + "attn.c_attn.bias")[i];
        q[t] = Vec(qkv.begin(), qkv.begin() + H);
        k[t] = Vec(qkv.begin() + H, qkv.begin() + 2 * H);
        v[t] = Vec(qkv.begin() + 2 * H, qkv.end());
      }
    }
    for (int t = 0; t < n; ++t) {
      Vec a(nh * D, 0.0);
      for (int hh = 0; hh < nh; ++hh) {
        const int g = hh / G;
        auto visible = [&](int u) { return u <= t && (window <= 0 || u > t - window); };
        std::vector<double> s(t + 1, 0.0);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          if (!visible(u)) continue;
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][hh * D + i] * k[u][g * D + i];
          s[u] = d / sqrt((double)D);
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u)
          if (visible(u)) sum += (s[u] = exp(s[u] - mx));
        for (int u = 0; u <= t; ++u)
          if (visible(u))
            for (int i = 0; i < D; ++i) a[hh * D + i] += s[u] / sum * v[u][g * D + i];
      }
      if (q3) {
        Vec ao = matvec(o.w(p + "self_attn.o_proj.weight"), a, H, nh * D, false);
        for (int i = 0; i < H; ++i) x[t][i] += ao[i];
        Vec h2 = rms(x[t], o.w(p + "post_attention_layernorm.weight"), c.eps);
        Vec gt = matvec(o.w(p + "mlp.gate_proj.weight"), h2, c.I, H, false);
        Vec up = matvec(o.w(p + "mlp.up_proj.weight"), h2, c.I, H, false);
        Vec act(c.I);
        for (int i = 0; i < c.I; ++i) act[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
        Vec dn = matvec(o.w(p + "mlp.down_proj.weight"), act, H, c.I, false);
        for (int i = 0; i < H; ++i) x[t][i] += dn[i];
      } else {
        Vec ao = matvec(o.w(p + "attn.c_proj.weight"), a, H, H, true);
        for (int i = 0; i < H; ++i) x[t][i] += ao[i] + o.w(p + "attn.c_proj.bias")[i];
        Vec h2 = lnorm(x[t], o.w(p + "ln_2.weight"), o.w(p + "ln_2.bias"), c.eps);
        Vec f = matvec(o.w(p + "mlp.c_fc.weight"), h2, c.I, H, true);
        for (int i = 0; i < c.I; ++i) {
          double z = f[i] + o.w(p + "mlp.c_fc.bias")[i];
          f[i] = 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
        }
        Vec pr = matvec(o.w(p + "mlp.c_proj.weight"), f, H, c.I, true);
        for (int i = 0; i < H; ++i) x[t][i] += pr[i] + o.w(p + "mlp.c_proj.bias")[i];
      }
    }
  }
  std::vector<Vec> out(n);
  for (int t = 0; t < n; ++t) {
    Vec h = q3 ? rms(x[t], o.w("model.norm.weight"), c.eps)
               : lnorm(x[t], o.w("transformer.ln_f.weight"), o.w("transformer.ln_f.bias"), c.eps);
    out[t] = matvec(q3 ? o.w("model.embed_tokens.weight") : o.w("transformer.wte.weight"), h, c.V, H, false);
  }
  return out;
}

// The hyper-parameters as the runtime's family resolve steps hand them over (ABI 4).
using HP = std::vector<mqb_hparam>;
static HP qwen3_hp(double heads) {
  return {{"vocab_size", 300, nullptr}, {"hidden_size", 64, nullptr}, {"intermediate_size", 128, nullptr},
          {"num_layers", 2, nullptr}, {"num_heads", heads, nullptr}, {"num_kv_heads", 2, nullptr},
          {"head_dim", 16, nullptr}, {"max_positions", 512, nullptr}, {"norm_eps", 1e-6, nullptr},
          {"tie_word_embeddings", 1, nullptr}, {"rope_theta", 1e6, nullptr}, {"attention_bias", 0, nullptr},
          {"scale_attn_by_inverse_layer_idx", 0, nullptr}};
}
static const HP QCFG = qwen3_hp(4);
static const HP GCFG = {{"vocab_size", 300, nullptr}, {"hidden_size", 64, nullptr}, {"intermediate_size", 256, nullptr},
                        {"num_layers", 2, nullptr}, {"num_heads", 4, nullptr}, {"num_kv_heads", 4, nullptr},
                        {"head_dim", 16, nullptr}, {"max_positions", 128, nullptr}, {"norm_eps", 1e-5, nullptr},
                        {"tie_word_embeddings", 1, nullptr}, {"rope_theta", 0, nullptr}, {"attention_bias", 1, nullptr},
                        {"scale_attn_by_inverse_layer_idx", 0, nullptr}};

// llama_hp: MistralForCausalLM as the runtime's llama resolve hands it over (llama.cc): qwen3's
// shape without q/k norms, 8 query heads over 2 KV heads, the rotary frequencies theta^(-2j/D)
// as resolved (rope type none, attention scaling 1) and sliding_window (0: none).
static HP llama_hp(int window) {
  static std::vector<std::string> keys;  // the rope_inv_freq.<j> names, alive for the hparams
  HP h = qwen3_hp(8);
  h.push_back({"mlp_bias", 0, nullptr});
  h.push_back({"rope_attention_scaling", 1, nullptr});
  h.push_back({"sliding_window", (double)window, nullptr});
  if (keys.empty())
    for (int j = 0; j < 8; ++j) keys.push_back("rope_inv_freq." + std::to_string(j));
  for (int j = 0; j < 8; ++j) h.push_back({keys[j].c_str(), 1.0 / pow(1e6, 2.0 * j / 16), nullptr});
  return h;
}

// QCFG_G5: five query heads per KV head (as in Qwen3-14B's 40/8), so the attention kernels run
// their GM = 8 instantiation with runtime G < GM.
static const HP QCFG_G5 = qwen3_hp(10);

static Owned make_qwen3(int nh = 4, int nkv = 2, bool qk_norm = true) {
  Owned o;
  o.add("model.embed_tokens.weight", {300, 64}, 0, 0.5f);
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    o.add(p + "input_layernorm.weight", {64}, 1, 0.3f);
    o.add(p + "post_attention_layernorm.weight", {64}, 1, 0.3f);
    o.add(p + "self_attn.q_proj.weight", {nh * 16, 64}, 0, 0.25f);
    o.add(p + "self_attn.k_proj.weight", {nkv * 16, 64}, 0, 0.25f);
    o.add(p + "self_attn.v_proj.weight", {nkv * 16, 64}, 0, 0.25f);
    o.add(p + "self_attn.o_proj.weight", {64, nh * 16}, 0, 0.1f);
    if (qk_norm) {
      o.add(p + "self_attn.q_norm.weight", {16}, 1, 0.3f);
      o.add(p + "self_attn.k_norm.weight", {16}, 1, 0.3f);
    }
    o.add(p + "mlp.gate_proj.weight", {128, 64}, 0, 0.2f);
    o.add(p + "mlp.up_proj.weight", {128, 64}, 0, 0.2f);
    o.add(p + "mlp.down_proj.weight", {64, 128}, 0, 0.1f);
  }
  o.add("model.norm.weight", {64}, 1, 0.3f);
  o.finish();
  return o;
}
static Owned make_gpt2() {
  Owned o;
  o.add("transformer.wte.weight", {300, 64}, 0, 0.5f);
  o.add("transformer.wpe.weight", {128, 64}, 0, 0.2f);
  for (int l = 0; l < 2; ++l) {
    std::string p = "transformer.h." + std::to_string(l) + ".";
    o.add(p + "ln_1.weight", {64}, 1, 0.3f);
    o.add(p + "ln_1.bias", {64}, 0, 0.2f);
    o.add(p + "ln_2.weight", {64}, 1, 0.3f);
    o.add(p + "ln_2.bias", {64}, 0, 0.2f);
    o.add(p + "attn.c_attn.weight", {64, 192}, 0, 0.25f);
    o.add(p + "attn.c_attn.bias", {192}, 0, 0.2f);
    o.add(p + "attn.c_proj.weight", {64, 64}, 0, 0.1f);
    o.add(p + "attn.c_proj.bias", {64}, 0, 0.1f);
    o.add(p + "mlp.c_fc.weight", {64, 256}, 0, 0.2f);
    o.add(p + "mlp.c_fc.bias", {256}, 0, 0.2f);
    o.add(p + "mlp.c_proj.weight", {256, 64}, 0, 0.1f);
    o.add(p + "mlp.c_proj.bias", {64}, 0, 0.1f);
  }
  o.add("transformer.ln_f.weight", {64}, 1, 0.3f);
  o.add("transformer.ln_f.bias", {64}, 0, 0.2f);
  o.finish();
  return o;
}

static int failures = 0;
static void check(bool ok, const std::string &what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

static double maxdiff(const float *a, const Vec &b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, fabs((double)a[i] - b[i]));
  return m;
}
static int argmax_ref(const Vec &v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); }

// model_params: the params that open family's model (hparams hp, weights o) on the backend with
// max_batch slots of max_context positions; hp and o must outlive the open.
static mqb_model_params model_params(const char *family, const HP &hp, const Owned &o, const char *prec, int max_batch,
                                     int max_context) {
  mqb_model_params p{};
  p.abi_version = MQB_ABI_VERSION;
  p.family = family;
  p.hparams = hp.data();
  p.n_hparams = (int)hp.size();
  p.precision = prec;
  p.max_batch = max_batch;
  p.max_context = max_context;
  p.tensors = o.t.data();
  p.n_tensors = (int)o.t.size();
  return p;
}

// window: the sliding window the reference applies (0: none), given here, not read from the
// backend's configuration.
static void run_family(const char *family, const HP &hp, Owned &o, const char *prec, double tol, int maxctx,
                       int window = 0) {
  Cfg c = cfg_from_hparams(family, hp.data(), (int)hp.size());
  const mqb_model_params p = model_params(family, hp, o, prec, 8, maxctx);
  mqb_model *m = nullptr;
  char err[512];
  if (mqb_model_open(&p, &m, err, sizeof err)) {
    check(false, std::string("open: ") + err);
    return;
  }
  std::mt19937 rng(7);
  auto rnd_ids = [&](int n) {
    std::vector<int> v(n);
    for (auto &x : v) x = (int)(rng() % 300);
    return v;
  };
  const int V = c.V;
  // logits_all over 70 tokens: two chunks of the 64-row logits buffer.
  {
    std::vector<int> ids = rnd_ids(70);
    std::vector<float> out((size_t)70 * V);
    int rc = mqb_logits_all(m, ids.data(), 70, out.data(), err, sizeof err);
    auto ref = ref_logits(o, c, ids, window);
    double md = 0;
    for (int t = 0; t < 70; ++t) md = std::max(md, maxdiff(out.data() + (size_t)t * V, ref[t]));
    check(rc == 0 && md < tol, std::string(family) + " " + prec + " logits_all max|d| = " + std::to_string(md));
    if (window > 0) {  // the window matters: the whole-cache reference is far from these logits
      auto full = ref_logits(o, c, ids);
      double mf = 0;
      for (int t = 0; t < 70; ++t) mf = std::max(mf, maxdiff(out.data() + (size_t)t * V, full[t]));
      check(mf > 4 * tol, std::string(family) + " " + prec + " sliding window " + std::to_string(window) +
                              ": the whole-cache reference is max|d| = " + std::to_string(mf) + " away (> 4 tol)");
    }
    // The same logits, bit for bit, with the SwiGLU / GELU prep one value at a time (prep_vec 0;
    // the 70 rows' products go through cuBLAS, so their down projection's input is that prep's).
    std::vector<float> alt((size_t)70 * V);
    knob(m, "prep_vec", 0);
    rc = mqb_logits_all(m, ids.data(), 70, alt.data(), err, sizeof err);
    knob(m, "prep_vec", 1);
    check(rc == 0 && alt == out, std::string(family) + " " + prec + " logits_all: the same bits with prep_vec 0");
    // ... and with qkv_post_kernel holding HV values a lane (post_n 0) instead of head_n's.
    knob(m, "post_n", 0);
    rc = mqb_logits_all(m, ids.data(), 70, alt.data(), err, sizeof err);
    knob(m, "post_n", 1);
    check(rc == 0 && alt == out, std::string(family) + " " + prec + " logits_all: the same bits with post_n 0");
  }
  // Batched generation with teacher-forced reference: prefill of several lengths in one call,
  // then decode steps; batches 6 (bucket 8), 3 (bucket 4 with padding), 1, and 3 again without
  // graphs (and with decode attention through attend, one thread per scored position, instead of
  // attend_flash, and the prefill's through attention_kernel's attend instead of the tensor
  // cores), with decode attention unfused (qkv_post + attention) and with 3 position splits
  // (uneven ranges, some empty at first); the default splits fill 132 SMs (up to 16). In bf16/fp16
  // the layers' products of every batch go through the tile kernel (qkv and gate/up with their
  // RMSNorm, and gate/up with the SwiGLU, fused into it; the fp32 runs take the GEMV at 1-4
  // rows); variant 6 sends batch 6 through the tile kernel with its K range split over two blocks
  // (partials summed in split order), variant 7 to cuBLAS, variant 8 to the tile
  // kernel unfused (prep kernels), variant 9 batch 3 through the fused GEMV.
  const char *vname[] = {"", "", "", " no-graph attend thread-scores", " unfused-attention",
                         " attention-split-3", " tile-split-K", " cuBLAS", " tile unfused", " GEMV"};
  // Each variant's debug switches: the value it runs with, then the backend's default it restores.
  struct Switch {
    const char *key;
    int on, off;
  };
  const std::vector<std::vector<Switch>> vsw = {
      {}, {}, {}, {{"graphs", 0, 1}, {"attn_flash", 0, 1}, {"attn_lanes", 0, 1}, {"prefill_tc", 0, 1}},
      {{"fused_attn", 0, 1}},
      {{"attn_split", 3, 0}}, {{"tile_z", 2, 0}},
      {{"skinny", 0, 1}},
      {{"fuse_max_b", 0, 16}}, {{"tile_max_b", 0, 16}, {"fuse_max_b", 0, 16}}};
  const bool half = std::string(prec) != "fp32";
  for (int variant = 0; variant < (half ? 10 : 6); ++variant) {
    std::vector<int> lens = variant == 0 || (variant >= 6 && variant <= 8) ? std::vector<int>{5, 20, 9, 33, 2, 12}
                          : variant == 2 ? std::vector<int>{17} : std::vector<int>{5, 20, 9};
    for (const Switch &w : vsw[variant]) knob(m, w.key, w.on);
    const int n = (int)lens.size(), steps = 5;
    std::vector<std::vector<int>> seqs;
    std::vector<int32_t> slots, nt, sp, toks;
    for (int i = 0; i < n; ++i) {
      seqs.push_back(rnd_ids(lens[i]));
      slots.push_back(7 - i);  // slots in a different order than entries
      nt.push_back(lens[i]);
      sp.push_back(0);
      toks.insert(toks.end(), seqs[i].begin(), seqs[i].end());
    }
    std::vector<std::vector<std::vector<float>>> got(n);  // [seq][step][V]
    std::vector<std::vector<int>> am_got(n);
    std::vector<float> lo((size_t)n * V);
    std::vector<int32_t> am(n);
    for (int s = 0; s <= steps; ++s) {
      int rc = mqb_forward(m, n, slots.data(), nt.data(), toks.data(), sp.data(), lo.data(), am.data(), err, sizeof err);
      if (rc) {
        check(false, std::string("forward: ") + err);
        return;
      }
      std::vector<int32_t> next;
      for (int i = 0; i < n; ++i) {
        got[i].emplace_back(lo.begin() + (size_t)i * V, lo.begin() + (size_t)(i + 1) * V);
        am_got[i].push_back(am[i]);
        // feed a token that is NOT the argmax sometimes, to keep the path teacher-forced
        int t = (s % 2 == 0) ? am[i] : (int)(rng() % 300);
        seqs[i].push_back(t);
        next.push_back(t);
        sp[i] += nt[i];
        nt[i] = 1;
      }
      toks = next;
    }
    double md = 0;
    bool am_ok = true;
    for (int i = 0; i < n; ++i) {
      std::vector<int> ids(seqs[i].begin(), seqs[i].end() - 1);
      auto ref = ref_logits(o, c, ids, window);
      for (int s = 0; s <= steps; ++s) {
        const Vec &r = ref[lens[i] - 1 + s];
        md = std::max(md, maxdiff(got[i][s].data(), r));
        int a = (int)(std::max_element(got[i][s].begin(), got[i][s].end()) - got[i][s].begin());
        if (a != am_got[i][s]) am_ok = false;
        (void)argmax_ref;
      }
    }
    for (const Switch &w : vsw[variant]) knob(m, w.key, w.off);
    check(md < tol, std::string(family) + " " + prec + " batch " + std::to_string(n) + vname[variant] +
                        " prefill+decode max|d| = " + std::to_string(md));
    check(am_ok, std::string(family) + " " + prec + " argmax_out == argmax(logits_out)");
  }
  // The tile kernel against cuBLAS on one 24-row prefill (6 sequences of 4 tokens, fresh slots,
  // so every run sees the same state): only the order of fp32 sums differs, which moves a
  // bf16/fp16 rounding of an activation now and then, so the logits agree far inside the
  // reference tolerance; fused (RMSNorm, SwiGLU) and with its K range split over two blocks.
  if (half) {
    knob(m, "tile_max_b", 32);  // 24 rows: the tile kernel, RMSNorm and SwiGLU fused
    knob(m, "fuse_max_b", 32);
    std::vector<int32_t> sl{0, 1, 2, 3, 4, 5}, nt(6, 4), sp(6, 0), tk = rnd_ids(24), am(6);
    std::vector<float> tl((size_t)6 * V), split((size_t)6 * V), cub((size_t)6 * V);
    int rc = mqb_forward(m, 6, sl.data(), nt.data(), tk.data(), sp.data(), tl.data(), am.data(), err, sizeof err);
    knob(m, "tile_z", 2);
    rc |= mqb_forward(m, 6, sl.data(), nt.data(), tk.data(), sp.data(), split.data(), am.data(), err, sizeof err);
    knob(m, "tile_z", 0);
    knob(m, "tile_max_b", 16);
    knob(m, "fuse_max_b", 16);
    knob(m, "skinny", 0);
    rc |= mqb_forward(m, 6, sl.data(), nt.data(), tk.data(), sp.data(), cub.data(), am.data(), err, sizeof err);
    knob(m, "skinny", 1);
    double d2 = 0, d3 = 0;
    for (size_t i = 0; i < cub.size(); ++i) {
      d2 = std::max(d2, fabs((double)split[i] - cub[i]));
      d3 = std::max(d3, fabs((double)tl[i] - cub[i]));
    }
    check(rc == 0 && d2 < tol / 10 && d3 < tol / 10,
          std::string(family) + " " + prec + " 24-row prefill, tile vs cuBLAS max|d| = " + std::to_string(d3) +
              ", tile split-K " + std::to_string(d2));
  }
  // Sampling on the device (mqb_forward_sampled): temperature 0 and a vanishing temperature
  // give the argmax, equal keys give equal draws, distinct keys at a high temperature spread.
  {
    const std::vector<int> prompt = rnd_ids(9);
    std::vector<int32_t> slots{0, 1, 2, 3}, nt(4, 9), sp(4, 0), toks, am(4);
    for (int i = 0; i < 4; ++i) toks.insert(toks.end(), prompt.begin(), prompt.end());
    std::vector<float> lo((size_t)4 * V);
    int rc = mqb_forward(m, 4, slots.data(), nt.data(), toks.data(), sp.data(), nullptr, am.data(), err, sizeof err);
    std::vector<int32_t> one(4, 1), pos(4, 9), x(4, am[0]);
    rc |= mqb_forward(m, 4, slots.data(), one.data(), x.data(), pos.data(), lo.data(), am.data(), err, sizeof err);
    const int a = (int)(std::max_element(lo.begin(), lo.begin() + V) - lo.begin());
    std::vector<float> temps{0.f, 1e-6f, 50.f, 50.f};
    std::vector<uint64_t> keys{11, 12, 13, 13};
    std::vector<int32_t> out(4, -1);
    rc |= mqb_forward_sampled(m, 4, slots.data(), one.data(), x.data(), pos.data(), temps.data(), keys.data(),
                              out.data(), nullptr, err, sizeof err);
    // The same step with logits_out (ABI 3: what the engine asks for when a batch-mate samples
    // top-k/top-p on the host): the same draws, and the logits of mqb_forward.
    std::vector<float> lo2((size_t)4 * V, -1.f);
    std::vector<int32_t> out2(4, -1);
    rc |= mqb_forward_sampled(m, 4, slots.data(), one.data(), x.data(), pos.data(), temps.data(), keys.data(),
                              out2.data(), lo2.data(), err, sizeof err);
    check(rc == 0 && out2 == out && lo2 == lo,
          std::string(family) + " " + prec + " sampled with logits_out: same draws, logits equal mqb_forward's");
    bool range = true;
    for (int v : out) range = range && v >= 0 && v < V;
    check(rc == 0 && range && out[0] == a && out[1] == a && out[2] == out[3],
          std::string(family) + " " + prec + " sampled: T=0 and T=1e-6 give the argmax (" + std::to_string(a) + ": " +
              std::to_string(out[0]) + ", " + std::to_string(out[1]) + "), one key one draw (" +
              std::to_string(out[2]) + ", " + std::to_string(out[3]) + ")");
    std::set<int> seen;
    for (uint64_t k = 100; k < 106; ++k) {
      std::vector<uint64_t> kk(4, k);
      rc |= mqb_forward_sampled(m, 4, slots.data(), one.data(), x.data(), pos.data(), temps.data(), kk.data(),
                                out.data(), nullptr, err, sizeof err);
      seen.insert(out[2]);
    }
    check(rc == 0 && seen.size() >= 3, std::string(family) + " " + prec + " sampled at T=50: " +
                                           std::to_string(seen.size()) + " distinct tokens in 6 draws");
    // A step that hands out logits (a top-k/top-p batch-mate) and a greedy one share one graph
    // (graph_key): in bucket 2, which no step above used, three of each, alternating, capture
    // once; the replayed steps give the eager step's logits and argmax.
    const size_t before = g_graphs.size();
    std::vector<int32_t> s2{0, 1}, one2(2, 1), pos2(2, 10), x2(2, am[0]), am2(2);
    std::vector<std::vector<float>> lg;
    std::vector<std::vector<int32_t>> ams;
    for (int k = 0; k < 6; ++k) {
      std::vector<float> l((size_t)2 * V, -1.f);
      rc |= mqb_forward(m, 2, s2.data(), one2.data(), x2.data(), pos2.data(), k % 2 ? nullptr : l.data(), am2.data(),
                        err, sizeof err);
      if (k % 2 == 0) lg.push_back(l);
      ams.push_back(am2);
    }
    const size_t captured = g_graphs.size() - before;
    bool same = lg[1] == lg[0] && lg[2] == lg[0];
    for (const auto &a : ams) same = same && a == ams[0];
    check(rc == 0 && captured == 1 && same, std::string(family) + " " + prec + " logits and greedy steps share a graph: " +
                                                std::to_string(captured) + " captured for 6 steps, same outputs " +
                                                std::to_string(same));
  }
  // Prefill and mixed chunks as graphs (run_chunk, padded to their bucket: 15 tokens to 16 on
  // the scratch slot, 5 rows to 8): two prompts (1 and 11 tokens) beside three decodes, run three
  // times graphed (eager, captured, replayed) and once with mixed_graphs 0, give the same logits
  // bit for bit, and one graph is captured. Every row must match the reference: in bf16/fp16 the
  // one-token tiles (the decodes, the 1-token prompt, the 1-token padding) go through
  // attention_kernel and the 11-token prompt through prefill_attn_kernel (prefill_one 1: from one
  // row on); a fifth run with prefill_one 0 sends all of them through prefill_attn_kernel, as the
  // default (17 rows) does for this chunk.
  {
    std::vector<int32_t> ctx_slots{0, 1, 2}, ctx_nt(3, 7), ctx_sp(3, 0), ctx_am(3);
    std::vector<int> ctx = rnd_ids(21);
    int rc = mqb_forward(m, 3, ctx_slots.data(), ctx_nt.data(), ctx.data(), ctx_sp.data(), nullptr, ctx_am.data(), err,
                         sizeof err);
    std::vector<int32_t> sl{3, 4, 0, 1, 2}, nt{1, 11, 1, 1, 1}, sp{0, 0, 7, 7, 7}, am(5);
    std::vector<int> tk = rnd_ids(12);
    tk.insert(tk.end(), ctx_am.begin(), ctx_am.end());
    std::vector<std::vector<float>> lg;
    knob(m, "prefill_one", 1);
    const size_t before = g_graphs.size();
    for (int k = 0; k < 5; ++k) {
      if (k == 3) knob(m, "mixed_graphs", 0);
      if (k == 4) knob(m, "prefill_one", 0);
      std::vector<float> l((size_t)5 * V, -1.f);
      rc |= mqb_forward(m, 5, sl.data(), nt.data(), tk.data(), sp.data(), l.data(), am.data(), err, sizeof err);
      lg.push_back(l);
    }
    knob(m, "mixed_graphs", 1);
    knob(m, "prefill_one", 17);
    const size_t captured = g_graphs.size() - before;
    const bool same = lg[1] == lg[0] && lg[2] == lg[0] && lg[3] == lg[0];
    double md = 0;
    for (size_t i = 0; i < lg[0].size(); ++i) md = std::max(md, fabs((double)lg[0][i] - lg[3][i]));
    check(rc == 0 && captured == 1 && same,
          std::string(family) + " " + prec + " a mixed chunk as a graph: " + std::to_string(captured) +
              " captured in 3 runs, logits equal to the eager chunk's " + std::to_string(same) + " (max|d| " +
              std::to_string(md) + ")");
    // The reference: each entry's sequence so far, its last position's logits.
    std::vector<std::vector<int>> ids{{tk[0]}, std::vector<int>(tk.begin() + 1, tk.begin() + 12)};
    for (int i = 0; i < 3; ++i) {
      ids.emplace_back(ctx.begin() + 7 * i, ctx.begin() + 7 * i + 7);
      ids.back().push_back(ctx_am[i]);
    }
    double mr[2] = {0, 0};
    for (int e = 0; e < 5; ++e) {
      const Vec r = ref_logits(o, c, ids[e], window).back();
      for (int k : {0, 1}) mr[k] = std::max(mr[k], maxdiff(lg[k == 0 ? 0 : 4].data() + (size_t)e * V, r));
    }
    check(mr[0] < tol && mr[1] < tol, std::string(family) + " " + prec +
                                          " a mixed chunk against the reference: max|d| " + std::to_string(mr[0]) +
                                          ", every tile through prefill attention " + std::to_string(mr[1]));
  }
  // blas_pick's choices for the cuBLAS products it saw (the buckets' products at load, batch 6's
  // in bucket 8 when the cuBLAS variant runs): against the emulated cuBLASLt above, each must be
  // algorithm 0, the fastest that computes what cublasGemmEx does, with the faster algorithm 2
  // refused by the check. The logits checks above ran through these choices.
  {
    const auto &plans = m->picker->plans();
    bool chose0 = !plans.empty(), refused = true;
    for (const auto &kv : plans) {
      printf("blas_pick: %s\n", kv.second.what.c_str());
      chose0 = chose0 && kv.second.lt && kv.second.algo.data[0] == 0;
      refused = refused && kv.second.what.find("algo 2 ") != std::string::npos &&
                kv.second.what.find("refused") != std::string::npos;
    }
    check(chose0 && refused, std::string(family) + " " + prec + " blas_pick: " + std::to_string(plans.size()) +
                                 " shapes tuned, each to the fastest algorithm that agrees with cublasGemmEx");
  }
  mqb_model_close(m);
}

// emu_tile runs sk::tile_kernel in the emulation on W [N, K] (a tensor-map stand-in with the
// kernel's box height: half as high with SwiGLU) in row tiles RT and K splits Z, and says whether
// every split-K counter was left at zero for the next product.
template <typename T>
static bool emu_tile(const std::vector<T> &W, int N, int K, int RT, int Z, const T *X, int B, float *out, int acc,
                     std::vector<float> &ws, std::vector<unsigned> &cnt, const sk::TileFuse<T> &f) {
  const int KS = 8 / RT, Kr = K / Z;
  by_octets((B + 7) / 8, [&](auto o) {
    auto kernel = sk::tile_kernel<T, decltype(o)::value>;
    emu_launch(dim3((N / 16 + RT - 1) / RT, Z), dim3(sk::THREADS), [&, kernel] {
      kernel(sk::TmaMap{W.data(), K, N, (f.act ? 8 : 16) * RT}, N, K, X, B, out, acc, RT, KS, Kr, sk::TSTAGES - 1, 0,
             ws.data(), cnt.data(), f);
    });
  });
  bool zeroed = true;
  for (unsigned c : cnt) zeroed = zeroed && c == 0u;
  return zeroed;
}

// tile_fused_products checks sk::tile_kernel's fused modes (sk::TileFuse) alone against a
// double-precision reference: the input rows RMSNorm(x) * w of fp32 rows x (the kernel rounds them
// to T, the reference does not, hence a bound of 5e-4 of the sum of |terms| where the exact
// product's is 1e-6), and with SwiGLU, act = silu(gate) * up of W = [gate; up] [2 x 128, 1024],
// within the propagated bound plus T's rounding of act. Every row-tile shape, K splits, 1, 2, 9
// and 32 rows; each staged both ways (TileFuse::compact, backend.cu's rms_compact_b: four rows at
// a time, so 9 rows take a part-filled third pass).
template <typename T>
static void tile_fused_products(const char *prec) {
  const int N = 256, K = 1024, I = N / 2;
  std::mt19937 r(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<T> W((size_t)N * K), act((size_t)32 * I);
  std::vector<float> Xr((size_t)32 * K), nw(K);
  for (auto &w : W) w = TT<T>::fromf(u(r));
  for (auto &x : Xr) x = 3.f * u(r);
  for (auto &w : nw) w = 0.5f + u(r);
  std::vector<float> ws((size_t)(K / 64) * 32 * N);
  std::vector<unsigned> cnt(N / 16, 0u);
  const float eps = 1e-6f;
  struct Shape { int RT, Z; };
  for (bool swiglu : {false, true})
    for (Shape sh : {Shape{8, 1}, Shape{8, 4}, Shape{4, 2}, Shape{2, 1}, Shape{2, 4}})
      for (int B : {1, 2, 9, 32})
      for (int compact : {0, 1}) {
        std::vector<float> out((size_t)B * N, 0.f);
        std::fill(act.begin(), act.end(), TT<T>::fromf(-7.f));
        sk::TileFuse<T> f;
        f.xr = Xr.data();
        f.nw = nw.data();
        f.eps = eps;
        f.act = swiglu ? act.data() : nullptr;
        f.compact = compact;
        const bool zeroed = emu_tile<T>(W, N, K, sh.RT, sh.Z, nullptr, B, out.data(), 0, ws, cnt, f);
        double worst = 0;  // largest error as a fraction of its bound
        for (int b = 0; b < B; ++b) {
          double ss = 0;
          for (int k = 0; k < K; ++k) ss += (double)Xr[(size_t)b * K + k] * Xr[(size_t)b * K + k];
          const double rstd = 1.0 / sqrt(ss / K + eps);
          std::vector<double> y(N), sc(N);
          for (int n = 0; n < N; ++n) {
            double s = 0, a = 0;
            for (int k = 0; k < K; ++k) {
              const double p = (double)TT<T>::tof(W[(size_t)n * K + k]) * Xr[(size_t)b * K + k] * rstd * nw[k];
              s += p;
              a += fabs(p);
            }
            y[n] = s;
            sc[n] = 5e-4 * a;
          }
          for (int n = 0; n < (swiglu ? I : N); ++n) {
            if (!swiglu) {
              worst = std::max(worst, fabs(y[n] - out[(size_t)b * N + n]) / sc[n]);
              continue;
            }
            const double g = y[n], v = y[I + n], sg = g / (1 + exp(-g));
            const double want = sg * v, bound = fabs(v) * 1.1 * sc[n] + fabs(sg) * sc[I + n] + sc[n] * sc[I + n] +
                                                fabs(want) * (std::is_same<T, __half>::value ? 1e-3 : 8e-3) + 1e-6;
            worst = std::max(worst, fabs(want - (double)TT<T>::tof(act[(size_t)b * I + n])) / bound);
          }
        }
        check(worst <= 1 && zeroed, std::string(prec) + " tile product, RMSNorm fused" + (compact ? " (compact)" : "") +
                                        (swiglu ? ", SwiGLU" : "") + ", RT " + std::to_string(sh.RT) + " Z " +
                                        std::to_string(sh.Z) + " rows " + std::to_string(B) + ": largest error " +
                                        std::to_string(worst) + " of its bound");
      }
}

// tile_products checks sk::tile_kernel alone against a double-precision product of the same
// rounded values, W [256, 1024] (16 chunks of 64 columns per block at one split: the chunk
// buffers are refilled four times), every row-tile shape, several K splits (finish's partial
// sums), 9, 24 and 32 input rows (part-filled octets), storing and accumulating.
template <typename T>
static void tile_products(const char *prec) {
  const int N = 256, K = 1024;
  std::mt19937 r(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<T> W((size_t)N * K), X((size_t)32 * K);
  for (auto &w : W) w = TT<T>::fromf(u(r));
  for (auto &x : X) x = TT<T>::fromf(u(r));
  std::vector<float> ws((size_t)(K / 64) * 32 * N);
  std::vector<unsigned> cnt(N / 16, 0u);
  struct Shape { int RT, Z; };
  for (Shape sh : {Shape{8, 1}, Shape{8, 16}, Shape{4, 2}, Shape{4, 8}, Shape{2, 1}, Shape{2, 4}}) {
    for (int B : {9, 24, 32}) {
      const int acc = B == 24;
      std::vector<float> out((size_t)B * N), base((size_t)B * N);
      for (auto &v : base) v = u(r);
      out = base;
      const bool zeroed = emu_tile<T>(W, N, K, sh.RT, sh.Z, X.data(), B, out.data(), acc, ws, cnt, sk::TileFuse<T>{});
      double md = 0, scale = 0;
      for (int b = 0; b < B; ++b)
        for (int n = 0; n < N; ++n) {
          double s = acc ? base[(size_t)b * N + n] : 0.0, a = 0;
          for (int k = 0; k < K; ++k) {
            const double p = (double)TT<T>::tof(W[(size_t)n * K + k]) * TT<T>::tof(X[(size_t)b * K + k]);
            s += p;
            a += fabs(p);
          }
          md = std::max(md, fabs(s - out[(size_t)b * N + n]));
          scale = std::max(scale, a);
        }
      check(md <= 1e-6 * scale && zeroed, std::string(prec) + " tile product RT " + std::to_string(sh.RT) + " Z " +
                                              std::to_string(sh.Z) + " rows " + std::to_string(B) +
                                              (acc ? " accumulating" : "") + ": max|d| = " + std::to_string(md) +
                                              " (bound " + std::to_string(1e-6 * scale) + ")");
    }
  }
  tile_fused_products<T>(prec);
}

// prefill_attn_products checks pa::prefill_attn_kernel alone (prefill_attn.cuh) against a
// double-precision causal softmax attention of the same T-rounded q, K and V: 4 query heads over
// 2 KV heads, head_dim 64 and 128, a 100-token prompt in two tiles (64 + 36: a second K/V tile,
// warps with no rows), a 5-token continuation at positions 40-44 of another slot over its cached
// rows, and a 1-token tile at position 45. Cache rows past each sequence's last position hold
// NaNs, so a read of one shows. The kernel rounds the probabilities to T for the P V product and
// its output to T: bound 1e-2 (bf16) / 1.5e-3 (fp16) of the largest |v|, which is 1.
// window > 0: Mistral's sliding window, the reference's own mask (key j visible to the row at
// position p where p - window < j <= p): rows whose window begins inside a K/V tile, after it
// (warps that skip tiles), and a window of one key.
template <typename T>
static void prefill_attn_products(const char *prec, int window = 0) {
  const int nh = 4, nkv = 2, maxctx = 160, Tn = 106;
  struct Tok { int slot, pos; };
  std::vector<Tok> toks;
  for (int p = 0; p < 100; ++p) toks.push_back({0, p});
  for (int p = 40; p < 46; ++p) toks.push_back({1, p});
  const int last[2] = {99, 45};
  const std::vector<pa::Tile> tiles = {{0, 64}, {64, 36}, {100, 5}, {105, 1}};
  std::mt19937 r(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const T nan = TT<T>::fromf(NAN);
  for (int D : {64, 128}) {
    std::vector<T> kc((size_t)2 * maxctx * nkv * D, nan), vc(kc.size(), nan), out((size_t)Tn * nh * D);
    for (int sl = 0; sl < 2; ++sl)
      for (int p = 0; p <= last[sl]; ++p)
        for (int i = 0; i < nkv * D; ++i) {
          kc[((size_t)sl * maxctx + p) * nkv * D + i] = TT<T>::fromf(u(r));
          vc[((size_t)sl * maxctx + p) * nkv * D + i] = TT<T>::fromf(u(r));
        }
    std::vector<float> q((size_t)Tn * nh * D);
    for (auto &x : q) x = 0.4f * u(r);
    std::vector<int> pos(Tn), slot(Tn);
    for (int i = 0; i < Tn; ++i) {
      pos[i] = toks[i].pos;
      slot[i] = toks[i].slot;
    }
    auto kernel = D == 64 ? pa::prefill_attn_kernel<T, 64> : pa::prefill_attn_kernel<T, 128>;
    emu_launch(dim3((unsigned)tiles.size(), nh), dim3(pa::THREADS), [&, kernel] {
      kernel(q.data(), kc.data(), vc.data(), pos.data(), slot.data(), tiles.data(), out.data(), nh, nkv, maxctx, window);
    });
    double worst = 0;
    for (int i = 0; i < Tn; ++i)
      for (int h = 0; h < nh; ++h) {
        const int kh = h / (nh / nkv), p = pos[i];
        auto at = [&](const std::vector<T> &c, int j, int d) {
          return (double)TT<T>::tof(c[(((size_t)slot[i] * maxctx + j) * nkv + kh) * D + d]);
        };
        const int j0 = window > 0 ? std::max(0, p - window + 1) : 0;  // keys j0..p
        std::vector<double> sc(p + 1);
        double mx = -1e300, l = 0;
        for (int j = j0; j <= p; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += (double)TT<T>::tof(TT<T>::fromf(q[((size_t)i * nh + h) * D + d])) * at(kc, j, d);
          sc[j] = dot;
          mx = std::max(mx, dot);
        }
        for (int j = j0; j <= p; ++j) l += sc[j] = std::exp(sc[j] - mx);
        for (int d = 0; d < D; ++d) {
          double ref = 0;
          for (int j = j0; j <= p; ++j) ref += sc[j] * at(vc, j, d);
          const double got = TT<T>::tof(out[((size_t)i * nh + h) * D + d]);
          worst = std::isfinite(got) ? std::max(worst, std::fabs(got - ref / l)) : INFINITY;
        }
      }
    const double bound = std::string(prec) == "bf16" ? 1e-2 : 1.5e-3;
    check(worst <= bound, std::string(prec) + " prefill attention on the tensor cores, head_dim " + std::to_string(D) +
                              (window > 0 ? ", sliding window " + std::to_string(window) : std::string()) +
                              ": largest error " + std::to_string(worst) + " (bound " + std::to_string(bound) + ")");
  }
}

#include "emu_flash.h"
#include "emu_swakv.h"

// decode_attn_products checks a decode step's attention with head_dim 128 (attend_flash's first
// step covers 64 positions, so longer sequences take more) against a double-precision
// reference: q_norm / k_norm, RoPE and the q scale of the step's fp32 qkv row, the new k and v
// rounded to T, softmax attention over positions 0..p of the T-rounded cache. Four paths:
// decode_attn_kernel with its q/k/v parameters loaded before the wait (pre_params: RoPE from the
// table rope_table_kernel makes) in one split, the same without (sincosf) in 3 splits merged
// through L2, and qkv_post_kernel with and without them + attention_kernel, each of those two
// also with 4 values a lane (head_n, as run_tokens launches it; its q must be the 8-value
// instance's bits too), and the first with 4 values a lane (its outputs the first path's bits).
// 4 and 16 query heads
// over 2 KV heads (with 16, GM 8: ten heads a block's eight warps make, two of them a second
// head each); positions 0, 7, 63, 64, 130 and 200, each in its own slot. Before the step the new
// position's rows and every row past it hold NaNs, so a read of one before it is written, or
// past it, shows. The new cache rows must be the reference's rounded to T (within one step of
// T) and the same bits in every path (the table holds sincosf's own values), the outputs within
// one step of T of the reference.
//
// window > 0: Mistral's sliding window, the reference's own mask (position p' visible to the
// new token at p where p - window < p' <= p); the cache rows below each token's window hold NaNs
// too, so a read of one shows.
template <typename T, int GM>
static void decode_attn_case(const char *prec, int nh, int window = 0) {
  const int nkv = 2, D = 128, G = nh / nkv, maxctx = 224, W = (nh + 2 * nkv) * D, S = 3;
  const std::vector<int> pos = {0, 7, 63, 64, 130, 200};
  const int Tn = (int)pos.size();
  std::vector<int> slot(Tn);
  for (int i = 0; i < Tn; ++i) slot[i] = Tn - 1 - i;
  std::mt19937 r(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const T nan = TT<T>::fromf(NAN);
  std::vector<T> kc0((size_t)Tn * maxctx * nkv * D, nan), vc0(kc0.size(), nan);
  for (int i = 0; i < Tn; ++i)
    for (int p = 0; p < pos[i]; ++p)
      for (int e = 0; e < nkv * D; ++e) {
        const bool seen = window <= 0 || p > pos[i] - window;
        const T kv = TT<T>::fromf(u(r)), vv = TT<T>::fromf(u(r));
        kc0[((size_t)slot[i] * maxctx + p) * nkv * D + e] = seen ? kv : nan;
        vc0[((size_t)slot[i] * maxctx + p) * nkv * D + e] = seen ? vv : nan;
      }
  std::vector<float> qkv((size_t)Tn * W), qn(D), kn(D), inv(D / 2);
  for (auto &x : qkv) x = u(r);
  for (int d = 0; d < D; ++d) {
    qn[d] = 1.f + 0.3f * u(r);
    kn[d] = 1.f + 0.3f * u(r);
  }
  for (int j = 0; j < D / 2; ++j) inv[j] = 1.0f / powf(1e6f, (float)(2 * j) / (float)D);
  std::vector<float2> tab((size_t)maxctx * D / 2);
  emu_launch(dim3(8), dim3(256), [&] { rope_table_kernel(inv.data(), D / 2, maxctx, tab.data()); });
  const float eps = 1e-6f, qscale = 1.f / sqrtf((float)D);
  // The reference's post-processed head h of token i (h < nh: q, nh + g: k, nh + nkv + g: v).
  auto head = [&](int i, int h) {
    const float *x = qkv.data() + (size_t)i * W + (size_t)h * D;
    std::vector<double> y(x, x + D);
    if (h >= nh + nkv) return y;
    const float *w = h < nh ? qn.data() : kn.data();
    double ss = 0;
    for (double v : y) ss += v * v;
    const double rr = 1.0 / std::sqrt(ss / D + eps);
    for (int d = 0; d < D; ++d) y[d] *= rr * w[d];
    std::vector<double> o(D);
    for (int d = 0; d < D; ++d) {
      const double ang = (double)((float)pos[i] * inv[d % (D / 2)]);  // the kernel's fp32 angle
      const double rot = d < D / 2 ? -y[d + D / 2] : y[d - D / 2];
      o[d] = (y[d] * std::cos(ang) + rot * std::sin(ang)) * (h < nh ? qscale : 1.0);
    }
    return o;
  };
  const double step = std::string(prec) == "bf16" ? 1.0 / 128 : 1.0 / 1024;  // T's relative step
  std::vector<T> rows0;  // the first path's new cache rows, which every path must write alike
  std::vector<float> q2;  // path 2's q, which the 4-values-a-lane instances must write alike
  std::vector<T> out0;    // path 0's outputs, which path 6 must write alike
  for (int path = 0; path < 7; ++path) {
    const char *name[] = {"decode_attn_kernel, parameters before the wait", "decode_attn_kernel in 3 splits",
                          "qkv_post_kernel (parameters before the wait) + attention_kernel",
                          "qkv_post_kernel + attention_kernel",
                          "qkv_post_kernel, 4 values a lane, parameters before the wait + attention_kernel",
                          "qkv_post_kernel, 4 values a lane + attention_kernel",
                          "decode_attn_kernel, 4 values a lane, parameters before the wait"};
    std::vector<T> kc = kc0, vc = vc0, out((size_t)Tn * nh * D, nan);
    std::vector<float> qbuf((size_t)Tn * nh * D), pacc((size_t)Tn * nkv * S * G * D), pml((size_t)Tn * nkv * S * G * 2);
    std::vector<unsigned> cnt(Tn * nkv, 0u);
    if (path < 2 || path == 6) {
      const DecAttn<T> a{qkv.data(), pos.data(), slot.data(), nh, nkv, D, maxctx, qn.data(), kn.data(), inv.data(), eps,
                         qscale, kc.data(), vc.data(), out.data(), pacc.data(), pml.data(), cnt.data(), 1, 1, 0, 0,
                         tab.data(), nullptr, window};
      if (path == 0) emu_launch(dim3(Tn, nkv, 1), dim3(ATT_THREADS), [&] { decode_attn_kernel<T, GM, true, true>(a); });
      else if (path == 6)  // head_n(128) = 4, as run_tokens launches it (post_n)
        emu_launch(dim3(Tn, nkv, 1), dim3(ATT_THREADS), [&] { decode_attn_kernel<T, GM, true, true, 4>(a); });
      else emu_launch(dim3(Tn, nkv, S), dim3(ATT_THREADS), [&] { decode_attn_kernel<T, GM, true>(a); });
    } else {
      // paths 4 and 5: head_n(128) = 4 values a lane, as run_tokens launches it (post_n)
      auto post = path == 2 ? qkv_post_kernel<T, true>
                : path == 3 ? qkv_post_kernel<T>
                : path == 4 ? qkv_post_kernel<T, true, 4>
                            : qkv_post_kernel<T, false, 4>;
      emu_launch(dim3(Tn, (nh + 2 * nkv + 7) / 8), dim3(256), [&, post] {
        post(qkv.data(), pos.data(), slot.data(), nh, nkv, D, qn.data(), kn.data(), eps, inv.data(), qscale,
             qbuf.data(), kc.data(), vc.data(), maxctx, tab.data(), (const int *)nullptr, (const int *)nullptr);
      });
      if (path == 2) q2 = qbuf;
      emu_launch(dim3(Tn, nkv), dim3(ATT_THREADS), [&] {
        attention_kernel<T, GM, true>(qbuf.data(), kc.data(), vc.data(), pos.data(), slot.data(), out.data(), nh, nkv, D,
                                     maxctx, 1, nullptr, window);
      });
    }
    double worst_row = 0, worst_out = 0;  // in steps of T
    std::vector<T> rows;
    for (int i = 0; i < Tn; ++i)
      for (int g = 0; g < nkv; ++g) {
        const std::vector<double> kref = head(i, nh + g), vref = head(i, nh + nkv + g);
        auto cache = [&](const std::vector<T> &c, int p, int d) {
          return (double)TT<T>::tof(c[(((size_t)slot[i] * maxctx + p) * nkv + g) * D + d]);
        };
        for (int d = 0; d < D; ++d)
          for (auto [ref, got] : {std::pair{kref[d], cache(kc, pos[i], d)}, std::pair{vref[d], cache(vc, pos[i], d)}}) {
            const double e = std::fabs(got - ref) / (std::fabs(ref) * step + 1e-5);
            worst_row = std::isfinite(e) ? std::max(worst_row, e) : INFINITY;
            rows.push_back(TT<T>::fromf((float)got));
          }
        for (int j = 0; j < G; ++j) {
          const std::vector<double> q = head(i, g * G + j);
          const int p0 = window > 0 ? std::max(0, pos[i] - window + 1) : 0;  // keys p0..pos[i]
          std::vector<double> sc(pos[i] + 1);
          double mx = -1e300, l = 0;
          for (int p = p0; p <= pos[i]; ++p) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += q[d] * cache(kc, p, d);
            mx = std::max(mx, sc[p] = dot);
          }
          for (int p = p0; p <= pos[i]; ++p) l += sc[p] = std::exp(sc[p] - mx);
          for (int d = 0; d < D; ++d) {
            double ref = 0;
            for (int p = p0; p <= pos[i]; ++p) ref += sc[p] * cache(vc, p, d);
            ref /= l;
            const double got = TT<T>::tof(out[((size_t)i * nh + g * G + j) * D + d]);
            const double e = std::fabs(got - ref) / (std::fabs(ref) * step + 1e-5);
            worst_out = std::isfinite(e) ? std::max(worst_out, e) : INFINITY;
          }
        }
      }
    if (path == 0) rows0 = rows, out0 = out;
    const bool same = memcmp(rows.data(), rows0.data(), rows.size() * sizeof(T)) == 0 &&
                      (path < 4 || path == 6 || qbuf == q2) &&
                      (path != 6 || memcmp(out.data(), out0.data(), out.size() * sizeof(T)) == 0);
    check(worst_row <= 1 && worst_out <= 1 && same,
          std::string(prec) + " decode attention, " + std::to_string(nh) + " query heads" +
              (window > 0 ? ", sliding window " + std::to_string(window) : std::string()) + ", through " + name[path] +
              ": new cache rows within " +
              std::to_string(worst_row) +
              (same ? path < 4 ? " (the first path's bits)"
                      : path == 6 ? " (the first path's bits; outputs too)"
                                  : " (the first path's bits; q path 2's)"
                    : " (NOT the first path's bits, or q / outputs not those of path 2 / 0)") +
              ", outputs within " + std::to_string(worst_out) + " steps of T of the reference (bound 1)");
  }
}

template <typename T>
static void decode_attn_products(const char *prec) {
  decode_attn_case<T, 2>(prec, 4);
  decode_attn_case<T, 8>(prec, 16);
}

// vision_products: qwen3vl's kernels (vision_kernels.cuh) and the rotary offsets it adds to
// qkv_post_kernel, against double-precision references: the image's bidirectional attention
// (37 patches, 2 heads of 16: one full 32-key tile and a partial one) and (72 patches, 1 head of
// 64); the M-RoPE rows (frequency j from axis 1 where j % 3 == 1 and j < 3 s1, axis 2 where
// j % 3 == 2 and j < 3 s2, else axis 0) made past max_ctx; image rows replacing and DeepStack
// features added to the residual; and qkv_post_kernel's q rotated at the position plus the
// slot's rope delta (sdelta) and at a token's own row (rrow) equal to the plain kernel's at that
// position (same bits).
static void vision_products() {
  std::mt19937 r(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto [N, heads, hd] : {std::tuple<int, int, int>{37, 2, 16}, {72, 1, 64}}) {
    const int vh = heads * hd;
    std::vector<float> qkv((size_t)N * 3 * vh), out((size_t)N * vh, NAN);
    for (auto &x : qkv) x = 2.f * u(r);
    const float scale = 1.f / sqrtf((float)hd);
    emu_launch(dim3((N + VA_WARPS - 1) / VA_WARPS, heads), dim3(VA_WARPS * 32),
               [&] { vis_attn_kernel<64>(qkv.data(), N, heads, hd, scale, out.data()); });
    double worst = 0;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < N; ++i) {
        std::vector<double> sc(N);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < N; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += (double)qkv[(size_t)i * 3 * vh + h * hd + e] * qkv[(size_t)j * 3 * vh + vh + h * hd + e];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto &v : sc) sum += (v = std::exp(v - mx));
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (int j = 0; j < N; ++j) o += sc[j] / sum * qkv[(size_t)j * 3 * vh + 2 * vh + h * hd + e];
          worst = std::max(worst, std::fabs(o - out[(size_t)i * vh + h * hd + e]));
        }
      }
    check(worst < 1e-5, "vis_attn_kernel " + std::to_string(N) + " patches, " + std::to_string(heads) + "x" +
                            std::to_string(hd) + ": max|d| " + std::to_string(worst));
  }
  {  // M-RoPE rows
    const int half = 8, max_ctx = 16, Tn = 3, s1 = 3, s2 = 2;
    std::vector<float> inv(half);
    for (int j = 0; j < half; ++j) inv[j] = 1.0f / powf(1e4f, (float)(2 * j) / (2.f * half));
    std::vector<float2> tab((size_t)(max_ctx + Tn) * half, make_float2(NAN, NAN));
    emu_launch(dim3(1), dim3(256), [&] { rope_table_kernel(inv.data(), half, max_ctx, tab.data()); });
    const std::vector<int> rrow = {5, max_ctx + 1, 7}, pos3 = {5, 5, 5, 4, 9, 2, 7, 7, 7};
    emu_launch(dim3(Tn), dim3(128), [&] { mrope_rows_kernel(tab.data(), half, max_ctx, rrow.data(), pos3.data(), s1, s2); });
    bool ok = true;
    for (int j = 0; j < half; ++j) {
      const int a = (j % 3 == 1 && j < 3 * s1) ? 1 : (j % 3 == 2 && j < 3 * s2) ? 2 : 0;
      const float2 want = tab[(size_t)pos3[3 + a] * half + j], got = tab[(size_t)(max_ctx + 1) * half + j];
      ok = ok && want.x == got.x && want.y == got.y;
    }
    ok = ok && std::isnan(tab[(size_t)max_ctx * half].x) && std::isnan(tab[(size_t)(max_ctx + 2) * half].x);
    check(ok, "mrope_rows_kernel: the image token's row takes each frequency from its axis; text tokens' rows untouched");
  }
  {  // image rows and DeepStack
    const int H = 40, Tn = 3, n_img = 2;
    std::vector<float> res((size_t)Tn * H), res0, dev((size_t)3 * n_img * H);
    for (auto &x : res) x = u(r);
    for (auto &x : dev) x = u(r);
    res0 = res;
    const std::vector<const float *> src = {nullptr, dev.data() + H, nullptr};
    const std::vector<int> stride = {0, n_img * H, 0};
    emu_launch(dim3(Tn), dim3(256), [&] { img_rows_kernel(res.data(), H, src.data(), stride.data(), -1); });
    emu_launch(dim3(Tn), dim3(256), [&] { img_rows_kernel(res.data(), H, src.data(), stride.data(), 1); });
    bool ok = true;
    for (int c = 0; c < H; ++c) {
      ok = ok && res[c] == res0[c] && res[2 * H + c] == res0[2 * H + c];
      ok = ok && res[H + c] == dev[H + c] + dev[(size_t)2 * n_img * H + H + c];
    }
    check(ok, "img_rows_kernel: the image token's row replaced, then DeepStack feature 1 added; text rows untouched");
  }
  {  // qkv_post_kernel's rotary offsets
    const int nh = 2, nkv = 1, D = 32, maxctx = 32, W = (nh + 2 * nkv) * D, delta = -5;
    std::vector<float> qkv(W), qn(D, 1.f), kn(D, 1.f), inv(D / 2);
    for (auto &x : qkv) x = u(r);
    for (int j = 0; j < D / 2; ++j) inv[j] = 1.0f / powf(1e6f, (float)(2 * j) / (float)D);
    std::vector<float2> tab((size_t)maxctx * D / 2);
    emu_launch(dim3(1), dim3(256), [&] { rope_table_kernel(inv.data(), D / 2, maxctx, tab.data()); });
    auto q_at = [&](int p, const int *rrow, const int *sdelta) {
      std::vector<float> q((size_t)nh * D), kc((size_t)maxctx * nkv * D), vc(kc.size());
      const int pos = p, sl = 0;
      emu_launch(dim3(1, 1), dim3(256), [&] {
        qkv_post_kernel<float, true>(qkv.data(), &pos, &sl, nh, nkv, D, qn.data(), kn.data(), 1e-6f, inv.data(), 1.f,
                                     q.data(), kc.data(), vc.data(), maxctx, tab.data(), rrow, sdelta);
      });
      return q;
    };
    const int row = 20 + delta;
    check(q_at(20, nullptr, &delta) == q_at(row, nullptr, nullptr) && q_at(20, &row, nullptr) == q_at(row, nullptr, nullptr) &&
              q_at(20, nullptr, nullptr) != q_at(row, nullptr, nullptr),
          "qkv_post_kernel: q at position 20 with rope delta -5 (sdelta) or row 15 (rrow) is q at 15");
  }
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  assert(f2h(1.0f) == 0x3C00 && f2h(65504.f) == 0x7BFF && f2h(1e-7f) == 0x0002 && f2h(0.1f) == 0x2E66);
  assert(f2bf(1.0f) == 0x3F80 && f2bf(-0.1f) == 0xBDCD);
  assert(__half2float(__half{0x2E66}) == 0.0999755859375f);
  Owned q = make_qwen3(), g = make_gpt2();
  // EMU_ONLY=family:precision runs one configuration (the whole set takes many minutes on 2 cores).
  const char *only = getenv("EMU_ONLY");
  auto want = [&](const char *f, const char *p) { return !only || std::string(only) == std::string(f) + ":" + p; };
  if (want("qwen3", "fp32")) run_family("qwen3", QCFG, q, "fp32", 2e-4, 256);
  if (want("gpt2", "fp32")) run_family("gpt2", GCFG, g, "fp32", 2e-4, 128);
  // The tile products alone (EMU_ONLY=tile:bf16) run with qwen3 in the same precision too.
  if (want("qwen3", "bf16") || want("tile", "bf16")) tile_products<__nv_bfloat16>("bf16");
  if (want("qwen3", "bf16") || want("attn", "bf16")) prefill_attn_products<__nv_bfloat16>("bf16");
  if (want("qwen3", "fp16") || want("attn", "fp16")) prefill_attn_products<__half>("fp16");
  if (want("qwen3", "bf16") || want("attn", "bf16")) decode_attn_products<__nv_bfloat16>("bf16");
  if (want("qwen3", "fp16") || want("attn", "fp16")) decode_attn_products<__half>("fp16");
  if (want("qwen3", "bf16") || want("flash", "bf16")) flash_products();
  if (want("qwen3", "bf16")) run_family("qwen3", QCFG, q, "bf16", 0.25, 256);
  if (want("qwen3", "fp16") || want("tile", "fp16")) tile_products<__half>("fp16");
  if (want("qwen3", "fp16")) run_family("qwen3", QCFG, q, "fp16", 0.05, 256);
  if (want("qwen3g5", "bf16")) {
    Owned q5 = make_qwen3(10, 2);
    run_family("qwen3", QCFG_G5, q5, "bf16", 0.25, 256);
  }
  if (want("gpt2", "bf16")) run_family("gpt2", GCFG, g, "bf16", 0.25, 128);
  // Mistral's sliding window (EMU_ONLY=llama:bf16, make cuda-host): the attention kernels alone
  // with windows against the reference's own mask, then a llama model with sliding_window 8
  // (prompts of up to 33 tokens, 70-token logits_all, decode steps past the window, batches 1-6,
  // mixed chunks, graphs, fused / unfused / split decode attention, the tensor-core prefill).
  if (want("llama", "bf16") || want("llama", "fp16")) {
    const bool bf = want("llama", "bf16");
    for (int w : {1, 8, 40}) bf ? prefill_attn_products<__nv_bfloat16>("bf16", w) : prefill_attn_products<__half>("fp16", w);
    for (int w : {8, 70}) bf ? decode_attn_case<__nv_bfloat16, 8>("bf16", 16, w) : decode_attn_case<__half, 8>("fp16", 16, w);
  }
  if (want("swa", "bf16")) {  // the short sliding-window run (make cuda-host)
    prefill_attn_products<__nv_bfloat16>("bf16", 8);
    decode_attn_case<__nv_bfloat16, 2>("bf16", 4, 8);
    window_model(WINDOW_FAMILY, "bf16", 0.25);
    window_ring(WINDOW_FAMILY, "bf16", 0.25, false);  // the windowed cache (emu_swakv.h): its logits_all check
  }
  for (const char *prec : {"fp32", "bf16", "fp16"}) {
    const double tol = std::string(prec) == "fp32" ? 2e-4 : std::string(prec) == "bf16" ? 0.25 : 0.05;
    if (want("llama", prec)) {
      Owned l = make_qwen3(8, 2, false);
      run_family("llama", llama_hp(8), l, prec, tol, 256, 8);
    }
    if (want("llama", prec) || want("swakv", prec)) window_ring(WINDOW_FAMILY, prec, tol, true);  // EMU_ONLY=swakv:<prec> alone
  }
  if (want("vision", "fp32")) vision_products();
  printf("launches %d, gemms %d, graph replays %d\n", n_launch, n_gemm, n_replay);
  printf("%d passed, %d failed\n", failures == 0 ? 1 : 0, failures);
  return failures ? 1 : 0;
}
