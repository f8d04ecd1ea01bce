// cuda_backend.cc: the loader side of include/mq_backend.h. The CPU runtime never links CUDA;
// device "cuda" dlopen()s libmodelqual_cuda.so (built by `make cuda` from native/cuda) and
// drives it through the same scheduler as the CPU models.
//
// Search order: $MODELQUAL_CUDA_LIB, then libmodelqual_cuda.so next to the running
// executable, then the dynamic loader's default search path.
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstring>

#include "mq_backend.h"
#include "runtime.h"

static_assert((int)MQ_DTYPE_F32 == (int)MQB_DTYPE_F32 && (int)MQ_DTYPE_BF16 == (int)MQB_DTYPE_BF16 &&
                  (int)MQ_DTYPE_F16 == (int)MQB_DTYPE_F16,
              "mq_dtype and mqb_dtype must agree");

namespace mq {
namespace {

const char *const kLib = "libmodelqual_cuda.so";

struct Api {
  int32_t (*abi_version)(void);
  int (*model_open)(const mqb_model_params *, mqb_model **, char *, size_t);
  void (*model_close)(mqb_model *);
  int32_t (*vocab_size)(const mqb_model *);
  int (*forward)(mqb_model *, int32_t, const int32_t *, const int32_t *, const int32_t *, const int32_t *, float *,
                 int32_t *, char *, size_t);
  int (*forward_sampled)(mqb_model *, int32_t, const int32_t *, const int32_t *, const int32_t *, const int32_t *,
                         const float *, const uint64_t *, int32_t *, float *, char *, size_t);
  int (*logits_all)(mqb_model *, const int32_t *, int32_t, float *, char *, size_t);
  void (*slot_reset)(mqb_model *, int32_t);
  int (*routing)(mqb_model *, uint64_t *, int64_t, int32_t *, int32_t *, char *, size_t);
  int (*set_images)(mqb_model *, int32_t, const float *, int64_t, const int32_t *, int32_t, const int32_t *, int32_t,
                    char *, size_t);
  int64_t (*vision_ns)(mqb_model *, int32_t);
  const char *const *(*families)(void);
};

std::string exe_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  std::string s(buf);
  size_t slash = s.rfind('/');
  return slash == std::string::npos ? "" : s.substr(0, slash);
}

void *open_lib(std::string *tried) {
  std::vector<std::string> cands;
  if (const char *env = getenv("MODELQUAL_CUDA_LIB"))
    if (*env) cands.push_back(env);
  std::string d = exe_dir();
  if (!d.empty()) cands.push_back(d + "/" + kLib);
  cands.push_back(kLib);
  for (auto &c : cands) {
    dlerror();
    void *h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    const char *e = dlerror();
    *tried += std::string(tried->empty() ? "" : "; ") + (e ? e : (c + ": unknown error").c_str());
  }
  return nullptr;
}

class Cuda : public Backend {
 public:
  Cuda(const mq_engine_params &p, const Family &family, const HParams &hp, int max_batch, int max_context) {
    std::string tried;
    lib_ = open_lib(&tried);
    if (!lib_)
      throw Error(MQ_ERR_LOAD, std::string("device cuda: cannot load ") + kLib + ": " + tried +
                                   "; build it with make cuda (or set MODELQUAL_CUDA_LIB to its path)");
    sym(api_.abi_version, "mqb_abi_version");
    sym(api_.model_open, "mqb_model_open");
    sym(api_.model_close, "mqb_model_close");
    sym(api_.vocab_size, "mqb_vocab_size");
    sym(api_.forward, "mqb_forward");
    sym(api_.forward_sampled, "mqb_forward_sampled");
    sym(api_.logits_all, "mqb_logits_all");
    sym(api_.slot_reset, "mqb_slot_reset");
    sym(api_.set_images, "mqb_set_images");
    sym(api_.vision_ns, "mqb_vision_ns");
    sym(api_.families, "mqb_families");
    // Optional (a library built before it serves no routing counts).
    api_.routing = reinterpret_cast<decltype(api_.routing)>(dlsym(lib_, "mqb_routing"));
    int32_t v = api_.abi_version();
    if (v != MQB_ABI_VERSION)
      throw Error(MQ_ERR_LOAD, "device cuda: " + std::string(kLib) + " speaks backend ABI " + std::to_string(v) +
                                   ", this runtime speaks " + std::to_string(MQB_ABI_VERSION) + "; rebuild it with make cuda");
    std::string known;
    bool supported = false;
    for (const char *const *f = api_.families(); f && *f; f++) {
      supported = supported || family.name == *f;
      known += (known.empty() ? "" : ", ") + std::string(*f);
    }
    if (!supported)
      throw Error(MQ_ERR_LOAD, "device cuda: family " + family.name + " has no CUDA implementation in " + kLib +
                                   " (it has: " + known + "); serve it with --device cpu");
    std::vector<mqb_tensor> ts(p.n_tensors);
    for (int i = 0; i < p.n_tensors; i++) {
      ts[i].name = p.tensors[i].name;
      ts[i].data = p.tensors[i].data;
      ts[i].dtype = p.tensors[i].dtype;  // mq_dtype and mqb_dtype share their values
      std::memcpy(ts[i].shape, p.tensors[i].shape, sizeof(ts[i].shape));
      ts[i].ndim = p.tensors[i].ndim;
    }
    // The backend reads the family's resolved hyper-parameters, never config.json.
    std::vector<mqb_hparam> hps;
    for (const auto &kv : hp.numbers()) hps.push_back(mqb_hparam{kv.first.c_str(), kv.second, nullptr});
    for (const auto &kv : hp.strings()) hps.push_back(mqb_hparam{kv.first.c_str(), 0, kv.second.c_str()});
    mqb_model_params mp;
    std::memset(&mp, 0, sizeof(mp));
    mp.abi_version = MQB_ABI_VERSION;
    mp.family = family.name.c_str();
    mp.hparams = hps.data();
    mp.n_hparams = (int32_t)hps.size();
    mp.precision = p.precision ? p.precision : "fp32";
    mp.max_batch = max_batch;
    mp.max_context = max_context;
    mp.device_index = p.device_index;
    mp.tensors = ts.data();
    mp.n_tensors = (int32_t)ts.size();
    char err[1024] = {0};
    if (api_.model_open(&mp, &model_, err, sizeof(err)) != 0 || !model_)
      throw Error(MQ_ERR_LOAD, std::string("device cuda: model open failed: ") + err);
    vocab_ = api_.vocab_size(model_);
    max_batch_ = max_batch;
  }

