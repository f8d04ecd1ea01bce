"""step_gaps.py: where a decode step's wall time goes between the GPU's kernels and the host.

Runs the Qwen3-0.6B-shaped model (random weights, bf16) at batch DECODE_B for a few graph-replayed
decode steps under torch.profiler, whose CUPTI tracing sees every kernel in the process (ours
included), and prints medians over steps: wall time of the host call, the GPU's kernel span (first
kernel start to last kernel end) and the time between one step's last kernel and the next one's
first (copies, the host's own work, the graph launch)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import mqb_bench as mb  # noqa: E402


def main():
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen3ForCausalLM
    lib = mb.load_lib(sys.argv[1] if len(sys.argv) > 1 else "native/cuda/build/libmodelqual_cuda.so")
    cfg = mb.qwen3_shape_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg)
    sd = model.state_dict()
    be = mb.Backend(lib, "qwen3", mb.config_json(cfg, model), sd, "bf16", max_batch=32, max_context=4096)
    del sd, model
    torch.cuda.empty_cache()
    variants = [("default", {}), ("graph_seg7", dict(graph_segments=7)), ("graph_seg14", dict(graph_segments=14)),
                ("graph_devlaunch", dict(graph_flags=4))]
    for (variant, opts), B in [(v, b) for v in variants for b in (int(x) for x in os.environ.get("DECODE_B", "1,32").split(","))]:
        with be.switched(opts):
            g = torch.Generator().manual_seed(B)
            prompts = torch.randint(0, cfg.vocab_size, (B, 32), generator=g).tolist()
            be.forward(list(range(B)), [32] * B, [t for p in prompts for t in p], [0] * B)
            toks = [0] * B
            be.decoder(B)
            pos = 32
            for _ in range(12):
                toks = be.decode_fast(toks, pos)
                pos += 1
            n = 40
            walls = []
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    t0 = time.perf_counter()
                    toks = be.decode_fast(toks, pos)
                    walls.append(time.perf_counter() - t0)
                    pos += 1
            api = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cuda"):
                    api.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
            evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and "Memcpy" not in e.name and "Memset" not in e.name]
            evs.sort(key=lambda e: e.time_range.start)
            steps, cur = [], None
            for e in evs:
                if "embed_kernel" in e.name:
                    cur = []
                    steps.append(cur)
                if cur is not None:
                    cur.append(e)
            spans, gaps, ksum = [], [], []
            for i, s in enumerate(steps):
                spans.append(max(e.time_range.end for e in s) - s[0].time_range.start)
                ksum.append(sum(e.time_range.end - e.time_range.start for e in s))
                if i:
                    gaps.append(s[0].time_range.start - max(e.time_range.end for e in steps[i - 1]))
            med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
            names = {}
            for e in steps[len(steps) // 2] if steps else []:
                k = e.name.split("<")[0].split("(")[0][-40:]
                names[k] = names.get(k, 0) + 1
            print("GAPS %s batch %d host API per step (total us / calls): %s" % (variant, B, ", ".join(
                "%s %.1f/%d" % (k, sum(v) / n, len(v) // n) for k, v in sorted(api.items()))), flush=True)
            print("GAPS %s batch %d: %d steps traced; host call %.1f us, GPU span %.1f us, GPU idle between steps %.1f us "
                  "(median); events per step %d: %s" % (variant, B, len(steps), med(walls) * 1e6, med(spans), med(gaps),
                                                        len(steps[len(steps) // 2]) if steps else 0, names), flush=True)
    be.close()


if __name__ == "__main__":
    main()
