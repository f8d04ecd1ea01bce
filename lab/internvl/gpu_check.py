#!/usr/bin/env python3
"""GPU checks of the internvl CUDA model (native/models/internvl.cu) through libmodelqual_cuda.so's
C ABI (ABI 5 and later, ctypes), against transformers' InternVLForConditionalGeneration in bf16 on the same
GPU (issue 50 item 8). Lab driver, not product: the GPU host has Python and no Go.

  parity  internvl-tiny (the fixture snapshot `qual fixtures` made): for every image of
          families/internvl/corpus.jsonl and every two-image request of corpus-pairs.jsonl,
          transformers' processor makes input_ids and pixel_values once; both models get exactly
          those (the engine through mqb_set_image with the tiles stacked, as the runtime hands
          them: grid (tiles, side, side)). Compared: the first step's full-vocabulary logits (max
          |d|, top-1 equal) and 32 greedy tokens (EOS ignored) through mqb_forward (prefill, then
          31 decode steps) against transformers' generate. Then one planted defect
          (MODELQUAL_FAULTS=internvl.shuffle_transposed) on a fresh model must move the logits.
  bench   internvl3.5-1b's shapes (InternViT 1024 x 24, Qwen3 1024 x 28, 448 tiles of 14-pixel
          patches, 256 tokens a tile), random bf16 weights made by transformers on the GPU from
          the tiny snapshot's files with the sizes changed: on one corpus photo, time to first
          token (set_image + prefill to the first token, median of --reps) and decode tokens/s
          against transformers (generate, sdpa); and our decode tokens/s after that image
          against a text-only prompt of the same length (the image costs prefill, not decode).

Usage: python3 gpu_check.py --lib LIB.so --snapshot DIR --out OUTDIR [--root .] [--budget S]
"""
import argparse
import ctypes
import json
import os
import shutil
import sys
import time
import traceback

