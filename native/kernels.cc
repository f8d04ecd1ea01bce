// kernels.cc: the thread pool, the weight table and the fp32 math the models share.
//
// The hot spot of small models is the LM head (e.g. 151,936 x 64 for qwen3-tiny): a
// matrix-times-few-vectors product that streams the whole embedding matrix once per step. The
// AVX-512 kernel below reads each 16-row block of W once per step for all batched tokens (so a
// batch of 8 costs little more memory traffic than a batch of 1), reduces 16 dot products at a
// time with a shuffle tree, and tracks the argmax while the logits are still in registers.
// Other code is plain loops that -O3 -march=x86-64-v3 vectorises.
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "runtime.h"

namespace mq {

int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// ---- thread pool ------------------------------------------------------------------------------

// spin_ns is how long an idle worker polls for the next job before sleeping: long enough to
// cover the gap between two decode steps of a busy engine, short enough not to burn a core.
static const int64_t spin_ns = 300000;

ThreadPool::ThreadPool(int n) : n_(n < 1 ? 1 : n) {
  for (int i = 1; i < n_; i++) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto &t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
  if (n_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_ - 1);
  gen_.fetch_add(1);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }
  fn(0, n_);
  // Spin briefly, then yield: if the scheduler queued a worker on this CPU, a pure spin would
  // keep it off the CPU for a whole time slice (milliseconds).
  for (int spins = 0; pending_.load() != 0; spins++) {
    if (spins < 256)
      _mm_pause();
    else
      std::this_thread::yield();
  }
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    int64_t spin_start = 0;
    int spins = 0;
    while ((g = gen_.load()) == seen && !stop_.load()) {
      if (++spins & 63) {
        _mm_pause();
        continue;
      }
      std::this_thread::yield();  // let a thread queued on this CPU (the caller) run
      int64_t t = now_ns();
      if (spin_start == 0) spin_start = t;
      if (t - spin_start < spin_ns) continue;
      std::unique_lock<std::mutex> l(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(l, [&] { return gen_.load() != seen || stop_.load(); });
      sleepers_.fetch_sub(1);
      spin_start = 0;
    }
    if (stop_.load()) return;
    seen = g;
    (*job_)(idx, n_);
    pending_.fetch_sub(1);
  }
}

// ---- weights ----------------------------------------------------------------------------------

Weights::Weights(const mq_tensor *t, int n) {
  for (int i = 0; i < n; i++) {
    mq_tensor c = t[i];
    std::string name = c.name ? c.name : "";
    c.name = nullptr;
    map_[name] = c;
  }
}

static std::string shape_str(const int64_t *s, int n) {
  std::ostringstream o;
  o << "[";
  for (int i = 0; i < n; i++) o << (i ? "," : "") << s[i];
  o << "]";
  return o.str();
}

const float *Weights::get(const std::string &name, std::vector<int64_t> shape) const {
  auto it = map_.find(name);
  if (it == map_.end())
    throw Error(MQ_ERR_LOAD, "tensor " + name + " is missing from the bundle; rebuild it from a complete checkpoint");
  const mq_tensor &t = it->second;
  bool ok = t.ndim == (int)shape.size();
  for (int i = 0; ok && i < t.ndim; i++) ok = t.shape[i] == shape[i];
  if (!ok)
    throw Error(MQ_ERR_LOAD, "tensor " + name + " has shape " + shape_str(t.shape, t.ndim) + ", config.json implies " +
                                 shape_str(shape.data(), (int)shape.size()));
  if (!t.data) throw Error(MQ_ERR_LOAD, "tensor " + name + " has no data");
  return t.data;
}

const float *Weights::get_any(const std::vector<std::string> &names, std::vector<int64_t> shape) const {
  for (auto &n : names)
    if (has(n)) return get(n, shape);
  return get(names[0], shape);
}

// ---- dot products -----------------------------------------------------------------------------

float dot(const float *a, const float *b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float *x, float *y, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static bool have_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return ok;
}

// reduce16 returns a vector whose lane L is the horizontal sum of v[(L%4)*4 + L/4]; callers
// pass accumulators in that transposed order to get lane L = sum of accumulator L.
__attribute__((target("avx512f,avx512dq"))) static inline __m512 reduce16(const __m512 *v) {
  __m512 u[8], w[4], x[2];
  for (int i = 0; i < 8; i++)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; i++)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; i++)
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Per-token running argmax over a row range: best value and lowest index reaching it.
struct ArgMax {
  float v = -INFINITY;
  int32_t i = -1;
  void see(float x, int32_t idx) {
    if (x > v || i < 0) {
      v = x;
      i = idx;
    }
  }
};

