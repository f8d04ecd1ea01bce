// engine.cc: the C ABI of modelqual.h: engine lifetime, validation, the step scheduler
// (continuous batching: queued prompts are prefilled in the same forward pass that decodes one
// token for every running sequence), sampling and stop rules. Models live in
// native/models/<family>.cc and register themselves (registry.cc); this file names none.
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "runtime.h"

using namespace mq;

static thread_local std::string g_last_error;

static mq_status fail(mq_status s, const std::string &msg) {
  g_last_error = msg;
  return s;
}

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator; one per sequence so a
// seed reproduces its tokens whatever else shares the batch (on a backend that samples on the
// device too: where a sequence is sampled is decided per sequence, in mq_engine_step).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

struct Seq {
  uint64_t id;
  int slot;
  std::vector<int32_t> prompt;
  mq_sampling s;
  Rng rng;
  int pos = 0;  // tokens in the KV cache
  bool prefilled = false;
  int32_t last = -1;
  int n_out = 0;
  int64_t added_ns = 0, first_ns = 0;
  // The token history the penalties read (empty unless the sequence asks for one).
  std::vector<char> seen;         // vocab entries: in the prompt or generated (repetition penalty)
  std::vector<int32_t> seen_ids;  // the distinct ids of seen, in first-seen order
  std::vector<int32_t> count;     // vocab entries: times generated (presence/frequency penalty)
  std::vector<int32_t> gen_ids;   // the distinct generated ids, in first-seen order
};

}  // namespace

// SampleScratch is one sampling thread's working memory, kept across steps.
struct SampleScratch {
  std::vector<int32_t> cand;
  std::vector<double> prob;
  std::vector<float> p;
  std::vector<float> block;
  std::vector<float> vals;                      // the plain sampler's candidate logits, then weights
  std::vector<std::pair<int32_t, float>> saved;  // logits the processors changed, to restore
};

// exp_neg returns e^x for x <= 0 to about 2e-7 relative error (x below -87 gives 0): a
// branch-free Cody-Waite reduction to 2^n * 2^f with a degree-6 polynomial for 2^f, so the
// compiler vectorises the full-vocabulary softmax loop (std::exp does not vectorise without
// -ffast-math). Sampling needs relative accuracy, not bit equality with libm.
static inline float exp_neg(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;  // x * log2(e)
  const float n = std::floor(t);
  const float f = t - n;  // [0, 1)
  float y = 1.5353362e-4f;
  y = y * f + 1.3398874e-3f;
  y = y * f + 9.6181291e-3f;
  y = y * f + 5.5503342e-2f;
  y = y * f + 2.4022652e-1f;
  y = y * f + 6.9314718e-1f;
  y = y * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &y, sizeof(bits));
  bits += (int32_t)n << 23;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

// exp_weights writes w[j] = exp_neg((x[j] - mx) * invT) for j < n (n a multiple of 8) with
// AVX2, the same operations in the same order as the scalar code compiles to (GCC does not
// vectorise std::floor without -fno-trapping-math): bit-identical weights.
static void exp_weights(const float *x, float *w, int n, float mx, float invT) {
  const __m256 vmx = _mm256_set1_ps(mx), vinv = _mm256_set1_ps(invT), lo = _mm256_set1_ps(-87.0f);
  const __m256 l2e = _mm256_set1_ps(1.44269504088896341f);
  for (int j = 0; j + 8 <= n; j += 8) {
    __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vmx), vinv);
    d = _mm256_max_ps(lo, d);  // std::max(d, -87): keeps d when d is NaN
    const __m256 t = _mm256_mul_ps(d, l2e);
    const __m256 nf = _mm256_floor_ps(t);
    const __m256 f = _mm256_sub_ps(t, nf);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(1.5353362e-4f), f, _mm256_set1_ps(1.3398874e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.6181291e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.5503342e-2f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.4022652e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(6.9314718e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_add_epi32(_mm256_castps_si256(y), _mm256_slli_epi32(_mm256_cvttps_epi32(nf), 23));
    _mm256_storeu_ps(w + j, _mm256_castsi256_ps(bits));
  }
}

// TokenLogprobs is one sampled token's log-probability and its most likely alternatives.
struct TokenLogprobs {
  float logprob = 0;
  int rank = 1;
  int n_top = 0;
  int32_t top_ids[MQ_MAX_TOP_LOGPROBS];
  float top[MQ_MAX_TOP_LOGPROBS];
};

// log_probs fills out with log_softmax(lg)[tok] and the k most likely tokens (descending
// logit, ties to the lowest id, as torch.topk on a stable order) with theirs. The
// distribution is the model's raw one (vLLM's default "raw_logprobs"): no temperature, top-k
// or top-p, so a served logprob is comparable to transformers' log_softmax of the same logits
// whatever the request's sampling. The normaliser is summed in double over exp_weights'
// vectorised fp32 weights (2e-7 relative), so a logprob is within about 1e-6 of fp32 torch.
static void log_probs(int V, const float *lg, int32_t tok, int k, bool unnormalised, SampleScratch &sc,
                      TokenLogprobs &out) {
  float mx = -INFINITY;
  for (int i = 0; i < V; i++) mx = std::max(mx, lg[i]);
  auto &p = sc.p;
  p.resize(V);
  const int v8 = V / 8 * 8;
  exp_weights(lg, p.data(), v8, mx, 1.0f);
  double sum = 0;
  for (int i = 0; i < v8; i++) sum += p[i];
  for (int i = v8; i < V; i++) sum += exp_neg(lg[i] - mx);
  double lse = (double)mx + std::log(sum);
  if (unnormalised) lse = mx;  // fault engine.logprobs_unnormalised: logit - max, no log-sum-exp
  out.logprob = (float)((double)lg[tok] - lse);
  // The top k by insertion into a short sorted array: a candidate must beat the k-th logit
  // strictly, so among equal logits the lower id (seen first) stays ahead.
  int n = 0, above = 0;
  const float lt = lg[tok];
  for (int i = 0; i < V; i++) above += lg[i] > lt;
  out.rank = 1 + above;
  for (int i = 0; i < V && k > 0; i++) {
    const float x = lg[i];
    if (n == k && !(x > lg[out.top_ids[n - 1]])) continue;
    if (x != x) continue;  // NaN
    int j = n < k ? n++ : k - 1;
    while (j > 0 && x > lg[out.top_ids[j - 1]]) {
      out.top_ids[j] = out.top_ids[j - 1];
      j--;
    }
    out.top_ids[j] = i;
  }
  out.n_top = n;
  for (int j = 0; j < n; j++) out.top[j] = (float)((double)lg[out.top_ids[j]] - lse);
}

