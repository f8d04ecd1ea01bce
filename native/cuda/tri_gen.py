"""tri_gen.py: compiles the Triton decode products (debug `tri_min_b`, experimental) into cubins
the CUDA backend loads at open from MQB_TRITON_DIR.

Why: at batch 32 the layers' products run on cuBLAS, whose kernels do not wait for the kernel
before them, so the graph's edges into them must stay plain (NOTES.md run 144). A Triton kernel
executes griddepcontrol.wait, so it can be launched under programmatic dependent launch like the
backend's own kernels. probe/triton_chain.py timed a batch-32 step's 112 products in a graph at
4.62 us each against cuBLAS's 6.30 with K slices added by fp32 atomics (run 150), but 6.22 with
the slices added in a fixed order (run 152), which the bits' independence from timing needs.

So the K slices here are added as 64-bit fixed-point integers (MODE 2, FX): integer addition is
associative, so atomics give the same bits whatever order the slices arrive in. A partial p
becomes trunc(p * 2^32) (resolution 2.3e-10); the sum is turned back into a float by the kernel
that reads it next (the backend's RMSNorm prep), which adds it to the residual and zeroes the
buffer for the next product. A partial that is not finite or whose magnitude reaches 2^26 (16
slices of it stay below 2^30, so the int64 sum cannot overflow) sets its row's flag instead, and
the prep makes that row NaN: a broken model's NaN is not hidden.

The kernel: out[b, n] (= or FX +=) sum_k x[b, k] w[n, k] for b < B (at most BR = 32 rows), fp32
accumulation in the tensor cores; program (pn, pk) covers weight rows pn*BN.. and K slice pk of
KS. MODE 0 stores fp32 (KS 1 only).

Writes, into --out: one <name>.cubin per variant and kernels.txt, a line per variant:
  file kernel_name BN BK KS MODE num_warps shared_bytes n_params MASK
With TRI_NOMASK=1 the input rows are loaded without a mask of the live rows (MASK 0): all 32
rows are read, which the backend allows where its input buffers hold 32 rows. TRI_STAGES=n
compiles every variant with n pipeline stages instead of its own (fewer stages, less code: a
decode step's kernels evict each other's code, NOTES.md runs 82-86).
Needs python3 with torch and triton and a GPU (the kernels are compiled by launching them once;
MODE 2 is also checked against torch, bits independent of the launch order included).
Usage: python3 native/cuda/tri_gen.py --out DIR
"""
import argparse
import os
import re

import torch
import triton
import triton.language as tl

BR = 32  # rows a launch covers (the decode buckets of 17..32 sequences)
FX_SCALE = 4294967296.0  # 2^32: the fixed point of MODE 2 (the backend's fx_to_float divides by it)
FX_LIMIT = 67108864.0  # 2^26: a partial's largest magnitude before its row is flagged
# (BN, BK, KS, MODE, num_warps, num_stages). MODE 0 (KS 1): the shapes probe/triton_chain.py ran
# for qkv and gate/up (run 150: b's 64 x 64 tiles); MODE 2: 64 x 64 tiles in 8 or 4 K slices
# (run 150's fastest for o_proj and down), 64 x 128 in 8, and 64 x 32 in 2 (the parity model's).
VARIANTS = [(64, 64, 1, 0, 4, 4), (64, 128, 1, 0, 4, 4), (64, 32, 1, 0, 4, 4),
            (64, 64, 8, 2, 4, 4), (64, 64, 4, 2, 4, 4), (64, 128, 8, 2, 4, 4), (64, 32, 2, 2, 4, 4)]


@triton.jit
def tri_linear(w_ptr, x_ptr, out_ptr, bad_ptr, N, K, B, BR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               KS: tl.constexpr, MODE: tl.constexpr, MASK: tl.constexpr):
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
        if MASK:
            acc = tl.dot(tl.load(wp), tl.load(xp, mask=live[None, :], other=0.0), acc)
        else:  # rows past B are read (the backend's inputs hold TRI_BR rows) but never stored
            acc = tl.dot(tl.load(wp), tl.load(xp), acc)
        wp += BK
        xp += BK
    op = out_ptr + rb[None, :] * N + rn[:, None]
    om = live[None, :] & (rn[:, None] < N)
    if MODE == 0:
        tl.store(op, acc, mask=om)
    else:
        bad = (acc != acc) | (tl.abs(acc) >= 67108864.0)  # FX_LIMIT
        iv = tl.where(bad, 0.0, acc * 4294967296.0).to(tl.int64)  # FX_SCALE
        tl.atomic_add(op, iv, mask=om, sem="relaxed")
        rowbad = tl.max(bad.to(tl.int32), axis=0)
        tl.atomic_or(bad_ptr + rb, rowbad, mask=live & (rowbad != 0), sem="relaxed")


