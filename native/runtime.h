// runtime.h: internals shared by the engine (engine.cc), the math kernels (kernels.cc) and the
// family model code (models/*.cc). Not part of the C ABI.
#ifndef MODELQUAL_RUNTIME_H
#define MODELQUAL_RUNTIME_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "modelqual.h"

namespace mq {

// Error carries a user-facing message across the C++ layers; the C ABI turns it into a status
// and mq_last_error().
struct Error : std::runtime_error {
  mq_status status;
  Error(mq_status s, const std::string &m) : std::runtime_error(m), status(s) {}
};

// ThreadPool runs fn(i, n) on n threads (the caller is thread 0). Workers spin briefly after a
// job so back-to-back parallel regions of a decode step do not pay a wake-up each time, then
// sleep on a condition variable so an idle engine costs no CPU.
class ThreadPool {
 public:
  explicit ThreadPool(int n);
  ~ThreadPool();
  int size() const { return n_; }
  void run(const std::function<void(int, int)> &fn);

 private:
  void worker(int idx);
  int n_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)> *job_ = nullptr;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Weights looks tensors up by Hugging Face name and checks their shapes.
class Weights {
 public:
  Weights(const mq_tensor *t, int n);
  bool has(const std::string &name) const { return map_.count(name) != 0; }
  // get returns the data of name, requiring exactly the given shape.
  const float *get(const std::string &name, std::vector<int64_t> shape) const;
  // get_any accepts the first name present among the candidates.
  const float *get_any(const std::vector<std::string> &names, std::vector<int64_t> shape) const;

 private:
  std::map<std::string, mq_tensor> map_;
};

// Batch is one forward pass: n entries, entry i appends ntok[i] tokens (tokens[off[i]..]) to KV
// slot slot[i] starting at position pos[i].
struct Batch {
  int n = 0;
  std::vector<int> slot, ntok, pos, off;
  std::vector<int32_t> tokens;
  int rows() const { return (int)tokens.size(); }
};

// Backend is one model on one device. The engine owns scheduling, sampling and stop rules.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int vocab() const = 0;
  virtual std::string device() const { return "cpu"; }
  // forward writes, for each entry, the logits of its last new token to logits + i*vocab
  // (skipped when logits is NULL) and their argmax (lowest id on ties) to argmax[i].
  virtual void forward(const Batch &b, float *logits, int32_t *argmax) = 0;
  // logits_all writes full logits for every position of ids, using KV slot scratch_slot.
  virtual void logits_all(const int32_t *ids, int n, int scratch_slot, float *out) = 0;
  virtual void reset_slot(int slot) { (void)slot; }
  // deterministic backends (mock) choose tokens themselves: the engine uses argmax as-is and
  // skips sampling; logits may then be left unwritten by forward.
  virtual bool deterministic() const { return false; }
  // samples_on_device backends draw plain temperature samples themselves (forward_sampled), so
  // those logits never cross to the host; top-k/top-p entries are sampled on the host from the
  // logits the same call returns.
  virtual bool samples_on_device() const { return false; }
  // forward_sampled: like forward, but out[i] is entry i's next token: the argmax when
  // temperature[i] <= 0, else a draw from softmax(logits / temperature[i]) keyed by rng_key[i].
  // With logits != NULL every entry's logits are written there too (as forward).
  virtual void forward_sampled(const Batch &b, const float *temperature, const uint64_t *rng_key, int32_t *out,
                               float *logits) {
    (void)b, (void)temperature, (void)rng_key, (void)out, (void)logits;
    throw Error(MQ_ERR_BACKEND, "this backend does not sample on the device");
  }
};

// KVCache holds keys and values per layer and slot: [layer][slot][position][kv_dim]. The memory
// is reserved with mmap and only touched as positions fill, so an engine's resident size
// grows with use rather than with max_batch * max_context.
class KVCache {
 public:
  KVCache(int layers, int slots, int ctx, int kv_dim);
  ~KVCache();
  KVCache(const KVCache &) = delete;
  KVCache &operator=(const KVCache &) = delete;
  float *k(int layer, int slot) { return at(k_, layer, slot); }
  float *v(int layer, int slot) { return at(v_, layer, slot); }

 private:
  float *at(float *base, int layer, int slot) {
    return base + (((size_t)layer * slots_ + slot) * ctx_) * kvd_;
  }
  int layers_, slots_, ctx_, kvd_;
  size_t bytes_;
  float *k_ = nullptr, *v_ = nullptr;
};

struct ModelArgs {
  mq_hparams hp;
  int max_batch;     // live sequence slots
  int n_slots;       // max_batch + 1 scratch slot for logits_all
  int max_context;
  ThreadPool *pool;
  const Weights *w;
  bool fault_rope_theta_x10 = false;
  bool fault_drop_q_norm = false;
};