// rows_avx512 computes y[t*N + o] for o in [r0, r1) with 16-row blocks; r0 is a multiple of 16.
// Rows past the last full block fall back to scalar dots.
__attribute__((target("avx512f,avx512dq"))) static void rows_avx512(const float *x, int T, int K, const float *W,
                                                                     int N, int r0, int r1, const float *bias,
                                                                     float *y, ArgMax *am) {
  const int kfull = K & ~15;
  const __mmask16 tail = (__mmask16)((1u << (K & 15)) - 1);
  static const int order[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int r = r0;
  // Process tokens in groups so the x chunks of a group stay in L1 while a W block is reused.
  for (; r + 16 <= r1; r += 16) {
    const float *wb = W + (size_t)r * K;
    __m512 bv = bias ? _mm512_loadu_ps(bias + r) : _mm512_setzero_ps();
    for (int t = 0; t < T; t++) {
      const float *xt = x + (size_t)t * K;
      __m512 acc[16];
      for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
      int k = 0;
      for (; k < kfull; k += 16) {
        __m512 xv = _mm512_loadu_ps(xt + k);
        for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(wb + (size_t)j * K + k), xv, acc[j]);
      }
      if (k < K) {
        __m512 xv = _mm512_maskz_loadu_ps(tail, xt + k);
        for (int j = 0; j < 16; j++)
          acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wb + (size_t)j * K + k), xv, acc[j]);
      }
      __m512 in[16];
      for (int j = 0; j < 16; j++) in[j] = acc[order[j]];
      __m512 out = _mm512_add_ps(reduce16(in), bv);
      _mm512_storeu_ps(y + (size_t)t * N + r, out);
      if (am) {
        // Block max, then the lowest lane holding it: keeps torch.argmax's first-index rule.
        float m = _mm512_reduce_max_ps(out);
        if (m > am[t].v || am[t].i < 0) {
          __mmask16 eq = _mm512_cmp_ps_mask(out, _mm512_set1_ps(m), _CMP_EQ_OQ);
          if (eq) {
            am[t].v = m;
            am[t].i = r + __builtin_ctz((unsigned)eq);
          }
        }
      }
    }
  }
  (void)lane;
  for (; r < r1; r++) {
    for (int t = 0; t < T; t++) {
      float v = dot(x + (size_t)t * K, W + (size_t)r * K, K) + (bias ? bias[r] : 0.f);
      y[(size_t)t * N + r] = v;
      if (am) am[t].see(v, r);
    }
  }
}

static void rows_generic(const float *x, int T, int K, const float *W, int N, int r0, int r1, const float *bias,
                         float *y, ArgMax *am) {
  for (int r = r0; r < r1; r++) {
    const float *wr = W + (size_t)r * K;
    for (int t = 0; t < T; t++) {
      float v = dot(x + (size_t)t * K, wr, K) + (bias ? bias[r] : 0.f);
      y[(size_t)t * N + r] = v;
      if (am) am[t].see(v, r);
    }
  }
}

static void rows(const float *x, int T, int K, const float *W, int N, int r0, int r1, const float *bias, float *y,
                 ArgMax *am) {
  if (have_avx512())
    rows_avx512(x, T, K, W, N, r0, r1, bias, y, am);
  else
    rows_generic(x, T, K, W, N, r0, r1, bias, y, am);
}

// parallel_threshold is the multiply-add count below which a matrix product runs on the
// calling thread: waking the pool costs more than it saves for the tiny per-layer products.
static const double parallel_threshold = 1 << 18;

static void split(int N, int parts, int i, int *a, int *b) {
  int blocks = (N + 15) / 16;
  int per = (blocks + parts - 1) / parts;
  *a = std::min(N, i * per * 16);
  *b = std::min(N, (i + 1) * per * 16);
}

void linear(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, const float *bias, float *y) {
  if (pool->size() == 1 || (double)T * K * N < parallel_threshold) {
    rows(x, T, K, W, N, 0, N, bias, y, nullptr);
    return;
  }
  pool->run([&](int i, int n) {
    int a, b;
    split(N, n, i, &a, &b);
    if (a < b) rows(x, T, K, W, N, a, b, bias, y, nullptr);
  });
}

// merge_argmax combines per-part argmaxes (parts in row order, so strict > keeps the lowest id).
static void merge_argmax(const std::vector<ArgMax> &am, int parts, int T, int32_t *argmax) {
  for (int t = 0; t < T; t++) {
    ArgMax best;
    for (int i = 0; i < parts; i++) {
      const ArgMax &c = am[(size_t)i * T + t];
      if (c.i >= 0 && (best.i < 0 || c.v > best.v)) best = c;
    }
    argmax[t] = best.i;
  }
}

// run_parts gives each of n parts a contiguous range [b0, b1) of nb blocks, on the pool.
template <typename F>
static void run_parts(ThreadPool *pool, int n, int nb, F &&f) {
  auto part = [&](int i, int nn) {
    int per = (nb + nn - 1) / nn;
    f(i, nn, std::min(nb, i * per), std::min(nb, (i + 1) * per));
  };
  if (n == 1)
    part(0, 1);
  else
    pool->run(part);
}

void lm_head(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, float *y, int32_t *argmax) {
  int n = ((double)T * K * N < parallel_threshold) ? 1 : pool->size();
  std::vector<ArgMax> am((size_t)n * T);
  auto part = [&](int i, int nn) {
    int a, b;
    split(N, nn, i, &a, &b);
    if (a < b) rows(x, T, K, W, N, a, b, nullptr, y, am.data() + (size_t)i * T);
  };
  if (n == 1)
    part(0, 1);
  else
    pool->run(part);
  if (argmax) merge_argmax(am, n, T, argmax);
}

