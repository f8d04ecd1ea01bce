#!/usr/bin/env python3
"""Parity test and benchmark of libmodelqual_cuda.so through its C ABI (ctypes), on a GPU.

Why a Python driver: transformers (the reference) lives in Python on the GPU machine, which has
no Go toolchain. The driver loads random-weight models with transformers, hands their
state_dict as fp32 host arrays to mqb_model_open exactly as the Go runtime hands bundle tensors,
and compares.

  parity  tiny qwen3 / gpt2 (fixture shapes), precisions fp32/bf16/fp16: mqb_logits_all and
          greedy decoding through mqb_forward (one mixed-length prefill call + 32 batched decode
          steps, batch 6 / 3 / 1, with and without graphs: qwen3 bf16/fp16 through the tile
          kernel at every batch, fp32 and gpt2's batches 3 and 1 through the fused GEMV) against
          transformers fp32 and bf16 on the same GPU: max |dlogit| (teacher-forced along our
          tokens) and greedy agreement with transformers' own greedy tokens.
  bench   Qwen3-0.6B-shaped random model in bf16: decode tokens/s at batch 1 and 32
          (BENCH_BATCHES lists others) through mqb_forward (greedy via argmax_out), the
          memory-bandwidth bound (weight bytes per step over the device-to-device copy
          bandwidth measured here), transformers eager generate at batch 1 and 32, ratios;
          "chained" the same decode with the host out of the loop
          (mqb_debug_chain: tokens fed on the device, no synchronisation between steps).
          BENCH_VARIANTS picks switch settings to compare (key=value[+key=value...]);
          BENCH_ROUNDS=n passes over them n times in turn and prints each one's median and its
          ratio to the default's (run_variants).
  trace   graph-replayed decode steps under CUPTI: every kernel charged with how much it moved
          the step's end, and the GPU's idle time between steps (see trace()).
  decode  plain decode steps, the process to run under Nsight Compute.
  prefill prompts prefilled in one forward call (the engine's share of time to first token), per
          token cap of a forward chunk (MQB_TCAP), with the kernels' summed time (see prefill_bench()).
  coldstart the first calls on a freshly opened model as a served concurrency-32 point makes them
          (one prompt, then 31 prompts beside its first decode, then decode steps of 32), each
          timed, and the same sequence again on the warm model (see coldstart()).

Usage (GPU machine, after `make cuda`):
  python3 native/cuda/mqb_bench.py parity --lib native/cuda/build/libmodelqual_cuda.so --out parity.json
  python3 native/cuda/mqb_bench.py bench  --lib native/cuda/build/libmodelqual_cuda.so --out bench.json
"""
import argparse
import contextlib
import ctypes
import json
import os
import sys
import time

C_I32P = ctypes.POINTER(ctypes.c_int32)
C_F32P = ctypes.POINTER(ctypes.c_float)
C_CHARP = ctypes.POINTER(ctypes.c_char)  # error buffers (create_string_buffer)


class MqbTensor(ctypes.Structure):  # ABI 3: fp32 data only
    _fields_ = [("name", ctypes.c_char_p), ("data", C_F32P), ("shape", ctypes.c_int64 * 4),
                ("ndim", ctypes.c_int32)]


class MqbParams(ctypes.Structure):  # ABI 3: the backend parsed config.json itself
    _fields_ = [("abi_version", ctypes.c_int32), ("family", ctypes.c_char_p),
                ("config_json", ctypes.c_char_p), ("precision", ctypes.c_char_p),
                ("max_batch", ctypes.c_int32), ("max_context", ctypes.c_int32),
                ("device_index", ctypes.c_int32), ("tensors", ctypes.POINTER(MqbTensor)),
                ("n_tensors", ctypes.c_int32)]


class MqbTensor4(ctypes.Structure):  # ABI 4: tensors at their stored precision
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("ndim", ctypes.c_int32)]


class MqbHparam(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_double), ("str", ctypes.c_char_p)]


class MqbParams4(ctypes.Structure):  # ABI 4: resolved hyper-parameters instead of config.json
    _fields_ = [("abi_version", ctypes.c_int32), ("family", ctypes.c_char_p),
                ("hparams", ctypes.POINTER(MqbHparam)), ("n_hparams", ctypes.c_int32),
                ("precision", ctypes.c_char_p), ("max_batch", ctypes.c_int32),
                ("max_context", ctypes.c_int32), ("device_index", ctypes.c_int32),
                ("tensors", ctypes.POINTER(MqbTensor4)), ("n_tensors", ctypes.c_int32)]


ABIS = (3, 4, 5, 6)  # MQB_ABI_VERSION values this driver speaks (6: native/include/mq_backend.h today; 5 adds mqb_set_image, 6 mqb_set_images and mqb_vision_ns)


def hparams_of(family, d):
    """The hyper-parameters ABI 4 passes, from a config dict, with transformers' defaults (what
    the runtime's family resolve steps in native/models compute in the product)."""
    if family == "gpt2":
        H, nh = d["n_embd"], d["n_head"]
        return dict(vocab_size=d["vocab_size"], hidden_size=H, num_layers=d["n_layer"], num_heads=nh,
                    num_kv_heads=nh, head_dim=H // nh, intermediate_size=d.get("n_inner") or 4 * H,
                    max_positions=d["n_positions"], norm_eps=d.get("layer_norm_epsilon", 1e-5), rope_theta=0,
                    tie_word_embeddings=1, attention_bias=1,
                    scale_attn_by_inverse_layer_idx=int(bool(d.get("scale_attn_by_inverse_layer_idx", False))))
    H, nh = d["hidden_size"], d["num_attention_heads"]
    rp = d.get("rope_parameters") or {}
    theta = d.get("rope_theta") or rp.get("rope_theta") or 10000
    return dict(vocab_size=d["vocab_size"], hidden_size=H, num_layers=d["num_hidden_layers"], num_heads=nh,
                num_kv_heads=d.get("num_key_value_heads") or nh, head_dim=d.get("head_dim") or H // nh,
                intermediate_size=d["intermediate_size"], max_positions=d["max_position_embeddings"],
                norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=theta,
                tie_word_embeddings=int(bool(d.get("tie_word_embeddings", False))),
                attention_bias=int(bool(d.get("attention_bias", False))), scale_attn_by_inverse_layer_idx=0)


def load_lib(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.mqb_abi_version.restype = ctypes.c_int32
    lib.abi = lib.mqb_abi_version()
    assert lib.abi in ABIS, "ABI version %d; this driver speaks %s" % (lib.abi, ABIS)
    lib.mqb_model_open.argtypes = [ctypes.POINTER(MqbParams4 if lib.abi >= 4 else MqbParams),
                                   ctypes.POINTER(ctypes.c_void_p), C_CHARP, ctypes.c_size_t]
    lib.mqb_model_open.restype = ctypes.c_int
    lib.mqb_model_close.argtypes = [ctypes.c_void_p]
    lib.mqb_vocab_size.argtypes = [ctypes.c_void_p]
    lib.mqb_vocab_size.restype = ctypes.c_int32
    lib.mqb_forward.argtypes = [ctypes.c_void_p, ctypes.c_int32, C_I32P, C_I32P, C_I32P, C_I32P, C_F32P,
                                C_I32P, C_CHARP, ctypes.c_size_t]
    lib.mqb_forward.restype = ctypes.c_int
    lib.mqb_forward_sampled.argtypes = [ctypes.c_void_p, ctypes.c_int32, C_I32P, C_I32P, C_I32P, C_I32P, C_F32P,
                                        ctypes.POINTER(ctypes.c_uint64), C_I32P, C_F32P, C_CHARP, ctypes.c_size_t]
    lib.mqb_forward_sampled.restype = ctypes.c_int
    lib.mqb_logits_all.argtypes = [ctypes.c_void_p, C_I32P, ctypes.c_int32, C_F32P, C_CHARP,
                                   ctypes.c_size_t]
    lib.mqb_logits_all.restype = ctypes.c_int
    lib.mqb_slot_reset.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    # The debug entry points exist only in the lab's builds (lab/cuda/debug_abi.cu compiled in);
    # a product build has none: lib.debug is False and the switches and chained decode refuse
    # (SwitchUnavailable, RuntimeError) while everything else runs. The per-kernel profile and the
    # decode-step timeline left the library: run this script under `nsys profile` for them.
    lib.debug = hasattr(lib, "mqb_debug_set")
    if lib.debug:
        lib.mqb_debug_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32]
        lib.mqb_debug_set.restype = ctypes.c_int
        lib.mqb_debug_chain.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, C_I32P, C_I32P, C_CHARP,
                                        ctypes.c_size_t]
        lib.mqb_debug_chain.restype = ctypes.c_int
    return lib