  ~Cuda() override {
    if (model_) api_.model_close(model_);
    // The library is left loaded: CUDA runtimes do not support being unloaded and reloaded.
  }

  int vocab() const override { return vocab_; }
  std::string device() const override { return "cuda"; }

  void forward(const Batch &b, float *logits, int32_t *argmax) override {
    args(b);
    char err[1024] = {0};
    if (api_.forward(model_, b.n, slots_.data(), ntok_.data(), b.tokens.data(), pos_.data(), logits, argmax, err,
                     sizeof(err)) != 0)
      throw Error(MQ_ERR_BACKEND, std::string("device cuda: ") + err);
  }

  bool samples_on_device() const override { return true; }

  void forward_sampled(const Batch &b, const float *temperature, const uint64_t *rng_key, int32_t *out,
                       float *logits) override {
    args(b);
    char err[1024] = {0};
    if (api_.forward_sampled(model_, b.n, slots_.data(), ntok_.data(), b.tokens.data(), pos_.data(), temperature,
                             rng_key, out, logits, err, sizeof(err)) != 0)
      throw Error(MQ_ERR_BACKEND, std::string("device cuda: ") + err);
  }

  void logits_all(const int32_t *ids, int n, int slot, float *out) override {
    (void)slot;  // the backend keeps its own scratch slot
    char err[1024] = {0};
    if (api_.logits_all(model_, ids, n, out, err, sizeof(err)) != 0)
      throw Error(MQ_ERR_BACKEND, std::string("device cuda: ") + err);
  }

