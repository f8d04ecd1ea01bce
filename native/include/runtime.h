// runtime.h: internals shared by the engine (engine.cc), the math kernels (kernels.cc), the family
// registry (registry.cc) and the family model code (native/models/*.cc). Not part of the C ABI.
//
// A family is one file, native/models/<family>.cc, that registers itself:
//
//   MQ_REGISTER_FAMILY(Family{"qwen3", "text", {"Qwen3ForCausalLM"}, resolve_qwen3, make_qwen3});
//
// resolve turns the checkpoint's config.json (as typed key/values: Config) into the canonical
// hyper-parameters (HParams) the CPU model and any device backend read; make builds the CPU
// model. Nothing else in the runtime names a family.
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

// TensorLayout is what a family reads from a bundle, for qual bundle build to normalise a
// checkpoint's tensor names and check every tensor before it writes a bundle, so a checkpoint
// that builds opens (mq_family_layout). reads and carried come from the family's own loading
// code run over a declaring Weights (Weights::declaring), so they cannot drift from what the
// engine reads; renames and dropped are the family's layout rules (Family::layout), the names
// the reference loaders (transformers, diffusers) accept for the same tensors.
struct TensorLayout {
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> reads;         // every tensor the model reads, with the shape its config implies
  std::vector<std::string> carried;  // patterns ('*' matches any run) of tensors carried but never read
  // rename: a checkpoint tensor named from + rest, which the family does not read under that
  // name, is the family's to + rest (the first rule giving a name the family reads wins).
  std::vector<std::pair<std::string, std::string>> renames;
  // dropped: patterns of tensors the reference loader discards (a tied head, a task head a base
  // model does not have); they are left out of the bundle.
  std::vector<std::string> dropped;
  // split: a checkpoint tensor whose name ends with from (the rest of the name, P, before it)
  // of shape [N, len(to)*M, ...] is N*len(to) tensors P + to[j] ('*' replaced by n) of shape
  // [M, ...], expert n's part j being the n*len(to)+j-th equal byte range (transformers 5's
  // fused experts split into per-expert ones). Splits apply before renames.
  std::vector<std::pair<std::string, std::vector<std::string>>> splits;
  void split(const std::string &from, const std::vector<std::string> &to) { splits.push_back({from, to}); }
  void rename(const std::string &from, const std::string &to) { renames.push_back({from, to}); }
  void drop(const std::string &pattern) { dropped.push_back(pattern); }
  std::string json() const;
};

// Weights looks tensors up by checkpoint name and checks their shapes. Tensors stored at another
// precision (a bf16 or fp16 bundle) are converted to fp32 once, at open, because the CPU runtime
// computes in fp32; fp32 tensors are read in place from the bundle's mapping. Every get marks its
// tensor used, so the engine can refuse a bundle carrying tensors its family never reads (a
// misnamed or foreign tensor would otherwise go unnoticed).
class Weights {
 public:
  Weights(const mq_tensor *t, int n);
  ~Weights();
  Weights(const Weights &) = delete;
  Weights &operator=(const Weights &) = delete;
  // declaring is a Weights holding no tensors that records into out what a model constructor
  // reads: every get (name and shape; the data it returns reads as zeros and costs no memory),
  // and every ignore_* as a carried pattern. has answers true, so a family's "if present"
  // branch must read the name a canonical checkpoint uses.
  static std::unique_ptr<Weights> declaring(TensorLayout *out);
  bool has(const std::string &name) const { return declare_ || map_.count(name) != 0; }
  // get returns the data of name, requiring exactly the given shape.
  const float *get(const std::string &name, std::vector<int64_t> shape) const;
  // get_any accepts the first name present among the candidates.
  const float *get_any(const std::vector<std::string> &names, std::vector<int64_t> shape) const;
  // ignore marks every tensor whose name ends with suffix as read (buffers a checkpoint may
  // carry that are not weights, such as GPT-2's causal-mask attn.bias).
  void ignore_suffix(const std::string &suffix) const;
  // ignore_prefix marks every tensor whose name starts with prefix as read (a pipeline
  // component part the family never runs, such as the VAE encoder of a text-to-image family).
  void ignore_prefix(const std::string &prefix) const {
    if (declare_) declare_->carried.push_back(prefix + "*");
    for (const auto &kv : map_)
      if (kv.first.compare(0, prefix.size(), prefix) == 0) used_[kv.first] = true;
  }
  // file_backed says p is read in place from the bundle's read-only file mapping (not a
  // converted copy), so its pages may be released and faulted back (LMHead).
  bool file_backed(const float *p) const;
  // unused lists the tensors no get or ignore_suffix touched.
  std::vector<std::string> unused() const;

 private:
  struct Entry {
    mq_tensor t;
    const float *f32 = nullptr;  // t.data when F32, else converted_.back()
    bool converted = false;
  };
  std::map<std::string, Entry> map_;
  std::vector<std::unique_ptr<float[]>> converted_;
  mutable std::map<std::string, bool> used_;
  Weights() = default;
  TensorLayout *declare_ = nullptr;                         // set by declaring()
  mutable std::vector<std::pair<void *, size_t>> zeros_;  // declaring: read-only zero mappings
};