def need_debug(lib, what):
    """Refuses what (a debug feature) on a product build, saying how to get a lab build."""
    if not lib.debug:
        raise RuntimeError("%s needs the lab's debug entry points: build the library with "
                           "lab/cuda/debug_abi.cu (before_after.sh LAB_DEBUG=1, or cmake -DMQB_EXTRA_SOURCES=...)" % what)


def i32arr(vals):
    return (ctypes.c_int32 * len(vals))(*vals)


class SwitchUnavailable(RuntimeError):
    """A debug switch this build or model does not have (mqb_debug_set refused it)."""


class Backend:
    """One mqb_model opened from a torch state_dict."""

    def __init__(self, lib, family, config_json, state_dict, precision, max_batch, max_context):
        import torch
        self.lib = lib
        keep = []
        items = list(state_dict.items())
        abi4 = lib.abi >= 4
        arr = ((MqbTensor4 if abi4 else MqbTensor) * len(items))()
        for i, (name, t) in enumerate(items):
            h = t.detach().to(torch.float32).cpu().contiguous()
            nb = name.encode()
            keep += [h, nb]
            arr[i].name = nb
            if abi4:
                arr[i].data = ctypes.c_void_p(h.data_ptr())
                arr[i].dtype = 0  # f32
            else:
                arr[i].data = ctypes.cast(ctypes.c_void_p(h.data_ptr()), C_F32P)
            for d in range(h.dim()):
                arr[i].shape[d] = h.shape[d]
            arr[i].ndim = h.dim()
        if abi4:
            hp = hparams_of(family, json.loads(config_json))
            hps = (MqbHparam * len(hp))()
            for i, (k, v) in enumerate(hp.items()):
                kb = k.encode()
                keep.append(kb)
                hps[i].key, hps[i].value, hps[i].str = kb, float(v), None
            keep.append(hps)
            p = MqbParams4(lib.abi, family.encode(), ctypes.cast(hps, ctypes.POINTER(MqbHparam)), len(hp),
                           precision.encode(), max_batch, max_context, 0,
                           ctypes.cast(arr, ctypes.POINTER(MqbTensor4)), len(items))
        else:
            p = MqbParams(lib.abi, family.encode(), config_json.encode(), precision.encode(), max_batch,
                          max_context, 0, ctypes.cast(arr, ctypes.POINTER(MqbTensor)), len(items))
        err = ctypes.create_string_buffer(4096)
        m = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = lib.mqb_model_open(ctypes.byref(p), ctypes.byref(m), err, 4096)
        self.open_s = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError("mqb_model_open: " + err.value.decode())
        del keep
        self.m = m
        self.V = lib.mqb_vocab_size(m)
        self.err = ctypes.create_string_buffer(4096)
        self._dec = None

    def close(self):
        if self.m:
            self.lib.mqb_model_close(self.m)
            self.m = None

    def set(self, key, value):
        if not self.lib.debug:
            raise SwitchUnavailable("%s: this build has no debug switches (a product build)" % key)
        rc = self.lib.mqb_debug_set(self.m, key.encode(), int(value))
        if rc != 0:
            raise SwitchUnavailable("mqb_debug_set %s=%s failed" % (key, value))

    @contextlib.contextmanager
    def switched(self, opts):
        """The debug switches opts for the with block, then backend.cu's defaults (DEFAULTS) for
        them again, also when one could not be set (SwitchUnavailable: e.g. tc_min_b in a build
        without MQB_TC_PRODUCTS) or the block raised."""
        try:
            for k, v in opts.items():
                self.set(k, v)
            yield
        finally:
            for k in opts:
                self.set(k, DEFAULTS[k])

    def forward(self, slots, ntoks, tokens, start_pos, want_logits=False, out=None):
        """Returns (argmax list, logits tensor [n, V] or None); out: a float32 [n, V] tensor to
        take the logits (a fresh one is allocated otherwise)."""
        import torch
        n = len(slots)
        am = (ctypes.c_int32 * n)()
        lo = None
        lp = None
        if want_logits:
            lo = out if out is not None else torch.empty((n, self.V), dtype=torch.float32)
            lp = ctypes.cast(ctypes.c_void_p(lo.data_ptr()), C_F32P)
        rc = self.lib.mqb_forward(self.m, n, i32arr(slots), i32arr(ntoks), i32arr(tokens), i32arr(start_pos), lp,
                                  am, self.err, 4096)
        if rc != 0:
            raise RuntimeError("mqb_forward: " + self.err.value.decode())
        return list(am), lo

    def forward_sampled(self, slots, ntoks, tokens, start_pos, temps, keys):
        """Next token of every entry drawn on the device (temperature <= 0: argmax)."""
        n = len(slots)
        out = (ctypes.c_int32 * n)()
        rc = self.lib.mqb_forward_sampled(self.m, n, i32arr(slots), i32arr(ntoks), i32arr(tokens), i32arr(start_pos),
                                          (ctypes.c_float * n)(*temps), (ctypes.c_uint64 * n)(*keys), out, None,
                                          self.err, 4096)
        if rc != 0:
            raise RuntimeError("mqb_forward_sampled: " + self.err.value.decode())
        return list(out)

    def decoder(self, n):
        """Preallocated arrays for fast decode steps of n sequences in slots 0..n-1."""
        self._dec = dict(n=n, slots=i32arr(list(range(n))), ntok=i32arr([1] * n), tok=(ctypes.c_int32 * n)(),
                         pos=(ctypes.c_int32 * n)(), am=(ctypes.c_int32 * n)())
        return self._dec

    def decode_fast(self, toks, pos):
        d = self._dec
        for i in range(d["n"]):
            d["tok"][i] = toks[i]
            d["pos"][i] = pos[i] if isinstance(pos, list) else pos
        rc = self.lib.mqb_forward(self.m, d["n"], d["slots"], d["ntok"], d["tok"], d["pos"], None, d["am"],
                                  self.err, 4096)
        if rc != 0:
            raise RuntimeError("mqb_forward: " + self.err.value.decode())
        return list(d["am"])

    def logits_all(self, ids):
        import torch
        out = torch.empty((len(ids), self.V), dtype=torch.float32)
        rc = self.lib.mqb_logits_all(self.m, i32arr(ids), len(ids), ctypes.cast(ctypes.c_void_p(out.data_ptr()), C_F32P),
                                     self.err, 4096)
        if rc != 0:
            raise RuntimeError("mqb_logits_all: " + self.err.value.decode())
        return out


# ----------------------------------------------------------------------------------------------
# Models


def qwen3_config(**kw):
    from transformers import Qwen3Config
    theta = kw.pop("rope_theta")
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    except TypeError:
        cfg = Qwen3Config(rope_theta=theta, **kw)
    rp = getattr(cfg, "rope_parameters", None) or {}
    eff = rp.get("rope_theta", getattr(cfg, "rope_theta", None)) if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
    if eff != theta:
        raise RuntimeError("could not set rope_theta=%s on Qwen3Config (got %s)" % (theta, eff))
    return cfg


def config_json(cfg, model=None):
    d = json.loads(cfg.to_json_string(use_diff=False))
    # The backend prefers a top-level rope_theta; make it the one transformers really uses,
    # read back from the rotary embedding's inv_freq (inv_freq[1] = theta^(-2/D)).
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:
        d["rope_theta"] = rp["rope_theta"]
    if model is not None and getattr(cfg, "model_type", "") == "qwen3":
        try:
            inv = model.model.rotary_emb.inv_freq.double().cpu()
            eff = float(inv[1] ** (-(2 * inv.numel()) / 2.0))
            want = d.get("rope_theta")
            if want is None or abs(eff - want) / want > 1e-3:
                print("WARNING: transformers uses rope_theta %.6g, config says %s; passing the former" % (eff, want))
                d["rope_theta"] = eff
        except Exception as e:  # keep the config's value
            print("WARNING: could not read inv_freq: %s" % e)
    return json.dumps(d)