static void conv1d_cols(const float *x, int T, int K, const float *W, int N, int c0, int c1, const float *bias,
                        float *y) {
  for (int t = 0; t < T; t++) {
    float *yt = y + (size_t)t * N;
    for (int o = c0; o < c1; o++) yt[o] = bias ? bias[o] : 0.f;
  }
  for (int k = 0; k < K; k++) {
    const float *wk = W + (size_t)k * N;
    for (int t = 0; t < T; t++) {
      float a = x[(size_t)t * K + k];
      float *yt = y + (size_t)t * N;
      for (int o = c0; o < c1; o++) yt[o] += a * wk[o];
    }
  }
}

void conv1d(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, const float *bias, float *y) {
  if (pool->size() == 1 || (double)T * K * N < parallel_threshold) {
    conv1d_cols(x, T, K, W, N, 0, N, bias, y);
    return;
  }
  pool->run([&](int i, int n) {
    int a, b;
    split(N, n, i, &a, &b);
    if (a < b) conv1d_cols(x, T, K, W, N, a, b, bias, y);
  });
}

void layer_norm(const float *x, int T, int D, const float *g, const float *b, float eps, float *y) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * D;
    float *yt = y + (size_t)t * D;
    double mean = 0, var = 0;
    for (int i = 0; i < D; i++) mean += xt[i];
    mean /= D;
    for (int i = 0; i < D; i++) var += (xt[i] - mean) * (xt[i] - mean);
    var /= D;
    float inv = (float)(1.0 / std::sqrt(var + eps));
    for (int i = 0; i < D; i++) yt[i] = ((xt[i] - (float)mean) * inv) * g[i] + b[i];
  }
}

void rms_norm(const float *x, int T, int D, const float *g, float eps, float *y) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * D;
    float *yt = y + (size_t)t * D;
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)xt[i] * xt[i];
    float inv = (float)(1.0 / std::sqrt(ss / D + eps));
    for (int i = 0; i < D; i++) yt[i] = g[i] * (xt[i] * inv);
  }
}

void attention(const float *q, int ntok, int pos, int H, int Hkv, int hd, const float *K, const float *V, float scale,
               float *out, float *scratch) {
  const int group = H / Hkv;
  const int kvd = Hkv * hd;
  for (int i = 0; i < ntok; i++) {
    const int len = pos + i + 1;  // causal: keys 0..pos+i
    for (int h = 0; h < H; h++) {
      const float *qh = q + (size_t)i * H * hd + (size_t)h * hd;
      const int kh = h / group;
      float mx = -INFINITY;
      for (int j = 0; j < len; j++) {
        float s = dot(qh, K + (size_t)j * kvd + (size_t)kh * hd, hd) * scale;
        scratch[j] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int j = 0; j < len; j++) {
        scratch[j] = std::exp(scratch[j] - mx);
        sum += scratch[j];
      }
      float inv = (float)(1.0 / sum);
      float *oh = out + (size_t)i * H * hd + (size_t)h * hd;
      for (int d = 0; d < hd; d++) oh[d] = 0;
      for (int j = 0; j < len; j++) axpy(scratch[j] * inv, V + (size_t)j * kvd + (size_t)kh * hd, oh, hd);
    }
  }
}

}  // namespace mq

// ---- KV cache ---------------------------------------------------------------------------------
#include <sys/mman.h>

namespace mq {

KVCache::KVCache(int layers, int slots, int ctx, int kv_dim) : layers_(layers), slots_(slots), ctx_(ctx), kvd_(kv_dim) {
  bytes_ = (size_t)layers * slots * ctx * kv_dim * sizeof(float);
  if (bytes_ == 0) return;
  void *k = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void *v = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (k == MAP_FAILED || v == MAP_FAILED) {
    if (k != MAP_FAILED) munmap(k, bytes_);
    if (v != MAP_FAILED) munmap(v, bytes_);
    throw Error(MQ_ERR_LOAD, "KV cache of " + std::to_string(2 * bytes_ >> 20) +
                                 " MiB could not be reserved; lower max_batch or max_context");
  }
  k_ = (float *)k;
  v_ = (float *)v;
}

KVCache::~KVCache() {
  if (k_) munmap(k_, bytes_);
  if (v_) munmap(v_, bytes_);
}

}  // namespace mq

// ---- packed LM head ---------------------------------------------------------------------------

