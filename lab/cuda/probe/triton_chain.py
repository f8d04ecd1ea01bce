"""triton_chain.py: what batch 32's layer products cost as a chain of Triton kernels launched
with programmatic dependent launch (PDL), against the same chain on cuBLAS.

At batch 32 the layers' products run on cuBLAS, whose kernels do not execute
griddepcontrol.wait, so the edges into them must stay plain (NOTES.md run 144: made
programmatic, batch 32 decoded 9 % faster and wrong). Each product then costs 4-6 us in a graph
whatever its size. A kernel of our own can wait, and can load what does not depend on the kernel
before it (the weights) ahead of the wait; the tile kernel does so, but at 32 rows it is slower
than cuBLAS (runs 107-109, 148). Triton, which this GPU machine's python3 has, compiles such a
kernel from Python; this one puts the weights on the 64- or 128-row side of each tile, the shape
the Hopper tensor cores' warpgroup instructions (wgmma) take. This probe times, with no model
around it, the 4 x 28 products of a Qwen3-0.6B-shaped step at 32 rows (bf16 inputs, fp32
accumulation) captured in one CUDA graph:
- cuBLAS (torch.mm, bf16 out);
- Triton, plain launches;
- Triton with PDL: griddepcontrol.wait before the first load, launch_dependents after it;
- the same with the first weight tile loaded before the wait (pre).
K splits add into fp32 outputs with atomics (order not fixed), or, in the `ordered` rows, in slice
order as run 151's backend kernel added them, or, in the `fx` rows, as 64-bit fixed point with
integer atomics (order-free bits, tri_gen.py's MODE 2 in run 153).
PROBE_SET=evict instead times cuBLAS's and Triton's chains with a kernel of ~1 or ~32 KB of code
after every product, standing in for a step's other kernels (run 155).

Usage (GPU machine): [PROBE_SET=evict] python3 native/cuda/probe/triton_chain.py
"""
import os
import statistics

import torch
import triton
import triton.language as tl

B, L = 32, 28
H, QKV, AO, I = 1024, 4096, 2048, 3072
# (N, K) of a layer's products: qkv, o_proj, gate/up, down
SHAPES = [(QKV, H), (H, AO), (2 * I, H), (H, I)]


@triton.jit
def skinny(w_ptr, x_ptr, out_ptr, ws_ptr, cnt_ptr, N, K, B, BR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           KSPLIT: tl.constexpr, PDL: tl.constexpr, PRE: tl.constexpr, ORDERED: tl.constexpr, FX: tl.constexpr,
           MASK: tl.constexpr):
    """out[b, n] (+)= sum_k x[b, k] w[n, k] for BN weight rows and all BR input rows, over
    program 1's share of K. ORDERED: the K slices are added as run 151's backend kernel added
    them (each stores its partial, the last of a tile to arrive sums them in slice order and
    resets the tile's counter) instead of with atomics. FX: the slices added as 64-bit fixed
    point (trunc(p * 2^32)) with integer atomics into ws, as tri_gen.py's MODE 2 does (order-free
    bits); the conversion back is left to a consumer, as in the backend. MASK: the input rows
    loaded under a mask of the live rows b < B, as tri_gen.py's kernel loads them."""
    pn = tl.program_id(0)
    pk = tl.program_id(1)
    kper = K // KSPLIT
    k0 = pk * kper
    rn = pn * BN + tl.arange(0, BN)
    rb = tl.arange(0, BR)
    rk = tl.arange(0, BK)
    wp = w_ptr + rn[:, None] * K + (k0 + rk)[None, :]
    xp = x_ptr + rb[None, :] * K + (k0 + rk)[:, None]
    acc = tl.zeros((BN, BR), dtype=tl.float32)
    if PRE:
        w0 = tl.load(wp)  # the weights never depend on the kernel before
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.dot(w0, tl.load(xp), acc)
        wp += BK
        xp += BK
        for _ in range(BK, kper, BK):
            acc = tl.dot(tl.load(wp), tl.load(xp), acc)
            wp += BK
            xp += BK
    else:
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        for _ in range(0, kper, BK):
            if MASK:
                acc = tl.dot(tl.load(wp), tl.load(xp, mask=(rb < B)[None, :], other=0.0), acc)
            else:
                acc = tl.dot(tl.load(wp), tl.load(xp), acc)
            wp += BK
            xp += BK
    op = out_ptr + rb[None, :] * N + rn[:, None]
    if KSPLIT == 1:
        tl.store(op, acc)
    elif FX:
        tl.atomic_add(ws_ptr.to(tl.pointer_type(tl.int64)) + rb[None, :] * N + rn[:, None],
                      (acc * 4294967296.0).to(tl.int64), sem="relaxed")
    elif ORDERED:
        tl.store(ws_ptr + pk * (BR * N) + rb[None, :] * N + rn[:, None], acc)
        tl.debug_barrier()
        seen = tl.atomic_add(cnt_ptr + pn, 1, sem="acq_rel")
        if seen == KSPLIT - 1:
            tot = tl.zeros((BN, BR), dtype=tl.float32)
            for s in range(0, KSPLIT):
                tot += tl.load(ws_ptr + s * (BR * N) + rb[None, :] * N + rn[:, None], cache_modifier=".cg")
            tl.store(op, tot)
            tl.atomic_xchg(cnt_ptr + pn, 0)
    else:
        tl.atomic_add(op, acc, sem="relaxed")


