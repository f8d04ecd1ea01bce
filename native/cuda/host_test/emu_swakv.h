// emu_swakv.h: the CPU emulation's checks of sliding-window attention through the whole backend:
// window_model (a windowed decoder's logits against the reference's own mask) and window_ring (the
// windowed KV cache: a ring of mqb_model::kv_rows rows a slot, kv_row; backend.cu: kv_rows_for).
// Included by emu_test.cc after its helpers: check, knob, maxdiff, the windowed decoder's
// hparams and weights (a decoder without q/k norms) and its reference (ref_logits).
#pragma once

// WINDOW_FAMILY: the registered family whose config carries a sliding window.
static const char *const WINDOW_FAMILY = "llama";

// Windowed: a decoder model with sliding_window `window` (8 query heads over 2 KV heads, no q/k
// norms), its resolved Cfg and the params that open it with max_batch slots of max_context.
struct Windowed {
  HP hp;
  Owned o;
  Cfg c;
  mqb_model_params p;
  Windowed(const char *family, const char *prec, int window, int max_batch, int max_context)
      : hp(llama_hp(window)), o(make_qwen3(8, 2, false)), c(cfg_from_hparams(family, hp.data(), (int)hp.size())),
        p(model_params(family, hp, o, prec, max_batch, max_context)) {}
};

// Batch: one mqb_forward call's inputs: each sequence i (the third joins at call 1) with the
// tokens of seq[i] not yet fed to its slot's cache.
struct Batch {
  std::vector<int32_t> sl, nt, tk, sp;
  std::vector<int> who;
};
static Batch next_batch(const std::vector<std::vector<int>> &seq, const std::vector<size_t> &fed,
                        const int32_t *slot_of, int call) {
  Batch b;
  for (int i = 0; i < (int)seq.size(); ++i) {
    if (i == 2 && call < 1) continue;
    b.who.push_back(i);
    b.sl.push_back(slot_of[i]);
    b.nt.push_back((int)(seq[i].size() - fed[i]));
    b.sp.push_back((int)fed[i]);
    b.tk.insert(b.tk.end(), seq[i].begin() + fed[i], seq[i].end());
  }
  return b;
}

// decode_mode sets how call `call`'s decode attention runs: fused until call 3, then in 3 position
// splits, then from call 4 unfused (qkv_post + attention_kernel).
static void decode_mode(mqb_model *m, int call) {
  if (call == 3) knob(m, "attn_split", 3);
  if (call == 4) {
    knob(m, "attn_split", 0);
    knob(m, "fused_attn", 0);
  }
}

// kv_poison fills the rows of cache slot `slot` (every layer, K and V) that no query from
// position next on may read with NaN: the rows holding no position of the slot's sequence, and
// those holding a position before window_lo(next, window). The rows a windowed cache has handed
// to newer positions hold those positions; the rest are what a paged cache would have returned
// to its pool, so a read of any of them turns the logits into NaN. Returns the rows poisoned.
static int kv_poison(mqb_model *m, int slot, int next, int window) {
  const size_t es = dt_size(m->dt), row = (size_t)m->c.nkv * m->c.D * es;
  std::vector<unsigned char> nan(row);
  for (size_t i = 0; i < row; i += es) {
    const uint32_t f = 0x7FC00000u;  // quiet NaN: fp32, and its top half bf16's
    const uint16_t h = m->dt == DT_F16 ? 0x7E00 : 0x7FC0;
    if (es == 4) memcpy(&nan[i], &f, 4);
    else memcpy(&nan[i], &h, 2);
  }
  const int rows = m->kv_rows, lo = window_lo(next, window);
  int n = 0;
  for (int r = 0; r < rows; ++r) {
    // The newest position below next that this row holds (-1: none yet).
    const int q = next <= r ? -1 : r + (next - 1 - r) / rows * rows;
    if (q >= lo) continue;
    ++n;
    for (const Layer &ly : m->layers)
      for (void *c : {ly.kc, ly.vc})
        memcpy(static_cast<unsigned char *>(c) + ((size_t)slot * rows + r) * row, nan.data(), row);
  }
  return n;
}

// kv_unring gives m a cache of every position (kv_rows = max_ctx), the layout before the window
// bounded it, as the baseline the ring must equal bit for bit.
static void kv_unring(mqb_model *m) {
  cudaStreamSynchronize(m->stream);
  m->clear_graphs();  // their launches hold the old cache's pointers
  m->kv_rows = m->max_ctx;
  const size_t per = (size_t)m->slots * m->max_ctx * m->c.nkv * m->c.D * dt_size(m->dt);
  for (Layer &ly : m->layers) {
    ly.kc = m->dmalloc(per);
    ly.vc = m->dmalloc(per);
    memset(ly.kc, 0, per);
    memset(ly.vc, 0, per);
  }
}

