"""dual_stream.py: would a batch-32 decode step run faster as two independent batch-16 halves on
two CUDA streams at once than as one batch-32 step?

A decode step of this model is ~280 dependent kernels of a few microseconds, most of each spent
in launch, ramp and drain rather than in moving bytes (NOTES.md). Two halves of the batch do not
depend on each other, so their kernel chains could overlap on the GPU: while one half's kernel
waits for its predecessor, the other's works. This probe measures that before anything is built
for it: two models (the Qwen3-0.6B shape, bf16, each its own weights, stream and graphs) decode
at once from two threads (ctypes releases the GIL during a call), against one model alone.
Two copies of the weights read twice the bytes of a shared copy, so this is the pessimistic side.

Usage (GPU machine, after the CMake build): python3 native/cuda/probe/dual_stream.py [lib]
"""
import ctypes
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mqb_bench as mb  # noqa: E402

PROMPT, WARM, STEPS, ROUNDS = 32, 16, 150, 3


def warm(be, B, seed):
    """Prefill B prompts and run the warm-up steps (the graphs are captured here, one model at a
    time: capture is thread-local but the timed part must not overlap another's capture)."""
    _, pos = mb.prefill_and_warm(be, B, PROMPT, WARM, be.V, seed)
    return pos


def chain(be, B, pos, steps, res, i):
    """mqb_debug_chain: steps decode steps of B sequences with no host synchronisation."""
    out = (ctypes.c_int32 * B)()
    t0 = time.perf_counter()
    rc = be.lib.mqb_debug_chain(be.m, B, steps, mb.i32arr([pos - 1] * B), out, be.err, 4096)
    res[i] = (t0, time.perf_counter())
    if rc != 0:
        raise RuntimeError("mqb_debug_chain: " + be.err.value.decode())


def sync(be, B, pos, steps, res, i):
    """The synchronous decode loop of the bench (host work and a wait between steps)."""
    toks = [1] * B
    t0 = time.perf_counter()
    for s in range(steps):
        toks = be.decode_fast(toks, pos + s)
    res[i] = (t0, time.perf_counter())


def together(fn, models, B, steps):
    """fn on every model at once (one thread each); returns tokens/s over the whole span."""
    pos = [warm(be, B, 7 + k) for k, be in enumerate(models)]
    res = [None] * len(models)
    ts = [threading.Thread(target=fn, args=(be, B, pos[k], steps, res, k)) for k, be in enumerate(models)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    span = max(r[1] for r in res) - min(r[0] for r in res)
    return len(models) * B * steps / span


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else "native/cuda/build/libmodelqual_cuda.so"
    _, a = mb.shape_backend(lib)
    _, b = mb.shape_backend(lib)
    cases = [
        ("one model, batch 32, chained", chain, [a], 32),
        ("two models, batch 16 each, chained, at once", chain, [a, b], 16),
        ("one model, batch 16, chained", chain, [a], 16),
        ("one model, batch 32, sync", sync, [a], 32),
        ("two models, batch 16 each, sync, at once", sync, [a, b], 16),
        ("two models, batch 32 each, chained, at once", chain, [a, b], 32),
        ("two models, batch 8 each, chained, at once", chain, [a, b], 8),
        ("one model, batch 8, chained", chain, [a], 8),
    ]
    got = {name: [] for name, *_ in cases}
    for r in range(ROUNDS):
        for name, fn, models, B in cases:
            tps = together(fn, models, B, STEPS)
            got[name].append(tps)
            print("DUAL round %d: %-46s %9.0f tok/s" % (r, name, tps), flush=True)
    for name, *_ in cases:
        print("DUAL median: %-46s %9.0f tok/s" % (name, statistics.median(got[name])), flush=True)
    a.close()
    b.close()


if __name__ == "__main__":
    main()