namespace mq {

// bf16 keeps the top 16 bits of a float, rounded to nearest even (NaN is not expected in
// weights and is passed through truncated).
static inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)(u >> 16);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static bool have_avx512_bf16() {
  static const bool ok = have_avx512() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

static bool have_avx512_vnni() {
  static const bool ok = have_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return ok;
}

static void *map_anon(size_t bytes) {
  void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? nullptr : m;
}

LMHead::LMHead(const float *W, int N, int K) : W_(W), N_(N), K_(K), nb_(0) {
  if (!have_avx512() || N < 16) return;
  nb_ = N / 16;
  bytes_ = (size_t)nb_ * K * 16 * sizeof(float);
  qbytes_ = (size_t)nb_ * ((K + 1) / 2) * 32 * sizeof(uint16_t);
  const int K4 = (K + 3) / 4;
  // K <= 32768 keeps the int32 sums (|S| <= K * 255 * 127) from overflowing.
  p_ = (float *)map_anon(bytes_);
  // K <= 32768 keeps the int32 sums (|S| <= K * 255 * 127) from overflowing.
  if (p_ && have_avx512_vnni() && K <= 32768) {
    q8bytes_ = (size_t)nb_ * K4 * 64;
    q8_ = (int8_t *)map_anon(q8bytes_);
  }
  if (q8_) {
    // Per-row symmetric int8: q = round(w / s), s = float(rowmax / 127), so |w - s q| <= s/2
    // (up to the 2^-53 relative error of the double quotient). Rows must be finite and either
    // zero or far above the float denormal range, else the bf16 screen is used instead.
    sw_.resize((size_t)nb_ * 16);
    corr_.resize((size_t)nb_ * 16);
    bool ok = true;
    for (int b = 0; ok && b < nb_; b++)
      for (int j = 0; j < 16; j++) {
        const size_t r = (size_t)b * 16 + j;
        const float *src = W + r * K;
        float m = 0;
        for (int k = 0; k < K; k++) m = std::max(m, std::fabs(src[k]));
        if (!std::isfinite(m) || (m != 0 && m < 1e-30f)) {
          ok = false;
          break;
        }
        const float sc = m == 0 ? 1.0f : (float)((double)m / 127.0);
        const double inv = 1.0 / (double)sc;
        int32_t sum = 0;
        for (int k = 0; k < K; k++) {
          double qd = std::nearbyint((double)src[k] * inv);
          int q = (int)std::max(-127.0, std::min(127.0, qd));
          q8_[(size_t)b * K4 * 64 + (size_t)(k / 4) * 64 + j * 4 + (k % 4)] = (int8_t)q;
          sum += q;
        }
        sw_[r] = sc;
        corr_[r] = 128 * sum;
      }
    if (!ok) {
      munmap(q8_, q8bytes_);
      q8_ = nullptr;
      std::vector<float>().swap(sw_);
      std::vector<int32_t>().swap(corr_);
    }
  }
  q_ = (!q8_ && have_avx512_bf16()) ? (uint16_t *)map_anon(qbytes_) : nullptr;
  if (!p_) {  // fall back to the unpacked kernel
    if (p_) munmap(p_, bytes_);
    if (q_) munmap(q_, qbytes_);
    if (q8_) munmap(q8_, q8bytes_);
    p_ = nullptr;
    q_ = nullptr;
    q8_ = nullptr;
    nb_ = 0;
    return;
  }
  for (int b = 0; b < nb_; b++)
    for (int j = 0; j < 16; j++) {
      const float *src = W + ((size_t)b * 16 + j) * K;
      size_t base = (size_t)b * K * 16 + j;
      for (int k = 0; k < K; k++) {
        p_[base + (size_t)k * 16] = src[k];
        // bf16 pairs (k, k+1) of a row are adjacent, as vdpbf16ps consumes them.
        if (q_) q_[(size_t)b * ((K + 1) / 2) * 32 + (size_t)(k / 2) * 32 + j * 2 + (k % 2)] = to_bf16(src[k]);
        wmax_ = std::max(wmax_, std::fabs(src[k]));
      }
    }
  // Release the packed rows' bundle pages (whole pages strictly inside them) from this
  // process: the mapping is read-only and file-backed, so a later read just faults them back.
  const uintptr_t page = 4096;
  uintptr_t a = ((uintptr_t)W + page - 1) & ~(page - 1);
  uintptr_t e = ((uintptr_t)(W + (size_t)nb_ * 16 * K)) & ~(page - 1);
  if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

LMHead::~LMHead() {
  if (p_) munmap(p_, bytes_);
  if (q_) munmap(q_, qbytes_);
  if (q8_) munmap(q8_, q8bytes_);
}

void LMHead::row(int v, float *out) const {
  if (v < nb_ * 16) {
    const float *b = p_ + (size_t)(v / 16) * K_ * 16 + (v % 16);
    for (int k = 0; k < K_; k++) out[k] = b[(size_t)k * 16];
  } else {
    std::memcpy(out, W_ + (size_t)v * K_, sizeof(float) * K_);
  }
}

static const int prefetch_blocks = 4;
static const int CH = 4;  // accumulation chains per token: fixed, so logits never depend on the batch

// packed_tokens accumulates TG tokens against one fp32 packed block. Every token uses CH chains
// over k (chain c takes k = c, c+CH, ...) summed as ((c0 + c1) + c2) + c3, whatever TG is: a
// token's logits are bit-identical alone or batched, and exact_block reproduces them.
template <int TG>
__attribute__((target("avx512f,avx512dq"))) static inline void packed_tokens(const float *pb, int K, const float *x,
                                                                              __m512 *out) {
  __m512 acc[TG][CH];
  for (int t = 0; t < TG; t++)
    for (int c = 0; c < CH; c++) acc[t][c] = _mm512_setzero_ps();
  int k = 0;
  for (; k + CH <= K; k += CH)
    for (int c = 0; c < CH; c++) {
      __m512 w = _mm512_load_ps(pb + (size_t)(k + c) * 16);
      for (int t = 0; t < TG; t++) acc[t][c] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[(size_t)t * K + k + c]), acc[t][c]);
    }
  for (; k < K; k++) {
    __m512 w = _mm512_load_ps(pb + (size_t)k * 16);
    for (int t = 0; t < TG; t++) acc[t][0] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[(size_t)t * K + k]), acc[t][0]);
  }
  for (int t = 0; t < TG; t++) {
    __m512 s = acc[t][0];
    for (int c = 1; c < CH; c++) s = _mm512_add_ps(s, acc[t][c]);
    out[t] = s;
  }
}