def qwen3_shape_config():
    """Qwen3-0.6B's shapes (the benchmark model, random weights)."""
    return qwen3_config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                        rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0)


def tiny_model(family, seed):
    import torch
    torch.manual_seed(seed)
    if family.startswith("qwen3"):
        from transformers import Qwen3ForCausalLM
        # qwen3g5: five query heads per KV head (as Qwen3-14B's 40/8), the attention kernels'
        # GM = 8 instantiation with G < GM.
        heads = 10 if family == "qwen3g5" else 4
        cfg = qwen3_config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=heads, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                           rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0)
        model = Qwen3ForCausalLM(cfg)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=64, n_layer=2, n_head=4)
        model = GPT2LMHeadModel(cfg)
    # Random init leaves norms at 1 and biases at 0; perturb them so a misapplied weight shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith(".bias"):
                p.add_(0.2 * torch.randn_like(p))
    try:
        model.set_attn_implementation("eager")
    except Exception:
        model.config._attn_implementation = "eager"
    return model.eval()


def hf_greedy(model, ids, steps, dev):
    import torch
    out = []
    x = torch.tensor([ids], device=dev)
    past = None
    with torch.no_grad():
        for _ in range(steps):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            nxt = int(r.logits[0, -1].float().argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]], device=dev)
    return out


def hf_logits(model, ids, dev):
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu()


def agree(a, b):
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return dict(match=sum(int(x == y) for x, y in zip(a, b)), total=len(a), first_mismatch=first)


def parity(args):
    import copy
    import torch
    lib = load_lib(args.lib)
    dev = "cuda"
    steps = 33  # 1 token from the prefill call + 32 decode steps
    results = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, configs=[])
    import transformers
    results["transformers"] = transformers.__version__
    lens = [5, 17, 33, 64, 9, 40]
    # Prefill chunks of 512 tokens (the backend's default is 2,048), so that the 700-token prompt
    # below spans two chunks and the second continues the first through the KV cache.
    os.environ.setdefault("MQB_TCAP", "512")
    for family in os.environ.get("PARITY_FAMILIES", "qwen3,gpt2").split(","):
        model = tiny_model(family, 1234)
        fam_be = "qwen3" if family.startswith("qwen3") else family  # the backend's family name
        if os.environ.get("SAMPLING_ONLY"):  # the device sampler alone (default decode path)
            sd = {k: v.clone() for k, v in model.state_dict().items()}
            V = model.config.vocab_size
            g = torch.Generator().manual_seed(7)
            prompt = torch.randint(0, V, (17,), generator=g).tolist()
            for prec in ["bf16"]:
                results["configs"].append(dict(family=family, precision=prec, sampling=sampling_check(
                    load_lib(args.lib), fam_be, config_json(model.config, model), sd, prec, prompt, V)))
            continue
        cj = config_json(model.config, model)
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        V = model.config.vocab_size
        ref32 = model.to(dev).float().eval()
        ref16 = copy.deepcopy(ref32).to(torch.bfloat16).eval()
        g = torch.Generator().manual_seed(7)
        prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
        la_ids = torch.randint(0, V, (100,), generator=g).tolist()
        la32 = hf_logits(ref32, la_ids, dev)
        la16 = hf_logits(ref16, la_ids, dev)
        hf32 = [hf_greedy(ref32, p, steps, dev) for p in prompts]
        hf16 = [hf_greedy(ref16, p, steps, dev) for p in prompts]
        # A prompt longer than one prefill chunk (MQB_TCAP 512): the first chunk ends no entry.
        plong = torch.randint(0, V, (700,), generator=torch.Generator().manual_seed(11)).tolist()
        long32, long16 = hf_greedy(ref32, plong, 16, dev), hf_greedy(ref16, plong, 16, dev)
        precs = ["fp32", "bf16", "fp16"] if family == "qwen3" else ["fp32", "bf16"]
        if os.environ.get("PARITY_PRECISIONS"):
            precs = [p for p in precs if p in os.environ["PARITY_PRECISIONS"].split(",")]
        for prec in precs:
            entry = dict(family=family, precision=prec)
            try:
                # max_batch 32: batch32 runs the decode bucket whose products go through cuBLAS
                # (tuned by blas_pick), the others the buckets of the backend's own kernels.
                be = Backend(lib, fam_be, cj, sd, prec, max_batch=32, max_context=1024)
                if os.environ.get("PARITY_ATTN_SPLIT"):
                    need_debug(lib, "PARITY_ATTN_SPLIT")
                    be.set("attn_split", int(os.environ["PARITY_ATTN_SPLIT"]))
                    entry["attn_split"] = int(os.environ["PARITY_ATTN_SPLIT"])
                la = be.logits_all(la_ids)
                entry["logits_all"] = dict(
                    n=len(la_ids), max_abs_vs_fp32=float((la - la32).abs().max()),
                    max_abs_vs_bf16=float((la - la16).abs().max()), ref_max_abs=float(la32.abs().max()),
                    hf_bf16_vs_fp32=float((la16 - la32).abs().max()),
                    argmax_agree_fp32=float((la.argmax(-1) == la32.argmax(-1)).float().mean()))
                runs = []
                for batch_name, idxs in [("batch6", [0, 1, 2, 3, 4, 5]), ("batch3", [0, 1, 2]), ("batch1", [3]),
                                         ("batch3_nograph", [0, 1, 2]), ("batch3_megakernel", [0, 1, 2]),
                                         ("batch32", [i % 6 for i in range(32)])]:
                    if batch_name == "batch3_nograph":
                        try:
                            be.set("graphs", 0)
                        except SwitchUnavailable:  # a product build: graphs stay on (MQB_GRAPHS=0 is the knob)
                            continue
                    if batch_name == "batch3_megakernel":
                        try:
                            be.set("megakernel", 1)
                        except RuntimeError:  # not in this build (cmake -DMQB_MEGAKERNEL=ON): nothing to compare
                            continue
                    ps = [prompts[i] for i in idxs]
                    n = len(ps)
                    toks, lo = be.forward(list(range(n)), [len(p) for p in ps], [t for p in ps for t in p], [0] * n,
                                          want_logits=True)
                    gen = [[t] for t in toks]
                    step_logits = [[lo[i].clone()] for i in range(n)]
                    pos = [len(p) for p in ps]
                    for _ in range(steps - 1):
                        toks, lo = be.forward(list(range(n)), [1] * n, toks, pos, want_logits=True)
                        for i in range(n):
                            gen[i].append(toks[i])
                            step_logits[i].append(lo[i].clone())
                        pos = [p + 1 for p in pos]
                    if batch_name == "batch3_nograph":
                        be.set("graphs", 1)
                    if batch_name == "batch3_megakernel":
                        be.set("megakernel", 0)
                    r = dict(name=batch_name, seqs=[])
                    md32 = md16 = 0.0
                    for j, i in enumerate(idxs):
                        full = prompts[i] + gen[j][:-1]
                        ours = torch.stack(step_logits[j])
                        r32 = hf_logits(ref32, full, dev)[len(prompts[i]) - 1:]
                        r16 = hf_logits(ref16, full, dev)[len(prompts[i]) - 1:]
                        d32 = float((ours - r32).abs().max())
                        d16 = float((ours - r16).abs().max())
                        md32, md16 = max(md32, d32), max(md16, d16)
                        am_ok = all(int(ours[s].argmax()) == gen[j][s] for s in range(steps))
                        r["seqs"].append(dict(prompt_len=len(prompts[i]), max_abs_vs_fp32=d32, max_abs_vs_bf16=d16,
                                              argmax_consistent=am_ok, greedy_vs_hf_fp32=agree(gen[j], hf32[i]),
                                              greedy_vs_hf_bf16=agree(gen[j], hf16[i]), tokens=gen[j]))
                    r["max_abs_vs_fp32"] = md32
                    r["max_abs_vs_bf16"] = md16
                    runs.append(r)
                tokens_of = {r["name"]: [s["tokens"] for s in r["seqs"]] for r in runs}
                b3 = tokens_of["batch3"]
                # graphs vs eager must give identical tokens; None: a product build (no switch to turn graphs off)
                entry["graph_equals_eager"] = (b3 == tokens_of["batch3_nograph"]
                                               if "batch3_nograph" in tokens_of else None)
                # batch composition must not change a sequence's tokens much; report equality
                entry["batch6_vs_batch3_same_tokens"] = tokens_of["batch6"][:3] == b3
                # the megakernel (a build with -DMQB_MEGAKERNEL=ON) against the per-kernel path; None: not built
                entry["megakernel_equals_per_kernel_tokens"] = (b3 == tokens_of["batch3_megakernel"]
                                                                if "batch3_megakernel" in tokens_of else None)
                entry["runs"] = runs
                toks, _ = be.forward([0], [len(plong)], plong, [0])
                gl, pos = [toks[0]], len(plong)
                for _ in range(15):
                    toks, _ = be.forward([0], [1], [gl[-1]], [pos])
                    gl.append(toks[0])
                    pos += 1
                entry["long_prompt"] = dict(prompt_len=len(plong), greedy_vs_hf_fp32=agree(gl, long32),
                                            greedy_vs_hf_bf16=agree(gl, long16))
                be.close()
                if prec != "fp32":
                    entry["sampling"] = sampling_check(lib, fam_be, cj, sd, prec, prompts[1], V)
            except Exception as e:  # keep going: one failing config must not hide the others
                import traceback
                traceback.print_exc()
                entry["error"] = str(e)
            results["configs"].append(entry)
            summarize_parity(entry)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