std::unique_ptr<Backend> make_gpt2(const ModelArgs &a);
std::unique_ptr<Backend> make_qwen3(const ModelArgs &a);
std::unique_ptr<Backend> make_mock(const ModelArgs &a);
std::unique_ptr<Backend> make_cuda(const mq_engine_params &p, const std::string &family, int n_slots,
                                   int max_context);

// ---- kernels (kernels.cc) -------------------------------------------------------------------

// linear computes y[t*N + o] = bias[o] + sum_k x[t*K + k] * W[o*K + k] for t < T, o < N
// (nn.Linear layout, W is [N, K]); parallel over o when the work is large enough.
void linear(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, const float *bias,
            float *y);
// conv1d computes y[t*N + o] = bias[o] + sum_k x[t*K + k] * W[k*N + o] (GPT-2 Conv1D, W [K, N]).
void conv1d(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, const float *bias,
            float *y);
// lm_head is linear without bias that also returns each row's argmax (lowest index on ties).
void lm_head(ThreadPool *pool, const float *x, int T, int K, const float *W, int N, float *y,
             int32_t *argmax);

// LMHead is the output projection W [N, K] (N = vocabulary), read in place from the bundle's
// mapping: the fp32 logits (sampling, logits_all) and the exact rescoring of greedy candidates
// use W itself, so the only copy is a screen a quarter (int8, AVX512-VNNI) or half (bf16) its
// size that greedy decoding reads instead of W. After building the screen the bundle pages of
// W are released from this process (madvise; W must therefore be a read-only file mapping, as
// the bundle's is, since anonymous memory would read back as zeros): greedy decoding faults
// back only the rows it rescores and the token embeddings it reads (with the page cache's
// folios around them), and sampling faults all of W back once.
class LMHead {
 public:
  LMHead(const float *W, int N, int K);
  ~LMHead();
  LMHead(const LMHead &) = delete;
  LMHead &operator=(const LMHead &) = delete;
  // forward writes y [T, N] (unless y is NULL: greedy decoding needs only the argmax, and
  // skipping the stores saves T*N*4 bytes of memory traffic) and, when argmax is not NULL,
  // each row's argmax.
  void forward(ThreadPool *pool, const float *x, int T, float *y, int32_t *argmax) const;

 private:
  // greedy computes argmax only: a bf16 screening pass, then exact fp32 for the few rows that
  // can win (see kernels.cc); the result equals forward's argmax bit for bit.
  void greedy(ThreadPool *pool, const float *x, int T, int32_t *argmax) const;
  const float *W_;
  int N_, K_, nb_;  // nb_ full 16-row blocks served by the AVX-512 kernels (0: plain lm_head)
  uint16_t *q_ = nullptr;  // bf16 [nb][K/2][16][2], for greedy screening
  size_t qbytes_ = 0;
  // int8 screen (AVX512-VNNI): q8_ [nb][K/4][16][4] with per-row scales sw_ and offset
  // corrections corr_ = 128 * sum(q8 row); used instead of the bf16 screen when present.
  void greedy8(ThreadPool *pool, const float *x, int T, int32_t *argmax) const;
  int8_t *q8_ = nullptr;
  size_t q8bytes_ = 0;
  std::vector<float> sw_;
  std::vector<int32_t> corr_;
  float wmax_ = 0;  // max |W|
};
void layer_norm(const float *x, int T, int D, const float *g, const float *b, float eps, float *y);
void rms_norm(const float *x, int T, int D, const float *g, float eps, float *y);
float dot(const float *a, const float *b, int n);
void axpy(float a, const float *x, float *y, int n);  // y += a*x
// attention for one entry: q [ntok, H*hd] at positions pos..pos+ntok-1 attends causally to the
// slot's cache K/V [ctx, Hkv*hd] (already holding the new tokens); writes out [ntok, H*hd].
void attention(const float *q, int ntok, int pos, int H, int Hkv, int hd, const float *K, const float *V,
               float scale, float *out, float *scratch);
int64_t now_ns();

// CausalLM is what every decoder-only family shares around its layers: it picks each entry's
// last row for the LM head and implements logits_all; a family implements run().
class CausalLM : public Backend {
 public:
  CausalLM(ThreadPool *pool, int hidden, int vocab) : pool_(pool), E_(hidden), V_(vocab) {}
  int vocab() const override { return V_; }
  void forward(const Batch &b, float *logits, int32_t *argmax) override;
  void logits_all(const int32_t *ids, int n, int slot, float *out) override;

 protected:
  // run computes every row of b through the layers and the final norm into hn_ [rows, E_].
  virtual void run(const Batch &b) = 0;
  ThreadPool *pool_;
  int E_, V_;
  std::unique_ptr<LMHead> head_;
  std::vector<float> hn_;

 private:
  std::vector<float> sel_;
};

}  // namespace mq

#endif
