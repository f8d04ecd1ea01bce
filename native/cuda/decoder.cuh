// decoder.cuh: the shared decoder's forward pass (run_tokens) over a step's tokens: embedding,
// per layer the norm, qkv, q/k post-processing and attention, o_proj, the MLP, then the final
// norm and the LM head with argmax or sampling. The family's Cfg picks the norm, MLP and rotary;
// its hooks (CudaFamily) fill its own rows. Included by backend.cu only.
#pragma once
#include "ops/embed.cuh"
#include "ops/linear.cuh"

namespace mqcuda {

template <typename T>
void prefill_attention(mqb_model &m, const Layer &ly, int ntiles) {
  if constexpr (!std::is_same<T, float>::value) {
    const Cfg &c = m.c;
    auto go = [&](auto kernel) {
      launch(m, kernel, dim3(ntiles, c.nh), dim3(pa::THREADS), 0, (const float *)m.qbuf, (const T *)ly.kc,
             (const T *)ly.vc, (const int *)m.d_pos(), (const int *)m.d_slot(), (const pa::Tile *)m.ptile,
             static_cast<T *>(m.attn), c.nh, c.nkv, m.kv_rows, c.window);
    };
    switch (c.D) {
      case 16: go(pa::prefill_attn_kernel<T, 16>); break;
      case 32: go(pa::prefill_attn_kernel<T, 32>); break;
      case 64: go(pa::prefill_attn_kernel<T, 64>); break;
      default: go(pa::prefill_attn_kernel<T, 128>); break;
    }
  }
}

// run_tokens: the forward pass over the T tokens described by the device meta arrays, logits of
// the R rows listed in rows[] into m.logits, and (want_keys) their argmax keys into m.keys.
// decode says every token is the next one of a different sequence (rows = tokens): attention
// may then run fused with the q/k/v post-processing (decode_attn_kernel, by the fused_attn rule
// below).
template <typename T>
void run_tokens(mqb_model &m, int Tn, int R, bool want_keys, bool decode, const TileGrid *tiles) {
  const Cfg &c = m.c;
  const int H = c.H, QKV = (c.nh + 2 * c.nkv) * c.D, AO = c.nh * c.D;
  const float eps = (float)c.eps;
  // Fused decode attention where the (token, KV head) grid cannot fill the GPU, so position
  // splits can (fused_attn 1); always with 2. At batch 32 it measured slower than qkv_post +
  // attention on the H200 (lab/cuda/NOTES.md).
  const bool fused = decode && (m.fused_attn == 2 || (m.fused_attn == 1 && Tn * c.nkv < m.sms));
  const int gm = gm_for(c.nh / c.nkv);
  const size_t asmem = attn_smem(gm, c.D);
  const int S = fused ? m.step_splits : 1;
  const int clz = cluster_of(m.attn_cluster, S);  // an item's S position splits
  // Prefill / mixed steps of bf16/fp16 models: attention on the tensor cores (prefill_attn.cuh),
  // over the chunk's tiles (cut once per chunk), the one-token tiles through attention_kernel.
  const bool tc_prefill = !decode && !std::is_same<T, float>::value && m.prefill_tc && pa::supported(c.D);
  const TileGrid grid = !tc_prefill ? TileGrid{} : tiles ? *tiles : prefill_tiles(m, Tn, ones_apart(m, R));
  launch(m, embed_kernel<T>, dim3(Tn), dim3(256), 0, (const int *)m.d_tok(), (const int *)m.d_pos(),
         (const T *)m.emb, (const float *)m.wpe, m.res, H, want_keys ? m.keys : nullptr, R);
  // The family's own rows (an image's tokens: their embeddings and rotary rows), set up by its
  // chunk_begin hook.
  const int *rrow = m.rows_on ? m.rope_rows : nullptr;
  const int *sdelta = m.rope_delta;
  if (m.rows_on) m.fam->embed_rows(m, Tn);
  for (int l = 0; l < c.L; ++l) {
    Layer &ly = m.layers[l];
    auto attention = [&]() {
      if (fused) {
        const DecAttn<T> da{m.qkv, m.d_pos(), m.d_slot(), c.nh, c.nkv, c.D, m.kv_rows, ly.qn, ly.kn,
                            m.inv_freq, eps, ly.qscale, static_cast<T *>(ly.kc),
                            static_cast<T *>(ly.vc), static_cast<T *>(m.attn), m.part_acc, m.part_ml, m.att_cnt,
                            m.attn_lanes ? 1 : 0, m.attn_flash ? 1 : 0, clz > 1 ? 1 : 0,
                            clz > 1 && m.attn_push && m.attn_park_fits ? 1 : 0, m.rope_tab, sdelta, c.window};
        const size_t dsmem_bytes = asmem + (da.push ? sizeof(float) * (size_t)clz * attn_park(gm, c.D) : 0);
        launch_gm(gm, [&](auto g) {
          constexpr int G = decltype(g)::value;
          // head_dim 128 with pre_params: head_vec with 4 values a lane (post_n, as qkv_post)
          auto k = !flash_only<T>(m, c.D) ? decode_attn_kernel<T, G, false>
                   : !m.pre_params        ? decode_attn_kernel<T, G, true>
                   : m.post_n && head_n(c.D) == 4 ? decode_attn_kernel<T, G, true, true, 4>
                                                  : decode_attn_kernel<T, G, true, true>;
          launch_cl(m, dim3(1, 1, clz), k, dim3(Tn, c.nkv, S), dim3(ATT_THREADS), dsmem_bytes, da);
        });
        return;
      }
      auto post = [&](auto n) {
        constexpr int N = decltype(n)::value;
        launch(m, m.pre_params ? qkv_post_kernel<T, true, N> : qkv_post_kernel<T, false, N>,
               dim3(Tn, (c.nh + 2 * c.nkv + 7) / 8), dim3(256), sizeof(float) * 8 * c.D, (const float *)m.qkv,
               (const int *)m.d_pos(), (const int *)m.d_slot(), c.nh, c.nkv, c.D, (const float *)ly.qn,
               (const float *)ly.kn, eps, (const float *)m.inv_freq, ly.qscale, m.qbuf,
               static_cast<T *>(ly.kc), static_cast<T *>(ly.vc), m.kv_rows, (const float2 *)m.rope_tab, rrow, sdelta);
      };
      switch (m.post_n ? head_n(c.D) : HV) {
        case 1: post(std::integral_constant<int, 1>{}); break;
        case 2: post(std::integral_constant<int, 2>{}); break;
        case 4: post(std::integral_constant<int, 4>{}); break;
        default: post(std::integral_constant<int, HV>{}); break;
      }
      // The one-token tiles' tokens are decode-like: attend_flash, as a decode step's.
      const bool flash = decode || m.prefill_flash || tc_prefill;  // with m.attn_flash
      if (tc_prefill && grid.multi > 0) prefill_attention<T>(m, ly, grid.multi);
      if (tc_prefill && grid.one == 0) return;
      launch_gm(gm, [&](auto g) {
        auto k = flash && flash_only<T>(m, c.D) ? attention_kernel<T, decltype(g)::value, true>
                                                : attention_kernel<T, decltype(g)::value, false>;
        launch(m, k, dim3(tc_prefill ? grid.one : Tn, c.nkv), dim3(ATT_THREADS), asmem, (const float *)m.qbuf,
               (const T *)ly.kc, (const T *)ly.vc, (const int *)m.d_pos(), (const int *)m.d_slot(),
               static_cast<T *>(m.attn), c.nh, c.nkv, c.D, m.kv_rows, m.attn_flash && flash ? 1 : 0,
               tc_prefill ? reinterpret_cast<const int *>(m.ptile + grid.multi) : (const int *)nullptr, c.window);
      });
    };
    linear<T>(m, "qkv", prep<T>(c.norm, m.res, nullptr, H, nullptr, ly.ln1_w, ly.ln1_b, eps), Tn, H,
              ly.w_qkv, QKV, ly.b_qkv, m.qkv, false, nullptr);
    attention();
    linear<T>(m, "o_proj", prep<T>(PREP_PLAIN, nullptr, (const T *)m.attn, AO, nullptr, nullptr, nullptr, eps), Tn, AO,
              ly.w_o, H, ly.b_o, m.res, true, nullptr);
    // A family's own feed-forward (a mixture of experts) takes the layer's place of the MLP.
    if (m.fam->ffn && m.fam->ffn(m, l, Tn)) {
      if (m.rows_on && m.fam->after_layer) m.fam->after_layer(m, l, Tn);
      continue;
    }
    const PrepArgs<T> up_in = prep<T>(c.norm, m.res, nullptr, H, nullptr, ly.ln2_w, ly.ln2_b, eps);
    // Gated MLPs' batches in the tile kernel's fused range: RMSNorm, gate/up and SwiGLU in one kernel,
    // whose T output (in m.mlp's memory) is the down projection's input as it is.
    T *act = reinterpret_cast<T *>(m.mlp);
    const bool swiglu_made =
        c.gated && !ly.b_up && tile_fused<T>(m, "up", up_in, Tn, H, static_cast<const T *>(ly.w_up), 2 * c.I, nullptr, act);
    if (!swiglu_made) linear<T>(m, "up", up_in, Tn, H, ly.w_up, c.mlp_width(), ly.b_up, m.mlp, false, nullptr);
    const PrepArgs<T> down_in =
        swiglu_made ? prep<T>(PREP_PLAIN, nullptr, act, c.I, nullptr, nullptr, nullptr, eps)
                    : prep<T>(c.gated ? PREP_SWIGLU : PREP_GELU, m.mlp, nullptr, c.mlp_width(), nullptr, nullptr,
                              nullptr, eps);
    linear<T>(m, "down", down_in, Tn, c.I, ly.w_down, H, ly.b_down, m.res, true, nullptr);
    if (m.rows_on && m.fam->after_layer) m.fam->after_layer(m, l, Tn);
  }
  if (m.hidden_out) {  // hidden_states: the residual stream is the output, no norm or head
    ck(cudaMemcpyAsync(m.hidden_out, m.res, sizeof(float) * (size_t)Tn * H, cudaMemcpyDeviceToDevice, m.stream),
       "hidden states copy");
    return;
  }
  linear<T>(m, "lm_head",
            prep<T>(c.norm, m.res, nullptr, H, (const int *)m.d_rows(), m.normf_w,
                    m.normf_b, eps),
            R, H, m.lm, c.V, nullptr, m.logits, false, want_keys ? m.keys : nullptr, Samp{m.samp_temp, m.samp_key});
}

// run_dispatch runs run_tokens for the model's precision. tiles: the prefill attention's tiles
// are uploaded already (a graphed chunk's, padded to those sizes); NULL cuts them here.
void run_dispatch(mqb_model &m, int Tn, int R, bool want_keys, bool decode, const TileGrid *tiles = nullptr) {
  switch (m.dt) {
    case DT_BF16: run_tokens<__nv_bfloat16>(m, Tn, R, want_keys, decode, tiles); break;
    case DT_F16: run_tokens<__half>(m, Tn, R, want_keys, decode, tiles); break;
    default: run_tokens<float>(m, Tn, R, want_keys, decode, tiles); break;
  }
}

void upload_meta(mqb_model &m) {
  if (m.warming) m.n_real_h() = 0;
  ck(cudaMemcpyAsync(m.meta, m.meta_h, sizeof(int) * m.meta_count(), cudaMemcpyHostToDevice, m.stream),
     "meta upload");
  ck(cudaMemcpyAsync(m.samp_temp, m.samp_temp_h, sizeof(float) * m.Rcap, cudaMemcpyHostToDevice, m.stream),
     "sampling upload");
  ck(cudaMemcpyAsync(m.samp_key, m.samp_key_h, sizeof(unsigned long long) * m.Rcap, cudaMemcpyHostToDevice,
                     m.stream),
     "sampling upload");
}

// set_samp fills logits row r's sampling from entry e of the caller's arrays (NULL: greedy).
void set_samp(mqb_model &m, int r, int e, const float *temp, const uint64_t *rkey) {
  const float t = temp && e >= 0 ? temp[e] : 0.f;
  m.samp_temp_h[r] = t > 0.f ? 1.f / t : 0.f;
  m.samp_key_h[r] = rkey && e >= 0 ? (unsigned long long)rkey[e] : 0ull;
}

// step_dispatch runs the decode step of b entries whose meta is uploaded, kernel by kernel (the
// kernel-by-kernel path always writes the logits buffer).
void step_dispatch(mqb_model &m, int b, bool) { run_dispatch(m, b, b, true, true); }

}  // namespace mqcuda