T_START = time.time()


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


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.mqb_model_open.argtypes = [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_vocab_size.argtypes = [ctypes.c_void_p]
    lib.mqb_forward.argtypes = [ctypes.c_void_p, ctypes.c_int32, I32P, I32P, I32P, I32P, F32P, I32P, ctypes.c_char_p,
                                ctypes.c_size_t]
    lib.mqb_set_image.argtypes = [ctypes.c_void_p, ctypes.c_int32, F32P, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
                                  ctypes.c_int32, I32P, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
    lib.mqb_slot_reset.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.mqb_model_close.argtypes = [ctypes.c_void_p]
    lib.mqb_families.restype = ctypes.POINTER(ctypes.c_char_p)
    return lib


def families(lib):
    f, out, i = lib.mqb_families(), [], 0
    while f[i]:
        out.append(f[i].decode())
        i += 1
    return out


def square(v, dflt):
    if v is None:
        return dflt
    if isinstance(v, (list, tuple)):
        assert len(v) == 2 and v[0] == v[1], v
        return int(v[0])
    return int(v)


def hparams_of(cfg):
    """The hyper-parameters native/models/internvl.cc's resolve_internvl (with resolve_qwen3 and
    resolve_decoder_shape for text_config) hands the backend."""
    t, v = cfg["text_config"], cfg["vision_config"]
    text_type = t.get("model_type", "qwen2")
    heads = t["num_attention_heads"]
    rope = t.get("rope_theta") or (t.get("rope_parameters") or {}).get("rope_theta") or 10000
    depth = v.get("num_hidden_layers", 24)
    layer = cfg.get("vision_feature_layer", -1)
    run = depth if layer == -1 else (layer if layer >= 0 else depth + 1 + layer)
    nums = {
        "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"], "num_layers": t["num_hidden_layers"],
        "num_heads": heads, "num_kv_heads": t.get("num_key_value_heads", heads),
        "head_dim": t.get("head_dim") or t["hidden_size"] // heads, "intermediate_size": t["intermediate_size"],
        "norm_eps": t.get("rms_norm_eps", 1e-6), "max_positions": t["max_position_embeddings"], "rope_theta": rope,
        "tie_word_embeddings": 1 if cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", True)) else 0,
        "attention_bias": 1 if (text_type == "qwen2" or t.get("attention_bias")) else 0,
        "scale_attn_by_inverse_layer_idx": 0, "text_qwen2": 1 if text_type == "qwen2" else 0,
        "vision_hidden_size": v.get("hidden_size", 1024), "vision_num_layers": depth,
        "vision_num_heads": v.get("num_attention_heads", 16), "vision_intermediate_size": v.get("intermediate_size", 4096),
        "vision_patch_size": square(v.get("patch_size"), 14), "vision_image_size": square(v.get("image_size"), 448),
        "vision_layer_norm_eps": v.get("layer_norm_eps", 1e-6),
        "vision_rms_norm": 1 if v.get("norm_type", "layer_norm") == "rms_norm" else 0,
        "vision_qk_norm": 1 if v.get("use_qk_norm") else 0, "vision_attention_bias": 1 if v.get("attention_bias") else 0,
        "vision_run_layers": run,
        "vision_final_layernorm": 1 if (layer == -1 and not v.get("use_mean_pooling", True)) else 0,
        "image_token_id": cfg.get("image_token_id", 151667),
    }
    arr = (HParam * len(nums))()
    keep = []
    for i, (k, val) in enumerate(nums.items()):
        kb = k.encode()
        keep.append(kb)
        arr[i] = HParam(kb, float(val), None)
    return arr, len(nums), keep, nums


class Model:
    """One mqb model of family internvl from a state dict (name -> torch tensor, transformers 5's
    names, as the runtime hands a bundle's tensors)."""

    def __init__(self, lib, cfg, state, precision, max_batch, max_context):
        import torch
        self.lib, self.keep = lib, []
        ts = (Tensor * len(state))()
        for i, (name, t) in enumerate(state.items()):
            t = t.detach()
            if t.dtype == torch.bfloat16:
                dt = 1
            else:
                t, dt = t.to(torch.float32), 0
            t = t.contiguous().cpu()
            nb = name.encode()
            self.keep += [t, nb]
            ts[i] = Tensor(nb, ctypes.c_void_p(t.data_ptr()), dt, (ctypes.c_int64 * 4)(*(list(t.shape) + [0] * (4 - t.dim()))),
                           t.dim())
        hp, n, keep, self.hp = hparams_of(cfg)
        self.keep += [hp, keep, ts]
        p = Params(lib.mqb_abi_version(), b"internvl", hp, n, precision.encode(), max_batch, max_context, 0, ts, len(state))
        self.m = ctypes.c_void_p()
        err = ctypes.create_string_buffer(2048)
        if lib.mqb_model_open(ctypes.byref(p), ctypes.byref(self.m), err, 2048) != 0:
            raise RuntimeError("mqb_model_open: " + err.value.decode())
        self.V = lib.mqb_vocab_size(self.m)

    def set_image(self, slot, pv, ids):
        import numpy as np
        px = np.ascontiguousarray(pv, dtype=np.float32)
        a = (ctypes.c_int32 * len(ids))(*ids)
        err = ctypes.create_string_buffer(2048)
        rc = self.lib.mqb_set_image(self.m, slot, px.ctypes.data_as(F32P), px.size, px.shape[0], px.shape[2] // self.patch(),
                                    px.shape[3] // self.patch(), a, len(ids), err, 2048)
        if rc != 0:
            raise RuntimeError("mqb_set_image: " + err.value.decode())

    def patch(self):
        return int(self.hp["vision_patch_size"])

    def forward(self, slots, ntok, tokens, pos, want_logits=False):
        import numpy as np
        n = len(slots)
        arr = lambda v: (ctypes.c_int32 * len(v))(*v)
        am = (ctypes.c_int32 * n)()
        lo = np.zeros((n, self.V), dtype=np.float32) if want_logits else None
        err = ctypes.create_string_buffer(2048)
        rc = self.lib.mqb_forward(self.m, n, arr(slots), arr(ntok), arr(tokens), arr(pos),
                                  lo.ctypes.data_as(F32P) if want_logits else None, am, err, 2048)
        if rc != 0:
            raise RuntimeError("mqb_forward: " + err.value.decode())
        return list(am), lo

    def generate(self, ids, pv, steps, slot=0, want_logits=True):
        """Prefill ids (with image pv, or None) in slot, then steps-1 greedy decode steps: the
        tokens, the first step's logits, the time to the first token and of each later step."""
        self.lib.mqb_slot_reset(self.m, slot)
        t0 = time.perf_counter()
        if pv is not None:
            self.set_image(slot, pv, ids)
        am, lo = self.forward([slot], [len(ids)], list(ids), [0], want_logits)
        t1 = time.perf_counter()
        toks = [am[0]]
        for s in range(1, steps):
            am, _ = self.forward([slot], [1], [toks[-1]], [len(ids) + s - 1])
            toks.append(am[0])
        t2 = time.perf_counter()
        self.lib.mqb_slot_reset(self.m, slot)
        return toks, (lo[0] if lo is not None else None), t1 - t0, (t2 - t1) / max(steps - 1, 1)

    def close(self):
        self.lib.mqb_model_close(self.m)


def processor(snapshot, notes):
    from transformers import AutoProcessor, AutoTokenizer
    attrs = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}

    def fix(tok):  # InternVLProcessor reads these from the tokenizer (extra_special_tokens)
        for k, v in attrs.items():
            if getattr(tok, k, None) != v:
                setattr(tok, k, v)
            if getattr(tok, k + "_id", None) is None:
                setattr(tok, k + "_id", tok.convert_tokens_to_ids(v))
    try:
        proc = AutoProcessor.from_pretrained(snapshot, local_files_only=True)
        fix(proc.tokenizer)
        return proc
    except Exception:
        notes.append("AutoProcessor failed; InternVLProcessor by hand: " + traceback.format_exc(limit=1))
        import transformers as tf
        from transformers import InternVLProcessor
        tok = AutoTokenizer.from_pretrained(snapshot, local_files_only=True)
        fix(tok)
        ipc = getattr(tf, "GotOcr2ImageProcessorFast", None) or getattr(tf, "GotOcr2ImageProcessor")
        ip = ipc.from_pretrained(snapshot, local_files_only=True)
        cfg = json.load(open(os.path.join(snapshot, "config.json")))
        return InternVLProcessor(image_processor=ip, tokenizer=tok, image_seq_length=cfg.get("image_seq_length", 256),
                                 chat_template=open(os.path.join(snapshot, "chat_template.jinja")).read())


def inputs_for(proc, root, images, prompt):
    from PIL import Image
    imgs = []
    for p in images:
        im = Image.open(os.path.join(root, p))
        im.load()
        imgs.append(im)
    content = [{"type": "image"} for _ in imgs] + [{"type": "text", "text": prompt}]
    text = proc.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    inp = proc(text=[text], images=imgs, return_tensors="pt")
    return inp


def hf_generate(hf, inp, steps, dtype):
    import torch
    kw = {k: v for k, v in inp.items() if k in ("input_ids", "attention_mask", "pixel_values")}
    kw = {k: (v.to("cuda", dtype) if k == "pixel_values" else v.to("cuda")) for k, v in kw.items()}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = hf.generate(**kw, max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True,
                    eos_token_id=None, pad_token_id=0)
    torch.cuda.synchronize()
    n = kw["input_ids"].shape[1]
    return [int(t) for t in o.sequences[0, n:]], o.logits[0][0].float().cpu().numpy(), time.perf_counter() - t0


def parity_refs(a, res):
    """Phase 1 (while the library compiles): transformers' bf16 answers over the corpus and the
    two-image requests, with the inputs both sides get."""
    import torch
    from transformers import InternVLForConditionalGeneration
    notes = res.setdefault("notes", [])
    snap = a.snapshot
    proc = processor(snap, notes)
    hf = InternVLForConditionalGeneration.from_pretrained(snap, local_files_only=True, dtype=torch.bfloat16,
                                                          attn_implementation="sdpa").to("cuda").eval()
    hf.generation_config.eos_token_id = None  # 32 tokens whatever they are, as the engine's ignore_eos
    hf.generation_config.pad_token_id = 0
    entries = [json.loads(l) for l in open(os.path.join(a.root, "families/internvl/corpus.jsonl")) if l.strip()]
    pairs = [json.loads(l) for l in open(os.path.join(a.root, "families/internvl/corpus-pairs.jsonl")) if l.strip()]
    refs = []
    for e in entries + pairs:
        imgs = e.get("images") or [e["image"]]
        r = {"name": e["name"], "images": len(imgs)}
        try:
            inp = inputs_for(proc, a.root, imgs, e["prompt"])
            r["ids"] = [int(x) for x in inp["input_ids"][0]]
            r["pv"] = inp["pixel_values"].to(torch.float32).numpy()
            with torch.no_grad():
                r["theirs"], r["tl"], _ = hf_generate(hf, inp, a.steps, torch.bfloat16)
        except Exception:
            r["error"] = "transformers: " + traceback.format_exc(limit=3)
        refs.append(r)
    del hf
    torch.cuda.empty_cache()
    return refs


def parity(lib, a, res, refs):
    """Phase 2: the library over the same inputs, compared with phase 1's answers."""
    import numpy as np
    from safetensors.torch import load_file
    snap = a.snapshot
    cfg = json.load(open(os.path.join(snap, "config.json")))
    state = {}
    for f in sorted(os.listdir(snap)):
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(snap, f)))
    m = Model(lib, cfg, state, "bf16", 2, 4096)
    res["tiny_hparams"] = m.hp
    rows, first = [], None
    for ref in refs:
        r = {k: ref[k] for k in ("name", "images", "error") if k in ref}
        if "error" not in r:
            try:
                ids, pv, theirs, tl = ref["ids"], ref["pv"], ref["theirs"], ref["tl"]
                r["tiles"], r["prompt_tokens"] = int(pv.shape[0]), len(ids)
                ours, ol, _, _ = m.generate(ids, pv, a.steps)
                if first is None:
                    first = (ids, pv, ol)
                r["max_abs_first_logits"] = float(np.abs(ol - tl).max())
                r["top1_equal"] = int(ol.argmax()) == int(tl.argmax())
                same = 0
                while same < a.steps and ours[same] == theirs[same]:
                    same += 1
                r["greedy_prefix_equal"] = same
                r["greedy_exact"] = same == a.steps
                r["ours_head"], r["hf_head"] = ours[:6], theirs[:6]
            except Exception:
                r["error"] = traceback.format_exc(limit=3)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr)
    m.close()
    res["parity"] = rows
    singles = [r for r in rows if r["images"] == 1]
    res["parity_summary"] = {
        "single_exact": sum(1 for r in singles if r.get("greedy_exact")), "single_total": len(singles),
        "pairs_exact": sum(1 for r in rows if r["images"] > 1 and r.get("greedy_exact")),
        "pairs_total": len(rows) - len(singles),
        "top1_equal": sum(1 for r in rows if r.get("top1_equal")), "total": len(rows),
        "max_abs_first_logits": max((r["max_abs_first_logits"] for r in rows if "max_abs_first_logits" in r),
                                    default=float("nan")),
    }
    # a planted defect must move the first-step logits well past the bf16 noise above
    if first is not None:
        os.environ["MODELQUAL_FAULTS"] = "internvl.shuffle_transposed"
        try:
            mf = Model(lib, cfg, state, "bf16", 2, 4096)
            _, fl, _, _ = mf.generate(first[0], first[1], 1)
            mf.close()
            res["fault_shuffle_transposed_max_abs_vs_ours"] = float(np.abs(fl - first[2]).max())
        finally:
            del os.environ["MODELQUAL_FAULTS"]