__attribute__((target("avx512f,avx512dq"))) static inline void prefetch_block(const void *p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch((const char *)p + off, _MM_HINT_T0);
}

template <int TG>
__attribute__((target("avx512f,avx512dq"))) static void packed_range(const float *p, int K, const float *x, int N,
                                                                      int b0, int b1, float *y, ArgMax *am) {
  __m512 out[TG];
  const size_t block = (size_t)K * 16;
  for (int b = b0; b < b1; b++) {
    // Prefetch a few blocks ahead: one core's streaming bandwidth from L3 is bounded by the
    // misses it keeps in flight, and the hardware prefetcher stops at 4 KiB page boundaries.
    if (TG <= 2 && b + prefetch_blocks < b1) prefetch_block(p + (b + prefetch_blocks) * block, block * sizeof(float));
    packed_tokens<TG>(p + (size_t)b * block, K, x, out);
    for (int t = 0; t < TG; t++) {
      if (y) _mm512_storeu_ps(y + (size_t)t * N + (size_t)b * 16, out[t]);
      if (am) {
        // Block max, then the lowest lane holding it: keeps torch.argmax's first-index rule.
        float m = _mm512_reduce_max_ps(out[t]);
        if (m > am[t].v || am[t].i < 0) {
          __mmask16 eq = _mm512_cmp_ps_mask(out[t], _mm512_set1_ps(m), _CMP_EQ_OQ);
          if (eq) {
            am[t].v = m;
            am[t].i = b * 16 + __builtin_ctz((unsigned)eq);
          }
        }
      }
    }
  }
}

static inline float *yt(float *y, int t, int N) { return y ? y + (size_t)t * N : nullptr; }

