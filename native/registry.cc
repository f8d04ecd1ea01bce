// registry.cc: the family registry, the typed view of config.json (Config), resolved
// hyper-parameters (HParams) and the registry's C ABI (mq_family_*).
//
// Why a registry: a family is one file, native/models/<family>.cc, that registers itself at
// start-up, as Ollama's model.Register and llama.cpp's architecture table do; the engine, the
// Go binding and the bundle format name no family.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "runtime.h"

namespace mq {

// ---- registry ---------------------------------------------------------------------------------

static std::vector<Family> &registry() {
  static std::vector<Family> r;  // function-local: safe whatever the static initialisation order
  return r;
}

bool register_family(Family f) {
  registry().push_back(std::move(f));
  return true;
}

// check_registry refuses two registrations of one name or architecture, once, on first use.
static void check_registry() {
  static bool checked = false;
  if (checked) return;
  std::set<std::string> names, archs;
  for (const Family &f : registry()) {
    if (!names.insert(f.name).second)
      throw Error(MQ_ERR_INTERNAL, "family \"" + f.name + "\" is registered twice (two native/models files?)");
    for (const std::string &a : f.architectures)
      if (!archs.insert(a).second)
        throw Error(MQ_ERR_INTERNAL, "architecture \"" + a + "\" is registered by two families");
    if (!f.resolve || !f.make) throw Error(MQ_ERR_INTERNAL, "family \"" + f.name + "\" registered without resolve or make");
  }
  checked = true;
}

const std::vector<Family> &families() {
  check_registry();
  return registry();
}

const Family &find_family(const std::string &name) {
  std::string known;
  for (const Family &f : families()) {
    if (f.name == name) return f;
    known += (known.empty() ? "" : ", ") + f.name;
  }
  throw Error(MQ_ERR_LOAD, "family \"" + name + "\" has no native model; known: " + known +
                               " (a family registers itself in native/models/<family>.cc)");
}

bool fault(const std::string &name) {
  const char *env = getenv("MODELQUAL_FAULTS");
  if (!env) return false;
  std::stringstream ss(env);
  std::string f;
  while (std::getline(ss, f, ',')) {
    f.erase(0, f.find_first_not_of(" \t"));
    f.erase(f.find_last_not_of(" \t") + 1);
    if (f == name) return true;
  }
  return false;
}

// ---- Config -----------------------------------------------------------------------------------

Config::Config(const mq_kv *kv, int n) {
  auto m = std::make_shared<std::map<std::string, Value>>();
  for (int i = 0; i < n; i++) {
    if (!kv[i].key) continue;
    Value v;
    v.type = kv[i].type;
    v.number = kv[i].number;
    if (kv[i].string) v.str = kv[i].string;
    if (v.type == MQ_KV_NUMBERS && kv[i].numbers) v.numbers.assign(kv[i].numbers, kv[i].numbers + kv[i].n);
    if (v.type == MQ_KV_STRINGS && kv[i].strings)
      for (int j = 0; j < kv[i].n; j++) v.strings.push_back(kv[i].strings[j] ? kv[i].strings[j] : "");
    (*m)[kv[i].key] = std::move(v);
  }
  kv_ = m;
}

Config Config::sub(const std::string &prefix) const {
  Config c = *this;
  c.prefix_ = prefix_ + prefix + ".";
  return c;
}

const Config::Value *Config::find(const std::string &key) const {
  auto it = kv_->find(prefix_ + key);
  if (it == kv_->end() || it->second.type == MQ_KV_NULL) return nullptr;
  return &it->second;
}

void Config::fail(const std::string &key, const std::string &want) const {
  throw Error(MQ_ERR_LOAD, "config.json: " + prefix_ + key + " " + want);
}

bool Config::has(const std::string &key) const { return find(key) != nullptr; }

double Config::number(const std::string &key) const {
  const Value *v = find(key);
  if (!v) fail(key, "is missing");
  if (v->type != MQ_KV_NUMBER) fail(key, "must be a number");
  return v->number;
}

double Config::number(const std::string &key, double dflt) const { return has(key) ? number(key) : dflt; }

int64_t Config::integer(const std::string &key) const {
  double d = number(key);
  if (d != std::floor(d) || std::fabs(d) > 9e15) fail(key, "must be an integer");
  return (int64_t)d;
}

int64_t Config::integer(const std::string &key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }

int64_t Config::positive(const std::string &key) const {
  int64_t v = integer(key);
  if (v <= 0) fail(key, "is " + std::to_string(v) + ", want a positive integer");
  return v;
}

bool Config::boolean(const std::string &key, bool dflt) const {
  const Value *v = find(key);
  if (!v) return dflt;
  if (v->type != MQ_KV_BOOL) fail(key, "must be true or false");
  return v->number != 0;
}

std::string Config::string(const std::string &key) const {
  const Value *v = find(key);
  if (!v) fail(key, "is missing");
  if (v->type != MQ_KV_STRING) fail(key, "must be a string");
  return v->str;
}

std::string Config::string(const std::string &key, const std::string &dflt) const {
  return has(key) ? string(key) : dflt;
}

std::vector<double> Config::numbers(const std::string &key) const {
  const Value *v = find(key);
  if (!v) fail(key, "is missing");
  if (v->type != MQ_KV_NUMBERS) fail(key, "must be a list of numbers");
  return v->numbers;
}

std::vector<std::string> Config::strings(const std::string &key) const {
  const Value *v = find(key);
  if (!v) fail(key, "is missing");
  if (v->type != MQ_KV_STRINGS) fail(key, "must be a list of strings");
  return v->strings;
}

double Config::first_number(const std::vector<std::string> &keys, double dflt) const {
  for (const std::string &k : keys)
    if (has(k)) return number(k);
  return dflt;
}

DecoderDims::DecoderDims(const HParams &hp)
    : vocab_size(hp.i("vocab_size")), hidden_size(hp.i("hidden_size")), num_layers(hp.i("num_layers")),
      num_heads(hp.i("num_heads")), num_kv_heads(hp.i("num_kv_heads")), head_dim(hp.i("head_dim")),
      intermediate_size(hp.i("intermediate_size")), max_positions(hp.i("max_positions")),
      norm_eps((float)hp.f("norm_eps")), rope_theta(hp.f("rope_theta")), tie_word_embeddings(hp.b("tie_word_embeddings")),
      attention_bias(hp.b("attention_bias")), scale_attn_by_inverse_layer_idx(hp.b("scale_attn_by_inverse_layer_idx")) {}

// ---- HParams ----------------------------------------------------------------------------------

double HParams::f(const std::string &key) const {
  auto it = num_.find(key);
  if (it == num_.end()) throw Error(MQ_ERR_INTERNAL, "hyper-parameter " + key + " was not resolved by the family");
  return it->second;
}

int HParams::i(const std::string &key) const { return (int)f(key); }

int64_t HParams::i64(const std::string &key) const { return (int64_t)f(key); }

std::string HParams::s(const std::string &key) const {
  auto it = str_.find(key);
  if (it == str_.end()) throw Error(MQ_ERR_INTERNAL, "hyper-parameter " + key + " was not resolved by the family");
  return it->second;
}

static std::string json_string(const std::string &s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += (char)c;
    } else if (c < 0x20) {
      char b[8];
      snprintf(b, sizeof(b), "\\u%04x", c);
      o += b;
    } else {
      o += (char)c;
    }
  }
  return o + "\"";
}