def shape_snapshot(tiny, dst):
    """A copy of the tiny snapshot's non-weight files with internvl3.5-1b's sizes (no weights:
    transformers draws them)."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(tiny):
        if not f.endswith(".safetensors") and os.path.isfile(os.path.join(tiny, f)):
            shutil.copy(os.path.join(tiny, f), os.path.join(dst, f))
    cfg = json.load(open(os.path.join(tiny, "config.json")))
    cfg["text_config"].update({"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                               "max_position_embeddings": 40960})
    cfg["vision_config"].update({"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                 "intermediate_size": 4096, "patch_size": [14, 14], "image_size": [448, 448]})
    cfg["image_seq_length"] = 256
    cfg["tie_word_embeddings"] = True
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
    for name, key, val in (("preprocessor_config.json", "max_patches", 12), ("processor_config.json", "image_seq_length", 256)):
        p = os.path.join(dst, name)
        if os.path.exists(p):
            d = json.load(open(p))
            if "image_processor" in d and isinstance(d["image_processor"], dict) and key == "max_patches":
                d["image_processor"][key] = val
            else:
                d[key] = val
            json.dump(d, open(p, "w"), indent=1)
    return cfg


def bench_prepare(a, res):
    """Phase 1: the internvl3.5-1b-shape model with random bf16 weights (transformers draws them
    on the GPU), its state dict on the host and the bench image's inputs."""
    import torch
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    notes = res.setdefault("notes", [])
    snap = "/tmp/internvl_1b_shape"
    cfg = shape_snapshot(a.snapshot, snap)
    proc = processor(snap, notes)
    proc.image_seq_length = 256
    try:
        proc.image_processor.max_patches = 12
    except Exception:
        pass
    t0 = time.time()
    hcfg = InternVLConfig.from_pretrained(snap)
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            hf = InternVLForConditionalGeneration._from_config(hcfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:
            hf = InternVLForConditionalGeneration._from_config(hcfg, torch_dtype=torch.bfloat16,
                                                               attn_implementation="sdpa")
    hf = hf.to("cuda", torch.bfloat16).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    state = {k: v.detach().to("cpu") for k, v in hf.state_dict().items()}
    res["bench_make_s"] = round(time.time() - t0, 1)
    inp = inputs_for(proc, a.root, [a.bench_image], "Describe this image.")
    return {"cfg": cfg, "hf": hf, "state": state, "inp": inp}


def bench(lib, a, res, prep, reps):
    """Phase 2 (after the build, so transformers' host-bound decode is not timed beside nvcc): TTFT
    and decode tokens/s, ours and transformers', and ours after the image against text-only."""
    import numpy as np
    import torch
    cfg, hf, state, inp = prep["cfg"], prep["hf"], prep["state"], prep["inp"]
    ids = [int(x) for x in inp["input_ids"][0]]
    pv = inp["pixel_values"].to(torch.float32).numpy()
    b = {"image": a.bench_image, "tiles": int(pv.shape[0]), "prompt_tokens": len(ids), "decode_steps": a.bench_steps,
         "reps": reps}
    t0 = time.time()
    m = Model(lib, cfg, state, "bf16", 1, len(ids) + a.bench_steps + 64)
    b["open_s"] = round(time.time() - t0, 1)
    # ours: warm-up, then reps of TTFT (set_image + prefill to the first token) and decode
    m.generate(ids, pv, 4, want_logits=False)
    tt, dt, toks = [], [], None
    for _ in range(reps):
        toks, _, t_first, t_step = m.generate(ids, pv, a.bench_steps, want_logits=False)
        tt.append(t_first), dt.append(t_step)
    b["ours_ttft_ms"] = 1000 * sorted(tt)[len(tt) // 2]
    b["ours_decode_tok_s"] = 1.0 / sorted(dt)[len(dt) // 2]
    # ours, text only at the same context: random text ids (no image tokens), same length
    rng = np.random.default_rng(0)
    txt = [int(x) for x in rng.integers(100, 150000, len(ids))]
    m.generate(txt, None, 4, want_logits=False)
    dt2 = []
    for _ in range(reps):
        _, _, _, t_step = m.generate(txt, None, a.bench_steps, want_logits=False)
        dt2.append(t_step)
    b["ours_text_decode_tok_s"] = 1.0 / sorted(dt2)[len(dt2) // 2]
    b["image_vs_text_decode"] = b["ours_decode_tok_s"] / b["ours_text_decode_tok_s"]
    m.close()
    res["bench_1b_shape"] = b
    # transformers: TTFT = generate 1 token; decode = (n - 1) / (t_n - t_1)
    with torch.no_grad():
        theirs, _, _ = hf_generate(hf, inp, 4, torch.bfloat16)
        t1s, tns = [], []
        for _ in range(reps):
            t1s.append(hf_generate(hf, inp, 1, torch.bfloat16)[2])
            theirs, _, tn = hf_generate(hf, inp, a.bench_steps, torch.bfloat16)
            tns.append(tn)
    t1, tn = sorted(t1s)[len(t1s) // 2], sorted(tns)[len(tns) // 2]
    b["hf_ttft_ms"] = 1000 * t1
    b["hf_decode_tok_s"] = (a.bench_steps - 1) / max(tn - t1, 1e-9)
    b["ttft_ratio_hf_over_ours"] = b["hf_ttft_ms"] / b["ours_ttft_ms"]
    b["decode_ratio_ours_over_hf"] = b["ours_decode_tok_s"] / b["hf_decode_tok_s"]
    same = 0
    while same < min(len(toks), len(theirs)) and toks[same] == theirs[same]:
        same += 1
    b["greedy_prefix_equal_hf"] = same


def table(res):
    out = []
    s = res.get("parity_summary")
    if s:
        out.append("internvl-tiny bf16 vs transformers bf16 (%s)" % res.get("device", ""))
        out.append("%-28s %5s %6s %10s %5s %6s" % ("entry", "tiles", "tokens", "max|dlog|", "top1", "greedy"))
        for r in res["parity"]:
            if "error" in r:
                out.append("%-28s ERROR %s" % (r["name"], r["error"].strip().splitlines()[-1][:90]))
                continue
            out.append("%-28s %5d %6d %10.4f %5s %3d/32" % (r["name"], r["tiles"], r["prompt_tokens"],
                                                             r["max_abs_first_logits"], "yes" if r["top1_equal"] else "NO",
                                                             r["greedy_prefix_equal"]))
        out.append("greedy exact: %d/%d single images, %d/%d pairs; top-1 equal %d/%d; max|dlogit| %.4f" % (
            s["single_exact"], s["single_total"], s["pairs_exact"], s["pairs_total"], s["top1_equal"], s["total"],
            s["max_abs_first_logits"] or float("nan")))
        if "fault_shuffle_transposed_max_abs_vs_ours" in res:
            out.append("planted internvl.shuffle_transposed moves first logits by %.4f" %
                       res["fault_shuffle_transposed_max_abs_vs_ours"])
    b = dict(res.get("bench_1b_shape") or {})
    for k in ("ours_ttft_ms", "hf_ttft_ms", "ttft_ratio_hf_over_ours", "ours_decode_tok_s", "hf_decode_tok_s",
              "decode_ratio_ours_over_hf", "ours_text_decode_tok_s", "image_vs_text_decode"):
        b.setdefault(k, float("nan"))  # a bench that stopped part way
    if "image" in b:
        out.append("internvl3.5-1b shape, random bf16, %s: %d tiles, %d prompt tokens" % (b["image"], b["tiles"], b["prompt_tokens"]))
        out.append("  TTFT ms      ours %8.1f  transformers %8.1f  (hf/ours %.2fx)" % (b["ours_ttft_ms"], b["hf_ttft_ms"],
                                                                                      b["ttft_ratio_hf_over_ours"]))
        out.append("  decode tok/s ours %8.1f  transformers %8.1f  (ours/hf %.2fx)" % (
            b["ours_decode_tok_s"], b["hf_decode_tok_s"], b["decode_ratio_ours_over_hf"]))
        out.append("  ours decode tok/s after the image %.1f vs text-only same context %.1f (ratio %.3f)" % (
            b["ours_decode_tok_s"], b["ours_text_decode_tok_s"], b["image_vs_text_decode"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--lib-ready", default="", help="wait for this file (the build's end) before opening --lib; "
                    "a file of the same name plus .failed ends the run")
    ap.add_argument("--snapshot", required=True, help="internvl-tiny snapshot (qual fixtures)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--root", default=".")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bench-image", default="fixtures/images/internvl/02-photo-1000x700.jpg")
    ap.add_argument("--bench-steps", type=int, default=64)
    ap.add_argument("--budget", type=float, default=270, help="seconds from start for everything")
    ap.add_argument("--only", default="", help="parity or bench")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import torch
    import transformers
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": transformers.__version__}
    path = os.path.join(a.out, "internvl_gpu.json")
    left = lambda: a.budget - (time.time() - T_START)

    def save():
        res["seconds"] = round(time.time() - T_START, 1)
        json.dump(res, open(path, "w"), indent=1, default=str)

    def step(name, fn, *args):
        try:
            return fn(*args)
        except Exception:
            res[name + "_error"] = traceback.format_exc()
            print(res[name + "_error"], file=sys.stderr)
        finally:
            save()

    # phase 1, beside the build: transformers' references and the bench model
    refs = step("parity_refs", parity_refs, a, res) if a.only in ("", "parity") else None
    prep = step("bench_prepare", bench_prepare, a, res) if a.only in ("", "bench") else None
    res["phase1_s"] = round(time.time() - T_START, 1)
    print("phase 1 (transformers) done at %.0f s" % res["phase1_s"], file=sys.stderr)
    if a.lib_ready:
        while not os.path.exists(a.lib_ready):
            if os.path.exists(a.lib_ready + ".failed") or left() < 20:
                res["lib_error"] = "the library build failed or did not end in time"
                save()
                print(res["lib_error"])
                return 1
            time.sleep(1)
    res["lib_ready_s"] = round(time.time() - T_START, 1)
    lib = load_lib(a.lib)
    res["families"] = families(lib)
    if refs is not None:
        step("parity", parity, lib, a, res, refs)
    if prep is not None:
        if left() < 35:
            res["bench_skipped"] = "%.0f s left of the budget" % left()
        else:
            step("bench", bench, lib, a, res, prep, a.reps if left() > 70 else 1)
    save()
    t = table(res)
    print(t)
    open(os.path.join(a.out, "table.txt"), "w").write(t + "\n")
    for k in ("parity_refs_error", "bench_prepare_error", "parity_error", "bench_error", "bench_skipped"):
        if k in res:
            print(k + ": " + res[k].strip().splitlines()[-1])
    s = res.get("parity_summary") or {}
    return 0 if s and s["single_exact"] >= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
