"""torch's CPU randn in bfloat16 against native/models/torch_randn.cc's torch_randn_bf16 (and the
float32 stream against torch_randn), on a host with torch and g++ (lab: run by
lab/cuda/one_call.sh). The question it answers: does FluxPipeline in bf16, which draws its latents
in the text encoder's dtype, get noise we can reproduce by seed.

    python3 lab/flux/randn_check.py OUT.json
Prints and writes, for each seed and length, how many values are bit-equal and the max |diff|,
plus the correlation of the bf16 and fp32 streams of one seed (near 0: unrelated noise).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = r'''
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
namespace mq { void torch_randn_bf16(uint64_t, float *, int64_t); void torch_randn(uint64_t, float *, int64_t); }
int main(int argc, char **argv) {
  const uint64_t seed = strtoull(argv[1], 0, 10);
  const int64_t n = atoll(argv[2]);
  std::vector<float> v(n);
  if (argv[3][0] == 'b') mq::torch_randn_bf16(seed, v.data(), n); else mq::torch_randn(seed, v.data(), n);
  fwrite(v.data(), 4, n, stdout);
}
'''


def main(out):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "main.cc"), "w") as f:
        f.write(DRIVER)
    exe = os.path.join(d, "randn")
    subprocess.run(["g++", "-O2", "-std=c++17", "-I" + os.path.join(ROOT, "native/include"), "-I" + os.path.join(ROOT, "native/models"),
                    os.path.join(d, "main.cc"), os.path.join(ROOT, "native/models/torch_randn.cc"), "-o", exe], check=True)
    rows, ok = [], True
    for dt, tag in ((torch.bfloat16, "b"), (torch.float32, "f")):
        for seed in (0, 42, 43, 12345, 2**33 + 7):
            for n in (7, 16, 1000, 1024, 1536, 65536):
                want = torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed), dtype=dt).float().numpy()
                got = np.frombuffer(subprocess.run([exe, str(seed), str(n), tag], check=True, capture_output=True).stdout, dtype=np.float32)
                eq = int((got.view(np.uint32) == want.view(np.uint32)).sum())  # bit equality: -0 is not +0
                r = {"dtype": str(dt), "seed": seed, "n": n, "equal": eq, "max_abs_diff": float(np.abs(got - want).max())}
                ok &= eq == n
                rows.append(r)
                print(json.dumps(r), flush=True)
    a = torch.randn(65536, generator=torch.Generator("cpu").manual_seed(42), dtype=torch.float32).numpy()
    b = torch.randn(65536, generator=torch.Generator("cpu").manual_seed(42), dtype=torch.bfloat16).float().numpy()
    res = {"torch": torch.__version__, "all_equal": ok, "corr_bf16_fp32_seed42": float(np.corrcoef(a, b)[0, 1]), "rows": rows}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
    with open(out, "w") as f:
        json.dump(res, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
