#!/usr/bin/env python3
"""GPU checks of the qwen3moe CUDA model (native/models/qwen3moe.cu) through libmodelqual_cuda.so's
C ABI (ABI 5 and later, ctypes), on the GPU host (no Go there).

  parity  qwen3moe-tiny in bf16: mqb_logits_all over every golden prompt against transformers'
          Qwen3MoeForCausalLM in bf16 on the same GPU and against the float32 golden's top-5;
          batched greedy decode through mqb_forward (all prompts at once, 16 steps) against
          transformers' bf16 greedy; routing counts (mqb_routing) after one prompt against the
          golden router choices.
  bench   decode tokens/s at batch 1 and 32 through mqb_forward on a model with
          Qwen3-30B-A3B's layer shapes (hidden 2048, 32/4 heads of 128, 128 experts of width
          768, top-8) but BENCH_LAYERS layers (default 8; the full 48 are 61 GB of bf16, more
          than this job's time allows to draw and upload), random bf16 weights drawn here; the
          same in transformers (generate, eager); the memory bound: bytes of the active weights
          per token (attention + router + 8 experts per layer, plus the LM head) over the measured
          device-to-device copy bandwidth.

Usage: python3 gpu_check.py --lib build/libmodelqual_cuda.so --snapshot DIR --golden G.json --out OUT.json
"""
import argparse
import ctypes
import json
import os
import sys
import time
import traceback


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("ndim", ctypes.c_int32)]


class HParam(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_double), ("str", ctypes.c_char_p)]


class Params(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("family", ctypes.c_char_p), ("hparams", ctypes.POINTER(HParam)),
                ("n_hparams", ctypes.c_int32), ("precision", ctypes.c_char_p), ("max_batch", ctypes.c_int32),
                ("max_context", ctypes.c_int32), ("device_index", ctypes.c_int32),
                ("tensors", ctypes.POINTER(Tensor)), ("n_tensors", ctypes.c_int32)]


I32P = ctypes.POINTER(ctypes.c_int32)
F32P = ctypes.POINTER(ctypes.c_float)


def hparams_of(cfg):
    """The hyper-parameters native/models/qwen3moe.cc's resolve hands the backend."""
    L = cfg["num_hidden_layers"]
    dense = cfg.get("mlp_only_layers") or []
    step = cfg.get("decoder_sparse_step", 1)
    ne = cfg.get("num_experts", 128)
    sparse = "".join("1" if (l not in dense and ne > 0 and (l + 1) % step == 0) else "0" for l in range(L))
    nums = {
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["hidden_size"], "num_layers": L,
        "num_heads": cfg["num_attention_heads"], "num_kv_heads": cfg["num_key_value_heads"],
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        "intermediate_size": cfg["intermediate_size"], "max_positions": cfg["max_position_embeddings"],
        "norm_eps": cfg.get("rms_norm_eps", 1e-6), "rope_theta": cfg.get("rope_theta", 10000),
        "tie_word_embeddings": 1 if cfg.get("tie_word_embeddings") else 0, "attention_bias": 0,
        "scale_attn_by_inverse_layer_idx": 0, "num_experts": ne,
        "num_experts_per_tok": cfg.get("num_experts_per_tok", 8),
        "moe_intermediate_size": cfg.get("moe_intermediate_size", 768),
        "norm_topk_prob": 1 if cfg.get("norm_topk_prob") else 0,
    }
    keep = []
    arr = (HParam * (len(nums) + 1))()
    for i, (k, v) in enumerate(nums.items()):
        kb = k.encode()
        keep.append(kb)
        arr[i] = HParam(kb, float(v), None)
    sb = sparse.encode()
    keep.append(sb)
    arr[len(nums)] = HParam(b"sparse_layers", 0.0, sb)
    return arr, len(nums) + 1, keep


