#!/bin/bash
# lab/cuda/nvcc_cpu/check.sh: compile the families' CUDA files with nvcc on the CPU machine (no
# GPU), when the device is out of reach. Debian bookworm's nvidia-cuda-toolkit (11.8: add
# "contrib non-free" to the apt sources, then apt-get install --no-install-recommends
# nvidia-cuda-toolkit) has no CUDA 12 tensor-map API: cuda12_shim.h declares those names only so
# the front end gets through linear.cuh/tile.cuh; nothing built here is run. Every
# native/models/*.cu goes through nvcc and ptxas for sm_90; backend.cu's front end passes but
# 11.8's ptxas lacks PTX 8's cluster-barrier modifiers, so it is compiled to PTX only.
# Usage (repository root): bash lab/cuda/nvcc_cpu/check.sh   -> one line per file, rc 1 on an error.
set -u
cd "$(dirname "$0")/../../.."
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
NV="nice nvcc -O1 -std=c++17 -arch=sm_90 -include lab/cuda/nvcc_cpu/cuda12_shim.h -Xcompiler -fPIC -Inative/include -Inative/cuda"
rc=0
for f in native/models/*.cu; do
  if $NV -c "$f" -o "$W/$(basename "$f").o" > "$W/log" 2>&1; then echo "ok   $f"; else rc=1; echo "FAIL $f"; grep -m 20 error "$W/log"; fi
done
if $NV -ptx native/cuda/backend.cu -o "$W/backend.ptx" > "$W/log" 2>&1; then echo "ok   native/cuda/backend.cu (to PTX)"; else rc=1; echo "FAIL native/cuda/backend.cu"; grep -m 20 error "$W/log"; fi
exit $rc
