// emu_flash.h: flash_products, the CPU emulation's check of img::flash_attention (included by
// emu_test.cc after its helpers: check, the bf16 rounding and the random inputs).
#pragma once

// flash_products checks img::flash_attention (flash_attn.cuh) against a double-precision
// reference of softmax(scale q k^T (+ causal mask)) v over the same bf16 inputs: L and Lk not
// multiples of the 16 * NW query or 64-key tiles, GQA (two query heads a KV head), causal and
// not, head dims 64, 128 and two padded ones (72 -> 80, 96), rows strided as the vision towers'
// fused q|k|v rows. Keys grow along the sequence and the scale is up to 1, so the row maxima move
// from tile to tile (a wrong running-max rescale shows). The output's other columns hold NaNs that
// must survive; an unsupported head dim must be refused. Bound: bf16 rounding of P and of the
// output (|o| <= 1): 1e-2.
static void flash_products() {
  using img::bf16;
  // variant: 0 the API's choice; else a block shape lab/cuda/flash_check.sh times (fa::launch<D,
  // NW, MT, BK>): 1 <128, 4, 2, 64>, 2 <128, 4, 2, 32>, 3 <64, 4, 2, 32>.
  struct Case { int L, Lk, H, Hkv, hd; bool causal; float scale; bool fused; int variant; };
  const Case cases[] = {{37, 100, 4, 2, 64, false, 0.5f, false, 0},  {150, 150, 2, 1, 128, true, 1.0f, false, 0},
                        {90, 90, 2, 2, 128, false, 0.125f, true, 0}, {130, 130, 2, 1, 64, true, 0.6f, false, 0},
                        {20, 75, 2, 2, 72, false, 0.4f, false, 0},   {33, 33, 1, 1, 96, true, 0.3f, true, 0},
                        {150, 150, 2, 1, 128, true, 1.0f, false, 1}, {150, 100, 2, 1, 128, false, 1.0f, false, 2},
                        {150, 150, 2, 1, 64, true, 1.0f, false, 3}};
  typedef bool (*Launch)(const bf16 *, int, const bf16 *, const bf16 *, int, bf16 *, int, int, int, int, int, int,
                         float, bool, cudaStream_t, int, long long, long long, long long);
  const Launch variants[] = {nullptr, img::fa::launch<128, 4, 2>, img::fa::launch<128, 4, 2, 32>,
                             img::fa::launch<64, 4, 2, 32>};
  std::mt19937 r(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Case &c : cases) {
    const int qw = c.H * c.hd, kw = c.Hkv * c.hd;
    // fused: one buffer of rows q|k|v (stride qw + 2 kw, as vit_attention); else three, and the
    // output's rows 8 elements wider than its heads.
    const int ldq = c.fused ? qw + 2 * kw : qw, ldkv = c.fused ? qw + 2 * kw : kw, ldo = qw + 8;
    std::vector<bf16> qb((size_t)c.L * ldq), kb, vb;
    const bf16 *q, *k, *v;
    if (c.fused) {
      for (auto &x : qb) x = __float2bfloat16(u(r));
      for (int j = 0; j < c.L; ++j)
        for (int e = 0; e < kw; ++e) {  // keys grow along the sequence
          bf16 &x = qb[(size_t)j * ldq + qw + e];
          x = __float2bfloat16(__bfloat162float(x) * (0.5f + 2.f * j / c.Lk));
        }
      q = qb.data(), k = q + qw, v = q + qw + kw;
    } else {
      kb.resize((size_t)c.Lk * kw), vb.resize(kb.size());
      for (auto &x : qb) x = __float2bfloat16(u(r));
      for (size_t i = 0; i < kb.size(); ++i) {
        kb[i] = __float2bfloat16(u(r) * (0.5f + 2.f * (float)(i / kw) / c.Lk));
        vb[i] = __float2bfloat16(u(r));
      }
      q = qb.data(), k = kb.data(), v = vb.data();
    }
    std::vector<bf16> out((size_t)c.L * ldo, __float2bfloat16(NAN));
    const bool ran = c.variant ? variants[c.variant](q, ldq, k, v, ldkv, out.data(), ldo, c.L, c.Lk, c.H, c.H / c.Hkv,
                                                     c.hd, c.scale, c.causal, nullptr, 1, 0, 0, 0)
                               : img::flash_attention(q, ldq, k, v, ldkv, out.data(), ldo, c.L, c.Lk, c.H, c.Hkv, c.hd,
                                                      c.scale, c.causal, nullptr);
    double worst = 0;
    bool others = true;
    for (int i = 0; i < c.L; ++i) {
      for (int e = qw; e < ldo; ++e) others = others && std::isnan(__bfloat162float(out[(size_t)i * ldo + e]));
      for (int h = 0; h < c.H; ++h) {
        const int g = h / (c.H / c.Hkv), lim = c.causal ? std::min(i + 1, c.Lk) : c.Lk;
        std::vector<double> sc(lim);
        double mx = -1e300, l = 0;
        for (int j = 0; j < lim; ++j) {
          double d = 0;
          for (int e = 0; e < c.hd; ++e)
            d += (double)__bfloat162float(q[(size_t)i * ldq + h * c.hd + e]) *
                 __bfloat162float(k[(size_t)j * ldkv + g * c.hd + e]);
          sc[j] = d * c.scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto &x : sc) l += (x = std::exp(x - mx));
        for (int e = 0; e < c.hd; ++e) {
          double ref = 0;
          for (int j = 0; j < lim; ++j) ref += sc[j] * __bfloat162float(v[(size_t)j * ldkv + g * c.hd + e]);
          const double got = __bfloat162float(out[(size_t)i * ldo + h * c.hd + e]);
          worst = std::isfinite(got) ? std::max(worst, std::fabs(got - ref / l)) : INFINITY;
        }
      }
    }
    char what[200];
    const char *vname[] = {"", " (fa::launch<128, 4, 2>)", " (fa::launch<128, 4, 2, 32>)", " (fa::launch<64, 4, 2, 32>)"};
    snprintf(what, sizeof what, "flash_attention%s L %d Lk %d heads %d/%d hd %d%s%s: largest error %.5f (bound 1e-2)%s",
             vname[c.variant], c.L, c.Lk, c.H, c.Hkv, c.hd, c.causal ? " causal" : "", c.fused ? " fused rows" : "",
             worst, others ? "" : ", columns past the heads written");
    check(ran && worst <= 1e-2 && others, what);
  }
  // A batch of three items (vision tiles: fused rows, item strides) in one launch must give each
  // item the bits of its own call.
  {
    const int L = 40, H = 2, hd = 64, ld = 3 * H * hd, B = 3;
    std::vector<bf16> x((size_t)B * L * ld), one((size_t)B * L * H * hd), all(one.size());
    for (auto &e : x) e = __float2bfloat16(u(r));
    bool ran = img::flash_attention_batched(x.data(), ld, x.data() + H * hd, x.data() + 2 * H * hd, ld, all.data(),
                                            H * hd, L, L, H, H, hd, 0.5f, false, nullptr, B, (long long)L * ld,
                                            (long long)L * ld, (long long)L * H * hd);
    for (int b = 0; b < B; ++b) {
      const bf16 *q = x.data() + (size_t)b * L * ld;
      ran = ran && img::flash_attention(q, ld, q + H * hd, q + 2 * H * hd, ld, one.data() + (size_t)b * L * H * hd,
                                        H * hd, L, L, H, H, hd, 0.5f, false, nullptr);
    }
    check(ran && memcmp(one.data(), all.data(), one.size() * sizeof(bf16)) == 0,
          "flash_attention_batched: 3 items in one launch, each the bits of its own call");
  }
  bf16 dummy[16] = {};
  check(!img::flash_attention(dummy, 60, dummy, dummy, 60, dummy, 60, 1, 1, 1, 1, 60, 1.f, false, nullptr) &&
            !img::flash_attention(dummy, 136, dummy, dummy, 136, dummy, 136, 1, 1, 1, 1, 136, 1.f, false, nullptr),
        "flash_attention refuses head dims 60 and 136");
}
