"""Before/after decode benchmark of two builds of libmodelqual_cuda.so in one process, on one GPU.

Per family (--families: qwen3, a Qwen3-0.6B-shaped model; gpt2, GPT-2 small's shape; random
weights, bf16) the same model is opened in both libraries (each speaks its own ABI version:
mqb_bench.Backend handles 3 to 5; neither needs the lab's debug entry points); rounds alternate
which library goes first, so drift in clocks or temperature falls on both. Prints per family and
batch the median tok/s of each, the ratio after/before, and whether both produced the same
greedy tokens (same kernels, same bits). lab/cuda/abdrive does the same for qwen3vl and zimage.

    python3 lab/cuda/before_after.py --before OLD.so --after NEW.so --rounds 5 --out ab.json
"""
import argparse
import json
import statistics
import sys
import time

import mqb_bench as mb


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="qwen3,gpt2")
    args = ap.parse_args()
    import torch
    libs = {"before": mb.load_lib(args.before), "after": mb.load_lib(args.after)}
    res = dict(device=torch.cuda.get_device_name(0), abi={k: lib.abi for k, lib in libs.items()},
               rounds=args.rounds, steps=args.steps, families={})
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for family in args.families.split(","):
        torch.manual_seed(0)
        if family == "qwen3":
            from transformers import Qwen3ForCausalLM
            cfg = mb.qwen3_shape_config()
            with torch.device("cuda"):
                model = Qwen3ForCausalLM(cfg)
            max_ctx = 4096
        elif family == "gpt2":
            from transformers import GPT2Config, GPT2LMHeadModel
            cfg = GPT2Config()  # GPT-2 small: 12 layers of 768, 50,257 tokens, 1,024 positions
            with torch.device("cuda"):
                model = GPT2LMHeadModel(cfg)
            max_ctx = 1024
        else:
            raise SystemExit("before_after.py: --families: %s is not qwen3 or gpt2" % family)
        model.eval()
        sd = model.state_dict()
        cj = mb.config_json(cfg, model)
        bes = {k: mb.Backend(lib, family, cj, sd, "bf16", max_batch=32, max_context=max_ctx) for k, lib in libs.items()}
        del sd, model
        torch.cuda.empty_cache()
        V = cfg.vocab_size
        tps = {(k, B): [] for k in bes for B in batches}
        same = {}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for B in batches:
                gens = {}
                for k in order:
                    t, step_s, gen = mb.bench_ours(bes[k], B, 32, 16, args.steps, V, seed=B)
                    tps[(k, B)].append(t)
                    gens[k] = gen
                    print("AB %s round %d batch %2d %-6s %9.0f tok/s (%.3f ms/step)" % (family, r, B, k, t, step_s * 1e3),
                          flush=True)
                same[B] = same.get(B, True) and gens["before"] == gens["after"]
        res["families"][family] = {}
        for B in batches:
            b, a = statistics.median(tps[("before", B)]), statistics.median(tps[("after", B)])
            res["families"][family][B] = dict(before=tps[("before", B)], after=tps[("after", B)], before_median=b,
                                              after_median=a, ratio=a / b, same_tokens=same[B])
            rows.append((family, B, b, a, same[B]))
        for be in bes.values():
            be.close()
        torch.cuda.empty_cache()
    print("| family | batch | before tok/s (median of %d) | after tok/s | after/before | same greedy tokens |" % args.rounds)
    print("|---|---|---|---|---|---|")
    for family, B, b, a, s in rows:
        print("| %s | %d | %.0f | %.0f | %.3f | %s |" % (family, B, b, a, a / b, s))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
