// kernels.cc: the thread pool, the weight table and the fp32 math the models share.
//
// The hot spot of small models is the LM head (e.g. 151,936 x 64 for qwen3-tiny): a
// matrix-times-few-vectors product that streams the whole embedding matrix once per step. The
// AVX-512 kernel below reads each 16-row block of W once per step for all batched tokens (so a
// batch of 8 costs little more memory traffic than a batch of 1), reduces 16 dot products at a
// time with a shuffle tree, and tracks the argmax while the logits are still in registers.
// Other code is plain loops that -O3 -march=x86-64-v3 vectorises.
#include <immintrin.h>
#include <sys/mman.h>
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

// to_f32 converts n elements of a stored dtype to fp32 (bf16: the top half of an fp32; fp16:
// IEEE half, through F16C).
static void to_f32(const void *src, int32_t dtype, size_t n, float *dst) {
  if (dtype == MQ_DTYPE_BF16) {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    for (size_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)s[i] << 16;
      std::memcpy(&dst[i], &u, 4);
    }
  } else {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(s[i]);
  }
}

Weights::Weights(const mq_tensor *t, int n) {
  for (int i = 0; i < n; i++) {
    Entry e;
    e.t = t[i];
    std::string name = t[i].name ? t[i].name : "";
    e.t.name = nullptr;
    if (t[i].dtype != MQ_DTYPE_F32 && t[i].dtype != MQ_DTYPE_BF16 && t[i].dtype != MQ_DTYPE_F16)
      throw Error(MQ_ERR_LOAD, "tensor " + name + " has dtype " + std::to_string(t[i].dtype) + "; the runtime reads F32, BF16 and F16");
    if (t[i].dtype == MQ_DTYPE_F32 || !t[i].data) {
      e.f32 = static_cast<const float *>(t[i].data);
    } else {
      size_t elems = 1;
      for (int d = 0; d < t[i].ndim; d++) elems *= (size_t)t[i].shape[d];
      std::unique_ptr<float[]> buf(new float[elems]);
      to_f32(t[i].data, t[i].dtype, elems, buf.get());
      e.f32 = buf.get();
      e.converted = true;
      converted_.push_back(std::move(buf));
    }
    map_[name] = e;
  }
}

static std::string shape_str(const int64_t *s, int n) {
  std::ostringstream o;
  o << "[";
  for (int i = 0; i < n; i++) o << (i ? "," : "") << s[i];
  o << "]";
  return o.str();
}

// The zero mappings of declaring Weights alive in the process: LMHead builds no screen over one
// (a model constructed only to list what it reads never runs, and screening a real model's
// head would cost seconds and gigabytes).
static std::mutex declared_mu;
static std::vector<std::pair<const void *, size_t>> declared_zeros;

static bool declared_zero(const void *p) {
  std::lock_guard<std::mutex> l(declared_mu);
  for (const auto &z : declared_zeros)
    if (p >= z.first && (const char *)p < (const char *)z.first + z.second) return true;
  return false;
}

Weights::~Weights() {
  std::lock_guard<std::mutex> l(declared_mu);
  for (const auto &z : zeros_) {
    for (size_t i = 0; i < declared_zeros.size(); i++)
      if (declared_zeros[i].first == z.first) {
        declared_zeros.erase(declared_zeros.begin() + i);
        break;
      }
    munmap(z.first, z.second);
  }
}

std::unique_ptr<Weights> Weights::declaring(TensorLayout *out) {
  std::unique_ptr<Weights> w(new Weights());
  w->declare_ = out;
  return w;
}

