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
};

}  // namespace

// SampleScratch is one sampling thread's working memory, kept across steps.
struct SampleScratch {
  std::vector<int32_t> cand;
  std::vector<double> prob;
  std::vector<float> p;
  std::vector<float> block;
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

// plain_temperature says s asks for no top-k or top-p truncation over a vocabulary of V.
static bool plain_temperature(const mq_sampling &s, int V) {
  return !(s.top_k > 0 && s.top_k < V) && !(s.top_p > 0 && s.top_p < 1);
}

// sample draws a token from logits with temperature, then top-k, then top-p (nucleus), the
// order transformers' generate applies them; the lowest id wins ties.
static int32_t sample(int V, const float *lg, const mq_sampling &s, Rng &rng, SampleScratch &sc) {
  if (plain_temperature(s, V)) {
    // Plain temperature sampling (OpenAI's default, temperature 1): one pass for the
    // maximum, one vectorised pass for the weights, one scan for the draw; no index array.
    // The maximum in 16 independent chains (max is exact, so the order does not matter).
    float mx = -INFINITY;
    {
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
    }
    auto &p = sc.p;
    p.resize(V);
    const float invT = (float)(1.0 / s.temperature);
    // Weights in blocks of L with one sum per block: the weight loop vectorises, and the draw
    // scans the block sums first (V/L additions) and then L weights of one block.
    constexpr int L = 16;
    const int nb = V / L;
    auto &bs = sc.block;
    bs.resize(nb);
    // Each block's sum adds its L weights in order from 0; G blocks are summed side by side
    // so the G dependency chains overlap (same operations, same order per block).
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
    for (int blk = 0; blk < nb; blk++) sum += bs[blk];
    for (int k = nb * L; k < V; k++) sum += (p[k] = exp_neg((lg[k] - mx) * invT));
    const double u = rng.uniform() * sum;
    double acc = 0;
    int k = 0;
    for (int blk = 0; blk < nb; blk++, k += L) {
      if (u < acc + bs[blk]) break;
      acc += bs[blk];
    }
    for (; k < V; k++) {
      acc += p[k];
      if (u < acc) return k;
    }
    for (k = V - 1; k >= 0; k--)  // rounding put u past the total: the last possible token
      if (p[k] > 0) return k;
    return 0;
  }
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
  // The draw walks the kept tokens in vocabulary order, as torch.multinomial does after
  // transformers' top-k/top-p masks. An order by logit (or nth_element's arbitrary one) would
  // let a change in the last bits of two near-equal logits (another batch shape on a GPU)
  // reorder the walk and move a seeded draw to another token.
  std::sort(cand.begin(), cand.begin() + n);
  auto &p = sc.prob;
  p.resize(n);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (p[i] = weight(cand[i]));
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

// image_input copies and checks an mq_image.
static std::shared_ptr<const ImageInput> image_input(const mq_image *im) {
  if (!im->pixels || im->n_pixels <= 0 || im->grid_t <= 0 || im->grid_h <= 0 || im->grid_w <= 0)
    throw Error(MQ_ERR_INVALID_ARGUMENT, "image: pixels and a positive grid are required");
  auto in = std::make_shared<ImageInput>();
  in->pixels.assign(im->pixels, im->pixels + im->n_pixels);
  in->grid_t = im->grid_t, in->grid_h = im->grid_h, in->grid_w = im->grid_w;
  return in;
}

mq_status mq_engine_add_image(mq_engine *e, const int32_t *prompt, int32_t n, const mq_image *image,
                              const mq_sampling *s, uint64_t *seq_out) {
  if (!e || !image) return fail(MQ_ERR_INVALID_ARGUMENT, "mq_engine_add_image: NULL argument");
  mq_status st = mq_engine_add(e, prompt, n, s, seq_out);
  if (st != MQ_OK) return st;
  const int slot = e->last_added_slot;
  try {
    e->be->set_image(slot, image_input(image), prompt, n);
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

static mq_event done_event(const Seq &q, int32_t token, mq_finish_reason r) {
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
        ev.push_back(done_event(*e->slots[i], -1, MQ_FINISH_CANCELLED));
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
      const mq_sampling &s = e->members[i]->s;
      if (s.temperature > 0 && !(device_sampling && plain_temperature(s, e->vocab))) {
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
        ev.push_back(done_event(*q, -1, MQ_FINISH_ERROR));
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
            if (e->on_host[i] && !e->be->deterministic())
              e->sampled[i] = sample(e->vocab, e->logits.data() + (size_t)i * e->vocab, q->s,
                                     q->rng, e->scratch[t]);
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
        if (q->first_ns == 0) q->first_ns = t;
        mq_finish_reason r = MQ_FINISH_NONE;
        if (!q->s.ignore_eos && std::find(e->eos.begin(), e->eos.end(), tok) != e->eos.end())
          r = MQ_FINISH_STOP;
        else if (q->n_out >= (int)q->s.max_new_tokens)
          r = MQ_FINISH_LENGTH;
        if (r != MQ_FINISH_NONE) {
          ev.push_back(done_event(*q, tok, r));
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
  if (n <= 0 || n > e->max_context) return fail(MQ_ERR_INVALID_ARGUMENT, "ids must hold 1 to max_context tokens");
  try {
    e->be->set_image(e->max_batch, image_input(image), ids, n);
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

}  // extern "C"