// Config is config.json as the caller flattened it (mq_kv): typed reads by dotted key, each
// error naming the key and saying what was wanted. A pipeline's config holds one object per
// component, read through sub("transformer").
class Config {
 public:
  Config(const mq_kv *kv, int n);
  // sub views the keys under prefix + "." (errors still name the full key).
  Config sub(const std::string &prefix) const;
  bool has(const std::string &key) const;  // present and not null
  double number(const std::string &key) const;
  double number(const std::string &key, double dflt) const;
  int64_t integer(const std::string &key) const;  // required, integral
  int64_t integer(const std::string &key, int64_t dflt) const;
  int64_t positive(const std::string &key) const;  // required, integral, > 0
  bool boolean(const std::string &key, bool dflt) const;
  std::string string(const std::string &key) const;
  std::string string(const std::string &key, const std::string &dflt) const;
  std::vector<double> numbers(const std::string &key) const;  // required list of numbers
  std::vector<std::string> strings(const std::string &key) const;  // required list of strings
  // first returns the first present key's number (e.g. rope_theta or rope_parameters.rope_theta).
  double first_number(const std::vector<std::string> &keys, double dflt) const;

 private:
  struct Value {
    int type = MQ_KV_NULL;
    double number = 0;
    std::string str;
    std::vector<double> numbers;
    std::vector<std::string> strings;
  };
  const Value *find(const std::string &key) const;
  [[noreturn]] void fail(const std::string &key, const std::string &want) const;
  std::shared_ptr<const std::map<std::string, Value>> kv_;
  std::string prefix_;
};

// HParams are a family's resolved hyper-parameters by canonical name (numbers and strings).
// The CPU model reads them, and so does a device backend (handed over as mqb_hparam), so the
// config is interpreted once, by the family's resolve.
class HParams {
 public:
  void set(const std::string &key, double v) { num_[key] = v; }
  void set_string(const std::string &key, const std::string &v) { str_[key] = v; }
  bool has(const std::string &key) const { return num_.count(key) || str_.count(key); }
  double f(const std::string &key) const;
  int i(const std::string &key) const;
  int64_t i64(const std::string &key) const;
  bool b(const std::string &key) const { return f(key) != 0; }
  std::string s(const std::string &key) const;
  const std::map<std::string, double> &numbers() const { return num_; }
  const std::map<std::string, std::string> &strings() const { return str_; }
  std::string json() const;  // {"key": value, ...}

 private:
  std::map<std::string, double> num_;
  std::map<std::string, std::string> str_;
};

// Batch is one forward pass: n entries, entry i appends ntok[i] tokens (tokens[off[i]..]) to KV
// slot slot[i] starting at position pos[i].
struct Batch {
  int n = 0;
  std::vector<int> slot, ntok, pos, off;
  std::vector<int32_t> tokens;
  int rows() const { return (int)tokens.size(); }
};

// ImageInput is the images of one vision-language prompt (mq_image, copied). One image: pixels
// and grid_t/h/w. Several (mq_engine_add_images, for a family whose images keep their own grids):
// pixels holds them one after another, images lists each one's grid and where its pixels start,
// and grid_t/h/w is the first image's. images always lists at least the first image.
struct ImageInput {
  struct Grid {
    int t = 0, h = 0, w = 0;
    size_t offset = 0, count = 0;  // its pixel values: pixels[offset, offset + count)
  };
  std::vector<float> pixels;
  int grid_t = 0, grid_h = 0, grid_w = 0;
  std::vector<Grid> images;
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
  // routing_counts: a mixture-of-experts model's tokens routed to each expert of each layer
  // since open, out [layers * experts]; returns experts (0: not a mixture of experts). May be
  // called from another thread while forward runs.
  virtual int routing_counts(std::vector<uint64_t> *out, int *layers) const {
    (void)out, (void)layers;
    return 0;
  }
  // set_image attaches an image to the sequence about to be prefilled in slot with prompt
  // (checked against it here, so a bad request fails alone); reset_slot drops it. Families
  // without images refuse.
  virtual void set_image(int slot, std::shared_ptr<const ImageInput> img, const int32_t *prompt, int n) {
    (void)slot, (void)img, (void)prompt, (void)n;
    throw Error(MQ_ERR_INVALID_ARGUMENT, "this model does not take images");
  }
  // vision_ns: the wall time (ns) the vision tower and projector have spent on slot's images
  // since set_image (0 without images or before they are encoded); reset_slot clears it.
  virtual int64_t vision_ns(int slot) const {
    (void)slot;
    return 0;
  }
  // several_images: set_image takes an ImageInput listing more than one image, each on its own
  // grid (mq_engine_add_images); the engine refuses a list to a backend without it.
  virtual bool several_images() const { return false; }
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

// KVCache holds keys and values per layer and slot: [layer][slot][row][kv_dim], a row per
// position, or fewer rows that the model reuses (a sliding window's ring, kept by the shared decoder).
// The memory is reserved with mmap and only touched as rows fill, so an engine's resident size
// grows with use rather than with max_batch * ctx.
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
  const HParams *hp;  // resolved by the family's resolve
  int max_batch;      // live sequence slots
  int n_slots;        // max_batch + 1 scratch slot for logits_all
  int max_context;
  ThreadPool *pool;
  const Weights *w;
};