// packed_rows covers blocks [b0, b1) for all T tokens, in chunks of blocks that stay in L2
// while every token group passes over them, so each weight is read from memory once per step.
static void packed_rows(const float *p, int K, const float *x, int T, int N, int b0, int b1, float *y, ArgMax *am) {
  const int chunk = 64;
  for (int c0 = b0; c0 < b1; c0 += chunk) {
    int c1 = std::min(b1, c0 + chunk);
    int t = 0;
    for (; t + 4 <= T; t += 4)
      packed_range<4>(p, K, x + (size_t)t * K, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
    if (t + 2 <= T) {
      packed_range<2>(p, K, x + (size_t)t * K, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
      t += 2;
    }
    if (t < T) packed_range<1>(p, K, x + (size_t)t * K, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
  }
}

// ---- greedy screening in bf16 -----------------------------------------------------------------
//
// Greedy decoding needs only the argmax, and at small batch the LM head is bound by memory
// bandwidth, so a first pass reads a bf16 copy of W (half the bytes) with vdpbf16ps and keeps
// every row whose approximate logit is within 2*bound of the approximate maximum; those rows'
// blocks are then recomputed exactly with the fp32 kernel above. bound is a rigorous limit on
// |approx - exact| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.1):
//   |Σ x~ w~ - Σ x w| <= (2 ub + ub^2) Σ|x||w|   (bf16 keeps 8 significant bits, ub = 2^-8)
//   each fp32 sum adds <= γ_n Σ|operands|, γ_n = n u/(1 - n u), u = 2^-24, n <= K + CH + 1,
// with Σ|x||w| <= ||x||_1 max|w|. A row outside the set has exact logit < M - bound, and the
// row attaining the approximate max M has exact logit >= M - bound, so the exact argmax (ties
// to the lowest id) is always among the recomputed rows: the result equals the fp32 argmax.
// Without AVX512-BF16 the greedy path computes all logits exactly instead.

struct Cand {
  int32_t row;
  float v;
};

struct Screen {
  float m = -INFINITY;  // running approximate max
  float thr = -INFINITY;
  std::vector<Cand> cands;
};

// screen_range: TG tokens against one bf16 block per iteration with vdpbf16ps, which multiplies
// 16 lanes x 2 adjacent k in bf16 and accumulates in fp32 (x is rounded to bf16 pairs first).
template <int TG>
__attribute__((target("avx512f,avx512dq,avx512bf16"))) static void screen_range(const uint16_t *q, int K2,
                                                                                 const uint32_t *xp, int b0, int b1,
                                                                                 const float *bound2, Screen *sc) {
  const size_t block = (size_t)K2 * 32;
  for (int b = b0; b < b1; b++) {
    const uint16_t *qb = q + (size_t)b * block;
    if (TG <= 2 && b + 2 * prefetch_blocks < b1) prefetch_block(q + (b + 2 * prefetch_blocks) * block, block * 2);
    const int C = TG >= 4 ? 1 : 4 / TG;  // chains per token: keep >= 4 dot products in flight
    __m512 acc[TG][4];
    for (int t = 0; t < TG; t++)
      for (int c = 0; c < C; c++) acc[t][c] = _mm512_setzero_ps();
    int k = 0;
    for (; k + C <= K2; k += C)
      for (int c = 0; c < C; c++) {
        __m512bh w = (__m512bh)_mm512_load_si512((const void *)(qb + (size_t)(k + c) * 32));
        for (int t = 0; t < TG; t++)
          acc[t][c] = _mm512_dpbf16_ps(acc[t][c], w, (__m512bh)_mm512_set1_epi32((int)xp[(size_t)t * K2 + k + c]));
      }
    for (; k < K2; k++) {
      __m512bh w = (__m512bh)_mm512_load_si512((const void *)(qb + (size_t)k * 32));
      for (int t = 0; t < TG; t++)
        acc[t][0] = _mm512_dpbf16_ps(acc[t][0], w, (__m512bh)_mm512_set1_epi32((int)xp[(size_t)t * K2 + k]));
    }
    for (int t = 0; t < TG; t++) {
      __m512 v = acc[t][0];
      for (int c = 1; c < C; c++) v = _mm512_add_ps(v, acc[t][c]);
      Screen &s = sc[t];
      float m = _mm512_reduce_max_ps(v);
      if (m < s.thr) continue;
      if (m > s.m) {
        s.m = m;
        s.thr = m - bound2[t];
      }
      __mmask16 keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(s.thr), _CMP_GE_OQ);
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, v);
      while (keep) {
        int j = __builtin_ctz((unsigned)keep);
        keep &= keep - 1;
        s.cands.push_back({b * 16 + j, lanes[j]});
      }
    }
  }
}

static void screen_rows(const uint16_t *q, int K2, const uint32_t *xp, int T, int b0, int b1, const float *bound2,
                        Screen *sc) {
  const int chunk = 64;
  for (int c0 = b0; c0 < b1; c0 += chunk) {
    int c1 = std::min(b1, c0 + chunk);
    int t = 0;
    for (; t + 8 <= T; t += 8) screen_range<8>(q, K2, xp + (size_t)t * K2, c0, c1, bound2 + t, sc + t);
    if (t + 4 <= T) {
      screen_range<4>(q, K2, xp + (size_t)t * K2, c0, c1, bound2 + t, sc + t);
      t += 4;
    }
    if (t + 2 <= T) {
      screen_range<2>(q, K2, xp + (size_t)t * K2, c0, c1, bound2 + t, sc + t);
      t += 2;
    }
    if (t < T) screen_range<1>(q, K2, xp + (size_t)t * K2, c0, c1, bound2 + t, sc + t);
  }
}

__attribute__((target("avx512f,avx512dq"))) static void exact_block(const float *p, int K, const float *x, int b,
                                                                     float *out16) {
  __m512 v;
  packed_tokens<1>(p + (size_t)b * K * 16, K, x, &v);
  _mm512_storeu_ps(out16, v);
}

// ---- greedy screening in int8 ------------------------------------------------------------------
//
// With AVX512-VNNI the screen uses int8 instead (vpdpbusd: 64 multiply-adds per instruction,
// exact int32 sums). W rows are quantised symmetrically with a float scale sw per row
// (|w - sw qw| <= sw/2, sw <= wmax/127 (1+u)); each token's x with one scale sx =
// float(max|x| / 127) (|x - sx qx| <= sx/2), stored offset by 128 as u8, the offset removed
// with corr = 128 Σ qw. The approximate logit is fl(fl(S sw) sx), S the exact int dot. Then
//   |Σ x w - sw sx S| <= Σ |x| sw/2 + Σ (sx/2) |sw qw| <= wmax/254 (||x||_1 + K max|x|) (1+3u)
//   |fl(fl(S sw) sx) - sw sx S| <= (2u + u^2) sw sx Σ|qx||qw| <= 3u K max|x| wmax
// and the exact fp32 logits add γ_n ||x||_1 wmax; the candidate argument is the bf16 one.

template <int TG>
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vnni"))) static void screen8_range(
    const int8_t *q, int K4, const uint32_t *xq, const float *sw, const int32_t *corr, const float *sx, int b0,
    int b1, const float *bound2, Screen *sc) {
  const size_t block = (size_t)K4 * 64;
  for (int b = b0; b < b1; b++) {
    const int8_t *qb = q + (size_t)b * block;
    if (TG <= 2 && b + 2 * prefetch_blocks < b1) prefetch_block(q + (b + 2 * prefetch_blocks) * block, block);
    const int C = TG >= 4 ? 1 : 4 / TG;  // chains per token (int sums: exact in any order)
    __m512i acc[TG][4];
    for (int t = 0; t < TG; t++)
      for (int c = 0; c < C; c++) acc[t][c] = _mm512_setzero_si512();
    int k = 0;
    for (; k + C <= K4; k += C)
      for (int c = 0; c < C; c++) {
        __m512i w = _mm512_load_si512((const void *)(qb + (size_t)(k + c) * 64));
        for (int t = 0; t < TG; t++)
          acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], _mm512_set1_epi32((int)xq[(size_t)t * K4 + k + c]), w);
      }
    for (; k < K4; k++) {
      __m512i w = _mm512_load_si512((const void *)(qb + (size_t)k * 64));
      for (int t = 0; t < TG; t++)
        acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], _mm512_set1_epi32((int)xq[(size_t)t * K4 + k]), w);
    }
    const __m512i cv = _mm512_loadu_si512((const void *)(corr + (size_t)b * 16));
    const __m512 swv = _mm512_loadu_ps(sw + (size_t)b * 16);
    for (int t = 0; t < TG; t++) {
      __m512i si = acc[t][0];
      for (int c = 1; c < C; c++) si = _mm512_add_epi32(si, acc[t][c]);
      si = _mm512_sub_epi32(si, cv);
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(si), swv), _mm512_set1_ps(sx[t]));
      Screen &s = sc[t];
      __mmask16 keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(s.thr), _CMP_GE_OQ);
      if (!keep) continue;  // no lane reaches the threshold
      float m = _mm512_reduce_max_ps(v);
      if (m > s.m) {
        s.m = m;
        s.thr = m - bound2[t];
        keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(s.thr), _CMP_GE_OQ);
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, v);
      while (keep) {
        int j = __builtin_ctz((unsigned)keep);
        keep &= keep - 1;
        s.cands.push_back({b * 16 + j, lanes[j]});
      }
    }
  }
}