// The plain sampler's candidate budget: the most tokens it weighs explicitly.
constexpr int kCandidateBudget = 4096;

struct mq_engine {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Weights> weights;
  std::unique_ptr<Backend> be;
  std::string family, device, task;
  HParams hp;
  int max_batch = 0, max_context = 0, vocab = 0, n_threads = 1;
  std::vector<int32_t> eos;
  std::vector<std::unique_ptr<Seq>> slots;
  int live = 0;
  int last_added_slot = -1;  // the slot mq_engine_add just filled (mq_engine_add_image)
  uint64_t next_id = 1;
  std::mutex cancel_mu;
  std::vector<uint64_t> cancels;
  // per-step scratch
  Batch batch;
  std::vector<Seq *> members;
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  std::vector<mq_event> events;
  std::vector<int32_t> sampled;
  std::vector<float> temps;     // device sampling: per-entry temperature
  std::vector<uint64_t> keys;   // device sampling: per-entry random key
  std::vector<char> on_host;    // per entry: sampled on the host from its logits
  std::vector<SampleScratch> scratch;  // one per pool thread
  std::vector<TokenLogprobs> lp;       // per entry, for sequences that asked for logprobs
  bool fault_lp_unnormalised = false;  // MODELQUAL_FAULTS engine.logprobs_unnormalised
};

// plain_temperature says s asks for no top-k, top-p or min-p truncation over a vocabulary of V
// (and no logits processor): a backend that samples on the device may draw it there.
static bool rep_on(const mq_sampling &s) { return s.repetition_penalty > 0 && s.repetition_penalty != 1; }
static bool pf_on(const mq_sampling &s) { return s.presence_penalty != 0 || s.frequency_penalty != 0; }
static bool truncates(const mq_sampling &s, int V) {
  return (s.top_k > 0 && s.top_k < V) || (s.top_p > 0 && s.top_p < 1) || (s.min_p > 0 && s.min_p <= 1);
}
// processes says the sequence's next logits pass through a processor (a penalty, or min_tokens
// still suppressing EOS after n_out tokens): they must reach the host, even when greedy.
static bool processes(const mq_sampling &s, int n_out) { return rep_on(s) || pf_on(s) || n_out < s.min_tokens; }
static bool plain_temperature(const mq_sampling &s, int V) { return !truncates(s, V); }

// History is a view of a sequence's token history for the processors.
struct History {
  const std::vector<int32_t> &seen_ids, &gen_ids, &count;
  int n_out;
};

// process applies the logits processors to lg in place, in transformers' order (repetition
// penalty, then min_tokens) with OpenAI's presence/frequency penalties after the repetition
// penalty (vLLM's order), each in fp32 as torch computes it; every value changed is saved so
// that restore gives the raw logits back (logprobs are of the raw distribution).
static void process(float *lg, const mq_sampling &s, const History &h, const int32_t *eos, int n_eos,
                    std::vector<std::pair<int32_t, float>> &saved) {
  saved.clear();
  if (rep_on(s)) {
    // RepetitionPenaltyLogitsProcessor: torch.where(score < 0, score * penalty, score / penalty)
    // over every id of prompt + output (once per id, as its gather/scatter).
    const float rp = s.repetition_penalty;
    for (int32_t id : h.seen_ids) {
      const float v = lg[id];
      saved.emplace_back(id, v);
      lg[id] = v < 0 ? v * rp : v / rp;
    }
  }
  if (pf_on(s)) {
    // OpenAI: logit -= count * frequency_penalty + (count > 0) * presence_penalty, over the
    // generated tokens (vLLM: two fp32 subtractions in this order).
    for (int32_t id : h.gen_ids) {
      float v = lg[id];
      saved.emplace_back(id, v);
      v = v - s.frequency_penalty * (float)h.count[id];
      v = v - s.presence_penalty;
      lg[id] = v;
    }
  }
  if (h.n_out < s.min_tokens)
    for (int i = 0; i < n_eos; i++) {
      saved.emplace_back(eos[i], lg[eos[i]]);
      lg[eos[i]] = -INFINITY;
    }
}

static void restore(float *lg, const std::vector<std::pair<int32_t, float>> &saved) {
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) lg[it->first] = it->second;
}

// argmax is the greedy token: the highest logit, the lowest id on ties (NaN never wins).
static int32_t argmax(int V, const float *lg) {
  int32_t best = 0;
  float bv = -INFINITY;
  bool any = false;
  for (int i = 0; i < V; i++)
    if (lg[i] > bv || (!any && lg[i] == bv)) bv = lg[i], best = i, any = true;
  return best;
}

// vmax is the largest logit (NaN ignored), in 16 independent chains (max is exact, so the
// order does not matter).
static float vmax(int V, const float *lg) {
  float mx = -INFINITY;
  // _mm256_max_ps(x, m) keeps m when x is NaN or equal, as std::max(m, x) does.
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  int i = 0;
  for (; i + 16 <= V; i += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(lg + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(lg + i + 8), m1);
  }
  float m16[16];
  _mm256_storeu_ps(m16, m0);
  _mm256_storeu_ps(m16 + 8, m1);
  for (int j = 0; j < 16; j++) mx = std::max(mx, m16[j]);
  for (; i < V; i++) mx = std::max(mx, lg[i]);
  return mx;
}