const float *Weights::get(const std::string &name, std::vector<int64_t> shape) const {
  if (declare_) {
    // Record the read once; hand back zeros of the asked size: a private read-only anonymous
    // mapping reads as the shared zero page, so a model of any size is declared in no memory.
    bool seen = false;
    for (const TensorLayout::Tensor &t : declare_->reads) seen = seen || t.name == name;
    if (!seen) declare_->reads.push_back({name, shape});
    size_t bytes = sizeof(float);
    for (int64_t d : shape) bytes *= (size_t)std::max<int64_t>(d, 1);
    for (const auto &z : zeros_)
      if (z.second >= bytes) return static_cast<const float *>(z.first);
    void *m = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw Error(MQ_ERR_INTERNAL, "declaring tensor " + name + ": cannot map " + std::to_string(bytes) + " bytes");
    zeros_.push_back({m, bytes});
    std::lock_guard<std::mutex> l(declared_mu);
    declared_zeros.push_back({m, bytes});
    return static_cast<const float *>(m);
  }
  auto it = map_.find(name);
  if (it == map_.end())
    throw Error(MQ_ERR_LOAD, "tensor " + name + " is missing from the bundle; rebuild it from a complete checkpoint");
  used_[name] = true;
  const mq_tensor &t = it->second.t;
  bool ok = t.ndim == (int)shape.size();
  for (int i = 0; ok && i < t.ndim; i++) ok = t.shape[i] == shape[i];
  if (!ok)
    throw Error(MQ_ERR_LOAD, "tensor " + name + " has shape " + shape_str(t.shape, t.ndim) + ", config.json implies " +
                                 shape_str(shape.data(), (int)shape.size()));
  if (!it->second.f32) throw Error(MQ_ERR_LOAD, "tensor " + name + " has no data");
  return it->second.f32;
}

const float *Weights::get_any(const std::vector<std::string> &names, std::vector<int64_t> shape) const {
  for (auto &n : names)
    if (has(n)) return get(n, shape);
  return get(names[0], shape);
}

void Weights::ignore_suffix(const std::string &suffix) const {
  if (declare_) declare_->carried.push_back("*" + suffix);
  for (const auto &kv : map_)
    if (kv.first.size() >= suffix.size() && kv.first.compare(kv.first.size() - suffix.size(), suffix.size(), suffix) == 0)
      used_[kv.first] = true;
}

bool Weights::file_backed(const float *p) const {
  for (const auto &kv : map_)
    if (kv.second.f32 == p) return !kv.second.converted;
  return false;
}