def n_params(ptx, name):
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise SystemExit("tri_gen: no .entry %s in the PTX" % name)
    return len(re.findall(r"\.param\s", m.group(1)))


def check_fx(dev):
    """MODE 2 against torch at a Qwen3-0.6B down shape with 17 live rows: the fixed-point sum is
    within the bf16 inputs' fp32 product error, rows past B untouched, the bits the same when
    the slices are launched in the reverse order (one launch per slice), and a NaN input flags
    only its row."""
    N, K, B = 1024, 3072, 17
    torch.manual_seed(0)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(BR, K, device=dev, dtype=torch.bfloat16)
    bad = torch.zeros(BR, device=dev, dtype=torch.int32)
    ref = x[:B].float() @ w.float().t()
    out = torch.zeros(BR, N, device=dev, dtype=torch.int64)
    tri_linear[(N // 64, 8)](w, x, out, bad, N, K, B, BR=BR, BN=64, BK=64, KS=8, MODE=2, MASK=1, num_warps=4, num_stages=4)
    got = out[:B].double() / FX_SCALE
    err = (got - ref.double()).abs().max().item()
    assert err < 1e-3, "tri_gen: the fixed-point product is off by %g" % err
    assert int(out[B:].abs().sum().item()) == 0 and int(bad.sum().item()) == 0, "tri_gen: rows past B were written"
    # The same slices one launch each, last first: integer sums, so the same bits.
    out2 = torch.zeros_like(out)
    kper = K // 8
    for s in reversed(range(8)):
        tri_linear[(N // 64, 1)](w[:, s * kper:(s + 1) * kper].contiguous(), x[:, s * kper:(s + 1) * kper].contiguous(),
                                 out2, bad, N, kper, B, BR=BR, BN=64, BK=64, KS=1, MODE=2, MASK=1, num_warps=4, num_stages=4)
    # Not an assertion: the two compilations (KS 8 and 1) need not give one slice the same fp32 partial.
    print("tri_gen: the slices in reverse order, one launch each: %s bits" % ("the same" if torch.equal(out, out2) else "OTHER"))
    x[3, 5] = float("nan")
    out.zero_()
    tri_linear[(N // 64, 8)](w, x, out, bad, N, K, B, BR=BR, BN=64, BK=64, KS=8, MODE=2, MASK=1, num_warps=4, num_stages=4)
    flagged = bad.nonzero().flatten().tolist()
    assert flagged == [3], "tri_gen: a NaN in row 3 flagged rows %s" % flagged
    print("tri_gen: fixed-point check passed (max|d| %.3g against torch, NaN row flagged)" % err)


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
    outs = {0: torch.zeros(BR, N, device=dev, dtype=torch.float32), 2: torch.zeros(BR, N, device=dev, dtype=torch.int64)}
    bad = torch.zeros(BR, device=dev, dtype=torch.int32)
    lines = []
    mask = 0 if os.environ.get("TRI_NOMASK") else 1
    for bn, bk, ks, mode, warps, stages in VARIANTS:
        stages = int(os.environ.get("TRI_STAGES", stages))
        ck = tri_linear[(N // bn, ks)](w, x, outs[mode], bad, N, K, B, BR=BR, BN=bn, BK=bk, KS=ks, MODE=mode,
                                       MASK=mask, num_warps=warps, num_stages=stages)
        md = ck.metadata
        if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
            raise SystemExit("tri_gen: variant %s needs scratch memory, which the backend does not give" %
                             ((bn, bk, ks, mode),))
        name = md.name
        f = "tri_%d_%d_%d_%d.cubin" % (bn, bk, ks, mode)
        with open(os.path.join(args.out, f), "wb") as fh:
            fh.write(ck.asm["cubin"])
        print("tri_gen: %s: %d stages, cubin %d bytes" % (f, stages, len(ck.asm["cubin"])))
        lines.append("%s %s %d %d %d %d %d %d %d %d" % (f, name, bn, bk, ks, mode, md.num_warps, md.shared,
                                                         n_params(ck.asm["ptx"], name), mask))
    torch.cuda.synchronize()
    check_fx(dev)
    with open(os.path.join(args.out, "kernels.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("tri_gen: %d kernels into %s" % (len(lines), args.out))
    for l in lines:
        print("tri_gen:", l)


if __name__ == "__main__":
    main()
