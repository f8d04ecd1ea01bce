// qk_same_bytes.cc: img::qk_k of two source trees on the CPU emulation (native/cuda/host_test),
// the same bytes expected: for qk_units.patch, which changes how head-dim-128 units are loaded and
// grouped but not their arithmetic (the tiny fixtures' heads are 16 and 32 wide, so their images
// do not reach that path). Cases: head dims 128 and 64, with and without the norms, GQA, row
// counts off the 4-unit groups. Build once per tree (TREE: a folder holding native/ of that tree)
// from the repository root, run both, compare:
//   g++ -std=c++20 -O1 -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I$TREE -I. -Inative/cuda/stub \
//     -Inative/include -x c++ lab/cuda/results/gpu_2026-12-08a_h100/qk_same_bytes.cc native/cuda/blas_pick.cc -o t -pthread
//   ./t > out.bin            # then cmp the two trees' out.bin
// Result (2026-12-08): the same 251,904 bytes; with the store of the lane's second pair taken
// from its first (a planted defect), 72,947 bytes differ.
#include "native/cuda/host_test/emu_cuda.h"
#include <cstdio>
#include <vector>
#include <random>
#include "native/cuda/ops/image_attention.cuh"
float __shfl_xor_sync(unsigned m, float v, int o, int) { return __shfl_xor_sync(m, v, o); }
using namespace mqcuda::img;
int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.5f);
  struct C { int rows, H, Hkv, hd; bool norm; };
  const C cases[] = {{37, 4, 4, 128, true}, {37, 4, 2, 128, true}, {5, 3, 1, 128, false}, {29, 2, 2, 64, true}, {11, 6, 3, 128, true}};
  for (const C &c : cases) {
    const int heads = c.H + 2 * c.Hkv, ld = heads * c.hd + 8, half = c.hd / 2;
    std::vector<bf16> qkv((size_t)c.rows * ld), q((size_t)c.rows * c.H * c.hd), k((size_t)c.rows * c.Hkv * c.hd), v(k.size());
    for (auto &x : qkv) x = __float2bfloat16(nd(rng));
    std::vector<float> nq(c.hd), nk(c.hd), cs((size_t)c.rows * half), sn(cs.size());
    for (auto &x : nq) x = 1.f + 0.1f * nd(rng);
    for (auto &x : nk) x = 1.f + 0.1f * nd(rng);
    for (size_t i = 0; i < cs.size(); i++) { const float a = 0.37f * i; cs[i] = cosf(a), sn[i] = sinf(a); }
    KL(qk_k, qk_blocks(c.rows, c.H, c.Hkv), 256, 0, 0)(qkv.data(), c.rows, ld, c.H, c.Hkv, c.hd, c.norm ? nq.data() : nullptr,
                                                    c.norm ? nk.data() : nullptr, 1e-6f, cs.data(), sn.data(), q.data(), k.data(), v.data());
    fwrite(q.data(), 2, q.size(), stdout), fwrite(k.data(), 2, k.size(), stdout), fwrite(v.data(), 2, v.size(), stdout);
  }
  return 0;
}