std::vector<std::string> Weights::unused() const {
  std::vector<std::string> out;
  for (const auto &kv : map_)
    if (!used_.count(kv.first)) out.push_back(kv.first);
  return out;
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

// ---- LM head ----------------------------------------------------------------------------------

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

LMHead::LMHead(const float *W, int N, int K, bool release_pages) : W_(W), N_(N), K_(K), nb_(0) {
  if (!have_avx512() || N < 16 || declared_zero(W)) return;
  nb_ = N / 16;
  const int K4 = (K + 3) / 4;
  // K <= 32768 keeps the int32 sums (|S| <= K * 255 * 127) from overflowing.
  if (have_avx512_vnni() && K <= 32768) {
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
        wmax_ = std::max(wmax_, m);
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
      wmax_ = 0;  // the bf16 screen below computes it again
      munmap(q8_, q8bytes_);
      q8_ = nullptr;
      std::vector<float>().swap(sw_);
      std::vector<int32_t>().swap(corr_);
    }
  }
  if (!q8_ && have_avx512_bf16()) {
    qbytes_ = (size_t)nb_ * ((K + 1) / 2) * 32 * sizeof(uint16_t);
    q_ = (uint16_t *)map_anon(qbytes_);
  }
  if (!q8_ && !q_) return;  // no screen: greedy decoding reads W like sampling does
  if (q_)  // the int8 screen's loop above already took wmax_; W is read once either way
    for (int b = 0; b < nb_; b++)
      for (int j = 0; j < 16; j++) {
        const float *src = W + ((size_t)b * 16 + j) * K;
        for (int k = 0; k < K; k++) {
          // bf16 pairs (k, k+1) of a row are adjacent, as vdpbf16ps consumes them.
          q_[(size_t)b * ((K + 1) / 2) * 32 + (size_t)(k / 2) * 32 + j * 2 + (k % 2)] = to_bf16(src[k]);
          wmax_ = std::max(wmax_, std::fabs(src[k]));
        }
      }
  // Greedy decoding reads the screen instead of W, so release the bundle pages of W that
  // building it touched (whole pages strictly inside W): the mapping is read-only and
  // file-backed, so a later read (a rescored row, a token embedding, a sampling step) just
  // faults them back from the page cache.
  if (!release_pages) return;  // a converted copy in anonymous memory would read back as zeros
  const uintptr_t page = 4096;
  uintptr_t a = ((uintptr_t)W + page - 1) & ~(page - 1);
  uintptr_t e = ((uintptr_t)(W + (size_t)N * K)) & ~(page - 1);
  if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

LMHead::~LMHead() {
  if (q_) munmap(q_, qbytes_);
  if (q8_) munmap(q8_, q8bytes_);
}

static const int prefetch_blocks = 4;
static const int CH = 4;  // accumulation chains per token: fixed, so logits never depend on the batch

// Every logit is one fixed sum, whichever kernel computes it and whatever the batch: CH fused
// multiply-add chains over k (chain c takes k = c, c+CH, ..., and the K % CH last k go to chain
// 0 after the rest), summed as ((c0 + c1) + c2) + c3 (rows past the last 16-row block use dot()
// instead). rm_range and tl_range compute 16-row blocks of W as stored (row-major, no copy),
// row_dot one row: a token's logits are bit-identical alone or batched, and greedy's rescoring
// of a row reproduces forward's logit exactly.
static inline float row_dot(const float *w, const float *x, int K) {
  __m128 acc = _mm_setzero_ps();
  int k = 0;
  for (; k + CH <= K; k += CH) acc = _mm_fmadd_ps(_mm_loadu_ps(w + k), _mm_loadu_ps(x + k), acc);
  alignas(16) float c[CH];
  _mm_store_ps(c, acc);
  for (; k < K; k++) c[0] = std::fma(w[k], x[k], c[0]);
  return ((c[0] + c[1]) + c[2]) + c[3];
}

__attribute__((target("avx512f,avx512dq"))) static inline void prefetch_block(const void *p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch((const char *)p + off, _MM_HINT_T0);
}

// transpose4 exchanges 128-bit lanes: lane j of z[i] is lane i of r[j].
__attribute__((target("avx512f,avx512dq"))) static inline void transpose4(const __m512 *r, __m512 *z) {
  const __m512 t0 = _mm512_shuffle_f32x4(r[0], r[1], 0x44);  // r0.0 r0.1 r1.0 r1.1
  const __m512 t1 = _mm512_shuffle_f32x4(r[0], r[1], 0xEE);  // r0.2 r0.3 r1.2 r1.3
  const __m512 t2 = _mm512_shuffle_f32x4(r[2], r[3], 0x44);  // r2.0 r2.1 r3.0 r3.1
  const __m512 t3 = _mm512_shuffle_f32x4(r[2], r[3], 0xEE);  // r2.2 r2.3 r3.2 r3.3
  z[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);                 // r0.0 r1.0 r2.0 r3.0
  z[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);                 // r0.1 r1.1 r2.1 r3.1
  z[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
  z[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
}

// quad_sum adds the CH chains held in the 4 floats of each 128-bit lane, ((c0 + c1) + c2) + c3:
// lane 4i + g of the result is the sum of 128-bit lane i of a[g].
__attribute__((target("avx512f,avx512dq"))) static inline __m512 quad_sum(const __m512 *a) {
  const __m512 t0 = _mm512_shuffle_ps(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0));  // a0.c0 a0.c1 a1.c0 a1.c1
  const __m512 t1 = _mm512_shuffle_ps(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2));  // a0.c2 a0.c3 a1.c2 a1.c3
  const __m512 t2 = _mm512_shuffle_ps(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t3 = _mm512_shuffle_ps(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 c0 = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));  // a0.c0 a1.c0 a2.c0 a3.c0
  const __m512 c1 = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  const __m512 c2 = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 c3 = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), c2), c3);
}