static bool all_finite(const std::vector<float> &v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// window_ring: a decoder model with sliding_window 8, chunks of Tcap 64 (MQB_TCAP) and 160
// positions a slot, so its cache is a ring of 8 + 64 - 1 = 71 rows (the bound checked), run
// beside the same model with a cache of every position (kv_unring), both with the rows no later
// query may read poisoned with NaN before every call (kv_poison):
// - logits_all of 150 tokens on the scratch slot (the whole slot poisoned first): chunks of 64
//   whose first query reads back 7 keys while the chunk's 64 new rows wrap the ring (positions
//   64 and 128 are where a ring one row short loses a key);
// - long: a 140-token prompt beside a 9-token one (chunks of 64 tokens: the tensor-core prefill
//   in bf16), a 70-token prompt joining their decodes (a mixed chunk), then decode steps fused,
//   in 3 position splits and unfused (qkv_post + attention_kernel), to position 144 (18 windows,
//   twice round the ring).
// Every call's logits must equal the whole cache's bit for bit (the same sums in the same order,
// read from other rows), be finite (no poisoned row read), and be within tol of the reference,
// which applies the window by its own mask.
static void window_ring(const char *family, const char *prec, double tol, bool long_run) {
  const int window = 8, maxctx = 160;
  const Windowed w(family, prec, window, 3, maxctx);
  const Owned &o = w.o;
  const Cfg &c = w.c;
  mqb_model *ring = nullptr, *full = nullptr;
  char err[512];
  setenv("MQB_TCAP", "64", 1);
  setenv("MQB_BLAS_TUNE", "0", 1);  // no eager decode steps at open: the emulation is slow enough
  const bool opened = !mqb_model_open(&w.p, &ring, err, sizeof err) && !mqb_model_open(&w.p, &full, err, sizeof err);
  unsetenv("MQB_TCAP");
  unsetenv("MQB_BLAS_TUNE");
  if (!opened) {
    check(false, std::string("open: ") + err);
    if (ring) mqb_model_close(ring);
    return;
  }
  const std::string name = std::string(family) + " " + prec + " windowed cache (window 8, chunks of 64, 160 positions)";
  check(ring->Tcap == 64 && ring->kv_rows == window + ring->Tcap - 1 && ring->kv_rows < maxctx,
        name + ": a slot holds " + std::to_string(ring->kv_rows) + " rows (bound window + Tcap - 1 = " +
            std::to_string(window + ring->Tcap - 1) + ") instead of " + std::to_string(maxctx));
  kv_unring(full);
  std::mt19937 rng(21);
  auto ids = [&](int n) {
    std::vector<int> v(n);
    for (auto &x : v) x = (int)(rng() % 300);
    return v;
  };
  const int V = c.V;
  {  // logits_all
    const std::vector<int> seq = ids(150);
    std::vector<float> a((size_t)150 * V), b((size_t)150 * V);
    kv_poison(ring, ring->scratch, 0, window);
    kv_poison(full, full->scratch, 0, window);
    const bool ok = !mqb_logits_all(ring, seq.data(), 150, a.data(), err, sizeof err) &&
                    !mqb_logits_all(full, seq.data(), 150, b.data(), err, sizeof err);
    const auto ref = ref_logits(o, c, seq, window);
    double md = 0;
    for (int t = 0; t < 150; ++t) md = std::max(md, maxdiff(a.data() + (size_t)t * V, ref[t]));
    check(ok && a == b && all_finite(a) && md < tol,
          name + ": logits_all of 150 tokens equal the whole cache's bit for bit (" +
              std::string(a == b ? "equal" : "DIFFERENT") + "), finite over the poisoned rows, reference max|d| = " +
              std::to_string(md));
  }
  if (!long_run) {
    mqb_model_close(ring);
    mqb_model_close(full);
    return;
  }
  std::vector<std::vector<int>> seq = {ids(140), ids(9), ids(70)};
  const int32_t slot_of[3] = {2, 0, 1};
  std::vector<size_t> fed(3, 0);
  bool same = true, finite = true, ok = true;
  double md = 0;
  int poisoned = 0, calls = 0;
  for (int s = 0; ok && seq[0].size() < 145; ++s) {
    decode_mode(ring, s);
    decode_mode(full, s);
    const Batch bt = next_batch(seq, fed, slot_of, s);
    const std::vector<int> &who = bt.who;
    for (int i : who) {
      poisoned += kv_poison(ring, slot_of[i], (int)fed[i], window);
      kv_poison(full, slot_of[i], (int)fed[i], window);
    }
    const size_t n = who.size();
    std::vector<float> la(n * V), lb(n * V);
    std::vector<int32_t> aa(n), ab(n);
    ok = !mqb_forward(ring, (int)n, bt.sl.data(), bt.nt.data(), bt.tk.data(), bt.sp.data(), la.data(), aa.data(), err,
                      sizeof err) &&
         !mqb_forward(full, (int)n, bt.sl.data(), bt.nt.data(), bt.tk.data(), bt.sp.data(), lb.data(), ab.data(), err,
                      sizeof err);
    ++calls;
    same = same && la == lb && aa == ab;
    finite = finite && all_finite(la);
    for (size_t e = 0; ok && e < n; ++e) {
      const int i = who[e];
      fed[i] = seq[i].size();
      if (seq[0].size() >= 143 || s < 2)  // the reference is quadratic: the first calls and the last
        md = std::max(md, maxdiff(la.data() + e * V, ref_logits(o, c, seq[i], window).back()));
      seq[i].push_back(aa[e]);
    }
  }
  knob(ring, "fused_attn", 1);
  knob(full, "fused_attn", 1);
  check(ok && same && finite && md < tol && poisoned > 0,
        name + ": 3 sequences to position " + std::to_string(seq[0].size() - 1) + " in " + std::to_string(calls) +
            " calls (prefill chunks, a mixed chunk, decode fused, split, unfused): logits and tokens equal the "
            "whole cache's bit for bit (" + (same ? "equal" : "DIFFERENT") + "), finite with " +
            std::to_string(poisoned) + " dead rows poisoned (" + (finite ? "finite" : "NaN") +
            "), reference max|d| = " + std::to_string(md) + (ok ? "" : std::string("; error: ") + err));
  mqb_model_close(ring);
  mqb_model_close(full);
}

// window_model: the short sliding-window run of make cuda-host (EMU_ONLY=swa:bf16; run_family
// covers every path at length): a decoder model with sliding_window 8 (the
// reference applies the window itself, ref_logits), three sequences in slots 3, 1, 2. Call 0:
// prompts of 20 and 11 tokens prefilled together (tensor-core prefill, rows and tiles past the
// window); call 1: a 13-token prompt joining their first decodes (a mixed chunk); calls 2-4: decode
// steps of the three as served (fused decode attention), in 3 position splits (3 splits of 8
// positions), and unfused (qkv_post + attention_kernel). Every call's logits against the
// reference, the tokens fed the argmax (teacher-forced along them).
static void window_model(const char *family, const char *prec, double tol) {
  const int window = 8;
  const Windowed w(family, prec, window, 4, 64);
  const Owned &o = w.o;
  const Cfg &c = w.c;
  mqb_model *m = nullptr;
  char err[512];
  if (mqb_model_open(&w.p, &m, err, sizeof err)) {
    check(false, std::string("open: ") + err);
    return;
  }
  std::mt19937 rng(9);
  std::vector<std::vector<int>> seq(3);
  for (int i = 0; i < 3; ++i) {
    seq[i].resize(i == 0 ? 20 : i == 1 ? 11 : 13);
    for (auto &x : seq[i]) x = (int)(rng() % 300);
  }
  const int32_t slot_of[3] = {3, 1, 2};
  std::vector<size_t> fed(3, 0);  // tokens of each sequence in its cache
  double md = 0, mfull = 0;
  bool ok = true;
  for (int s = 0; s <= 4 && ok; ++s) {
    decode_mode(m, s);
    const Batch bt = next_batch(seq, fed, slot_of, s);
    const std::vector<int> &who = bt.who;
    std::vector<float> lo(who.size() * (size_t)c.V);
    std::vector<int32_t> am(who.size());
    if (mqb_forward(m, (int)who.size(), bt.sl.data(), bt.nt.data(), bt.tk.data(), bt.sp.data(), lo.data(), am.data(),
                    err, sizeof err)) {
      check(false, std::string("forward: ") + err);
      ok = false;
      break;
    }
    for (size_t e = 0; e < who.size(); ++e) {
      const int i = who[e];
      fed[i] = seq[i].size();
      md = std::max(md, maxdiff(lo.data() + e * c.V, ref_logits(o, c, seq[i], window).back()));
      mfull = std::max(mfull, maxdiff(lo.data() + e * c.V, ref_logits(o, c, seq[i]).back()));
      seq[i].push_back(am[e]);
    }
  }
  knob(m, "fused_attn", 1);
  mqb_model_close(m);
  check(ok && md < tol, std::string(family) + " " + prec + " sliding window 8, 3 sequences to " +
                            std::to_string(seq[0].size() - 1) + " positions (prefill, a mixed chunk, decode fused, "
                            "split, unfused): max|d| = " + std::to_string(md));
  check(ok && mfull > 4 * tol, std::string(family) + " " + prec + " sliding window 8: the whole-cache reference is max|d| = " +
                                   std::to_string(mfull) + " away (> 4 tol)");
}