static void screen8_rows(const int8_t *q, int K4, const uint32_t *xq, const float *sw, const int32_t *corr,
                         const float *sx, int T, int b0, int b1, const float *bound2, Screen *sc) {
  const int chunk = 64;
  for (int c0 = b0; c0 < b1; c0 += chunk) {
    int c1 = std::min(b1, c0 + chunk);
    int t = 0;
    for (; t + 8 <= T; t += 8)
      screen8_range<8>(q, K4, xq + (size_t)t * K4, sw, corr, sx + t, c0, c1, bound2 + t, sc + t);
    if (t + 4 <= T) {
      screen8_range<4>(q, K4, xq + (size_t)t * K4, sw, corr, sx + t, c0, c1, bound2 + t, sc + t);
      t += 4;
    }
    if (t + 2 <= T) {
      screen8_range<2>(q, K4, xq + (size_t)t * K4, sw, corr, sx + t, c0, c1, bound2 + t, sc + t);
      t += 2;
    }
    if (t < T) screen8_range<1>(q, K4, xq + (size_t)t * K4, sw, corr, sx + t, c0, c1, bound2 + t, sc + t);
  }
}

// finish_greedy recomputes the surviving candidates of every token exactly (see greedy).
static void finish_greedy(const float *p, const float *W, int K, int N, int nb, const float *x, int T, int n_parts,
                          const std::vector<Screen> &sc, const float *bound2, int32_t *argmax);

void LMHead::greedy8(ThreadPool *pool, const float *x, int T, int32_t *argmax) const {
  const int K4 = (K_ + 3) / 4;
  std::vector<uint32_t> xq((size_t)T * K4, 0x80808080u);  // padding: qx = 0
  std::vector<float> sx(T), bound2(T);
  const double u = std::ldexp(1.0, -24);
  const double n = (double)(K_ + CH + 1);
  const double gamma = n * u / (1 - n * u);
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * K_;
    double l1 = 0, xm = 0;
    for (int k = 0; k < K_; k++) {
      l1 += std::fabs(xt[k]);
      xm = std::max(xm, (double)std::fabs(xt[k]));
    }
    const float s = (float)(xm / 127.0);
    double bound = (wmax_ / 254.0 * (l1 + K_ * xm) * 1.01 + 3 * u * K_ * xm * wmax_ * 1.01 + gamma * l1 * wmax_) *
                       1.001 +
                   1e-30;
    bound2[t] = (float)(2 * bound * 1.0001);
    if (!std::isfinite(bound2[t]) || !std::isfinite(l1) || !(xm >= 1e-30) || !(s > 0)) {
      std::vector<float> tmp((size_t)T * N_);  // no safe screen: compute all logits exactly
      forward(pool, x, T, tmp.data(), argmax);
      return;
    }
    sx[t] = s;
    for (int k = 0; k < K_; k++) {
      double qd = std::nearbyint((double)xt[k] / (double)s);
      int q = (int)std::max(-127.0, std::min(127.0, qd)) + 128;
      uint32_t &w = xq[(size_t)t * K4 + k / 4];
      w = (w & ~(0xffu << (8 * (k % 4)))) | ((uint32_t)q << (8 * (k % 4)));
    }
  }
  int n_parts = ((double)T * K_ * N_ < parallel_threshold) ? 1 : pool->size();
  std::vector<Screen> sc((size_t)n_parts * T);
  run_parts(pool, n_parts, nb_, [&](int i, int, int b0, int b1) {
    if (b0 < b1)
      screen8_rows(q8_, K4, xq.data(), sw_.data(), corr_.data(), sx.data(), T, b0, b1, bound2.data(),
                   sc.data() + (size_t)i * T);
  });
  finish_greedy(p_, W_, K_, N_, nb_, x, T, n_parts, sc, bound2.data(), argmax);
}