def sampling_check(lib, family, cj, sd, prec, prompt, V):
    """Device Gumbel-max sampling against softmax(logits/T): 32 slots hold the same history, so
    every entry of a step draws from the same distribution; 120 steps at the same position give
    3,840 draws. Also a wrong temperature (the planted defect) must fail the same test, and
    temperature-0 entries in the same batch must return the argmax."""
    import torch
    be = Backend(lib, family, cj, sd, prec, max_batch=32, max_context=256)
    n = 32
    toks, _ = be.forward(list(range(n)), [len(prompt)] * n, prompt * n, [0] * n)
    x, pos = toks[0], len(prompt)
    _, lo = be.forward([0], [1], [x], [pos], want_logits=True)
    lg = lo[0].double()
    lo_t, hi_t = 1e-4, 10.0  # temperature with the top probability near 0.5
    for _ in range(60):
        mid = (lo_t * hi_t) ** 0.5
        if torch.softmax(lg / mid, 0).max() > 0.5:
            lo_t = mid
        else:
            hi_t = mid
    T = (lo_t * hi_t) ** 0.5
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(V, dtype=torch.float64)
    greedy_ok = True
    argmax = int(lg.argmax())
    steps = 120
    for _ in range(steps):
        keys = torch.randint(0, 2 ** 62, (n,), generator=g).tolist()
        temps = [T] * (n - 2) + [0.0, 0.0]
        out = be.forward_sampled(list(range(n)), [1] * n, [x] * n, [pos] * n, temps, keys)
        for t in out[:n - 2]:
            counts[t] += 1
        greedy_ok = greedy_ok and out[n - 2] == argmax and out[n - 1] == argmax
    be.close()
    N = counts.sum()

    def chi2(temp):
        p = torch.softmax(lg / temp, 0)
        e = p * N
        big = e >= 5
        obs = torch.cat([counts[big], counts[~big].sum().view(1)])
        exp = torch.cat([e[big], e[~big].sum().view(1)])
        keep = exp > 0
        stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
        dof = int(keep.sum()) - 1
        tvd = float(0.5 * (counts / N - p).abs().sum())
        return stat, dof, tvd

    s_ok, d_ok, tvd_ok = chi2(T)
    s_bad, d_bad, tvd_bad = chi2(T * 1.5)
    r = dict(temperature=T, draws=int(N), top_prob=float(torch.softmax(lg / T, 0).max()),
             chi2=s_ok, dof=d_ok, tvd=tvd_ok, chi2_wrong_T=s_bad, dof_wrong_T=d_bad, tvd_wrong_T=tvd_bad,
             greedy_entries_are_argmax=greedy_ok,
             # 99.9th percentile of chi2 is below dof + 3.1*sqrt(2 dof) + 10 for these dof
             passes=s_ok < d_ok + 3.1 * (2 * d_ok) ** 0.5 + 10, wrong_T_fails=s_bad >= d_bad + 3.1 * (2 * d_bad) ** 0.5 + 10)
    print("SAMPLING %s %s: T=%.4g draws=%d chi2=%.1f/dof %d (tvd %.3f) pass=%s; wrong T: chi2=%.1f/dof %d fail=%s; "
          "greedy entries argmax=%s" % (family, prec, T, N, s_ok, d_ok, tvd_ok, r["passes"], s_bad, d_bad,
                                        r["wrong_T_fails"], greedy_ok), flush=True)
    return r


def summarize_parity(e):
    if "error" in e:
        print("PARITY %s %s ERROR %s" % (e["family"], e["precision"], e["error"]), flush=True)
        return
    la = e["logits_all"]
    print("PARITY %s %s logits_all: max|d| vs hf32 %.3g, vs hf bf16 %.3g (hf bf16 vs hf32 %.3g, |ref| max %.3g, argmax agree %.3f)"
          % (e["family"], e["precision"], la["max_abs_vs_fp32"], la["max_abs_vs_bf16"], la["hf_bf16_vs_fp32"],
             la["ref_max_abs"], la["argmax_agree_fp32"]), flush=True)
    for r in e["runs"]:
        g32 = sum(s["greedy_vs_hf_fp32"]["match"] for s in r["seqs"])
        g16 = sum(s["greedy_vs_hf_bf16"]["match"] for s in r["seqs"])
        tot = sum(s["greedy_vs_hf_fp32"]["total"] for s in r["seqs"])
        first = [s["greedy_vs_hf_fp32"]["first_mismatch"] for s in r["seqs"]]
        cons = all(s["argmax_consistent"] for s in r["seqs"])
        print("   %-15s decode max|d| vs hf32 %.3g vs hf bf16 %.3g | greedy = hf32 %d/%d (first mismatch %s), = hf bf16 %d/%d | argmax==logits %s"
              % (r["name"], r["max_abs_vs_fp32"], r["max_abs_vs_bf16"], g32, tot, first, g16, tot, cons), flush=True)
    print("   graph==eager %s, batch6 prefix==batch3 %s, megakernel==per-kernel tokens %s"
          % (e["graph_equals_eager"], e["batch6_vs_batch3_same_tokens"], e.get("megakernel_equals_per_kernel_tokens")),
          flush=True)
    lp = e.get("long_prompt")
    if lp:
        print("   long prompt %d tokens (two prefill chunks): greedy = hf32 %d/%d, = hf bf16 %d/%d"
              % (lp["prompt_len"], lp["greedy_vs_hf_fp32"]["match"], lp["greedy_vs_hf_fp32"]["total"],
                 lp["greedy_vs_hf_bf16"]["match"], lp["greedy_vs_hf_bf16"]["total"]), flush=True)


# ----------------------------------------------------------------------------------------------
# Benchmark


