#!/usr/bin/env python3
"""Lab driver (not product): transformers' Qwen3-VL on the GPU in bf16 over the qwen3vl image
corpus, as the reference of lab/cuda/vlbench (the native engine on --device cuda).

For every corpus entry it records, as fixtures/golden/make_qwen3vl_golden.py does but on CUDA
in bfloat16 (SDPA attention, KV cache: what a transformers user runs): the prompt ids, 32 greedy
tokens (EOS ignored) and each step's top-5 logits, and the timings vlbench compares with: time
to first token (generate with max_new_tokens=1, median of --reps, after a warm-up) and output
tokens/s ((n - 1) / (t_n - t_1) of a 32-token generate). The model reads the same RGB the engine
does: a JPEG through its Pillow-decoded PNG (fixtures/golden/qwen3vl-tiny/<name>.decoded.png),
so both sides see identical pixels.

  python3 lab/cuda/qwen3vl_hf.py --snapshot DIR --corpus families/qwen3vl/corpus.jsonl --out hf.json
"""
import argparse
import json
import os
import sys
import time

import torch
import transformers
from PIL import Image
from transformers import AutoProcessor, Qwen3VLForConditionalGeneration


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshot", required=True)
    ap.add_argument("--fixture", default="qwen3vl-tiny")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--root", default=".")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    proc = AutoProcessor.from_pretrained(a.snapshot, local_files_only=True)
    model = Qwen3VLForConditionalGeneration.from_pretrained(a.snapshot, local_files_only=True, dtype=dt,
                                                            attn_implementation="sdpa").to("cuda").eval()
    model.generation_config.eos_token_id = None  # 32 tokens whatever they are, as the engine's ignore_eos
    model.generation_config.pad_token_id = 0
    entries = [json.loads(l) for l in open(a.corpus) if l.strip()]
    out = []

    def gen(inputs, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
        torch.cuda.synchronize()
        return o, time.perf_counter() - t0

    for i, e in enumerate(entries):
        src = e["image"]
        dec = os.path.join("fixtures", "golden", "qwen3vl-tiny", e["name"] + ".decoded.png")
        if src.endswith(".jpg") and os.path.exists(os.path.join(a.root, dec)):
            src = dec
        img = Image.open(os.path.join(a.root, src))
        img.load()
        if src.endswith(".jpg"):  # no decoded PNG in the repository: write Pillow's pixels for vlbench
            src = os.path.join("/tmp", e["name"] + ".decoded.png")
            img.convert("RGB").save(src)
            img = Image.open(src)
            img.load()
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": e["prompt"]}]}]
        text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = proc(text=[text], images=[img], return_tensors="pt").to("cuda")
        if i == 0:
            gen(inputs, a.steps)  # warm-up
        o, _ = gen(inputs, a.steps)
        greedy = [int(t) for t in o.sequences[0, inputs["input_ids"].shape[1]:]]
        steps = []
        for lg in o.logits:
            top = torch.topk(lg[0].float(), 5)
            steps.append({"top5_ids": [int(x) for x in top.indices], "top5_logits": [float(x) for x in top.values]})
        ttft, tot = [], []
        for _ in range(a.reps):
            ttft.append(gen(inputs, 1)[1])
            tot.append(gen(inputs, a.steps)[1])
        ttft.sort(), tot.sort()
        t1, tn = ttft[len(ttft) // 2], tot[len(tot) // 2]
        thw = [int(x) for x in inputs["image_grid_thw"][0]]
        out.append({"name": e["name"], "image": e["image"], "rgb_source": src, "width": img.size[0], "height": img.size[1],
                    "grid_thw": thw, "prompt_ids": [int(x) for x in inputs["input_ids"][0]], "greedy_ids": greedy,
                    "steps": steps, "ttft_ms": t1 * 1000, "out_tok_per_s": (a.steps - 1) / max(tn - t1, 1e-9)})
        print(f"{e['name']}: grid {thw} ttft {t1*1000:.1f} ms, {(a.steps-1)/max(tn-t1,1e-9):.0f} tok/s, {greedy[:6]}",
              file=sys.stderr)
    json.dump({"fixture": a.fixture, "dtype": a.dtype, "device": torch.cuda.get_device_name(0),
               "transformers_version": transformers.__version__, "torch_version": torch.__version__, "entries": out},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
