// emu_moe: runs native/models/qwen3moe.cu through the CPU emulation of the CUDA backend
// (native/cuda/host_test/emu_cuda.h: no GPU, no nvcc) and compares its logits with a
// double-precision Qwen3-MoE written here: logits_all over 70 tokens (two prefill chunks of
// mixed experts), then batched decode steps (graphs on, then off) against the same reference,
// plus the routing counts. Build and run: sh run_emu.sh (fp32, bf16).
#include "../../native/cuda/host_test/emu_cuda.h"
#include "../../native/models/qwen3moe.cu"

using Vec = std::vector<double>;
static const int V = 300, H = 64, L = 3, NH = 4, NKV = 2, D = 16, I = 128, NE = 8, K = 2, MI = 32;
static const char *SPARSE = "101";

struct W {
  std::vector<std::string> names;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<mqb_tensor> t;
  std::map<std::string, size_t> by;
  std::mt19937 rng{11};
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
  const float *w(const std::string &n) const { return data[by.at(n)].data(); }
};

static Vec mv(const float *Wt, const Vec &x, int N, int Kd) {
  Vec y(N, 0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < Kd; ++k) y[n] += (double)Wt[(size_t)n * Kd + k] * x[k];
  return y;
}
static Vec rms(const Vec &x, const float *w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double r = 1 / sqrt(ss / x.size() + 1e-6);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

// ref: logits of every position; counts[l*NE+e] += tokens routed.
static std::vector<Vec> ref(const W &o, const std::vector<int> &ids, std::vector<long> *counts) {
  const int n = ids.size(), G = NH / NKV;
  std::vector<Vec> x(n);
  for (int t = 0; t < n; ++t) x[t] = Vec(o.w("model.embed_tokens.weight") + (size_t)ids[t] * H, o.w("model.embed_tokens.weight") + (size_t)(ids[t] + 1) * H);
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      Vec h = rms(x[t], o.w(p + "input_layernorm.weight"));
      q[t] = mv(o.w(p + "self_attn.q_proj.weight"), h, NH * D, H);
      k[t] = mv(o.w(p + "self_attn.k_proj.weight"), h, NKV * D, H);
      v[t] = mv(o.w(p + "self_attn.v_proj.weight"), h, NKV * D, H);
      auto nr = [&](Vec &z, int heads, const float *nw) {
        for (int hh = 0; hh < heads; ++hh) {
          Vec seg = rms(Vec(z.begin() + hh * D, z.begin() + (hh + 1) * D), nw), out(D);
          for (int i = 0; i < D; ++i) {
            int j = i % (D / 2);
            double ang = t / pow(1e6, 2.0 * j / D);
            double rot = i < D / 2 ? -seg[i + D / 2] : seg[i - D / 2];
            out[i] = seg[i] * cos(ang) + rot * sin(ang);
          }
          std::copy(out.begin(), out.end(), z.begin() + hh * D);
        }
      };
      nr(q[t], NH, o.w(p + "self_attn.q_norm.weight"));
      nr(k[t], NKV, o.w(p + "self_attn.k_norm.weight"));
    }
    for (int t = 0; t < n; ++t) {
      Vec a(NH * D, 0);
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
          for (int i = 0; i < D; ++i) a[hh * D + i] += s[u] / sum * v[u][g * D + i];
      }
      Vec ao = mv(o.w(p + "self_attn.o_proj.weight"), a, H, NH * D);
      for (int i = 0; i < H; ++i) x[t][i] += ao[i];
      Vec h2 = rms(x[t], o.w(p + "post_attention_layernorm.weight"));
      auto swiglu = [&](const float *g, const float *u, const float *dn, int width) {
        Vec gt = mv(g, h2, width, H), up = mv(u, h2, width, H), act(width);
        for (int i = 0; i < width; ++i) act[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
        return mv(dn, act, H, width);
      };
      if (SPARSE[l] == '1') {
        Vec lg = mv(o.w(p + "mlp.gate.weight"), h2, NE, H);
        double mx = *std::max_element(lg.begin(), lg.end()), sum = 0;
        for (auto &e : lg) sum += (e = exp(e - mx));
        for (auto &e : lg) e /= sum;
        std::vector<int> idx(NE);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a2, int b2) { return lg[a2] > lg[b2]; });
        double tot = 0;
        for (int j = 0; j < K; ++j) tot += lg[idx[j]];
        for (int j = 0; j < K; ++j) {
          const int e = idx[j];
          if (counts) (*counts)[l * NE + e]++;
          const std::string xp = p + "mlp.experts." + std::to_string(e) + ".";
          Vec y = swiglu(o.w(xp + "gate_proj.weight"), o.w(xp + "up_proj.weight"), o.w(xp + "down_proj.weight"), MI);
          for (int i = 0; i < H; ++i) x[t][i] += lg[e] / tot * y[i];
        }
      } else {
        Vec y = swiglu(o.w(p + "mlp.gate_proj.weight"), o.w(p + "mlp.up_proj.weight"), o.w(p + "mlp.down_proj.weight"), I);
        for (int i = 0; i < H; ++i) x[t][i] += y[i];
      }
    }
  }
  std::vector<Vec> out(n);
  for (int t = 0; t < n; ++t) out[t] = mv(o.w("model.embed_tokens.weight"), rms(x[t], o.w("model.norm.weight")), V, H);
  return out;
}