// sample_full draws from softmax(lg / T) over the whole vocabulary: one vectorised pass for
// the weights in blocks, one scan for the draw. Exact, about 1 ms on Qwen3's vocabulary on a
// small VM; the fallback of sample_plain.
static int32_t sample_full(int V, const float *lg, float mx, float invT, double u01, SampleScratch &sc) {
  auto &p = sc.p;
  p.resize(V);
  // Weights in blocks of L with one sum per block: the weight loop vectorises, and the draw
  // scans the block sums first (V/L additions) and then L weights of one block.
  constexpr int L = 16;
  const int nb = V / L;
  auto &bs = sc.block;
  bs.resize(nb);
  constexpr int G = 8;
  int blk = 0;
  for (; blk + G <= nb; blk += G) {
    const float *x = lg + (size_t)blk * L;
    float *w = p.data() + (size_t)blk * L;
    exp_weights(x, w, G * L, mx, invT);
    float acc[G];
    for (int g = 0; g < G; g++) acc[g] = 0;
    for (int j = 0; j < L; j++)
      for (int g = 0; g < G; g++) acc[g] += w[g * L + j];
    for (int g = 0; g < G; g++) bs[blk + g] = acc[g];
  }
  for (; blk < nb; blk++) {
    const float *x = lg + (size_t)blk * L;
    float *w = p.data() + (size_t)blk * L;
    float acc = 0;
    for (int j = 0; j < L; j++) acc += (w[j] = exp_neg((x[j] - mx) * invT));
    bs[blk] = acc;
  }
  double sum = 0;
  for (int b = 0; b < nb; b++) sum += bs[b];
  for (int k = nb * L; k < V; k++) sum += (p[k] = exp_neg((lg[k] - mx) * invT));
  const double u = u01 * sum;
  double acc = 0;
  int k = 0;
  for (int b = 0; b < nb; b++, k += L) {
    if (u < acc + bs[b]) break;
    acc += bs[b];
  }
  for (; k < V; k++) {
    acc += p[k];
    if (u < acc) return k;
  }
  for (k = V - 1; k >= 0; k--)  // rounding put u past the total: the last possible token
    if (p[k] > 0) return k;
  return 0;
}

// collect writes the ids i with lg[i] >= th to out in increasing order; -1 when there are
// more than budget of them (the scan stops there).
static int collect(int V, const float *lg, float th, int budget, int32_t *out) {
  const __m256 vt = _mm256_set1_ps(th);
  int n = 0, i = 0;
  for (; i + 8 <= V; i += 8) {
    int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(lg + i), vt, _CMP_GE_OQ));
    while (m) {
      if (n == budget) return -1;
      out[n++] = i + __builtin_ctz(m);
      m &= m - 1;
    }
  }
  for (; i < V; i++)
    if (lg[i] >= th) {
      if (n == budget) return -1;
      out[n++] = i;
    }
  return n;
}

// Candidate cut-offs in units of the temperature below the top logit, widest first: a token
// below the cut-off D has weight (relative to the top token's) below e^-D.
static const float kCuts[] = {16, 12, 10, 8, 6, 4, 2};
constexpr int kNCuts = sizeof(kCuts) / sizeof(kCuts[0]);

// sample_plain draws exactly from softmax(lg / T) without weighing the whole vocabulary (the
// way llama.cpp's samplers narrow the candidates before the softmax, but exact): rejection
// sampling with an envelope that is each candidate's own weight and a flat bound eps over the
// whole vocabulary for the rest.
//
// With m the top logit and w_i = exp((l_i - m) / T) <= 1, the candidates C are the ids with
// l_i >= m - D*T for the widest cut-off D of kCuts that keeps |C| within the budget (C empty
// and eps = 1 when even D = 2 keeps too many: a flat distribution), so every other id has
// w_i <= eps = e^-D. The proposal picks a candidate with weight w_i, or (total weight V*eps)
// a uniform id j with weight eps: a candidate j is rejected, any other accepted with
// probability w_j / eps. Each id is then accepted with probability proportional to w_i
// (candidates through the first branch, the rest through the second), so a draw that is
// accepted is an exact sample, whatever the number of rejections before it. Expected
// proposals: (Z_C + V*eps) / Z, about 1 for a peaked distribution (D = 16: V*eps < 0.02) and
// a few hundred cheap ones at most for a flat one (the cut-offs are at most 4 apart, and the
// tokens above the next wider cut-off, about the budget or more, hold weight against V*eps).
// The cost is one pass for m, one for C (cut short when the widest cut-off overflows, plus an
// eighth of a pass to estimate a narrower one), and the budget's weights, instead of the
// weights of the whole vocabulary. After kMaxProposals rejections (never seen
// in practice) it falls back to weighing everything, still exact.
static int32_t sample_plain(int V, const float *lg, float T, Rng &rng, SampleScratch &sc, int budget) {
  const float mx = vmax(V, lg);
  const float invT = 1.0f / T;
  if (!(mx > -INFINITY)) return 0;  // no finite logit: nothing to weigh
  auto &cand = sc.cand;
  cand.resize(budget);
  int n = collect(V, lg, mx - kCuts[0] * T, budget, cand.data());
  float D = kCuts[0];
  if (n < 0) {
    // Too many within the widest cut-off: estimate each narrower cut-off's count from one
    // vector of every 8 (an eighth of a pass), then collect at the widest whose estimate fits
    // three quarters of the budget, moving narrower while a collection overflows. Any cut-off
    // keeps the draw exact; the estimate only picks a cheap one.
    constexpr int S = 64;  // floats per sampled stride: one 8-float vector of each
    __m256i c[kNCuts];
    __m256 t[kNCuts];
    for (int k = 1; k < kNCuts; k++) c[k] = _mm256_setzero_si256(), t[k] = _mm256_set1_ps(mx - kCuts[k] * T);
    for (int i = 0; i + 8 <= V; i += S) {
      const __m256 x = _mm256_loadu_ps(lg + i);
      for (int k = 1; k < kNCuts; k++)
        c[k] = _mm256_sub_epi32(c[k], _mm256_castps_si256(_mm256_cmp_ps(x, t[k], _CMP_GE_OQ)));
    }
    D = 0;
    int k = 1;
    for (; k < kNCuts; k++) {
      int32_t v[8], cnt = 0;
      _mm256_storeu_si256((__m256i *)v, c[k]);
      for (int j = 0; j < 8; j++) cnt += v[j];
      if ((int64_t)cnt * (S / 8) <= (int64_t)budget * 3 / 4) break;
    }
    for (; k < kNCuts && D == 0; k++) {
      n = collect(V, lg, mx - kCuts[k] * T, budget, cand.data());
      if (n >= 0) D = kCuts[k];
    }
    if (D == 0) n = 0;  // flat: no candidates, a bound of 1 for every token
  }
  // eps bounds every non-candidate's computed weight: e^-D, widened by a margin for the
  // rounding of (l - m) * invT and of exp_neg (2e-7), so no acceptance probability exceeds 1.
  const double eps = D > 0 ? std::exp(-(double)D) * (1 + 1e-4) : 1.0;
  auto &w = sc.vals;
  w.resize(n + 8);
  for (int k = 0; k < n; k++) w[k] = lg[cand[k]];
  const int n8 = n / 8 * 8;
  exp_weights(w.data(), w.data(), n8, mx, invT);
  for (int k = n8; k < n; k++) w[k] = exp_neg((w[k] - mx) * invT);
  double zc = 0;
  for (int k = 0; k < n; k++) zc += w[k];
  const double total = zc + (double)V * eps;
  constexpr int kMaxProposals = 1 << 16;
  for (int it = 0; it < kMaxProposals; it++) {
    const double u = rng.uniform() * total;
    if (u < zc) {
      double acc = 0;
      for (int k = 0; k < n; k++) {
        acc += w[k];
        if (u < acc) return cand[k];
      }
      for (int k = n - 1; k >= 0; k--)  // rounding put u past the candidates' total
        if (w[k] > 0) return cand[k];
    }
    // The flat part: u - zc is uniform on [0, V*eps), so its id j is uniform over the
    // vocabulary and its fraction uniform on [0, 1), independent of j.
    const double r = (u - zc) / eps;
    int32_t j = (int32_t)r;
    if (j >= V) j = V - 1;
    const double frac = r - j;
    if (std::binary_search(cand.begin(), cand.begin() + n, j)) continue;
    const float wj = exp_neg((lg[j] - mx) * invT);
    if (frac * eps < wj) return j;
  }
  return sample_full(V, lg, mx, invT, rng.uniform(), sc);
}