void LMHead::greedy(ThreadPool *pool, const float *x, int T, int32_t *argmax) const {
  const int K2 = (K_ + 1) / 2;
  std::vector<uint32_t> xp((size_t)T * K2, 0);
  std::vector<float> bound2(T);
  const double u = std::ldexp(1.0, -24), ub = std::ldexp(1.0, -8);
  const double n = (double)(K_ + CH + 1);
  const double gamma = n * u / (1 - n * u);
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * K_;
    double l1 = 0;
    for (int k = 0; k < K_; k++) {
      l1 += std::fabs(xt[k]);
      xp[(size_t)t * K2 + k / 2] |= (uint32_t)to_bf16(xt[k]) << (16 * (k % 2));
    }
    // S = Σ|x||w| <= ||x||_1 max|w|; bf16 rounding of x and w: (2ub + ub^2) S; the screen's
    // fp32 sums (operands up to (1+ub)^2 larger) and the exact sums: γ_n each; flushed
    // denormals: far below the absolute slack.
    double S = l1 * wmax_;
    double bound = ((2 * ub + ub * ub) + gamma * (1 + ub) * (1 + ub) + gamma) * S * 1.001 + 1e-20;
    bound2[t] = (float)(2 * bound * 1.0001);
    if (!std::isfinite(bound2[t]) || !q_) {  // no safe screen: compute all logits exactly
      std::vector<float> tmp((size_t)T * N_);
      forward(pool, x, T, tmp.data(), argmax);
      return;
    }
  }
  int n_parts = ((double)T * K_ * N_ < parallel_threshold) ? 1 : pool->size();
  std::vector<Screen> sc((size_t)n_parts * T);
  run_parts(pool, n_parts, nb_, [&](int i, int, int b0, int b1) {
    if (b0 < b1) screen_rows(q_, K2, xp.data(), T, b0, b1, bound2.data(), sc.data() + (size_t)i * T);
  });
  finish_greedy(p_, W_, K_, N_, nb_, x, T, n_parts, sc, bound2.data(), argmax);
}

static void finish_greedy(const float *p, const float *W, int K, int N, int nb, const float *x, int T, int n_parts,
                          const std::vector<Screen> &sc, const float *bound2, int32_t *argmax) {
  float lanes[16];
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * K;
    float m = -INFINITY;
    for (int i = 0; i < n_parts; i++) m = std::max(m, sc[(size_t)i * T + t].m);
    const float thr = m - bound2[t];
    ArgMax best;
    int last_block = -1;
    for (int i = 0; i < n_parts; i++)  // parts and their candidates ascend by row
      for (const Cand &c : sc[(size_t)i * T + t].cands) {
        if (c.v < thr) continue;
        int b = c.row / 16;
        if (b != last_block) {
          exact_block(p, K, xt, b, lanes);
          last_block = b;
        }
        best.see(lanes[c.row % 16], c.row);
      }
    for (int r = nb * 16; r < N; r++) best.see(dot(xt, W + (size_t)r * K, K), r);
    argmax[t] = best.i;
  }
}

void LMHead::forward(ThreadPool *pool, const float *x, int T, float *y, int32_t *argmax) const {
  if (!p_) {
    std::vector<float> tmp;
    if (!y) tmp.resize((size_t)T * N_);
    lm_head(pool, x, T, K_, W_, N_, y ? y : tmp.data(), argmax);
    return;
  }
  if (!y && argmax && q8_) {
    greedy8(pool, x, T, argmax);
    return;
  }
  if (!y && argmax && q_) {
    greedy(pool, x, T, argmax);
    return;
  }
  int n = ((double)T * K_ * N_ < parallel_threshold) ? 1 : pool->size();
  std::vector<ArgMax> am((size_t)n * T);
  run_parts(pool, n, nb_, [&](int i, int nn, int b0, int b1) {
    ArgMax *a = am.data() + (size_t)i * T;
    if (b0 < b1) packed_rows(p_, K_, x, T, N_, b0, b1, y, argmax ? a : nullptr);
    if (i == nn - 1)  // rows past the last full block
      for (int r = nb_ * 16; r < N_; r++)
        for (int t = 0; t < T; t++) {
          float v = dot(x + (size_t)t * K_, W_ + (size_t)r * K_, K_);
          if (y) y[(size_t)t * N_ + r] = v;
          a[t].see(v, r);
        }
  });
  if (argmax) merge_argmax(am, n, T, argmax);
}

}  // namespace mq

// ---- shared decoder-only plumbing ---------------------------------------------------------------

namespace mq {

void CausalLM::forward(const Batch &b, float *logits, int32_t *argmax) {
  run(b);
  sel_.resize((size_t)b.n * E_);
  for (int i = 0; i < b.n; i++)
    std::memcpy(&sel_[(size_t)i * E_], &hn_[(size_t)(b.off[i] + b.ntok[i] - 1) * E_], sizeof(float) * E_);
  head_->forward(pool_, sel_.data(), b.n, logits, argmax);
}

void CausalLM::logits_all(const int32_t *ids, int n, int slot, float *out) {
  Batch b;
  b.n = 1;
  b.slot = {slot};
  b.ntok = {n};
  b.pos = {0};
  b.off = {0};
  b.tokens.assign(ids, ids + n);
  run(b);
  head_->forward(pool_, hn_.data(), n, out, nullptr);
}

}  // namespace mq