def copy_bandwidth():
    import torch
    nbytes = 2 << 30
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    t = times[len(times) // 2]
    del x, y
    torch.cuda.empty_cache()
    return 2 * nbytes / t  # bytes read + written per second


def graph_floor(cfg, reps=200):
    """What a decode step's chain of dependent kernels costs before our kernels' own work: CUDA
    graphs (torch's capture, no programmatic dependent launch) of (a) as many 1-element adds as
    our batch-1 step has kernels and (b) the step's matrix products alone as cuBLAS GEMVs in
    bf16 (28 layers of qkv, o, gate/up, down with their own weights, then the LM head), at
    batch 1 and 32. Returns seconds per replay by name."""
    import torch
    import torch.nn.functional as F
    H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    QKV = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    AO = cfg.num_attention_heads * cfg.head_dim
    kernels = 5 * L + 2

    def timed(fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    out = {}
    x1 = torch.zeros(1, device="cuda")

    def adds():
        for _ in range(kernels):
            x1.add_(1)
    out["empty_chain_%d" % kernels] = timed(adds)
    bf = torch.bfloat16
    Ws = [(torch.randn(QKV, H, dtype=bf, device="cuda"), torch.randn(H, AO, dtype=bf, device="cuda"),
           torch.randn(2 * I, H, dtype=bf, device="cuda"), torch.randn(H, I, dtype=bf, device="cuda"))
          for _ in range(L)]
    lm = torch.randn(V, H, dtype=bf, device="cuda")
    for B in (1, 32):
        x = torch.randn(B, H, dtype=bf, device="cuda")

        def chain():
            h = x
            for wq, wo, wu, wd in Ws:
                q = F.linear(h, wq)
                h = F.linear(q[:, :AO], wo)
                u = F.linear(h, wu)
                h = F.linear(u[:, :I], wd)
            F.linear(h, lm)
        out["cublas_products_b%d" % B] = timed(chain)
    del Ws, lm
    torch.cuda.empty_cache()
    return out


def prefill_and_warm(be, B, prompt_len, warm, V, seed):
    """B random prompts (seeded) prefilled into slots 0..B-1, then warm decode steps (which also
    capture the step's graph); returns every step's tokens so far and the next position."""
    import torch
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, V, (B, prompt_len), generator=g).tolist()
    toks, _ = be.forward(list(range(B)), [prompt_len] * B, [t for p in prompts for t in p], [0] * B)
    be.decoder(B)
    pos = prompt_len
    gen = [toks]
    for _ in range(warm):
        toks = be.decode_fast(toks, pos)
        pos += 1
        gen.append(toks)
    return gen, pos


def bench_ours(be, B, prompt_len, warm, steps, V, seed):
    gen, pos = prefill_and_warm(be, B, prompt_len, warm, V, seed)
    toks = gen[-1]
    t0 = time.perf_counter()
    for _ in range(steps):
        toks = be.decode_fast(toks, pos)
        pos += 1
        gen.append(toks)
    dt = time.perf_counter() - t0
    return B * steps / dt, dt / steps, gen


def bench_chained(be, B, prompt_len, warm, steps, V, seed):
    """bench_ours' decode, but after the warm-up steps the rest run as one mqb_debug_chain: each
    step's tokens come from the previous step's argmax on the device, and the host never waits in
    between. Returns tok/s, s/step and the last step's tokens (for comparison with bench_ours')."""
    _, pos = prefill_and_warm(be, B, prompt_len, warm, V, seed)
    out = (ctypes.c_int32 * B)()
    t0 = time.perf_counter()
    need_debug(be.lib, "chained decode")
    rc = be.lib.mqb_debug_chain(be.m, B, steps, i32arr([pos - 1] * B), out, be.err, 4096)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError("mqb_debug_chain: " + be.err.value.decode())
    return B * steps / dt, dt / steps, list(out)


def bench_hf(model, B, prompt_len, new, V, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, prompt_len), generator=g).to("cuda")
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    produced = out.shape[1] - prompt_len
    return B * produced / dt, out[:, prompt_len:].tolist()


def kernel_name(e, width):
    """A CUPTI kernel event's name without its template arguments and parameters, cut to its last
    width characters (the trace and prefill modes' labels)."""
    return e.name.split("<")[0].split("(")[0].split(" ")[-1][-width:]


def switches_of(name):
    """The debug switches a variant named key=value[+key=value...] sets."""
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in name.split("+")}


# The backend's switches as the bench leaves them between variants (backend.cu's defaults).
DEFAULTS = {"pdl": 1, "graphs": 1, "mixed_graphs": 1, "gemv_max_b": 4, "attn_split": 0, "megakernel": 0, "mk_skip": 0, "fused_attn": 1,
            "tc_min_b": 0, "attn_lanes": 1, "attn_flash": 1, "skinny": 1,
            "tile_max_b": 16, "tile_rt": 0, "tile_z": 0, "fuse_max_b": 16, "tile_pre": 3, "prefill_flash": 1,
            "prefill_tc": 1, "prefill_one": 17, "prep_vec": 1, "post_n": 1, "blas_tune": 1, "attn_cluster": 1, "tile_cluster": 1, "pre_params": 1, "attn_push": 1,
            "tile_push": 1, "rms_compact_b": 2}


def run_variants(batches, variants, rounds, measure, out=print):
    """The decode benchmark's variants at each batch: rounds passes over the variants in turn (the
    same order each pass, so that a drift of the machine within the call touches every variant
    alike), measure(B, opts) giving (tok/s, s/step, tokens) for one. Prints every measurement
    and, with more than one round, each variant's median (of an even count, the mean of the middle
    two) and its ratio to the default's median. Returns {"b<B>_<name>": {tok_s, step_ms (medians),
    runs (tok/s of each round), same_tokens_as_default}}; a variant the build cannot run
    (SwitchUnavailable) is printed as skipped and left out."""
    import statistics
    ours = {}
    for B in batches:
        ref = None  # the default's tokens, from its first round
        for r in range(rounds):
            for name, opts in variants:
                if name.startswith("attn_split") and B == 32:
                    continue  # batch 32 is not fused by default, so the split does not apply
                # tile equals the default up to 16 rows (the layers' products of batches 1-16 run
                # the tile kernel by default).
                if name == "tile" and B <= 16:
                    continue
                key = "b%d_%s" % (B, name)
                if r > 0 and key not in ours:
                    continue  # skipped in the first round
                try:
                    tps, step_s, gen = measure(B, opts)
                except SwitchUnavailable as e:  # e.g. tc_products in a build without MQB_TC_PRODUCTS
                    out("BENCH ours batch %2d %-12s skipped: %s" % (B, name, e), flush=True)
                    continue
                e = ours.setdefault(key, dict(runs=[], step_s=[]))
                e["runs"].append(tps)
                e["step_s"].append(step_s)
                if name == "default" and ref is None:
                    ref = gen
                same = None
                if name != "default" and ref is not None:
                    same = gen == ref
                    e["same_tokens_as_default"] = e.get("same_tokens_as_default", True) and same
                out("BENCH ours batch %2d %-12s %9.0f tok/s  (%.3f ms/step)%s%s"
                    % (B, name, tps, step_s * 1e3, "" if same is None else "  same tokens: %s" % same,
                       "  (round %d)" % (r + 1) if rounds > 1 else ""), flush=True)
        for name, _ in variants:
            e = ours.get("b%d_%s" % (B, name))
            if e is None or "tok_s" in e:
                continue
            e["tok_s"] = statistics.median(e["runs"])
            e["step_ms"] = statistics.median(e.pop("step_s")) * 1e3
            if rounds > 1:
                d = ours.get("b%d_default" % B)
                vs = "" if d is None or name == "default" else "  %+.1f %% against the default" % (
                    100 * (e["tok_s"] / statistics.median(d["runs"]) - 1))
                out("BENCH median batch %2d %-12s %9.0f tok/s of %d rounds (%s)%s"
                    % (B, name, e["tok_s"], len(e["runs"]), ", ".join("%.0f" % x for x in e["runs"]), vs), flush=True)
    return ours