// see_block folds block b's 16 logits into a running argmax: the block max, then the lowest
// lane holding it, which keeps torch.argmax's first-index rule.
__attribute__((target("avx512f,avx512dq"))) static inline void see_block(__m512 out, int b, ArgMax *am) {
  float m = _mm512_reduce_max_ps(out);
  if (m > am->v || am->i < 0) {
    __mmask16 eq = _mm512_cmp_ps_mask(out, _mm512_set1_ps(m), _CMP_EQ_OQ);
    if (eq) {
      am->v = m;
      am->i = b * 16 + __builtin_ctz((unsigned)eq);
    }
  }
}

// rm_range computes blocks [b0, b1) for TG (1 or 2) tokens with rows in the lanes: register g
// of a block holds rows g, g+4, g+8, g+12 (one per 128-bit lane), lane 4i + c chain c of its
// row. Four 16-float row segments are transposed by 128-bit lanes so that each register takes
// the next 4 weights of its rows, multiplied by x[k, k+4) broadcast to every lane; quad_sum then
// yields the 16 logits in row order. The four registers also keep 4 independent chains per
// token in flight.
template <int TG>
__attribute__((target("avx512f,avx512dq"))) static void rm_range(const float *W, int K, const float *x, int N,
                                                                  int b0, int b1, float *y, ArgMax *am) {
  const size_t block = (size_t)K * 16;
  for (int b = b0; b < b1; b++) {
    // Prefetch a few blocks ahead: one core's streaming bandwidth from L3 is bounded by the
    // misses it keeps in flight, and the hardware prefetcher stops at 4 KiB page boundaries.
    if (b + prefetch_blocks < b1) prefetch_block(W + (b + prefetch_blocks) * block, block * sizeof(float));
    const float *wb = W + (size_t)b * block;
    __m512 acc[4][TG], r[4], z[4][4];
    for (int g = 0; g < 4; g++)
      for (int t = 0; t < TG; t++) acc[g][t] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
      for (int g = 0; g < 4; g++) {
        for (int i = 0; i < 4; i++) r[i] = _mm512_loadu_ps(wb + (size_t)(g + 4 * i) * K + k);
        transpose4(r, z[g]);
      }
      for (int s = 0; s < 4; s++)
        for (int t = 0; t < TG; t++) {
          const __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(x + (size_t)t * K + k + 4 * s));
          for (int g = 0; g < 4; g++) acc[g][t] = _mm512_fmadd_ps(z[g][s], xv, acc[g][t]);
        }
    }
    if (k < K) {  // K % 16 left: its whole 4-steps, then the K % 4 last k into chain 0 (lanes 4i)
      const int rem = K - k;
      const __mmask16 m = (__mmask16)((1u << rem) - 1);
      for (int g = 0; g < 4; g++) {
        for (int i = 0; i < 4; i++) r[i] = _mm512_maskz_loadu_ps(m, wb + (size_t)(g + 4 * i) * K + k);
        transpose4(r, z[g]);
      }
      int s = 0;
      for (; 4 * s + 4 <= rem; s++)
        for (int t = 0; t < TG; t++) {
          const __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(x + (size_t)t * K + k + 4 * s));
          for (int g = 0; g < 4; g++) acc[g][t] = _mm512_fmadd_ps(z[g][s], xv, acc[g][t]);
        }
      for (int c = 0; 4 * s + c < rem; c++) {
        const __m512i pick = _mm512_set1_epi32(c);  // weight c of each 128-bit lane, to position 0
        for (int t = 0; t < TG; t++) {
          const __m512 xv = _mm512_set1_ps(x[(size_t)t * K + k + 4 * s + c]);
          for (int g = 0; g < 4; g++)
            acc[g][t] = _mm512_mask3_fmadd_ps(_mm512_permutevar_ps(z[g][s], pick), xv, acc[g][t], (__mmask16)0x1111);
        }
      }
    }
    for (int t = 0; t < TG; t++) {
      const __m512 a4[4] = {acc[0][t], acc[1][t], acc[2][t], acc[3][t]};
      const __m512 out = quad_sum(a4);
      if (y) _mm512_storeu_ps(y + (size_t)t * N + (size_t)b * 16, out);
      if (am) see_block(out, b, am + t);
    }
  }
}