@triton.jit
def evict(p_ptr, ITERS: tl.constexpr):
    """A stand-in for the step's other kernels between two products: ITERS unrolled rounds of 8
    independent FMAs a thread (~128 bytes of code a round: ITERS 256 is ~32 KB, 4 is ~1 KB),
    launched under PDL like the backend's kernels. It evicts the products' code from the SMs'
    instruction caches, as a decode step's other kernels do (NOTES.md runs 82-86)."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    o = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    a = tl.load(p_ptr + o)
    for _ in tl.static_range(ITERS):
        a = a * 1.0001 + 0.5
    tl.store(p_ptr + o, a)


WS = {}  # the ordered sum's partials and tile counters, made at the first use


def product(w, x, out, cfg, pdl, pre, ordered=False, fx=False, mask=False):
    N, K = w.shape
    bn, bk, ks, warps, stages = cfg
    if "ws" not in WS:
        WS["ws"] = torch.zeros(16 * B * 2 * I, device=w.device, dtype=torch.float32)
        WS["cnt"] = torch.zeros(4096, device=w.device, dtype=torch.int32)
    skinny[(N // bn, ks)](w, x, out, WS["ws"], WS["cnt"], N, K, B, BR=B, BN=bn, BK=bk, KSPLIT=ks, PDL=pdl, PRE=pre,
                          ORDERED=ordered, FX=fx, MASK=mask, num_warps=warps, num_stages=stages, launch_pdl=pdl)


def graph_ms(fn, reps=30):
    """fn captured in one CUDA graph; median ms of a replay over reps."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def time_cases(cases, what, width):
    """Each (name, fn) of cases timed by graph_ms in 3 rounds, the cases in turn in each round;
    prints each one's median per chain of 4 x L products and per product."""
    got = {n: [] for n, _ in cases}
    for _ in range(3):
        for n, fn in cases:
            got[n].append(graph_ms(fn))
    for n, _ in cases:
        ms = statistics.median(got[n])
        print("TRITON %s %-*s %8.1f us a chain of %d products, %.2f us each (rounds %s)" %
              (what, width, n, ms * 1e3, 4 * L, ms * 1e3 / (4 * L), ", ".join("%.1f" % (v * 1e3) for v in got[n])),
              flush=True)