std::string HParams::json() const {
  std::string o = "{";
  bool first = true;
  for (const auto &kv : num_) {
    char b[64];
    snprintf(b, sizeof(b), "%.17g", kv.second);
    o += (first ? "" : ",") + json_string(kv.first) + ":" + b;
    first = false;
  }
  for (const auto &kv : str_) {
    o += (first ? "" : ",") + json_string(kv.first) + ":" + json_string(kv.second);
    first = false;
  }
  return o + "}";
}

}  // namespace mq

// ---- C ABI ------------------------------------------------------------------------------------

using namespace mq;

extern "C" {

int32_t mq_family_count(void) {
  try {
    return (int32_t)families().size();
  } catch (const std::exception &e) {
    fprintf(stderr, "modelqual: %s\n", e.what());
    return 0;
  }
}

const char *mq_family_info(int32_t i) {
  static std::vector<std::string> infos;  // built once; stable pointers for the process
  static bool built = false;
  if (!built) {
    try {
      for (const Family &f : families()) {
        std::string a = "[";
        for (size_t j = 0; j < f.architectures.size(); j++) a += (j ? "," : "") + json_string(f.architectures[j]);
        infos.push_back("{\"name\":" + json_string(f.name) + ",\"task\":" + json_string(f.task) + ",\"architectures\":" + a + "]}");
      }
    } catch (...) {
    }
    built = true;
  }
  if (i < 0 || i >= (int32_t)infos.size()) return nullptr;
  return infos[i].c_str();
}

}  // extern "C"