// kept_set leaves in sc.cand[0..n) (ascending id) the tokens temperature, top-k, top-p and min-p
// keep, in transformers' order, and returns n; mx is the top logit among them.
static int kept_set(int V, const float *lg, const mq_sampling &s, SampleScratch &sc, float &mx_out) {
  auto &cand = sc.cand;
  auto better = [lg](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); };
  cand.resize(V);
  std::iota(cand.begin(), cand.end(), 0);
  int n = V;
  if (s.top_k > 0 && s.top_k < V) {
    std::nth_element(cand.begin(), cand.begin() + s.top_k, cand.end(), better);
    n = s.top_k;
  }
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = std::max(mx, lg[cand[i]]);
  mx_out = mx;
  const double invT = 1.0 / s.temperature;
  auto weight = [&](int32_t id) { return std::exp(((double)lg[id] - mx) * invT); };
  if (s.top_p > 0 && s.top_p < 1) {
    // The nucleus is the shortest prefix of the by-logit order whose mass reaches top_p. Only
    // that prefix is sorted: the 64 most likely first, 8x more while the mass falls short. On a
    // 151,936-token vocabulary a full sort took 15.6 ms per token on a 2-core VM, the first
    // round (nth_element + sort of 64) 1.5 ms.
    double sum = 0;
    for (int i = 0; i < n; i++) sum += weight(cand[i]);
    const double limit = s.top_p * sum;
    for (int m = std::min(n, 64);; m = std::min(n, m * 8)) {
      if (m < n) std::nth_element(cand.begin(), cand.begin() + m, cand.begin() + n, better);
      std::sort(cand.begin(), cand.begin() + m, better);
      double cum = 0;
      int keep = 0;
      while (keep < m) {
        cum += weight(cand[keep++]);
        if (cum >= limit) break;
      }
      if (cum >= limit || m == n) {
        n = keep;
        break;
      }
    }
  }
  if (s.min_p > 0 && s.min_p <= 1) {
    // MinPLogitsWarper: probs < min_p * max(probs) are removed, i.e. weight (relative to the
    // top token, which always stays) below min_p.
    int keep = 0;
    for (int i = 0; i < n; i++)
      if (weight(cand[i]) >= s.min_p) cand[keep++] = cand[i];
    n = keep;
  }
  // The draw walks the kept tokens in vocabulary order, as torch.multinomial does after
  // transformers' masks. An order by logit (or nth_element's arbitrary one) would let a change
  // in the last bits of two near-equal logits (another batch shape on a GPU) reorder the walk
  // and move a seeded draw to another token.
  std::sort(cand.begin(), cand.begin() + n);
  return n;
}

// sample draws a token from (processed) logits: the argmax at temperature 0, else temperature,
// then top-k, top-p (nucleus) and min-p, the order transformers' generate applies them; the
// lowest id wins ties. A negative budget weighs the whole vocabulary for a plain temperature
// draw (the sampling tests' and benchmarks' reference: mq_sampling_draw).
static int32_t sample(int V, const float *lg, const mq_sampling &s, Rng &rng, SampleScratch &sc,
                      int budget = kCandidateBudget) {
  if (!(s.temperature > 0)) return argmax(V, lg);
  if (plain_temperature(s, V)) {
    if (budget < 0) return sample_full(V, lg, vmax(V, lg), 1.0f / s.temperature, rng.uniform(), sc);
    return sample_plain(V, lg, s.temperature, rng, sc, budget);
  }
  float mx;
  const int n = kept_set(V, lg, s, sc, mx);
  const double invT = 1.0 / s.temperature;
  auto &cand = sc.cand;
  auto &p = sc.prob;
  p.resize(n);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (p[i] = std::exp(((double)lg[cand[i]] - mx) * invT));
  double u = rng.uniform() * sum, acc = 0;
  for (int i = 0; i < n; i++) {
    acc += p[i];
    if (u < acc) return cand[i];
  }
  return cand[n - 1];
}

