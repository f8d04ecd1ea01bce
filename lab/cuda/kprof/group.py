"""group.py KPROF_FILE... : each kprof table's device time by kind of kernel (lab, not product).

Kinds by name: GEMM (cuBLAS/cuBLASLt/CUTLASS), attention (flash/fmha/sdpa), convolution (cuDNN,
implicit GEMM: the VAE), the rest (norms, elementwise, rotary, copies) — so two pipelines' profiles
of the same work show where one spends what the other does not.
"""
import re
import sys

KINDS = [
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa|softmax", re.I)),
    ("conv", re.compile(r"conv|im2col|implicit|winograd|cudnn|xmma_fprop|fprop|dgrad|wgrad", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|sm90_|sm80_|splitk|matmul", re.I)),
]


def kind(name):
    for k, rx in KINDS:
        if rx.search(name):
            return k
    return "other"


for path in sys.argv[1:]:
    tot, by = 0, {}
    for line in open(path, errors="replace"):
        if not line.startswith("KPROFALL\t"):
            continue
        _, ns, n, name = line.rstrip("\n").split("\t", 3)
        ns, n = int(ns), int(n)
        tot += ns
        k = kind(name)
        a = by.setdefault(k, [0, 0])
        a[0] += ns
        a[1] += n
    print("KGROUP %s: %.1f ms busy" % (path, tot / 1e6))
    for k, (ns, n) in sorted(by.items(), key=lambda x: -x[1][0]):
        print("KGROUP   %-9s %9.1f ms %5.1f%% %8d kernels" % (k, ns / 1e6, 100 * ns / max(tot, 1), n))
