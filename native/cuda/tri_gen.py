"""tri_gen.py: compiles the Triton decode products (debug `tri_min_b`, experimental) into cubins
the CUDA backend loads at open from MQB_TRITON_DIR.

Why: at batch 32 the layers' products run on cuBLAS, whose kernels do not wait for the kernel
before them, so the graph's edges into them must stay plain (NOTES.md run 144). A Triton kernel
executes griddepcontrol.wait, so it can be launched under programmatic dependent launch like the
backend's own kernels; and Triton compiles a 32-row product to the Hopper tensor cores' wgmma with
the weights as the 64- or 128-row side. probe/triton_chain.py timed a batch-32 step's 112
products in a graph at 4.62 us each against cuBLAS's 6.30 (NOTES.md run 150).

The kernel: out[b, n] (+)= sum_k x[b, k] w[n, k] for b < B (at most BR = 32 rows), fp32
accumulation; program (pn, pk) covers weight rows pn*BN.. and K slice pk of KS. K slices are
added in slice order by the last program of a tile to finish (a counter per tile, reset by that
program), so the same inputs give the same bits whatever the timing.

Writes, into --out: one <name>.cubin per variant and kernels.txt, a line per variant:
  file kernel_name BN BK KS ACC num_warps shared_bytes n_params
Needs python3 with torch and triton and a GPU (the kernels are compiled by launching them once).
Usage: python3 native/cuda/tri_gen.py --out DIR
"""
import argparse
import os
import re

import torch
import triton
import triton.language as tl

BR = 32  # rows a launch covers (the decode buckets of 17..32 sequences)
# (BN, BK, KS, num_warps, num_stages): the shapes probe/triton_chain.py found fastest for the
# Qwen3-0.6B shape's products (run 150), each with ACC 0 and 1.
VARIANTS = [(64, 128, 2, 4, 4), (64, 64, 8, 4, 4), (128, 128, 2, 8, 3), (64, 64, 4, 4, 4), (64, 64, 1, 4, 4)]


@triton.jit
def tri_linear(w_ptr, x_ptr, out_ptr, ws_ptr, cnt_ptr, N, K, B, BR: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, KS: tl.constexpr, ACC: tl.constexpr):
    pn = tl.program_id(0)
    pk = tl.program_id(1)
    kper = K // KS
    k0 = pk * kper
    rn = pn * BN + tl.arange(0, BN)
    rb = tl.arange(0, BR)
    rk = tl.arange(0, BK)
    live = rb < B
    wp = w_ptr + rn[:, None] * K + (k0 + rk)[None, :]
    xp = x_ptr + rb[None, :] * K + (k0 + rk)[:, None]
    acc = tl.zeros((BN, BR), dtype=tl.float32)
    # The input is the kernel before's output: wait for it (programmatic dependent launch), and let
    # the next kernel's blocks become resident as this one's run.
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    for _ in range(0, kper, BK):
        acc = tl.dot(tl.load(wp), tl.load(xp, mask=live[None, :], other=0.0), acc)
        wp += BK
        xp += BK
    op = out_ptr + rb[None, :] * N + rn[:, None]
    om = live[None, :] & (rn[:, None] < N)
    if KS == 1:
        if ACC:
            acc += tl.load(op, mask=om, other=0.0)
        tl.store(op, acc, mask=om)
    else:
        # This slice's partial, then the tile's counter; the last slice to arrive adds them all in
        # slice order (its own read back too, so the order never depends on who came last).
        tl.store(ws_ptr + pk * (BR * N) + rb[None, :] * N + rn[:, None], acc)
        tl.debug_barrier()
        seen = tl.atomic_add(cnt_ptr + pn, 1, sem="acq_rel")
        if seen == KS - 1:
            tot = tl.zeros((BN, BR), dtype=tl.float32)
            for s in range(0, KS):
                tot += tl.load(ws_ptr + s * (BR * N) + rb[None, :] * N + rn[:, None], cache_modifier=".cg")
            if ACC:
                tot += tl.load(op, mask=om, other=0.0)
            tl.store(op, tot, mask=om)
            tl.atomic_xchg(cnt_ptr + pn, 0)


def n_params(ptx, name):
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise SystemExit("tri_gen: no .entry %s in the PTX" % name)
    return len(re.findall(r"\.param\s", m.group(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda"
    # Compiled for N, K multiples of 16 and B not (17): the backend only sends such shapes.
    N, K, B = 6144, 3072, 17
    w = torch.zeros(N, K, device=dev, dtype=torch.bfloat16)
    x = torch.zeros(BR, K, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(BR, N, device=dev, dtype=torch.float32)
    ws = torch.zeros(16 * BR * N, device=dev, dtype=torch.float32)
    cnt = torch.zeros(N // 64, device=dev, dtype=torch.int32)
    lines = []
    for bn, bk, ks, warps, stages in VARIANTS:
        for acc in (0, 1):
            ck = tri_linear[(N // bn, ks)](w, x, out, ws, cnt, N, K, B, BR=BR, BN=bn, BK=bk, KS=ks, ACC=acc,
                                           num_warps=warps, num_stages=stages)
            md = ck.metadata
            if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
                raise SystemExit("tri_gen: variant %s needs scratch memory, which the backend does not give" %
                                 ((bn, bk, ks, acc),))
            name = md.name
            f = "tri_%d_%d_%d_%d.cubin" % (bn, bk, ks, acc)
            with open(os.path.join(args.out, f), "wb") as fh:
                fh.write(ck.asm["cubin"])
            lines.append("%s %s %d %d %d %d %d %d %d" % (f, name, bn, bk, ks, acc, md.num_warps, md.shared,
                                                          n_params(ck.asm["ptx"], name)))
    torch.cuda.synchronize()
    assert int(cnt.sum().item()) == 0, "tri_gen: a tile counter was not reset"
    with open(os.path.join(args.out, "kernels.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("tri_gen: %d kernels into %s" % (len(lines), args.out))
    for l in lines:
        print("tri_gen:", l)


if __name__ == "__main__":
    main()