class Model:
    def __init__(self, lib, cfg, state, precision, max_batch, max_context):
        import torch
        self.lib = lib
        self.keep = []
        ts = (Tensor * len(state))()
        for i, (name, t) in enumerate(state.items()):
            if t.dtype == torch.bfloat16:
                dt = 1
            else:
                t = t.to(torch.float32)
                dt = 0
            t = t.contiguous().cpu()
            self.keep.append(t)
            nb = name.encode()
            self.keep.append(nb)
            shape = (ctypes.c_int64 * 4)(*(list(t.shape) + [0] * (4 - t.dim())))
            ts[i] = Tensor(nb, ctypes.c_void_p(t.data_ptr()), dt, shape, t.dim())
        hp, n, keep = hparams_of(cfg)
        self.keep += [hp, keep, ts]
        p = Params(lib.mqb_abi_version(), b"qwen3moe", hp, n, precision.encode(), max_batch, max_context, 0, ts, len(state))
        self.m = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        if lib.mqb_model_open(ctypes.byref(p), ctypes.byref(self.m), err, 1024) != 0:
            raise RuntimeError("mqb_model_open: " + err.value.decode())
        self.V = lib.mqb_vocab_size(self.m)

    def logits_all(self, ids):
        import numpy as np
        out = np.zeros((len(ids), self.V), dtype=np.float32)
        a = (ctypes.c_int32 * len(ids))(*ids)
        err = ctypes.create_string_buffer(1024)
        if self.lib.mqb_logits_all(self.m, a, len(ids), out.ctypes.data_as(F32P), err, 1024) != 0:
            raise RuntimeError(err.value.decode())
        return out

    def forward(self, slots, ntok, tokens, pos, want_logits=False):
        import numpy as np
        n = len(slots)
        arr = lambda v: (ctypes.c_int32 * len(v))(*v)
        am = (ctypes.c_int32 * n)()
        lo = np.zeros((n, self.V), dtype=np.float32) if want_logits else None
        err = ctypes.create_string_buffer(1024)
        rc = self.lib.mqb_forward(self.m, n, arr(slots), arr(ntok), arr(tokens), arr(pos),
                                  lo.ctypes.data_as(F32P) if want_logits else None, am, err, 1024)
        if rc != 0:
            raise RuntimeError(err.value.decode())
        return list(am), lo

    def routing(self):
        nl, ne = ctypes.c_int32(), ctypes.c_int32()
        err = ctypes.create_string_buffer(1024)
        self.lib.mqb_routing(self.m, None, 0, ctypes.byref(nl), ctypes.byref(ne), err, 1024)
        out = (ctypes.c_uint64 * (nl.value * ne.value))()
        self.lib.mqb_routing(self.m, out, len(out), ctypes.byref(nl), ctypes.byref(ne), err, 1024)
        return [list(out[l * ne.value:(l + 1) * ne.value]) for l in range(nl.value)]

    def reset(self, slot):
        self.lib.mqb_slot_reset(self.m, slot)

    def close(self):
        self.lib.mqb_model_close(self.m)


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.mqb_model_open.argtypes = [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_vocab_size.argtypes = [ctypes.c_void_p]
    lib.mqb_logits_all.argtypes = [ctypes.c_void_p, I32P, ctypes.c_int32, F32P, ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_forward.argtypes = [ctypes.c_void_p, ctypes.c_int32, I32P, I32P, I32P, I32P, F32P, I32P, ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_routing.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, I32P, I32P, ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_slot_reset.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.mqb_model_close.argtypes = [ctypes.c_void_p]
    return lib


def parity(lib, snapshot, golden_path, res):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    cfg = json.load(open(os.path.join(snapshot, "config.json")))
    g = json.load(open(golden_path))
    state = load_file(os.path.join(snapshot, "model.safetensors"))
    m = Model(lib, cfg, state, "bf16", 32, 1024)
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    rows = []
    for p in g["prompts"]:
        ids = p["prompt_ids"]
        ours = m.logits_all(ids)
        with torch.no_grad():
            theirs = hf(input_ids=torch.tensor([ids]).cuda()).logits[0].float().cpu().numpy()
        d_hf = float(abs(ours - theirs).max())
        st = p["steps"][0]
        d_gold = max(abs(float(ours[-1][i]) - v) for i, v in zip(st["top5_ids"], st["top5_logits"]))
        rows.append({"name": p["name"], "tokens": len(ids), "max_abs_vs_hf_bf16": d_hf, "top5_vs_fp32_golden": d_gold,
                     "argmax_equal_hf_bf16": int(ours[-1].argmax()) == int(theirs[-1].argmax())})
    res["logits_all"] = rows
    # batched greedy: every prompt at once (prefill in one call), 16 steps, against HF bf16 greedy
    n = min(len(g["prompts"]), 32)
    ps = g["prompts"][:n]
    slots = list(range(n))
    seqs = [list(p["prompt_ids"]) for p in ps]
    toks = [t for s in seqs for t in s]
    am, _ = m.forward(slots, [len(s) for s in seqs], toks, [0] * n)
    gen = [[a] for a in am]
    for step in range(15):
        am, _ = m.forward(slots, [1] * n, [x[-1] for x in gen], [len(seqs[i]) + len(gen[i]) - 1 for i in range(n)])
        for i in range(n):
            gen[i].append(am[i])
    agree = []
    for i, p in enumerate(ps):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p["prompt_ids"]]).cuda(), max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        theirs = out[0, len(p["prompt_ids"]):].tolist()
        same = 0
        while same < 16 and same < len(theirs) and gen[i][same] == theirs[same]:
            same += 1
        agree.append({"name": p["name"], "steps_equal_hf_bf16": same, "steps_equal_fp32_golden": next(
            (k for k in range(16) if k >= len(p["greedy_ids"]) or gen[i][k] != p["greedy_ids"][k]), 16)})
    res["batched_greedy"] = agree
    for s in slots:
        m.reset(s)
    # routing: counts of one prompt's prefill against the golden router choices
    before = m.routing()
    p = g["prompts"][4]
    m.logits_all(p["prompt_ids"])
    after = m.routing()
    want = {}
    for r in p["router"]:
        for es in r["experts"]:
            for e in es:
                want[(r["layer"], e)] = want.get((r["layer"], e), 0) + 1
    got = {}
    for l in range(len(after)):
        for e in range(len(after[l])):
            if after[l][e] - before[l][e]:
                got[(l, e)] = after[l][e] - before[l][e]
    res["routing"] = {"prompt": p["name"], "equal_to_transformers_fp32_choices": got == want,
                      "differing": sorted([f"{k}: {got.get(k, 0)} vs {want.get(k, 0)}" for k in set(got) | set(want) if got.get(k, 0) != want.get(k, 0)])[:20]}
    m.close()


def bench(lib, res):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    layers = int(os.environ.get("BENCH_LAYERS", "8"))
    cfg = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers,
               num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
               rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, num_experts=128,
               num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
               mlp_only_layers=[])
    torch.manual_seed(0)
    hf = Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg, attn_implementation="eager")).to(torch.bfloat16).cuda().eval()
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    # the bundle's per-expert layout from transformers' fused parameters
    state = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            mi = v.shape[1] // 2
            for e in range(v.shape[0]):
                state[f"{pre}{e}.gate_proj.weight"] = v[e, :mi].cpu()
                state[f"{pre}{e}.up_proj.weight"] = v[e, mi:].cpu()
        elif k.endswith("mlp.experts.down_proj") and v.dim() == 3:
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                state[f"{pre}{e}.down_proj.weight"] = v[e].cpu()
        else:
            state[k] = v.cpu()
    m = Model(lib, cfg, state, "bf16", 32, 2048)
    out = {"layers": layers}
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 20 / (time.perf_counter() - t0)  # read + write bytes/s
    out["copy_bandwidth_GBps"] = bw / 1e9
    H, MI, nh, nkv, D, V = 2048, 768, 32, 4, 128, 151936
    per_layer = 2 * (H * (nh + 2 * nkv) * D + nh * D * H + 128 * H + 8 * 3 * H * MI)
    active = layers * per_layer + 2 * V * H
    out["active_weight_bytes_per_token"] = active
    out["memory_bound_tokens_per_s_batch1"] = bw / active
    for B in (1, 32):
        prompt = [100 + i for i in range(16)]
        slots = list(range(B))
        m.forward(slots, [16] * B, prompt * B, [0] * B)
        last = [5] * B
        steps = 64
        for s in range(8):  # warm (graph capture)
            last, _ = m.forward(slots, [1] * B, last, [16 + s] * B)
        t0 = time.perf_counter()
        for s in range(steps):
            last, _ = m.forward(slots, [1] * B, last, [24 + s] * B)
        dt = time.perf_counter() - t0
        out[f"ours_tokens_per_s_batch{B}"] = B * steps / dt
        for sl in slots:
            m.reset(sl)
        ids = torch.tensor([prompt] * B).cuda()
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
            torch.cuda.synchronize()
        out[f"transformers_tokens_per_s_batch{B}"] = B * 32 / (time.perf_counter() - t0)
        out[f"ratio_vs_transformers_batch{B}"] = out[f"ours_tokens_per_s_batch{B}"] / out[f"transformers_tokens_per_s_batch{B}"]
    out["batch1_fraction_of_memory_bound"] = out["ours_tokens_per_s_batch1"] / out["memory_bound_tokens_per_s_batch1"]
    res["bench"] = out
    m.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--snapshot", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lib = load_lib(a.lib)
    res = {"device": None}
    try:
        import torch
        res["device"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    for name, fn in (("parity", lambda: parity(lib, a.snapshot, a.golden, res)), ("bench", lambda: bench(lib, res))):
        try:
            fn()
        except Exception:
            res[name + "_error"] = traceback.format_exc()
        json.dump(res, open(a.out, "w"), indent=1)
        print(json.dumps(res, indent=1)[:6000], file=sys.stderr)


if __name__ == "__main__":
    main()