def bench(args):
    import torch
    from transformers import Qwen3ForCausalLM
    lib = load_lib(args.lib)
    res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    import transformers
    res["transformers_version"] = transformers.__version__
    cfg = qwen3_shape_config()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    model.eval()
    res["hf_init_s"] = time.perf_counter() - t0
    V = cfg.vocab_size
    nparams = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    weight_bytes = nparams * 2
    res["params"] = nparams
    res["weight_bytes_bf16"] = weight_bytes
    sd = model.state_dict()
    be = Backend(lib, "qwen3", config_json(cfg, model), sd, "bf16", max_batch=32, max_context=4096)
    del sd
    res["backend_open_s"] = be.open_s
    model = model.to(torch.bfloat16)
    torch.cuda.empty_cache()

    bw = copy_bandwidth()
    res["d2d_copy_bytes_per_s"] = bw
    bound = bw / weight_bytes
    res["bandwidth_bound_tok_s"] = bound
    print("BENCH copy bandwidth %.0f GB/s, weights %.3f GB -> bound %.0f tok/s (70%% = %.0f)"
          % (bw / 1e9, weight_bytes / 1e9, bound, 0.7 * bound), flush=True)

    if os.environ.get("BENCH_FLOOR"):
        fl = graph_floor(cfg)
        res["graph_floor_s"] = fl
        for k, v in fl.items():
            print("FLOOR %-24s %.3f ms per graph replay" % (k, v * 1e3), flush=True)

    prompt_len, warm, steps = 32, 16, int(os.environ.get("BENCH_STEPS", "400"))
    # default: decode attention fused where tokens x KV heads < SMs (position splits for long
    # contexts only), GEMV products at batch 1-4, cuBLAS above. unfused_attn is qkv_post +
    # attention, fused_always the fused kernel at every batch; attn_splitN forces N splits;
    # tc_products the tensor-core products (a build with -DMQB_TC_PRODUCTS=ON; skipped otherwise);
    # megakernel the opt-in persistent kernel; no_attn_flash decode attention through attend
    # (phases with barriers, before run 30), no_attn_lanes that with one thread per scored
    # position (before run 26).
    # cublas sends the layers' products to the fused GEMV (1-4 rows) and cuBLAS instead of
    # tile.cuh's tile kernel (1-16 rows).
    # tile sends batches 17-32 to the tile kernel too (tile_cfg's shapes).
    # Any variant named key=value[+key=value...] (e.g. tile_max_b=32+tile_rt=4+tile_z=2) sets
    # those debug switches.
    # mk_skip variants (BENCH_VARIANTS=...,mk_barriers_only) time the megakernel without its
    # attention (1), its matrix products (2) or both (3) (timing only; wrong tokens).
    variants = [("default", {}), ("no_attn_flash", {"attn_flash": 0}), ("no_attn_lanes", {"attn_flash": 0, "attn_lanes": 0}),
                ("unfused_attn", {"fused_attn": 0}), ("fused_always", {"fused_attn": 2}),
                ("attn_split2", {"attn_split": 2}), ("attn_split4", {"attn_split": 4}), ("attn_split16", {"attn_split": 16}),
                ("cublas", {"skinny": 0}),
                ("tile", {"tile_max_b": 32}), ("tc_products", {"tc_min_b": 1}), ("no_graphs", {"graphs": 0}), ("megakernel", {"megakernel": 1})]
    extra = {"mk_no_attn": {"megakernel": 1, "mk_skip": 1}, "mk_no_layer_gemm": {"megakernel": 1, "mk_skip": 2},
             "mk_barriers_only": {"megakernel": 1, "mk_skip": 3}}
    named = dict(variants, **extra)  # every variant by name, before BENCH_VARIANTS picks some
    if os.environ.get("BENCH_VARIANTS"):
        keep_v = os.environ["BENCH_VARIANTS"].split(",")
        variants = [v for v in variants if v[0] in keep_v] + [(k, extra[k]) for k in keep_v if k in extra]
        variants += [(k, switches_of(k)) for k in keep_v if "=" in k]
    batches = [int(b) for b in os.environ.get("BENCH_BATCHES", "1,32").split(",")]

    def measure(B, opts):
        with be.switched(opts):
            return bench_ours(be, B, prompt_len, warm, steps, V, seed=B)
    ours = run_variants(batches, variants, int(os.environ.get("BENCH_ROUNDS", "1")), measure)
    # The same decode with the host out of the loop (mqb_debug_chain), positions 32-248 so that
    # every step's graph was captured by the warm-up: what pipelined decoding would reach.
    for B in (1, 32):
        csteps = 200
        _, _, gen = bench_ours(be, B, prompt_len, 16, csteps, V, seed=B + 7)
        try:
            tps, step_s, last = bench_chained(be, B, prompt_len, 16, csteps, V, seed=B + 7)
        except RuntimeError as e:  # e.g. a step whose graph the warm-up did not capture
            print("BENCH ours batch %2d chained      skipped: %s" % (B, e), flush=True)
            continue
        ours["b%d_chained" % B] = dict(tok_s=tps, step_ms=step_s * 1e3, same_last_tokens=last == gen[-1])
        print("BENCH ours batch %2d chained     %9.0f tok/s  (%.3f ms/step)  same last tokens: %s"
              % (B, tps, step_s * 1e3, last == gen[-1]), flush=True)
    # Long contexts (prompt LONG_PROMPT, default 2048): where position splits should pay; the
    # BENCH_VARIANTS named key=value[+...] run there too.
    long_len = int(os.environ.get("LONG_PROMPT", "2048"))
    long_variants = [("default", {}), ("attn_split1", {"attn_split": 1}), ("unfused_attn", {"fused_attn": 0}),
                     ("fused_always", {"fused_attn": 2})] + [v for v in variants if "=" in v[0]]
    gen_ref = {}
    for B in (1, 32):
        if not long_len:
            break
        for name, opts in long_variants:
            with be.switched(opts):
                tps, step_s, gen = bench_ours(be, B, long_len, 4, 64, V, seed=B + 100)
            key = "long%d_b%d_%s" % (long_len, B, name)
            ours[key] = dict(tok_s=tps, step_ms=step_s * 1e3)
            if name == "default":
                gen_ref[("long", B)] = gen
            else:
                ours[key]["same_tokens_as_default"] = gen == gen_ref[("long", B)]
            print("BENCH ours prompt %d batch %2d %-12s %9.0f tok/s  (%.3f ms/step)%s"
                  % (long_len, B, name, tps, step_s * 1e3,
                     "" if name == "default" else "  same tokens: %s" % ours[key]["same_tokens_as_default"]),
                  flush=True)
    # Sampling at temperature 1 on the device (OpenAI's default), batch 32.
    B = 32
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, V, (B, prompt_len), generator=g).tolist()
    toks, _ = be.forward(list(range(B)), [prompt_len] * B, [t for p in prompts for t in p], [0] * B)
    pos = prompt_len
    for i in range(warm + steps):
        if i == warm:
            t0 = time.perf_counter()
        keys = [(i * 7919 + j) * 2654435761 % (1 << 62) for j in range(B)]
        toks = be.forward_sampled(list(range(B)), [1] * B, toks, [pos] * B, [1.0] * B, keys)
        pos += 1
    dt = time.perf_counter() - t0
    ours["b32_sampled_t1"] = dict(tok_s=B * steps / dt, step_ms=dt / steps * 1e3)
    print("BENCH ours batch 32 sampled T=1 %9.0f tok/s  (%.3f ms/step)" % (B * steps / dt, dt / steps * 1e3),
          flush=True)
    res["ours"] = ours

    # Where a step spends its time, kernel by kernel: `nsys profile python3 mqb_bench.py ...`
    # (the library keeps no timing bookkeeping of its own).

    # bf16 parity on the big model: our logits vs transformers bf16 for one prompt, and greedy.
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, V, (64,), generator=g).tolist()
    la = be.logits_all(ids)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids], device="cuda")).logits[0].float().cpu()
    res["big_logits_max_abs_vs_hf_bf16"] = float((la - ref).abs().max())
    res["big_logits_ref_max_abs"] = float(ref.abs().max())
    res["big_argmax_agree"] = float((la.argmax(-1) == ref.argmax(-1)).float().mean())
    print("BENCH big-model logits max|d| vs hf bf16 %.4g (|ref| max %.3g), argmax agree %.3f"
          % (res["big_logits_max_abs_vs_hf_bf16"], res["big_logits_ref_max_abs"], res["big_argmax_agree"]), flush=True)

    if os.environ.get("SKIP_HF"):
        be.close()
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        return
    try:
        model.set_attn_implementation("eager")
    except Exception:
        model.config._attn_implementation = "eager"
    res["hf_attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    hf = {}
    hf_new = int(os.environ.get("HF_NEW_TOKENS", "48"))
    for B, new in ((1, hf_new), (32, hf_new)):
        tps, out = bench_hf(model, B, prompt_len, new, V, seed=B)
        hf["b%d" % B] = dict(tok_s=tps, new_tokens=new)
        print("BENCH transformers eager generate batch %2d: %.1f tok/s" % (B, tps), flush=True)
        if B == 1:
            # greedy agreement with our backend on the same prompt
            g1 = torch.Generator().manual_seed(B)
            p = torch.randint(0, V, (B, prompt_len), generator=g1).tolist()[0]
            toks, _ = be.forward([0], [prompt_len], p, [0])
            seq = [toks[0]]
            for s in range(new - 1):
                toks, _ = be.forward([0], [1], [seq[-1]], [prompt_len + s])
                seq.append(toks[0])
            hf["b1_greedy_agree"] = agree(seq, out[0])
            print("BENCH greedy ours vs transformers bf16 (batch 1, %d tokens): %s" % (new, hf["b1_greedy_agree"]),
                  flush=True)
    res["transformers"] = hf
    b1 = ours["b1_default"]["tok_s"]
    b32 = ours["b32_default"]["tok_s"]
    res["summary"] = dict(
        b1_tok_s=b1, b1_fraction_of_bound=b1 / bound, b1_target_70pct=0.7 * bound, b1_meets_70pct=b1 >= 0.7 * bound,
        b32_tok_s=b32, b32_meets_30000=b32 >= 30000,
        ratio_b1_vs_transformers=b1 / hf["b1"]["tok_s"], ratio_b32_vs_transformers=b32 / hf["b32"]["tok_s"])
    print("SUMMARY " + json.dumps(res["summary"]), flush=True)
    be.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def shape_backend(lib_path):
    """The Qwen3-0.6B-shaped model (random weights, seed 0) opened in bf16 for up to 32 sequences;
    transformers' copy is dropped once the backend has the weights. Returns (config, Backend)."""
    import torch
    from transformers import Qwen3ForCausalLM
    cfg = qwen3_shape_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    sd = model.state_dict()
    be = Backend(load_lib(lib_path), "qwen3", config_json(cfg, model), sd, "bf16", max_batch=32, max_context=4096)
    del sd, model
    torch.cuda.empty_cache()
    return cfg, be


def decode_only(args):
    """The Qwen3-0.6B-shaped model decoding at batch DECODE_B (default 1) for DECODE_STEPS steps
    after a 32-token prompt, with no timing and no transformers reference: the process to run
    under Nsight Compute (ncu -k regex:tile_kernel ...) to see single kernels in isolation."""
    cfg, be = shape_backend(args.lib)
    B = int(os.environ.get("DECODE_B", "1"))
    # DECODE_SKINNY=0, DECODE_TILE_MAX_B=32 etc.: the products' path and shape.
    for key in ("skinny", "tile_max_b", "tile_rt", "tile_z", "fuse_max_b"):
        if os.environ.get("DECODE_" + key.upper()):
            be.set(key, int(os.environ["DECODE_" + key.upper()]))
    _, step_s, _ = bench_ours(be, B, 32, 4, int(os.environ.get("DECODE_STEPS", "20")), cfg.vocab_size, seed=B)
    print("DECODE batch %d: %.3f ms/step" % (B, step_s * 1e3), flush=True)
    be.close()


def trace(args):
    """Where a graph-replayed decode step's time goes, kernel by kernel, without serialising it
    (the eager profile's events do): TRACE_STEPS steps of the Qwen3-0.6B-shaped model at each batch
    of TRACE_BATCHES under torch.profiler, whose CUPTI tracing sees every kernel in the process.
    Kernels overlap under programmatic dependent launch, so each is charged with how much it moved
    the step's end: its end minus the latest end before it (0 when it ends inside another). The
    layers' kernels are named by their place in the layer's repeating sequence (L3:tile_kernel is
    the layer's fourth kernel). TRACE_VARIANTS (default "default") names switch sets as bench
    variants do (key=value[+key=value...]). Prints TRACE lines: us per step per kernel, the kernel
    span and the GPU's idle time between steps (medians over steps), then each kernel's own time
    (start to end, overlaps with its neighbours included). TRACE_CHAINED=1 traces
    mqb_debug_chain's steps (tokens fed on the device) instead of the host's decode loop;
    TRACE_BOUNDARY=1 also lists what happens between two steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    cfg, be = shape_backend(args.lib)
    V, L, n = cfg.vocab_size, cfg.num_hidden_layers, int(os.environ.get("TRACE_STEPS", "30"))
    med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
    res = {}
    for pv in os.environ.get("TRACE_VARIANTS", "default").split(","):
        opts = {} if pv == "default" else switches_of(pv)
        for B in [int(b) for b in os.environ.get("TRACE_BATCHES", "1,16,32").split(",")]:
            with be.switched(opts):
                gen, pos = prefill_and_warm(be, B, 32, 12, V, seed=B)
                toks = gen[-1]
                acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if os.environ.get("TRACE_BOUNDARY") else [])
                with profile(activities=acts) as prof:
                    if os.environ.get("TRACE_CHAINED"):  # the host out of the loop (mqb_debug_chain)
                        out = (ctypes.c_int32 * B)()
                        if be.lib.mqb_debug_chain(be.m, B, n, i32arr([pos - 1] * B), out, be.err, 4096) != 0:
                            raise RuntimeError("mqb_debug_chain: " + be.err.value.decode())
                    else:
                        for _ in range(n):
                            toks = be.decode_fast(toks, pos)
                            pos += 1
            evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                          and "Memcpy" not in e.name and "Memset" not in e.name), key=lambda e: e.time_range.start)
            steps, cur = [], None
            for e in evs:
                if "embed_kernel" in e.name:
                    cur = []
                    steps.append(cur)
                if cur is not None:
                    cur.append((kernel_name(e, 32), e.time_range.start, e.time_range.end))
            steps = [s for s in steps[1:-1] if len(s) == len(steps[1])]  # whole steps of the usual shape
            if not steps:
                print("TRACE %s batch %d: no whole steps traced" % (pv, B), flush=True)
                continue
            k = (len(steps[0]) - 1) // L  # kernels per layer, if the layers repeat
            names = [s[0] for s in steps[0]]
            layered = k > 0 and all(names[1 + j] == names[1 + j + k] for j in range(k * (L - 1)))
            charge, dur, spans, gaps, prev_end = {}, {}, [], [], None
            for s in steps:
                end = s[0][1]
                for i, (name, t0, t1) in enumerate(s):
                    label = ("L%d:%s" % ((i - 1) % k, name)) if layered and 1 <= i <= k * L else name
                    charge[label] = charge.get(label, 0) + max(0, t1 - end)
                    dur[label] = dur.get(label, 0) + (t1 - t0)
                    end = max(end, t1)
                spans.append(end - s[0][1])
                if prev_end is not None:
                    gaps.append(s[0][1] - prev_end)
                prev_end = end
            if os.environ.get("TRACE_BOUNDARY"):
                # TRACE_BOUNDARY=1: every event (the GPU's kernels and copies, the host's runtime
                # calls) between one step's last kernel end and the next step's first kernel start.
                k_mid = len(steps) // 2
                t_end = max(t1 for _, _, t1 in steps[k_mid - 1])
                t_next = steps[k_mid][0][1]
                near = sorted((e for e in prof.events() if e.time_range.end >= t_end - 5 and e.time_range.start <= t_next + 5),
                              key=lambda e: e.time_range.start)
                print("TRACE %s batch %2d boundary (%.1f us): %s" % (pv, B, t_next - t_end, "; ".join(
                    "%s%s %+.1f/%.1f" % ("gpu:" if e.device_type == torch.autograd.DeviceType.CUDA else "cpu:",
                                         e.name[-40:], e.time_range.start - t_end, e.time_range.end - e.time_range.start)
                    for e in near[:40])), flush=True)
            per = {lb: v / len(steps) for lb, v in charge.items()}
            # each kernel's own duration (start to end, overlaps included), us per step
            own = {lb: v / len(steps) for lb, v in dur.items()}
            res["%s_b%d" % (pv, B)] = dict(us_per_step=per, own_us_per_step=own, span_us=med(spans), idle_us=med(gaps),
                                           kernels_per_step=len(steps[0]), kernels_per_layer=k if layered else None)
            top = sorted(per.items(), key=lambda kv: -kv[1])
            print("TRACE %s batch %2d: span %.1f us, idle between steps %.1f us, %d kernels per step (%s per layer): %s"
                  % (pv, B, med(spans), med(gaps), len(steps[0]), k if layered else "?",
                     ", ".join("%s %.1f" % kv for kv in top)), flush=True)
            print("TRACE %s batch %2d kernels' own time (us per step): %s"
                  % (pv, B, ", ".join("%s %.1f" % kv for kv in sorted(own.items(), key=lambda kv: -kv[1]))), flush=True)
    be.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def prefill_bench(args):
    """Prefill on the engine (what a request's time to first token is made of): PREFILL_BATCHES
    prompts of PREFILL_LEN (default 128) random tokens each in one forward call, the median of
    PREFILL_REPS (default 7) calls after two warm-ups, for each token cap per forward chunk in
    PREFILL_TCAPS (MQB_TCAP, read when a model is opened: one Qwen3-0.6B-shaped model per value;
    default "2048", the backend's) and each switch set in PREFILL_VARIANTS (default "default"; key=value[+...] as
    bench's). Prints PREFILL lines (ms per call and prompt tokens per second) and, for the largest
    batch, the kernels' summed time per name over one traced call (CUPTI), and all kernels' sum
    against the call's untraced median (PREFILL_TRACE_B picks another of the batches to trace), and
    whether each variant's logits are the first variant's bits. PREFILL_DECODES=N (default 0) puts N decode entries (one token each,
    after an L-token context) beside the prompts in every call: the mixed step a served point makes
    when requests arrive beside running ones."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    L = int(os.environ.get("PREFILL_LEN", "128"))
    reps = int(os.environ.get("PREFILL_REPS", "7"))
    batches = [int(b) for b in os.environ.get("PREFILL_BATCHES", "1,8,32").split(",")]
    D = int(os.environ.get("PREFILL_DECODES", "0"))
    res = {}
    first_logits = {}  # (tcap, B): the first variant's logits

    def prompts(B, V):  # B prompts of L tokens, flattened, the same for a batch in every variant
        return torch.randint(0, V, (B * L,), generator=torch.Generator().manual_seed(B)).tolist()

    for tcap in os.environ.get("PREFILL_TCAPS", "2048").split(","):
        os.environ["MQB_TCAP"] = tcap
        cfg, be = shape_backend(args.lib)
        V = cfg.vocab_size
        variants = os.environ.get("PREFILL_VARIANTS", "default").split(",")
        for pv in variants:
            opts = {} if pv == "default" else switches_of(pv)
            with be.switched(opts):
                mixed = {}
                for B in batches:
                    toks = prompts(B, V)
                    dslots = list(range(B, B + D))
                    if D:  # the decode entries' contexts
                        be.forward(dslots, [L] * D, prompts(D, V), [0] * D)
                    mixed[B] = (list(range(B)) + dslots, [L] * B + [1] * D, toks + [1] * D, [0] * B + [L] * D)
                    call = lambda: be.forward(*mixed[B])
                    first = call()[0]
                    call()
                    ts = []
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        out = call()[0]
                        ts.append(time.perf_counter() - t0)
                    ms = sorted(ts)[len(ts) // 2] * 1e3
                    key = "tcap%s_%s_b%d" % (tcap, pv, B)
                    res[key] = dict(ms=ms, tok_s=B * L / ms * 1e3, same_tokens=out == first, decodes=D)
                    # The call's logits against the first variant's, bit for bit (switches that
                    # only reorganise the work, e.g. post_tile or prep_vec, must give the same).
                    lo = be.forward(*mixed[B], want_logits=True)[1]
                    same = "" if (tcap, B) not in first_logits else " same logits as %s: %s" % (
                        variants[0], torch.equal(lo, first_logits[(tcap, B)]))
                    first_logits.setdefault((tcap, B), lo)
                    if same:
                        res[key]["same_logits_as_first_variant"] = same.endswith("True")
                    print("PREFILL tcap %5s %-24s batch %2d x %d tokens%s: %8.2f ms  %9.0f tok/s%s" % (
                        tcap, pv, B, L, " + %d decodes" % D if D else "", ms, B * L / ms * 1e3, same), flush=True)
                B = int(os.environ.get("PREFILL_TRACE_B", max(batches)))
                be.forward(*mixed[B])
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    be.forward(*mixed[B])
                call_ms = res["tcap%s_%s_b%d" % (tcap, pv, B)]["ms"]  # the untraced median: tracing slows the call
                tot = {}
                nk = 0
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        nk += 1
                        nm = kernel_name(e, 40)
                        tot[nm] = tot.get(nm, 0.0) + (e.time_range.end - e.time_range.start) / 1e3
                top = sorted(tot.items(), key=lambda kv: -kv[1])[:12]
                res["tcap%s_%s_b%d_kernels_ms" % (tcap, pv, B)] = dict(top)
                res["tcap%s_%s_b%d_kernels_total_ms" % (tcap, pv, B)] = sum(tot.values())
                print("PREFILL tcap %5s %-24s batch %2d kernels (ms, summed): all %d %.2f against the call's median %.2f;"
                      " %s" % (tcap, pv, B, nk, sum(tot.values()), call_ms, ", ".join("%s %.2f" % kv for kv in top)),
                      flush=True)
        be.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def coldstart(args):
    """What a served point pays for a model's first calls: on a freshly opened Qwen3-0.6B-shaped
    model, one prompt of COLD_LEN (default 128) tokens alone, then COLD_B - 1 (default 31) prompts
    in the call that decodes the first one's next token (as the server's continuous batching
    makes it when a burst of requests arrives), then COLD_STEPS (default 12) decode steps of all
    COLD_B sequences, then one more that hands out its logits (what a top-k / top-p request
    makes). Each call is timed on its own; the sequence then runs again on the same
    model (now warm), so the difference is the first use's cost: modules loaded, heuristics
    asked, graphs captured. COLD_WARMUPS (default "0,1") lists the MQB_WARMUP settings to open
    the model with (backend.cu's warm_up at load). Prints COLD lines; --out gets the figures."""
    import torch
    L = int(os.environ.get("COLD_LEN", "128"))
    B = int(os.environ.get("COLD_B", "32"))
    steps = int(os.environ.get("COLD_STEPS", "12"))
    res = {}

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3

    for wu in os.environ.get("COLD_WARMUPS", "0,1").split(","):
        os.environ["MQB_WARMUP"] = wu
        cfg, be = shape_backend(args.lib)
        V = cfg.vocab_size
        print("COLD MQB_WARMUP=%s: model open %.3f s (weights uploaded, warm_up)" % (wu, be.open_s), flush=True)
        toks = torch.randint(0, V, (B * L,), generator=torch.Generator().manual_seed(7)).tolist()
        res["warmup" + wu] = r = {"open_s": be.open_s}
        lbuf = torch.zeros((B, V), dtype=torch.float32)
        for rnd in ("first", "again"):
            ms = {}
            (first, _), ms["prompt_1"] = timed(lambda: be.forward([0], [L], toks[:L], [0]))
            slots = list(range(B))
            ntok = [1] + [L] * (B - 1)
            (nxt, _), ms["mixed"] = timed(lambda: be.forward(slots, ntok, [first[0]] + toks[L:], [L] + [0] * (B - 1)))
            pos = [L + 1] + [L] * (B - 1)
            dec = []
            for _ in range(steps):
                (nxt, _), t = timed(lambda: be.forward(slots, [1] * B, nxt, pos))
                dec.append(t)
                pos = [p + 1 for p in pos]
            ms["decode"] = dec
            # The step a top-k / top-p request makes: the same decode step, its logits handed out
            # (into a buffer touched beforehand, as the engine's reused one is, so that the timing
            # holds no page faults of fresh host memory).
            (nxt, _), ms["logits_step"] = timed(lambda: be.forward(slots, [1] * B, nxt, pos, want_logits=True,
                                                                   out=lbuf))
            pos = [p + 1 for p in pos]
            ms["tokens"] = nxt
            r[rnd] = ms
            print("COLD MQB_WARMUP=%s %s: 1 prompt %.2f ms; %d prompts + 1 decode %.2f ms; decode steps of %d: %s ms"
                  " (median %.3f); then one with logits %.2f ms" % (
                      wu, rnd, ms["prompt_1"], B - 1, ms["mixed"], B, ", ".join("%.2f" % t for t in dec[:6]),
                      sorted(dec)[len(dec) // 2], ms["logits_step"]), flush=True)
        be.close()
        del be
        torch.cuda.empty_cache()
    runs = [v for v in res.values()]
    toks = [v[rnd]["tokens"] for v in runs for rnd in ("first", "again")]
    print("COLD same tokens in every run: %s" % all(t == toks[0] for t in toks), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["parity", "bench", "all", "decode", "trace", "prefill", "coldstart"])
    ap.add_argument("--lib", default="native/cuda/build/libmodelqual_cuda.so")
    ap.add_argument("--out", required=True, help="JSON file; for mode all a folder for bench.json and parity.json")
    args = ap.parse_args()
    if args.mode == "all":  # one process: torch and transformers are imported once
        out = args.out
        args.out = os.path.join(out, "bench.json")
        try:
            bench(args)
        except Exception:
            import traceback
            traceback.print_exc()
        args.out = os.path.join(out, "parity.json")
        parity(args)
        return
    {"parity": parity, "bench": bench, "decode": decode_only, "trace": trace, "prefill": prefill_bench,
     "coldstart": coldstart}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