// Family is one registered model family (see the top of this file).
struct Family {
  std::string name;                        // the runtime family, e.g. "qwen3"
  std::string task;                        // "text" | "image" | "vision"
  std::vector<std::string> architectures;  // config.json architectures / model_index _class_name
  std::function<void(const Config &, HParams &)> resolve;
  std::function<std::unique_ptr<Backend>(const ModelArgs &)> make;  // the CPU model
  // threads: how many CPU threads the model's forward pass uses (0: the engine's n_threads).
  int threads = 0;
  // layout adds the family's layout rules (TensorLayout::rename, drop) for the resolved
  // hyper-parameters; empty when every checkpoint names the tensors as the model reads them.
  std::function<void(const HParams &, TensorLayout &)> layout;
  // cuda_image: an image family's pipeline on the GPU, driven through the loaded CUDA library's
  // mqb_image_* entry points (cuda_backend.cc opens the library); empty: no GPU pipeline.
  std::function<std::unique_ptr<Backend>(void *cuda_lib, const mq_engine_params &, const HParams &, int max_context)>
      cuda_image;
};

// ImageBackend is a text-to-image model (task "image"): one call turns prompt token ids and the
// request's controls into an RGB image. It is a Backend so the engine owns it as any model; the
// token-generation entry points are not its business and refuse.
class ImageBackend : public Backend {
 public:
  virtual mq_image_spec image_spec() const = 0;
  // generate validates r against image_spec (errors name the field) and fills out.
  virtual void generate(const mq_image_request &r, mq_image_output *out) = 0;
  void forward(const Batch &, float *, int32_t *) override {
    throw Error(MQ_ERR_INVALID_ARGUMENT, "this is a text-to-image model: it generates images, not tokens");
  }
  void logits_all(const int32_t *, int, int, float *) override {
    throw Error(MQ_ERR_INVALID_ARGUMENT, "this is a text-to-image model: it has no logits");
  }
};

// register_family adds f to the registry (at static initialisation, through
// MQ_REGISTER_FAMILY); a second family of the same name or architecture is a programming error
// reported when the registry is first read.
bool register_family(Family f);
// find_family returns the family named name, or throws Error naming the known families.
const Family &find_family(const std::string &name);
const std::vector<Family> &families();

#define MQ_CONCAT_(a, b) a##b
#define MQ_CONCAT(a, b) MQ_CONCAT_(a, b)
#define MQ_REGISTER_FAMILY(...) \
  static const bool MQ_CONCAT(mq_registered_, __LINE__) = ::mq::register_family(__VA_ARGS__)

// resolve_family_json resolves family's hyper-parameters from config as a JSON object
// (mq_family_resolve without the last-error slot).
mq_status resolve_family_json(const char *family, const mq_kv *config, int32_t n, char **json_out, std::string *err);
// family_layout_json is mq_family_layout without the thread's last-error slot.
mq_status family_layout_json(const char *family, const mq_kv *config, int32_t n, char **json_out, std::string *err);

// fault reports whether MODELQUAL_FAULTS (comma-separated) names name: a family plants its own
// defects ("qwen3.drop_q_norm") so the parity gates can be shown to fail.
bool fault(const std::string &name);

std::unique_ptr<Backend> make_cuda(const mq_engine_params &p, const Family &family, const HParams &hp,
                                   int n_slots, int max_context);

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
  // release_pages: W is a read-only file mapping (Weights::file_backed) whose pages may be
  // released after the screen is built.
  LMHead(const float *W, int N, int K, bool release_pages);
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

// torch_randn writes torch.randn(n) of a CPU generator seeded with seed (models/torch_randn.cc).
void torch_randn(uint64_t seed, float *out, int64_t n);
// torch_randn_bf16 is the same draw in bfloat16 (dtype=torch.bfloat16), widened to float.
void torch_randn_bf16(uint64_t seed, float *out, int64_t n);

// DecoderDims are the canonical hyper-parameters a decoder-only family resolves (and the CUDA
// decoder reads by the same names): vocab_size, hidden_size, num_layers, num_heads,
// num_kv_heads, head_dim, intermediate_size, max_positions, norm_eps, rope_theta,
// tie_word_embeddings, attention_bias, scale_attn_by_inverse_layer_idx (0 where a family has
// no such setting).
struct DecoderDims {
  int vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size, max_positions;
  float norm_eps;
  double rope_theta;
  bool tie_word_embeddings, attention_bias, scale_attn_by_inverse_layer_idx;
  explicit DecoderDims(const HParams &hp);
};

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
