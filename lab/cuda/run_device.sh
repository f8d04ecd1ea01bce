#!/bin/bash
# run_device.sh: what one GPU-machine call runs (via the device tool, from the repository root):
# build with CMake, parity against transformers, the Qwen3-0.6B-shaped benchmark; everything
# lands in $OUT (build.log, parity.log/json, bench.log/json). Usage: bash lab/cuda/run_device.sh [parity|bench|all]
set -o pipefail
OUT=${OUT:-/tmp/mqb_out}
mkdir -p "$OUT"
what=${1:-all}
cd "$(dirname "$0")/../.."
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv; nvcc --version | tail -2; cmake --version | head -1; } 2>&1 | tee "$OUT/env.txt"
t0=$(date +%s)
# MQB_CMAKE_FLAGS: extra configure flags, e.g. "-DMQB_MEGAKERNEL=ON -DMQB_TC_PRODUCTS=ON" for the opt-in paths.
if ! { cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release ${MQB_CMAKE_FLAGS} && cmake --build native/cuda/build -j 16; } > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$OUT/build.log" | head -60
  echo "CMAKE BUILD FAILED; trying nvcc directly"
  mkdir -p native/cuda/build
  if ! nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -lineinfo -Inative/include -Inative/cuda native/cuda/backend.cu native/cuda/blas_pick.cc native/models/*.cu \
      -o native/cuda/build/libmodelqual_cuda.so -lcublas -lcublasLt -lcuda -lpthread >> "$OUT/build.log" 2>&1; then
    grep -E "error" -A3 "$OUT/build.log" | tail -60
    echo "BUILD FAILED"
    exit 1
  fi
fi
echo "build ok in $(( $(date +%s) - t0 )) s"; grep -E "[1-9][0-9]* bytes spill" "$OUT/build.log" | head -10
export PYTHONUNBUFFERED=1
lib=native/cuda/build/libmodelqual_cuda.so
# PY_DEADLINE: seconds from the start of this script by which Python must be done.
PY_TIMEOUT=$(( ${PY_DEADLINE:-300} - ($(date +%s) - t0) ))
case "$what" in
  all) timeout $PY_TIMEOUT python3 lab/cuda/mqb_bench.py all --lib $lib --out "$OUT" 2>&1 | tee "$OUT/run.log" | grep -vE "warn" ;;
  *) timeout $PY_TIMEOUT python3 lab/cuda/mqb_bench.py "$what" --lib $lib --out "$OUT/$what.json" 2>&1 | tee "$OUT/run.log" | grep -vE "warn" ;;
esac
echo "total $(( $(date +%s) - t0 )) s"