static int failures = 0;
static void check(bool ok, const std::string &what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) failures++;
}

static void run(const char *prec, double tol) {
  W o;
  o.add("model.embed_tokens.weight", {V, H}, 0, 0.5f);
  for (int l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    o.add(p + "input_layernorm.weight", {H}, 1, 0.3f);
    o.add(p + "post_attention_layernorm.weight", {H}, 1, 0.3f);
    o.add(p + "self_attn.q_proj.weight", {NH * D, H}, 0, 0.25f);
    o.add(p + "self_attn.k_proj.weight", {NKV * D, H}, 0, 0.25f);
    o.add(p + "self_attn.v_proj.weight", {NKV * D, H}, 0, 0.25f);
    o.add(p + "self_attn.o_proj.weight", {H, NH * D}, 0, 0.1f);
    o.add(p + "self_attn.q_norm.weight", {D}, 1, 0.3f);
    o.add(p + "self_attn.k_norm.weight", {D}, 1, 0.3f);
    if (SPARSE[l] == '1') {
      o.add(p + "mlp.gate.weight", {NE, H}, 0, 0.6f);
      for (int e = 0; e < NE; ++e) {
        std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        o.add(x + "gate_proj.weight", {MI, H}, 0, 0.2f);
        o.add(x + "up_proj.weight", {MI, H}, 0, 0.2f);
        o.add(x + "down_proj.weight", {H, MI}, 0, 0.2f);
      }
    } else {
      o.add(p + "mlp.gate_proj.weight", {I, H}, 0, 0.2f);
      o.add(p + "mlp.up_proj.weight", {I, H}, 0, 0.2f);
      o.add(p + "mlp.down_proj.weight", {H, I}, 0, 0.1f);
    }
  }
  o.add("model.norm.weight", {H}, 1, 0.3f);
  o.finish();
  std::vector<mqb_hparam> hp = {{"vocab_size", V, nullptr}, {"hidden_size", H, nullptr}, {"intermediate_size", I, nullptr},
                                {"num_layers", L, nullptr}, {"num_heads", NH, nullptr}, {"num_kv_heads", NKV, nullptr},
                                {"head_dim", D, nullptr}, {"max_positions", 512, nullptr}, {"norm_eps", 1e-6, nullptr},
                                {"tie_word_embeddings", 1, nullptr}, {"rope_theta", 1e6, nullptr}, {"attention_bias", 0, nullptr},
                                {"scale_attn_by_inverse_layer_idx", 0, nullptr}, {"num_experts", NE, nullptr},
                                {"num_experts_per_tok", K, nullptr}, {"moe_intermediate_size", MI, nullptr},
                                {"norm_topk_prob", 1, nullptr}, {"sparse_layers", 0, SPARSE}};
  mqb_model_params p{};
  p.abi_version = MQB_ABI_VERSION;
  p.family = "qwen3moe";
  p.hparams = hp.data();
  p.n_hparams = (int)hp.size();
  p.precision = prec;
  p.max_batch = 8;
  p.max_context = 128;
  p.tensors = o.t.data();
  p.n_tensors = (int)o.t.size();
  mqb_model *m = nullptr;
  char err[512];
  if (mqb_model_open(&p, &m, err, sizeof err)) {
    check(false, std::string("open: ") + err);
    return;
  }
  std::mt19937 rng(5);
  auto ids = [&](int n) {
    std::vector<int> v(n);
    for (auto &x : v) x = (int)(rng() % V);
    return v;
  };
  {
    std::vector<int> s = ids(70);
    std::vector<float> out((size_t)70 * V);
    std::vector<long> cnt(L * NE, 0);
    int rc = mqb_logits_all(m, s.data(), 70, out.data(), err, sizeof err);
    auto r = ref(o, s, &cnt);
    double md = 0;
    for (int t = 0; t < 70; ++t)
      for (int i = 0; i < V; ++i) md = std::max(md, fabs(out[(size_t)t * V + i] - r[t][i]));
    check(rc == 0 && md < tol, std::string(prec) + " logits_all 70 tokens max|d| " + std::to_string(md));
    std::vector<uint64_t> got(L * NE);
    int32_t nl, ne;
    rc = mqb_routing(m, got.data(), (int64_t)got.size(), &nl, &ne, err, sizeof err);
    bool same = rc == 0 && nl == L && ne == NE;
    for (int i = 0; i < L * NE && same; ++i) same = (long)got[i] == cnt[i];
    std::string g;
    for (int i = 0; i < L * NE; ++i) g += std::to_string(got[i]) + "/" + std::to_string(cnt[i]) + " ";
    check(same, std::string(prec) + " routing counts equal the reference's (got/want): " + g);
  }
  for (int graphs = 1; graphs >= 0; --graphs) {
    cudaStreamSynchronize(m->stream);
    m->clear_graphs();
    m->use_graphs = graphs, m->mixed_graphs = graphs;
    std::vector<int> lens = {5, 20, 9};
    const int n = 3, steps = 4;
    std::vector<std::vector<int>> seqs;
    std::vector<int32_t> slots, nt, sp, toks;
    for (int i = 0; i < n; ++i) {
      seqs.push_back(ids(lens[i]));
      slots.push_back(6 - i), nt.push_back(lens[i]), sp.push_back(0);
      toks.insert(toks.end(), seqs[i].begin(), seqs[i].end());
    }
    double md = 0;
    std::vector<float> lo((size_t)n * V);
    std::vector<int32_t> am(n);
    std::vector<uint64_t> before(L * NE), after(L * NE);
    int32_t nl, ne;
    mqb_routing(m, before.data(), (int64_t)before.size(), &nl, &ne, err, sizeof err);
    for (int s = 0; s <= steps; ++s) {
      if (mqb_forward(m, n, slots.data(), nt.data(), toks.data(), sp.data(), lo.data(), am.data(), err, sizeof err)) {
        check(false, std::string("forward: ") + err);
        return;
      }
      for (int i = 0; i < n; ++i) {
        auto r = ref(o, seqs[i], nullptr);
        for (int v2 = 0; v2 < V; ++v2) md = std::max(md, fabs(lo[(size_t)i * V + v2] - r.back()[v2]));
      }
      toks.clear();
      for (int i = 0; i < n; ++i) {
        sp[i] = (int)seqs[i].size();
        nt[i] = 1;
        seqs[i].push_back(am[i]);
        toks.push_back(am[i]);
      }
    }
    check(md < tol, std::string(prec) + (graphs ? " graphs" : " eager") + " batched prefill + 4 decode steps max|d| " + std::to_string(md));
    // the served routing counts: the tokens fed (each sequence but its last, unfed token), not
    // the graphs' padding rows (the 34-token chunk runs as a 64-token graph, 3 decodes as 4);
    // in fp32 only: bf16 rounding flips some of this random router's near-ties (2026-12-07: 4
    // of 24 counts off by one, the logits then beyond the bf16 bound too)
    std::vector<long> cnt(L * NE, 0);
    for (int i = 0; i < n; ++i) ref(o, std::vector<int>(seqs[i].begin(), seqs[i].end() - 1), &cnt);
    mqb_routing(m, after.data(), (int64_t)after.size(), &nl, &ne, err, sizeof err);
    bool same = true;
    std::string g;
    for (int i = 0; i < L * NE; ++i) {
      same = same && (long)(after[i] - before[i]) == cnt[i];
      g += std::to_string(after[i] - before[i]) + "/" + std::to_string(cnt[i]) + " ";
    }
    if (std::string(prec) == "fp32")
      check(same, std::string(prec) + (graphs ? " graphs" : " eager") + " routing counts of the served tokens equal the reference's (got/want): " + g);
    for (int i = 0; i < n; ++i) mqb_slot_reset(m, slots[i]);
  }
  mqb_model_close(m);
}

int main() {
  run("fp32", 2e-3);
  run("bf16", 0.15);
  printf(failures ? "%d FAILED\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
