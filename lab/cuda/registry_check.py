"""Checks that a family registered itself in a build of libmodelqual_cuda.so (issue 48): the
library lists it (mqb_families) and opening it reaches the family's own load hook, whose refusal
a family scaffolded by `qual new-family` carries ("not written yet").

    python3 lab/cuda/registry_check.py LIB.so FAMILY
"""
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mqb_bench as mb  # noqa: E402


def main():
    path, family = sys.argv[1], sys.argv[2]
    lib = mb.load_lib(path)
    lib.mqb_families.restype = ctypes.POINTER(ctypes.c_char_p)
    fams, i = [], 0
    f = lib.mqb_families()
    while f[i]:
        fams.append(f[i].decode())
        i += 1
    print("%s: families %s, debug entry points %s" % (os.path.basename(path), fams, lib.debug))
    cj = json.dumps(dict(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=128,
                         rope_theta=10000.0))
    try:
        mb.Backend(lib, family, cj, {}, "bf16", max_batch=2, max_context=64)
        print("REGISTRY FAIL: %s opened, with no weights" % family)
        return 1
    except RuntimeError as e:
        ok = family in fams and "not written yet" in str(e)
        print("REGISTRY %s: %s listed %s, open: %s" % ("OK" if ok else "FAIL", family, family in fams, e))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