// From 4 tokens on, tl_range puts tokens in the lanes instead: for one row, lane 4t + c holds
// chain c of token t, so the row's next 4 weights are broadcast to every 128-bit lane (a load,
// no shuffle) and multiplied by xq, the 4 tokens' x[k, k+4) side by side (fill_xq, once per
// call). Each multiply-add then serves 4 tokens x 4 chains and W is used exactly as stored;
// only a block's 16 x 4 sums are rearranged at the end, a cost shared by 4 tokens.

// xq_regs is the number of registers per group of 4 tokens in xq: K/4 whole 4-steps, then one
// per k of the K % 4 tail (token t's x[k] in lane 4t, for chain 0).
static inline int xq_regs(int K) { return K / 4 + K % 4; }

// fill_xq lays out tokens [t0, t0 + nt) of x (nt <= 4; missing tokens are zero) as one group.
static void fill_xq(const float *x, int K, int t0, int nt, float *xq) {
  const int K4 = K / 4;
  std::memset(xq, 0, sizeof(float) * 16 * xq_regs(K));
  for (int t = 0; t < nt; t++) {
    const float *xt = x + (size_t)(t0 + t) * K;
    for (int k = 0; k < 4 * K4; k++) xq[(size_t)(k / 4) * 16 + 4 * t + k % 4] = xt[k];
    for (int c = 0; c < K % 4; c++) xq[(size_t)(K4 + c) * 16 + 4 * t] = xt[4 * K4 + c];
  }
}

// tl_range computes blocks [b0, b1) for P groups of 4 tokens laid out in xq; only the first nt
// tokens are stored and tracked. Sixteen accumulators cover 16 rows of one group, or 8 rows of
// two groups (P = 2), which halves the weight broadcasts per multiply-add.
template <int P>
__attribute__((target("avx512f,avx512dq"))) static void tl_range(const float *W, int K, const float *xq, int nt,
                                                                  int N, int b0, int b1, float *y, ArgMax *am) {
  constexpr int RP = 16 / P;  // rows per pass
  const int K4 = K / 4, L = xq_regs(K);
  for (int b = b0; b < b1; b++) {
    __m512 sums[P][4];  // group p, rows 4q..4q+3: lane 4t + g = token t, row 4q + g
    for (int h = 0; h < 16; h += RP) {
      const float *wb = W + ((size_t)b * 16 + h) * K;
      __m512 acc[P][RP];
      for (int p = 0; p < P; p++)
        for (int j = 0; j < RP; j++) acc[p][j] = _mm512_setzero_ps();
      for (int s = 0; s < K4; s++) {
        __m512 xv[P];
        for (int p = 0; p < P; p++) xv[p] = _mm512_loadu_ps(xq + ((size_t)p * L + s) * 16);
        for (int j = 0; j < RP; j++) {
          const __m512 wv = _mm512_broadcast_f32x4(_mm_loadu_ps(wb + (size_t)j * K + 4 * s));
          for (int p = 0; p < P; p++) acc[p][j] = _mm512_fmadd_ps(wv, xv[p], acc[p][j]);
        }
      }
      for (int c = 0; c < K % 4; c++)  // the K % 4 tail: chain 0 (lanes 4t) only
        for (int p = 0; p < P; p++) {
          const __m512 xv = _mm512_loadu_ps(xq + ((size_t)p * L + K4 + c) * 16);
          for (int j = 0; j < RP; j++)
            acc[p][j] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(wb[(size_t)j * K + 4 * K4 + c]), xv, acc[p][j],
                                              (__mmask16)0x1111);
        }
      for (int p = 0; p < P; p++)
        for (int q = 0; q < RP / 4; q++) sums[p][h / 4 + q] = quad_sum(&acc[p][4 * q]);
    }
    for (int p = 0; p < P; p++) {
      __m512 out[4];  // token t: lane 4q + g = row 4q + g
      transpose4(sums[p], out);
      for (int t = 0; t < 4 && 4 * p + t < nt; t++) {
        if (y) _mm512_storeu_ps(y + (size_t)(4 * p + t) * N + (size_t)b * 16, out[t]);
        if (am) see_block(out[t], b, am + 4 * p + t);
      }
    }
  }
}

