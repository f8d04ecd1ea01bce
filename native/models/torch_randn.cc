// models/torch_randn.cc: seeded Gaussian noise identical to torch's CPU generator, shared by the
// diffusion pipelines (every text-to-image family draws its initial latents here).
//
// Why: a diffusion pipeline's image is a function of its initial latents, and diffusers draws
// them with torch.Generator("cpu").manual_seed(seed) then torch.randn(shape) (randn_tensor).
// Unless the same seed gives the same numbers here, no image can match the reference by seed.
//
// What torch does (ATen's CPUGeneratorImpl, DistributionsHelper.h, cpu/DistributionTemplates.h):
//  - the engine is MT19937 seeded with the seed's low 32 bits (the standard initialisation);
//  - a float uniform is (next() & (2^24 - 1)) * 2^-24; a double uniform takes two draws,
//    hi << 32 | lo, and keeps the low 53 bits times 2^-53;
//  - randn of a contiguous float tensor with n >= 16 first fills all n uniforms, then turns each
//    full block of 16 into normals by Box-Muller (u1 = 1 - x[j], u2 = x[j+8], r = sqrt(-2 log u1),
//    theta = float(2 pi u2); x[j] = r cos theta, x[j+8] = r sin theta); when n is not a multiple
//    of 16 the last 16 values are redrawn (16 new uniforms) and transformed again;
//  - below 16 elements each value is a double Box-Muller draw (u1, u2 doubles,
//    r = sqrt(-2 log1p(-u2)), cos(2 pi u1) returned, r sin(2 pi u1) cached for the next value),
//    cast to float.
// randn in bfloat16 (a pipeline whose latents take a bf16 text encoder's dtype draws this) is
// another stream: the uniform keeps the low 8 bits of each draw (numeric_limits<BFloat16>::digits)
// where float keeps 24, and Box-Muller runs in BFloat16 arithmetic (normal_fill<BFloat16>: each
// operation on floats, its result rounded to bfloat16 to nearest even; theta is computed in double
// and rounded). Its values are unrelated to the float stream of the same seed.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime.h"

namespace mq {
namespace {

// MT19937 (Matsumoto & Nishimura 1998), the generator of std::mt19937 and of torch's CPU
// generator, written out so the stream does not depend on the C++ library.
class MT19937 {
 public:
  explicit MT19937(uint32_t seed) {
    s_[0] = seed;
    for (int i = 1; i < N; i++) s_[i] = 1812433253u * (s_[i - 1] ^ (s_[i - 1] >> 30)) + (uint32_t)i;
  }
  uint32_t next() {
    if (i_ >= N) twist();
    uint32_t y = s_[i_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
  }

 private:
  static constexpr int N = 624, M = 397;
  void twist() {
    for (int k = 0; k < N; k++) {
      uint32_t y = (s_[k] & 0x80000000u) | (s_[(k + 1) % N] & 0x7fffffffu);
      s_[k] = s_[(k + M) % N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    i_ = 0;
  }
  uint32_t s_[N];
  int i_ = N;
};

float uniform_f32(MT19937 &g) { return (float)(g.next() & 0xffffffu) * (1.0f / 16777216.0f); }

double uniform_f64(MT19937 &g) {
  uint64_t hi = g.next(), lo = g.next();
  uint64_t v = (hi << 32) | lo;
  return (double)(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

void box_muller_16(float *x) {
  const double two_pi = 2.0 * 3.14159265358979323846;
  for (int j = 0; j < 8; j++) {
    const float u1 = 1.0f - x[j];
    const float u2 = x[j + 8];
    const float r = std::sqrt(-2.0f * std::log(u1));
    const float theta = (float)(two_pi * (double)u2);
    x[j] = r * std::cos(theta) + 0.0f;  // torch's fma(.., std, mean): -0 becomes +0
    x[j + 8] = r * std::sin(theta) + 0.0f;
  }
}

// bf16 rounds a float to the nearest bfloat16, ties to even (c10::BFloat16's constructor).
float bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

void box_muller_16_bf16(float *x) {
  const double two_pi = 2.0 * 3.14159265358979323846;
  for (int j = 0; j < 8; j++) {
    const float u1 = bf16(1.0f - x[j]);
    const float u2 = x[j + 8];
    const float r = bf16(std::sqrt(bf16(-2.0f * bf16(std::log(u1)))));
    const float theta = bf16((float)(two_pi * (double)u2));
    // "* std + mean" (1 and 0): the + 0 turns a -0 (u1 == 1 gives r == -0) into torch's +0
    x[j] = bf16(r * bf16(std::cos(theta))) + 0.0f;
    x[j + 8] = bf16(r * bf16(std::sin(theta))) + 0.0f;
  }
}

// randn is both streams: bf16 selects the bfloat16 one (8-bit uniforms, bf16 Box-Muller, bf16
// casts) over the float one.
void randn(uint64_t seed, float *out, int64_t n, bool bf) {
  MT19937 g((uint32_t)(seed & 0xffffffffu));
  if (n <= 0) return;
  auto cast = [bf](double v) { return bf ? bf16((float)v) : (float)v; };
  if (n < 16) {  // at::normal_distribution<double>, cast
    const double two_pi = 2.0 * 3.14159265358979323846;
    bool cached = false;
    double spare = 0;
    for (int64_t i = 0; i < n; i++) {
      if (cached) {
        out[i] = cast(spare);
        cached = false;
        continue;
      }
      const double u1 = uniform_f64(g), u2 = uniform_f64(g);
      const double r = std::sqrt(-2.0 * std::log1p(-u2));
      spare = r * std::sin(two_pi * u1);
      cached = true;
      out[i] = cast(r * std::cos(two_pi * u1));
    }
    return;
  }
  auto uniform = [&g, bf] { return bf ? (float)(g.next() & 0xffu) * (1.0f / 256.0f) : uniform_f32(g); };
  auto fill16 = [bf](float *x) { bf ? box_muller_16_bf16(x) : box_muller_16(x); };
  for (int64_t i = 0; i < n; i++) out[i] = uniform();
  for (int64_t i = 0; i + 16 <= n; i += 16) fill16(out + i);
  if (n % 16 != 0) {
    float *tail = out + n - 16;
    for (int j = 0; j < 16; j++) tail[j] = uniform();
    fill16(tail);
  }
}

}  // namespace

void torch_randn(uint64_t seed, float *out, int64_t n) { randn(seed, out, n, false); }

void torch_randn_bf16(uint64_t seed, float *out, int64_t n) { randn(seed, out, n, true); }

}  // namespace mq

extern "C" MQ_API mq_status mq_torch_randn_bf16(uint64_t seed, float *out, int64_t n) {
  if (n < 0 || (n > 0 && !out)) return MQ_ERR_INVALID_ARGUMENT;
  mq::torch_randn_bf16(seed, out, n);
  return MQ_OK;
}

extern "C" MQ_API mq_status mq_torch_randn(uint64_t seed, float *out, int64_t n) {
  if (n < 0 || (n > 0 && !out)) return MQ_ERR_INVALID_ARGUMENT;
  mq::torch_randn(seed, out, n);
  return MQ_OK;
}
