#!/usr/bin/env python3
"""Lab driver (not product): transformers on the GPU in bf16 (SDPA, KV cache) as the reference of
lab/qwen3vl/gpucheck (the native engine on --device cuda), for a vision family's one-image and
two-image requests: the first --singles entries of the family's corpus.jsonl (one image each) and
every entry of its corpus-pairs.jsonl (two images, content parts in order). Per request: the
rendered prompt ids (each image's placeholders expanded by the checkpoint's processor), --steps
greedy tokens (EOS ignored) and every step's top-5 logits. Works for any checkpoint that
AutoProcessor and AutoModelForImageTextToText open (Qwen3-VL, InternVL -HF).

  python3 lab/qwen3vl/hf_multi.py --snapshot DIR --family qwen3vl --out hf.json
"""
import argparse
import json
import os
import sys

import torch
import transformers
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshot", required=True)
    ap.add_argument("--family", required=True, help="families/<family>/corpus*.jsonl")
    ap.add_argument("--root", default=".")
    ap.add_argument("--out", required=True)
    ap.add_argument("--singles", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    a = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if a.family == "internvl":  # its tiny checkpoint's tokenizer needs the image tokens named
        sys.path.insert(0, os.path.join(a.root, "lab", "internvl"))
        from gpu_check import processor
        proc = processor(a.snapshot, [])
    else:
        proc = AutoProcessor.from_pretrained(a.snapshot, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(a.snapshot, local_files_only=True, dtype=torch.bfloat16,
                                                        attn_implementation="sdpa").to("cuda").eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    fam = os.path.join(a.root, "families", a.family)
    reqs = []
    for l in open(os.path.join(fam, "corpus.jsonl")):
        if l.strip() and len(reqs) < a.singles:
            e = json.loads(l)
            img = e.get("image") or e["images"][0]
            reqs.append({"name": e["name"], "images": [img],
                         "content": [{"type": "image"}, {"type": "text", "text": e["prompt"]}]})
    for l in open(os.path.join(fam, "corpus-pairs.jsonl")):
        if l.strip():
            e = json.loads(l)
            content = e.get("content") or ([{"type": "image"} for _ in e["images"]] + [{"type": "text", "text": e["prompt"]}])
            reqs.append({"name": e["name"], "images": e["images"], "content": content})
    out = []
    for r in reqs:
        imgs = []
        for p in r["images"]:
            im = Image.open(os.path.join(a.root, p))
            im.load()
            imgs.append(im)
        text = proc.apply_chat_template([{"role": "user", "content": r["content"]}], tokenize=False,
                                        add_generation_prompt=True)
        inputs = proc(text=[text], images=imgs, return_tensors="pt").to("cuda")
        kw = dict(inputs)
        if a.family == "internvl":  # as lab/internvl/gpu_check.py's hf_generate
            kw = {k: v for k, v in kw.items() if k in ("input_ids", "attention_mask", "pixel_values")}
        kw["pixel_values"] = kw["pixel_values"].to(torch.bfloat16)
        with torch.no_grad():
            o = model.generate(**kw, max_new_tokens=a.steps, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
        greedy = [int(t) for t in o.sequences[0, inputs["input_ids"].shape[1]:]]
        steps = []
        for lg in o.logits:
            top = torch.topk(lg[0].float(), 5)
            steps.append({"top5_ids": [int(x) for x in top.indices], "top5_logits": [float(x) for x in top.values]})
        out.append({"name": r["name"], "images": r["images"], "prompt_ids": [int(x) for x in inputs["input_ids"][0]],
                    "greedy_ids": greedy, "steps": steps})
        print(f"{r['name']}: {len(r['images'])} image(s), {len(out[-1]['prompt_ids'])} prompt ids -> {greedy[:6]}",
              file=sys.stderr)
    json.dump({"family": a.family, "dtype": "bfloat16", "device": torch.cuda.get_device_name(0),
               "transformers_version": transformers.__version__, "torch_version": torch.__version__, "entries": out},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