static inline float *yt(float *y, int t, int N) { return y ? y + (size_t)t * N : nullptr; }

// rm_rows covers blocks [b0, b1) for all T tokens (xq: fill_xq's groups of 4 tokens, the last
// one padded when T % 4 == 3), in chunks of blocks that stay in L2 while every token group
// passes over them, so each weight is read from memory once per step.
static void rm_rows(const float *W, int K, const float *x, const float *xq, int T, int N, int b0, int b1, float *y,
                    ArgMax *am) {
  const int chunk = 64;
  const size_t L16 = (size_t)xq_regs(K) * 16;
  for (int c0 = b0; c0 < b1; c0 += chunk) {
    int c1 = std::min(b1, c0 + chunk);
    int t = 0;
    for (; t + 8 <= T; t += 8)
      tl_range<2>(W, K, xq + (t / 4) * L16, 8, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
    for (; t + 3 <= T; t += 4)
      tl_range<1>(W, K, xq + (t / 4) * L16, std::min(4, T - t), N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
    t = std::min(t, T);
    if (t + 2 <= T) {
      rm_range<2>(W, K, x + (size_t)t * K, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
      t += 2;
    }
    if (t < T) rm_range<1>(W, K, x + (size_t)t * K, N, c0, c1, yt(y, t, N), am ? am + t : nullptr);
  }
}

// ---- greedy screening in bf16 -----------------------------------------------------------------
//
// Greedy decoding needs only the argmax, and at small batch the LM head is bound by memory
// bandwidth, so a first pass reads a bf16 copy of W (half the bytes) with vdpbf16ps and keeps
// every row whose approximate logit is within 2*bound of the approximate maximum; those rows
// are then recomputed exactly from W (row_dot, the very sum forward computes), a few cache
// lines each. bound is a rigorous limit on |approx - exact| (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., 3.1):
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
static void finish_greedy(const float *W, int K, int N, int nb, const float *x, int T, int n_parts,
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
  finish_greedy(W_, K_, N_, nb_, x, T, n_parts, sc, bound2.data(), argmax);
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
  finish_greedy(W_, K_, N_, nb_, x, T, n_parts, sc, bound2.data(), argmax);
}

static void finish_greedy(const float *W, int K, int N, int nb, const float *x, int T, int n_parts,
                          const std::vector<Screen> &sc, const float *bound2, int32_t *argmax) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * K;
    float m = -INFINITY;
    for (int i = 0; i < n_parts; i++) m = std::max(m, sc[(size_t)i * T + t].m);
    const float thr = m - bound2[t];
    ArgMax best;
    for (int i = 0; i < n_parts; i++)  // parts and their candidates ascend by row
      for (const Cand &c : sc[(size_t)i * T + t].cands)
        if (c.v >= thr) best.see(row_dot(W + (size_t)c.row * K, xt, K), c.row);
    for (int r = nb * 16; r < N; r++) best.see(dot(xt, W + (size_t)r * K, K), r);
    argmax[t] = best.i;
  }
}

void LMHead::forward(ThreadPool *pool, const float *x, int T, float *y, int32_t *argmax) const {
  if (nb_ == 0) {
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
  const size_t L16 = (size_t)xq_regs(K_) * 16;
  std::vector<float> xq((T + 3) / 4 * L16);
  for (int t = 0; t + 3 <= T; t += 4) fill_xq(x, K_, t, std::min(4, T - t), xq.data() + (t / 4) * L16);
  run_parts(pool, n, nb_, [&](int i, int nn, int b0, int b1) {
    ArgMax *a = am.data() + (size_t)i * T;
    if (b0 < b1) rm_rows(W_, K_, x, xq.data(), T, N_, b0, b1, y, argmax ? a : nullptr);
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
