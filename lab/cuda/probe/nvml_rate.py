#!/usr/bin/env python3
"""nvml_rate.py: how often NVML's readings that qual/gpu samples change on this GPU, under load.

qual/gpu takes a profile point's energy from the total-energy counter's delta and its power from
the instant-power field (NVML_FI_DEV_POWER_INSTANT). A point shorter than the counter's update
period gets a delta made of whole updates, so this probe measures that period: with the GPU
kept busy by bf16 matrix products, it polls every 0.2 ms for PROBE_S seconds (default 3) and
prints, for the energy counter (nvmlDeviceGetTotalEnergyConsumption), the instant-power field
and nvmlDeviceGetPowerUsage, how many distinct values it saw and the median time between
changes, and the counter's delta against the instant power integrated over the same span.

Usage (GPU machine): python3 native/cuda/probe/nvml_rate.py
"""
import ctypes
import os
import statistics
import time

import torch


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]  # nvmlValue_t is an 8-byte union


FI_DEV_POWER_INSTANT = 186  # mW


def main():
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    assert nv.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    h = ctypes.c_void_p()
    assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0

    def energy_mj():
        e = ctypes.c_ulonglong()
        return e.value if nv.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e)) == 0 else None

    def instant_mw():
        f = FieldValue(fieldId=FI_DEV_POWER_INSTANT)
        if nv.nvmlDeviceGetFieldValues(h, 1, ctypes.byref(f)) != 0 or f.nvmlReturn != 0:
            return None
        return f.value & 0xFFFFFFFF  # unsigned int

    def usage_mw():
        p = ctypes.c_uint()
        return p.value if nv.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)) == 0 else None

    # Keep the GPU busy for longer than the poll: enough queued products for PROBE_S + 1 s.
    span = float(os.environ.get("PROBE_S", "3"))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    for _ in range(int((span + 1) / per)):
        a @ a
    time.sleep(0.3)  # let power settle at the load

    reads = {"energy counter": energy_mj, "instant power": instant_mw, "power usage": usage_mw}
    seen = {k: [] for k in reads}  # (time, value) at each change
    t_end = time.perf_counter() + span
    while True:
        t = time.perf_counter()
        if t > t_end:
            break
        for k, fn in reads.items():
            v = fn()
            if v is not None and (not seen[k] or seen[k][-1][1] != v):
                seen[k].append((t, v))
        time.sleep(0.0002)
    torch.cuda.synchronize()
    for k, ch in seen.items():
        gaps = [(b[0] - a_[0]) * 1e3 for a_, b in zip(ch, ch[1:])]
        print("NVML %-15s %4d values in %.1f s; median %.1f ms between changes (min %.1f, max %.1f)" % (
            k, len(ch), span, statistics.median(gaps) if gaps else float("nan"), min(gaps, default=float("nan")),
            max(gaps, default=float("nan"))), flush=True)
    ec, ip = seen["energy counter"], seen["instant power"]
    if len(ec) > 2 and len(ip) > 2:
        ta, tb = ec[1][0], ec[-1][0]  # between two counter changes
        joules = (ec[-1][1] - ec[1][1]) / 1e3
        integ = 0.0
        for (t1, p1), (t2, _) in zip(ip, ip[1:] + [(tb, None)]):
            lo, hi = max(t1, ta), min(t2, tb)
            if hi > lo:
                integ += p1 / 1e3 * (hi - lo)
        print("NVML over %.2f s: counter %.1f J, instant power integrated %.1f J (%.1f W against %.1f W)" % (
            tb - ta, joules, integ, joules / (tb - ta), integ / (tb - ta)), flush=True)
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