def main():
    torch.manual_seed(0)
    dev = "cuda"
    Ws = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for n, k in SHAPES] for _ in range(L)]
    Xs = [torch.randn(B, k, device=dev, dtype=torch.bfloat16) for _, k in SHAPES]
    Ob = [torch.empty(B, n, device=dev, dtype=torch.bfloat16) for n, _ in SHAPES]
    Of = [torch.zeros(B, n, device=dev, dtype=torch.float32) for n, _ in SHAPES]
    # Launch shapes per product (BN weight rows, BK, K splits, warps, stages): ~128-256 programs.
    CFGS = {
        "a": [(64, 128, 2, 4, 4), (64, 128, 8, 4, 4), (64, 128, 2, 4, 4), (64, 128, 8, 4, 4)],
        "b": [(64, 64, 2, 4, 4), (64, 64, 8, 4, 4), (64, 64, 1, 4, 4), (64, 64, 8, 4, 4)],
        "c": [(128, 128, 4, 8, 3), (64, 128, 16, 4, 3), (128, 128, 2, 8, 3), (64, 128, 12, 4, 3)],
    }
    # Each configuration checked once against torch (K splits add into a zeroed output; fx's into
    # the zeroed workspace as int64, read back here as the backend's prep read it).
    for name, cfgs in CFGS.items():
        for j, (w, x) in enumerate(zip(Ws[0], Xs)):
            ref = (x.float() @ w.float().t())
            n = w.shape[0]
            for how in ("atomics", "ordered", "fx", "fx masked"):
                fx = how.startswith("fx")
                Of[j].zero_()
                if fx:
                    WS["ws"].zero_()  # made by the first product; the ordered partials are in it
                # fx as its rows are timed: without the weights before the wait (pre), whose loop has no mask
                product(w, x, Of[j], cfgs[j], True, not fx, how == "ordered", fx, how == "fx masked")
                got = Of[j]
                if fx and cfgs[j][2] > 1:
                    got = WS["ws"].view(torch.int64)[:B * n].view(B, n).double().div(2.0 ** 32).float()
                err = (got - ref).abs().max().item()
                print("TRITON check %s %s product %d: max|d| %.3g (|ref| max %.3g)" %
                      (name, how, j, err, ref.abs().max().item()), flush=True)
                assert err < 1e-2 * max(1.0, ref.abs().max().item()), "the probe's kernel is wrong"
    assert int(WS["cnt"].sum().item()) == 0, "a tile counter was not reset"

    EV = torch.zeros(132 * 1024, device=dev, dtype=torch.float32)

    def chain(one, js=range(4), evict_iters=0):
        """one(l, j), the product j (an index into SHAPES) of layer l, for every layer and each j
        of js, as one function; with evict_iters, each followed by an evict kernel of that many
        rounds (132 programs)."""
        def f():
            for l in range(L):
                for j in js:
                    one(l, j)
                    if evict_iters:
                        evict[(132,)](EV, ITERS=evict_iters, num_warps=4, launch_pdl=True)
        return f

    def mm(l, j):
        torch.mm(Xs[j], Ws[l][j].t(), out=Ob[j])

    def blas(js=range(4)):
        """The products js of every layer on cuBLAS."""
        return chain(mm, js)

    def tri(cfgs, pdl, pre, ordered=False, js=range(4), fx=False, mask=False):
        """The same through the Triton kernel in the launch shapes cfgs."""
        return chain(lambda l, j: product(Ws[l][j], Xs[j], Of[j], cfgs[j], pdl, pre, ordered, fx, mask), js)

    if os.environ.get("PROBE_SET") == "evict":
        # Does code eviction between products (a real step's other kernels) cost Triton's
        # products more than cuBLAS's? Each chain with an evict kernel after every product, of
        # ~1 KB and of ~32 KB of code; evict alone (112 launches) for its own cost.
        b = CFGS["b"]
        ones = {"cuBLAS": mm, "triton b pdl": lambda l, j: product(Ws[l][j], Xs[j], Of[j], b[j], True, False),
                "triton b pdl fx": lambda l, j: product(Ws[l][j], Xs[j], Of[j], b[j], True, False, fx=True)}
        cases = []
        for n, one in ones.items():
            cases += [(n, chain(one)), (n + " +evict 1K", chain(one, evict_iters=4)),
                      (n + " +evict 32K", chain(one, evict_iters=256))]

        def ev_only(iters):
            def f():
                for _ in range(4 * L):
                    evict[(132,)](EV, ITERS=iters, num_warps=4, launch_pdl=True)
            return f
        cases += [("evict 1K alone", ev_only(4)), ("evict 32K alone", ev_only(256))]
        time_cases(cases, "evict", 28)
        return

    cases = [("cuBLAS (torch.mm)", blas())]
    for name, cfgs in CFGS.items():
        cases += [("triton %s plain" % name, tri(cfgs, False, False)), ("triton %s pdl" % name, tri(cfgs, True, False)),
                  ("triton %s pdl+pre" % name, tri(cfgs, True, True)),
                  ("triton %s pdl ordered" % name, tri(cfgs, True, False, True)),
                  ("triton %s pdl fx" % name, tri(cfgs, True, False, fx=True)),
                  ("triton %s pdl fx masked" % name, tri(cfgs, True, False, fx=True, mask=True))]
    time_cases(cases, "chain", 22)
    # Per product shape: the 28 layers' products of one shape alone in a graph.
    for j, (n, k) in enumerate(SHAPES):
        line = "TRITON shape %d (N %d, K %d): cuBLAS %.2f" % (j, n, k, graph_ms(blas([j])) * 1e3 / L)
        for name, cfgs in CFGS.items():
            line += ", triton %s pdl+pre %.2f" % (name, graph_ms(tri(cfgs, True, True, js=[j])) * 1e3 / L)
        print(line + " us each", flush=True)


if __name__ == "__main__":
    main()