  // routing_counts: a mixture of experts' routing counts, from the library's mqb_routing.
  int routing_counts(std::vector<uint64_t> *out, int *layers) const override {
    if (!api_.routing) return 0;
    int32_t nl = 0, ne = 0;
    char err[1024] = {0};
    if (api_.routing(model_, nullptr, 0, &nl, &ne, err, sizeof(err)) != 0 || ne == 0) return 0;
    out->assign((size_t)nl * ne, 0);
    if (api_.routing(model_, out->data(), (int64_t)out->size(), &nl, &ne, err, sizeof(err)) != 0)
      throw Error(MQ_ERR_BACKEND, std::string("device cuda: ") + err);
    *layers = nl;
    return ne;
  }

  // reset_slot: slot max_batch is the engine's scratch slot (mq_engine_logits_image), which is
  // the backend's too.
  void reset_slot(int slot) override {
    if (slot >= 0 && slot <= max_batch_) api_.slot_reset(model_, slot);
  }

  // set_image hands a vision family's images, each with its grid, to the backend (ABI 6), which
  // runs the tower; a family that takes its images stacked in one grid refuses a list there.
  void set_image(int slot, std::shared_ptr<const ImageInput> img, const int32_t *prompt, int n) override {
    std::vector<int32_t> grids;
    for (const ImageInput::Grid &g : img->images) grids.insert(grids.end(), {g.t, g.h, g.w});
    if (grids.empty()) grids = {img->grid_t, img->grid_h, img->grid_w};
    char err[1024] = {0};
    if (api_.set_images(model_, slot, img->pixels.data(), (int64_t)img->pixels.size(), grids.data(),
                        (int32_t)(grids.size() / 3), prompt, n, err, sizeof(err)) != 0)
      throw Error(MQ_ERR_INVALID_ARGUMENT, std::string("device cuda: ") + err);
  }
  bool several_images() const override { return true; }

  // vision_ns: the device time of the slot's tower and projector (mqb_vision_ns: events around
  // the encode, read after the prefill's synchronisation).
  int64_t vision_ns(int slot) const override {
    return slot >= 0 && slot <= max_batch_ ? api_.vision_ns(model_, slot) : 0;
  }

 private:
  // args copies the batch's int vectors into the ABI's int32 arrays (member scratch: a decode
  // step allocates nothing here once the vectors have grown).
  void args(const Batch &b) {
    slots_.assign(b.slot.begin(), b.slot.end());
    ntok_.assign(b.ntok.begin(), b.ntok.end());
    pos_.assign(b.pos.begin(), b.pos.end());
  }
  template <typename F>
  void sym(F &f, const char *name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
    if (!f)
      throw Error(MQ_ERR_LOAD, std::string("device cuda: ") + kLib + " lacks symbol " + name +
                                   "; rebuild it with make cuda");
  }
  void *lib_ = nullptr;
  Api api_{};
  mqb_model *model_ = nullptr;
  int vocab_ = 0;
  int max_batch_ = 0;
  std::vector<int32_t> slots_, ntok_, pos_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda(const mq_engine_params &p, const Family &family, const HParams &hp, int n_slots,
                                   int max_context) {
  if (family.task == "image") {  // text-to-image: the family's pipeline through the library's mqb_image_* entry points
    if (!family.cuda_image)
      throw Error(MQ_ERR_LOAD, "device cuda: family " + family.name + " has no CUDA implementation; serve it with --device cpu");
    std::string tried;
    void *lib = open_lib(&tried);
    if (!lib)
      throw Error(MQ_ERR_LOAD, std::string("device cuda: cannot load ") + kLib + ": " + tried +
                                   "; build it with make cuda (or set MODELQUAL_CUDA_LIB to its path)");
    return family.cuda_image(lib, p, hp, max_context);
  }
  return std::unique_ptr<Backend>(new Cuda(p, family, hp, n_slots, max_context));
}

}  // namespace mq
