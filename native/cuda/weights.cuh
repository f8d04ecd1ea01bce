// weights.cuh: the bundle's tensors by name (TensorMap) and their upload at the compute
// precision (rows of several tensors concatenated into one matrix where a product fuses them).
#pragma once
#include "model.cuh"

namespace mqcuda {

// ---------------------------------------------------------------------------------------------
// Loading

struct TensorMap {
  std::map<std::string, const mqb_tensor *> by;
  explicit TensorMap(const mqb_tensor *t, int n) {
    for (int i = 0; i < n; ++i) {
      if (!t[i].name) continue;
      std::string s = t[i].name;
      for (const char *pre : {"transformer.", "model."}) {
        size_t pl = strlen(pre);
        if (s.compare(0, pl, pre) == 0) {
          s = s.substr(pl);
          break;
        }
      }
      by[s] = &t[i];
    }
  }
  const mqb_tensor *find(const std::string &n) const {
    auto it = by.find(n);
    return it == by.end() ? nullptr : it->second;
  }
  const mqb_tensor *need(const std::string &n, std::vector<int64_t> shape) const {
    const mqb_tensor *t = find(n);
    if (!t) throw Fail(fmt("cuda backend: tensor %s is missing", n.c_str()));
    bool ok = t->ndim == (int)shape.size() && t->data;
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = t->shape[i] == shape[i];
    if (!ok) {
      std::string want, got;
      for (auto s : shape) want += fmt("%lld,", (long long)s);
      for (int i = 0; i < t->ndim && i < 4; ++i) got += fmt("%lld,", (long long)t->shape[i]);
      throw Fail(fmt("cuda backend: tensor %s has shape [%s], want [%s]%s", n.c_str(), got.c_str(), want.c_str(),
                     t->data ? "" : " (no data)"));
    }
    return t;
  }
};

// Part is a block of output rows of a fused weight: rows [0, n) of src, which is [n, K] (an
// nn.Linear weight) or, when transposed, [K, n] (a GPT-2 Conv1D weight).
struct Part {
  const mqb_tensor *src;
  int64_t n;
  bool transposed;
};

inline void *upload_matrix(mqb_model &m, const std::vector<Part> &parts, int64_t K) {
  int64_t N = 0;
  for (auto &p : parts) N += p.n;
  const size_t es = dt_size(m.dt);
  std::vector<unsigned char> host((size_t)N * K * es);
  int64_t r0 = 0;
  for (const auto &p : parts) {
    unsigned char *dst = host.data() + (size_t)r0 * K * es;
    const DType dt = m.dt;
    const int32_t sdt = p.src->dtype;
    const void *src = p.src->data;
    if (!p.transposed && same_dtype(sdt, dt)) {  // stored at the compute precision: copy rows
      memcpy(dst, src, (size_t)p.n * K * es);
      r0 += p.n;
      continue;
    }
    parallel_for(p.n, [&, dst, dt, sdt, src](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        for (int64_t k = 0; k < K; ++k) {
          const float v = elem(src, sdt, p.transposed ? k * p.n + r : r * K + k);
          const size_t idx = (size_t)r * K + k;
          if (dt == DT_F32) memcpy(dst + idx * 4, &v, 4);
          else {
            uint16_t h = dt == DT_BF16 ? f2bf(v) : f2h(v);
            memcpy(dst + idx * 2, &h, 2);
          }
        }
      }
    });
    r0 += p.n;
  }
  void *d = m.dmalloc(host.size());
  ck(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice), "weight upload");
  return d;
}

inline float *upload_f32(mqb_model &m, const std::vector<const mqb_tensor *> &parts) {
  std::vector<float> host;
  for (auto *t : parts) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
    for (int64_t i = 0; i < n; ++i) host.push_back(elem(t->data, t->dtype, i));
  }
  float *d = static_cast<float *>(m.dmalloc(host.size() * sizeof(float)));
  ck(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return d;
}

}  // namespace mqcuda
