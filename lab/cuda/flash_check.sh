#!/bin/bash
# lab/cuda/flash_check.sh: img::flash_attention (native/cuda/ops/flash_attn.cuh) on the GPU, one
# device call, under 3 minutes: builds lab/cuda/probe/flash_check.cu with nvcc (-O3, sm_90a with
# MQB_SM90A as lab/cuda/build_lib.sh builds the library;
# ptxas's register and spill report of the kernels kept) and runs it: per shape (Z-Image 512^2
# and 1024^2, Flux 1024^2, the InternVL and Qwen3-VL vision towers, causal and plain GQA, a key
# length other than the query length, lengths off the tiles) max|d|
# against an fp32 reference, time per call against the materialised cuBLAS path zimage.cu uses,
# TFLOP/s, and the card's cuBLAS bf16 GEMM rate. Nothing to carry: it builds from the sources.
# Output: $OUT/flash_check.txt (results), $OUT/build.txt (nvcc's log); exit status 0 when every
# shape is within its bound.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/flash_out}
mkdir -p "$OUT"
BIN=$(mktemp /tmp/flash_check.XXXXXX)
T0=$(date +%s)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  nvcc --version | tail -1
} > "$OUT/build.txt" 2>&1
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DMQB_SM90A -Xptxas -v -Inative/include -Inative/cuda lab/cuda/probe/flash_check.cu \
  native/cuda/blas_pick.cc -o "$BIN" -lcublas -lcublasLt -lcuda > "$OUT/nvcc.log" 2>&1
rc=$?
grep -E "error|warning" "$OUT/nvcc.log" | head -40 >> "$OUT/build.txt"
# ptxas: registers, spills and shared memory of each attention kernel instance (fa::flash_kernel,
# fw::flash_k; the lines after its name)
grep -A2 -E "Compiling entry function '_ZN6mqcuda3img2f[aw]" "$OUT/nvcc.log" | grep -E "entry|registers|spill" >> "$OUT/build.txt"
echo "nvcc rc $rc, $(( $(date +%s) - T0 )) s" >> "$OUT/build.txt"
rm -f "$OUT/nvcc.log"
[ $rc = 0 ] || { cat "$OUT/build.txt"; exit 1; }
timeout 150 "$BIN" "$OUT/flash_check.txt"
rc=$?
echo "run rc $rc, $(( $(date +%s) - T0 )) s total" | tee -a "$OUT/build.txt"
rm -f "$BIN"
exit $rc