// family_json runs what(family, config) for a registered family and hands its JSON to the
// caller in malloc'd memory, or its error: the shared body of the mq_family_* calls that answer
// JSON, without the thread's last-error slot (engine.cc owns it).
static mq_status family_json(const char *family, const mq_kv *config, int32_t n, char **json_out, std::string *err,
                             const std::function<std::string(const Family &, const Config &)> &what) {
  try {
    const Family &f = find_family(family ? family : "");
    std::string j = what(f, Config(config, n));
    char *out = (char *)malloc(j.size() + 1);
    if (!out) throw Error(MQ_ERR_INTERNAL, "out of memory");
    memcpy(out, j.c_str(), j.size() + 1);
    *json_out = out;
    return MQ_OK;
  } catch (const Error &e) {
    *err = e.what();
    return e.status;
  } catch (const std::exception &e) {
    *err = e.what();
    return MQ_ERR_INTERNAL;
  }
}

mq_status mq::resolve_family_json(const char *family, const mq_kv *config, int32_t n, char **json_out,
                                  std::string *err) {
  return family_json(family, config, n, json_out, err, [](const Family &f, const Config &c) {
    HParams hp;
    f.resolve(c, hp);
    return hp.json();
  });
}

std::string mq::TensorLayout::json() const {
  auto strings = [](const std::vector<std::string> &v) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); i++) o += (i ? "," : "") + json_string(v[i]);
    return o + "]";
  };
  std::string o = "{\"tensors\":[";
  for (size_t i = 0; i < reads.size(); i++) {
    o += (i ? "," : "") + std::string("{\"name\":") + json_string(reads[i].name) + ",\"shape\":[";
    for (size_t j = 0; j < reads[i].shape.size(); j++) o += (j ? "," : "") + std::to_string(reads[i].shape[j]);
    o += "]}";
  }
  o += "],\"renames\":[";
  for (size_t i = 0; i < renames.size(); i++)
    o += (i ? "," : "") + std::string("{\"from\":") + json_string(renames[i].first) + ",\"to\":" + json_string(renames[i].second) + "}";
  o += "],\"splits\":[";
  for (size_t i = 0; i < splits.size(); i++)
    o += (i ? "," : "") + std::string("{\"from\":") + json_string(splits[i].first) + ",\"to\":" + strings(splits[i].second) + "}";
  return o + "],\"carried\":" + strings(carried) + ",\"dropped\":" + strings(dropped) + "}";
}

// family_layout_json resolves the family's hyper-parameters, adds its layout rules and runs its
// CPU model constructor over a declaring Weights: what the constructor reads is the layout.
mq_status mq::family_layout_json(const char *family, const mq_kv *config, int32_t n, char **json_out, std::string *err) {
  return family_json(family, config, n, json_out, err, [](const Family &f, const Config &c) {
    HParams hp;
    f.resolve(c, hp);
    TensorLayout l;
    if (f.layout) f.layout(hp, l);
    std::unique_ptr<Weights> w = Weights::declaring(&l);
    ThreadPool pool(1);
    ModelArgs a;
    a.hp = &hp;
    a.max_batch = 1;
    a.n_slots = 2;
    a.max_context = 16;  // what the constructors size by context (KV cache, RoPE tables) stays small
    a.pool = &pool;
    a.w = w.get();
    f.make(a);
    return l.json();
  });
}

extern "C" void mq_free(void *p) { free(p); }