extern "C" {

int32_t mq_abi_version(void) { return MQ_ABI_VERSION; }

const char *mq_last_error(void) { return g_last_error.c_str(); }

mq_engine_params mq_engine_default_params(void) {
  mq_engine_params p;
  std::memset(&p, 0, sizeof(p));
  p.max_batch = 8;
  p.max_context = 0;
  p.device = "cpu";
  p.precision = "fp32";
  return p;
}

mq_sampling mq_sampling_default(void) {
  mq_sampling s;
  std::memset(&s, 0, sizeof(s));
  s.max_new_tokens = 16;
  return s;
}

mq_status mq_engine_open(const mq_engine_params *p, mq_engine **out) {
  if (!p || !out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_open: params and out must not be NULL");
  *out = nullptr;
  std::unique_ptr<mq_engine> e(new mq_engine);
  try {
    e->family = p->family ? p->family : "";
    e->device = p->device && *p->device ? p->device : "cpu";
    e->max_batch = p->max_batch;
    e->max_context = p->max_context;
    if (e->max_batch < 1) return fail(MQ_ERR_INVALID_ARGUMENT, "max_batch " + std::to_string(p->max_batch) + " must be >= 1");
    if (e->max_context < 1)
      return fail(MQ_ERR_INVALID_ARGUMENT, "max_context " + std::to_string(p->max_context) + " must be >= 1");
    if (e->device != "cpu" && e->device != "cuda")
      return fail(MQ_ERR_INVALID_ARGUMENT, "device \"" + e->device + "\" is not supported; use cpu or cuda");
    int n = p->n_threads;
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    e->n_threads = std::max(1, n);
    e->eos.assign(p->eos_ids, p->eos_ids + std::max(0, p->n_eos_ids));

    const Family &fam = find_family(e->family);
    e->task = fam.task;
    fam.resolve(Config(p->config, p->n_config), e->hp);
    ModelArgs a;
    a.hp = &e->hp;
    a.max_batch = e->max_batch;
    a.n_slots = e->max_batch + 1;  // the last slot is the scratch slot of mq_engine_logits
    a.max_context = e->max_context;
    if (e->device == "cuda") {
      e->n_threads = 1;
      e->pool.reset(new ThreadPool(1));
      e->be = make_cuda(*p, fam, e->hp, e->max_batch, e->max_context);
    } else {
      if (fam.threads > 0) e->n_threads = fam.threads;
      e->pool.reset(new ThreadPool(e->n_threads));
      e->weights.reset(new Weights(p->tensors, p->n_tensors));
      a.pool = e->pool.get();
      a.w = e->weights.get();
      e->be = fam.make(a);
      std::vector<std::string> unused = e->weights->unused();
      if (!unused.empty())
        return fail(MQ_ERR_LOAD, "tensor " + unused[0] + " (and " + std::to_string(unused.size() - 1) +
                                     " more) is not read by family " + e->family +
                                     ": the checkpoint does not fit its config.json; rebuild the bundle from a matching checkpoint");
    }
    e->vocab = e->be->vocab();
    e->slots.resize(e->max_batch);
    e->fault_lp_unnormalised = fault("engine.logprobs_unnormalised");
  } catch (const Error &err) {
    return fail(err.status, err.what());
  } catch (const std::exception &err) {
    return fail(MQ_ERR_INTERNAL, std::string("mq_engine_open: ") + err.what());
  }
  *out = e.release();
  return MQ_OK;
}

void mq_engine_close(mq_engine *e) { delete e; }

mq_status mq_engine_info_get(const mq_engine *e, mq_engine_info *out) {
  if (!e || !out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_info_get: NULL argument");
  out->vocab_size = e->vocab;
  out->max_context = e->max_context;
  out->max_batch = e->max_batch;
  out->n_threads = e->n_threads;
  out->device = e->device.c_str();
  out->task = e->task.c_str();
  return MQ_OK;
}

static void release(mq_engine *e, int slot);

// image_input copies and checks n mq_images (n >= 1) into one ImageInput, refusing several to
// a backend that takes one image per sequence.
static std::shared_ptr<const ImageInput> image_input(const mq_engine *e, const mq_image *im, int32_t n) {
  if (n < 1) throw Error(MQ_ERR_INVALID_ARGUMENT, "images: n_images must be at least 1");
  if (n > 1 && !e->be->several_images())
    throw Error(MQ_ERR_INVALID_ARGUMENT,
                "family " + e->family + " on device " + e->device + " takes one image per sequence, " + std::to_string(n) +
                    " given: start qual-server with --max-images-per-request 1" +
                    (e->device == "cpu" ? std::string()
                                        : std::string(", or serve this family on the cpu backend (--device cpu) if its CPU model takes several")));
  auto in = std::make_shared<ImageInput>();
  size_t total = 0;
  for (int32_t k = 0; k < n; k++) {
    if (!im[k].pixels || im[k].n_pixels <= 0 || im[k].grid_t <= 0 || im[k].grid_h <= 0 || im[k].grid_w <= 0)
      throw Error(MQ_ERR_INVALID_ARGUMENT, "image " + std::to_string(k) + ": pixels and a positive grid are required");
    total += (size_t)im[k].n_pixels;
  }
  in->pixels.reserve(total);
  for (int32_t k = 0; k < n; k++) {
    ImageInput::Grid g;
    g.t = im[k].grid_t, g.h = im[k].grid_h, g.w = im[k].grid_w;
    g.offset = in->pixels.size(), g.count = (size_t)im[k].n_pixels;
    in->pixels.insert(in->pixels.end(), im[k].pixels, im[k].pixels + im[k].n_pixels);
    in->images.push_back(g);
  }
  in->grid_t = im[0].grid_t, in->grid_h = im[0].grid_h, in->grid_w = im[0].grid_w;
  return in;
}

mq_status mq_engine_add_image(mq_engine *e, const int32_t *prompt, int32_t n, const mq_image *image,
                              const mq_sampling *s, uint64_t *seq_out) {
  if (!e || !image) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_add_image: NULL argument");
  return mq_engine_add_images(e, prompt, n, image, 1, s, seq_out);
}

mq_status mq_engine_add_images(mq_engine *e, const int32_t *prompt, int32_t n, const mq_image *images, int32_t n_images,
                               const mq_sampling *s, uint64_t *seq_out) {
  if (!e || !images) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_add_images: NULL argument");
  std::shared_ptr<const ImageInput> in;
  try {
    in = image_input(e, images, n_images);
  } catch (const Error &x) {
    return fail(x.status, x.what());
  }
  mq_status st = mq_engine_add(e, prompt, n, s, seq_out);
  if (st != MQ_OK) return st;
  const int slot = e->last_added_slot;
  try {
    e->be->set_image(slot, std::move(in), prompt, n);
  } catch (const Error &x) {
    release(e, slot);
    return fail(x.status, x.what());
  } catch (const std::exception &x) {
    release(e, slot);
    return fail(MQ_ERR_INTERNAL, x.what());
  }
  return MQ_OK;
}

mq_status mq_engine_add(mq_engine *e, const int32_t *prompt, int32_t n, const mq_sampling *s, uint64_t *seq_out) {
  if (!e || !s || !seq_out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_add: NULL argument");
  if (n <= 0 || !prompt) return fail(MQ_ERR_INVALID_ARGUMENT, "prompt is empty; pass at least one token id");
  for (int i = 0; i < n; i++)
    if (prompt[i] < 0 || prompt[i] >= e->vocab)
      return fail(MQ_ERR_INVALID_ARGUMENT, "prompt[" + std::to_string(i) + "] = " + std::to_string(prompt[i]) +
                                               " is outside the vocabulary [0, " + std::to_string(e->vocab) + ")");
  if (s->max_new_tokens < 1) return fail(MQ_ERR_INVALID_ARGUMENT, "max_new_tokens must be >= 1");
  if ((int64_t)n + s->max_new_tokens > e->max_context)
    return fail(MQ_ERR_INVALID_ARGUMENT, "prompt tokens (" + std::to_string(n) + ") + max_new_tokens (" +
                                             std::to_string(s->max_new_tokens) + ") exceeds max_context " +
                                             std::to_string(e->max_context) + "; shorten the prompt or lower max_new_tokens");
  if (!(s->temperature >= 0) || !std::isfinite(s->temperature))
    return fail(MQ_ERR_INVALID_ARGUMENT, "temperature must be a finite number >= 0");
  if (s->top_k < 0) return fail(MQ_ERR_INVALID_ARGUMENT, "top_k must be >= 0 (0 = off)");
  if (!(s->top_p >= 0) || !std::isfinite(s->top_p))
    return fail(MQ_ERR_INVALID_ARGUMENT, "top_p must be a finite number >= 0 (0 or 1 = off)");
  if (s->top_logprobs < 0 || s->top_logprobs > MQ_MAX_TOP_LOGPROBS)
    return fail(MQ_ERR_INVALID_ARGUMENT, "top_logprobs " + std::to_string(s->top_logprobs) + " must be in 0.." +
                                             std::to_string(MQ_MAX_TOP_LOGPROBS));
  if (!(s->repetition_penalty >= 0) || !std::isfinite(s->repetition_penalty))
    return fail(MQ_ERR_INVALID_ARGUMENT, "repetition_penalty must be a finite number > 0 (0 or 1 = off)");
  if (!std::isfinite(s->presence_penalty) || !std::isfinite(s->frequency_penalty))
    return fail(MQ_ERR_INVALID_ARGUMENT, "presence_penalty and frequency_penalty must be finite numbers");
  if (!(s->min_p >= 0 && s->min_p <= 1))
    return fail(MQ_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1] (0 = off)");
  if (s->min_tokens < 0) return fail(MQ_ERR_INVALID_ARGUMENT, "min_tokens must be >= 0 (0 = off)");
  int slot = -1;
  for (int i = 0; i < e->max_batch && slot < 0; i++)
    if (!e->slots[i]) slot = i;
  if (slot < 0)
    return fail(MQ_ERR_BATCH_FULL, "all " + std::to_string(e->max_batch) +
                                       " slots hold live sequences (max_batch); retry after a sequence finishes");
  std::unique_ptr<Seq> q(new Seq);
  q->id = e->next_id++;
  q->slot = slot;
  q->prompt.assign(prompt, prompt + n);
  q->s = *s;
  q->rng.s = s->seed;
  if (rep_on(*s)) {
    q->seen.assign(e->vocab, 0);
    for (int i = 0; i < n; i++)
      if (!q->seen[prompt[i]]) q->seen[prompt[i]] = 1, q->seen_ids.push_back(prompt[i]);
  }
  if (pf_on(*s)) q->count.assign(e->vocab, 0);
  q->added_ns = now_ns();
  *seq_out = q->id;
  e->slots[slot] = std::move(q);
  e->last_added_slot = slot;
  e->live++;
  return MQ_OK;
}

void mq_engine_cancel(mq_engine *e, uint64_t seq) {
  if (!e) return;
  std::lock_guard<std::mutex> l(e->cancel_mu);
  e->cancels.push_back(seq);
}

int32_t mq_engine_active(const mq_engine *e) { return e ? e->live : 0; }

mq_status mq_engine_routing(const mq_engine *e, uint64_t *out, int64_t cap, int32_t *layers, int32_t *experts) {
  if (!e || !layers || !experts) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_routing: NULL argument");
  try {
    std::vector<uint64_t> counts;
    int nl = 0;
    int ne = e->be->routing_counts(&counts, &nl);
    *layers = ne > 0 ? nl : 0;
    *experts = ne;
    if (!out || ne == 0) return MQ_OK;
    if (cap < (int64_t)counts.size())
      return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_routing: cap " + std::to_string(cap) + " is below layers*experts = " +
                                               std::to_string(counts.size()));
    std::copy(counts.begin(), counts.end(), out);
    return MQ_OK;
  } catch (const Error &x) {
    return fail(x.status, x.what());
  }
}

static mq_event done_event(const mq_engine *e, const Seq &q, int32_t token, mq_finish_reason r) {
  mq_event ev;
  std::memset(&ev, 0, sizeof(ev));
  ev.seq = q.id;
  ev.token = token;
  ev.done = 1;
  ev.reason = r;
  ev.added_ns = q.added_ns;
  ev.first_token_ns = q.first_ns;
  ev.done_ns = now_ns();
  ev.prompt_tokens = (int32_t)q.prompt.size();
  ev.output_tokens = q.n_out;
  ev.vision_ns = e->be->vision_ns(q.slot);
  return ev;
}

static void release(mq_engine *e, int slot) {
  e->slots[slot].reset();
  e->be->reset_slot(slot);
  e->live--;
}

mq_status mq_engine_step(mq_engine *e, mq_event_callback cb, void *user, int32_t *active_out) {
  if (!e) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_step: engine is NULL");
  auto &ev = e->events;
  ev.clear();
  mq_status st = MQ_OK;

  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> l(e->cancel_mu);
    cancels.swap(e->cancels);
  }
  for (uint64_t id : cancels)
    for (int i = 0; i < e->max_batch; i++)
      if (e->slots[i] && e->slots[i]->id == id) {
        ev.push_back(done_event(e, *e->slots[i], -1, MQ_FINISH_CANCELLED));
        release(e, i);
      }

  Batch &b = e->batch;
  b.n = 0;
  b.slot.clear();
  b.ntok.clear();
  b.pos.clear();
  b.off.clear();
  b.tokens.clear();
  e->members.clear();
  bool all_greedy = true;
  for (int i = 0; i < e->max_batch; i++) {
    Seq *q = e->slots[i].get();
    if (!q) continue;
    b.slot.push_back(i);
    b.off.push_back(b.rows());
    b.pos.push_back(q->pos);
    if (!q->prefilled) {
      b.ntok.push_back((int)q->prompt.size());
      b.tokens.insert(b.tokens.end(), q->prompt.begin(), q->prompt.end());
    } else {
      b.ntok.push_back(1);
      b.tokens.push_back(q->last);
    }
    b.n++;
    e->members.push_back(q);
    if (q->s.temperature > 0) all_greedy = false;
  }

  if (b.n > 0) {
    // A backend that samples on the device draws every plain temperature sample there (no
    // logits cross to the host for them); a top-k or top-p sequence is sampled on the host from
    // its logits, which the same call returns. The choice is per sequence, so a seeded request's
    // tokens do not depend on what its batch-mates ask for.
    const bool device_sampling = !all_greedy && e->be->samples_on_device();
    e->on_host.assign(b.n, 0);
    bool any_host = false;
    for (int i = 0; i < b.n; i++) {
      const Seq *q = e->members[i];
      const mq_sampling &s = q->s;
      // A sequence with a logits processor (penalties, min_tokens) is sampled on the host from
      // its processed logits, greedy ones included (transformers applies the processors before
      // the argmax too); so is top-k, top-p or min-p on any backend.
      if (processes(s, q->n_out) || (s.temperature > 0 && !(device_sampling && plain_temperature(s, e->vocab)))) {
        e->on_host[i] = 1;
        any_host = true;
      }
    }
    // Logits are materialised only for host sampling or logprobs: greedy needs the argmax alone.
    bool any_lp = false;
    for (Seq *q : e->members) any_lp = any_lp || q->s.logprobs;
    const bool need_logits = (!e->be->deterministic() && any_host) || any_lp;
    if (need_logits) e->logits.resize((size_t)b.n * e->vocab);
    float *logits = need_logits ? e->logits.data() : nullptr;
    e->argmax.assign(b.n, -1);
    std::string err;
    try {
      if (device_sampling) {
        e->temps.resize(b.n);
        e->keys.resize(b.n);
        for (int i = 0; i < b.n; i++) {
          Seq *q = e->members[i];
          const bool dev = q->s.temperature > 0 && !e->on_host[i];
          e->temps[i] = dev ? (float)q->s.temperature : 0.f;  // 0: the argmax, unused for host rows
          e->keys[i] = dev ? q->rng.next() : 0;               // one draw per sampled token, as on the host
        }
        e->be->forward_sampled(b, e->temps.data(), e->keys.data(), e->argmax.data(), logits);
      } else {
        e->be->forward(b, logits, e->argmax.data());
      }
    } catch (const std::exception &x) {
      err = x.what();
    }
    if (!err.empty()) {
      for (Seq *q : e->members) {
        ev.push_back(done_event(e, *q, -1, MQ_FINISH_ERROR));
        release(e, q->slot);
      }
      st = fail(MQ_ERR_BACKEND, "forward pass failed: " + err);
    } else {
      // Sampling is independent per sequence (each has its own RNG), so sequences are
      // spread over the pool; the result does not depend on the thread count.
      e->sampled.assign(e->argmax.begin(), e->argmax.end());
      if (need_logits) {
        e->scratch.resize(e->pool->size());
        if (any_lp) e->lp.resize(b.n);
        e->pool->run([&](int t, int nt) {
          for (int i = t; i < b.n; i += nt) {
            Seq *q = e->members[i];
            if (e->on_host[i] && !e->be->deterministic()) {
              float *lg = e->logits.data() + (size_t)i * e->vocab;
              auto &saved = e->scratch[t].saved;
              saved.clear();
              if (processes(q->s, q->n_out))
                process(lg, q->s, History{q->seen_ids, q->gen_ids, q->count, q->n_out}, e->eos.data(),
                        (int)e->eos.size(), saved);
              e->sampled[i] = sample(e->vocab, lg, q->s, q->rng, e->scratch[t]);
              restore(lg, saved);  // logprobs are of the model's raw distribution
            }
            if (q->s.logprobs)
              log_probs(e->vocab, e->logits.data() + (size_t)i * e->vocab, e->sampled[i], q->s.top_logprobs,
                        e->fault_lp_unnormalised, e->scratch[t], e->lp[i]);
          }
        });
      }
      const int64_t t = now_ns();
      for (int i = 0; i < b.n; i++) {
        Seq *q = e->members[i];
        q->pos += b.ntok[i];
        q->prefilled = true;
        const int32_t tok = e->sampled[i];
        q->last = tok;
        q->n_out++;
        if (tok >= 0 && tok < e->vocab && !q->seen.empty() && !q->seen[tok]) q->seen[tok] = 1, q->seen_ids.push_back(tok);
        if (tok >= 0 && tok < e->vocab && !q->count.empty() && q->count[tok]++ == 0) q->gen_ids.push_back(tok);
        if (q->first_ns == 0) q->first_ns = t;
        mq_finish_reason r = MQ_FINISH_NONE;
        if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())
          r = MQ_FINISH_STOP;
        else if (q->n_out >= (int)q->s.max_new_tokens)
          r = MQ_FINISH_LENGTH;
        if (r != MQ_FINISH_NONE) {
          ev.push_back(done_event(e, *q, tok, r));
        } else {
          mq_event x;
          std::memset(&x, 0, sizeof(x));
          x.seq = q->id;
          x.token = tok;
          ev.push_back(x);
        }
        if (q->s.logprobs) {
          mq_event &x = ev.back();
          const TokenLogprobs &l = e->lp[i];
          x.has_logprob = 1;
          x.logprob = l.logprob;
          x.rank = l.rank;
          x.n_top = l.n_top;
          std::copy(l.top_ids, l.top_ids + l.n_top, x.top_ids);
          std::copy(l.top, l.top + l.n_top, x.top_logprobs);
        }
        if (r != MQ_FINISH_NONE) release(e, q->slot);
      }
    }
  }
  if (active_out) *active_out = e->live;
  // Callbacks run after the engine state is consistent, so they may call add or cancel.
  if (cb) {
    std::vector<mq_event> out;
    out.swap(ev);
    for (const mq_event &x : out) cb(&x, user);
    out.swap(ev);
  }
  if (active_out) *active_out = e->live;
  return st;
}

mq_status mq_family_resolve(const char *family, const mq_kv *config, int32_t n_config, char **json_out) {
  if (!json_out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_family_resolve: json_out is NULL");
  *json_out = nullptr;
  std::string err;
  mq_status st = resolve_family_json(family, config, n_config, json_out, &err);
  return st == MQ_OK ? MQ_OK : fail(st, err);
}

mq_status mq_family_layout(const char *family, const mq_kv *config, int32_t n_config, char **json_out) {
  if (!json_out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_family_layout: json_out is NULL");
  *json_out = nullptr;
  std::string err;
  mq_status st = family_layout_json(family, config, n_config, json_out, &err);
  return st == MQ_OK ? MQ_OK : fail(st, err);
}

mq_status mq_engine_logits_image(mq_engine *e, const int32_t *ids, int32_t n, const mq_image *image, float *out) {
  if (!e || !ids || !out || !image) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_logits_image: NULL argument");
  return mq_engine_logits_images(e, ids, n, image, 1, out);
}

mq_status mq_engine_logits_images(mq_engine *e, const int32_t *ids, int32_t n, const mq_image *images, int32_t n_images,
                                  float *out) {
  if (!e || !ids || !out || !images) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_logits_images: NULL argument");
  if (n <= 0 || n > e->max_context) return fail(MQ_ERR_INVALID_ARGUMENT, "ids must hold 1 to max_context tokens");
  try {
    e->be->set_image(e->max_batch, image_input(e, images, n_images), ids, n);
  } catch (const Error &x) {
    e->be->reset_slot(e->max_batch);
    return fail(x.status, x.what());
  }
  return mq_engine_logits(e, ids, n, out);  // resets the scratch slot, image included
}

mq_status mq_engine_logits(mq_engine *e, const int32_t *ids, int32_t n, float *out) {
  if (!e || !ids || !out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_logits: NULL argument");
  if (n <= 0) return fail(MQ_ERR_INVALID_ARGUMENT, "ids is empty; pass at least one token id");
  if (n > e->max_context)
    return fail(MQ_ERR_INVALID_ARGUMENT, "ids has " + std::to_string(n) + " tokens, more than max_context " +
                                             std::to_string(e->max_context));
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= e->vocab)
      return fail(MQ_ERR_INVALID_ARGUMENT, "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                               " is outside the vocabulary [0, " + std::to_string(e->vocab) + ")");
  try {
    e->be->logits_all(ids, n, e->max_batch, out);
    e->be->reset_slot(e->max_batch);
  } catch (const std::exception &x) {
    return fail(MQ_ERR_BACKEND, std::string("logits: ") + x.what());
  }
  return MQ_OK;
}

mq_status mq_engine_image_spec(const mq_engine *e, mq_image_spec *out) {
  if (!e || !out) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_image_spec: NULL argument");
  const ImageBackend *ib = dynamic_cast<const ImageBackend *>(e->be.get());
  if (!ib) return fail(MQ_ERR_INVALID_ARGUMENT, "family " + e->family + " serves task " + e->task + ", not image");
  *out = ib->image_spec();
  return MQ_OK;
}

mq_status mq_engine_generate_image(mq_engine *e, const mq_image_request *r, mq_image_output *out) {
  if (!e || !r || !out || !out->rgb) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_generate_image: NULL argument");
  ImageBackend *ib = dynamic_cast<ImageBackend *>(e->be.get());
  if (!ib) return fail(MQ_ERR_INVALID_ARGUMENT, "family " + e->family + " serves task " + e->task + ", not image");
  try {
    ib->generate(*r, out);
  } catch (const Error &err) {
    return fail(err.status, err.what());
  } catch (const std::exception &x) {
    return fail(MQ_ERR_BACKEND, std::string("generate image: ") + x.what());
  }
  return MQ_OK;
}

static mq_status check_row(int32_t vocab, const float *logits, const mq_sampling *s) {
  if (vocab < 1 || !logits || !s) return fail(MQ_ERR_INVALID_ARGUMENT, "vocab >= 1, logits and s are required");
  if (!(s->temperature >= 0) || !(s->repetition_penalty >= 0) || !(s->min_p >= 0 && s->min_p <= 1) || s->top_k < 0 ||
      !(s->top_p >= 0))
    return fail(MQ_ERR_INVALID_ARGUMENT, "sampling controls out of range");
  return MQ_OK;
}

mq_status mq_sampling_probs(int32_t vocab, const float *logits, const int32_t *prompt, int32_t n_prompt,
                            const int32_t *output, int32_t n_output, const int32_t *eos_ids, int32_t n_eos,
                            const mq_sampling *s, float *processed_out, double *probs_out) {
  if (mq_status st = check_row(vocab, logits, s)) return st;
  auto ok = [&](const int32_t *ids, int32_t n) {
    for (int i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= vocab) return false;
    return true;
  };
  if (n_prompt < 0 || n_output < 0 || n_eos < 0 || !ok(prompt, n_prompt) || !ok(output, n_output) || !ok(eos_ids, n_eos))
    return fail(MQ_ERR_INVALID_ARGUMENT, "token ids must be in [0, vocab)");
  // The history as mq_engine_add and mq_engine_step build it.
  std::vector<char> seen(vocab, 0);
  std::vector<int32_t> seen_ids, gen_ids, count(vocab, 0);
  for (int i = 0; i < n_prompt; i++)
    if (!seen[prompt[i]]) seen[prompt[i]] = 1, seen_ids.push_back(prompt[i]);
  for (int i = 0; i < n_output; i++) {
    if (!seen[output[i]]) seen[output[i]] = 1, seen_ids.push_back(output[i]);
    if (count[output[i]]++ == 0) gen_ids.push_back(output[i]);
  }
  std::vector<float> lg(logits, logits + vocab);
  std::vector<std::pair<int32_t, float>> saved;
  process(lg.data(), *s, History{seen_ids, gen_ids, count, n_output}, eos_ids, n_eos, saved);
  if (processed_out) std::copy(lg.begin(), lg.end(), processed_out);
  if (!probs_out) return MQ_OK;
  std::fill(probs_out, probs_out + vocab, 0.0);
  if (!(s->temperature > 0)) {
    probs_out[argmax(vocab, lg.data())] = 1;
    return MQ_OK;
  }
  SampleScratch sc;
  float mx;
  const int n = kept_set(vocab, lg.data(), *s, sc, mx);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (probs_out[sc.cand[i]] = std::exp(((double)lg[sc.cand[i]] - mx) / s->temperature));
  for (int i = 0; i < n; i++) probs_out[sc.cand[i]] /= sum;
  return MQ_OK;
}

mq_status mq_sampling_draw(int32_t vocab, const float *logits, const mq_sampling *s, uint64_t seed,
                           int32_t candidate_budget, int32_t n, int32_t *out) {
  if (mq_status st = check_row(vocab, logits, s)) return st;
  if (n < 0 || (n > 0 && !out)) return fail(MQ_ERR_INVALID_ARGUMENT, "n >= 0 and out are required");
  Rng rng{seed};
  SampleScratch sc;
  const int budget = candidate_budget != 0 ? std::max(candidate_budget, -1) : kCandidateBudget;
  for (int i = 0; i < n; i++) out[i] = sample(vocab, logits, *s, rng, sc, budget);
  return MQ_OK;
}

}  // extern "C"
