#!/bin/bash
# lab/cuda/specs_call.sh: the families' compiled gpu specs on the GPU host, one family per device
# call where the carry limit (64 MiB with the tree) fits one test binary at a time (lab, not
# product). Meant for a warm machine: what one call unpacks or builds is kept for the next.
#
# Carried (each optional; what an earlier call on the same machine left is used):
#   .devq/*.tar.xz  binaries in a tar: qual, qual-server (go build -trimpath -ldflags='-s -w') and
#                   FAMILY.test (go test -c -trimpath -ldflags='-s -w' ./families/FAMILY), xz'd with a
#                   dictionary larger than one binary (xz --lzma2=preset=6,dict=384MiB), so the code
#                   they share is stored once: 4 test binaries in 21 MB, where one alone is 14;
#   .devq/NAME.xz   one binary each.
# qual alone is 13 MB xz'd and the tree 44 MB, so a first call carries qual.xz (and diffusers'
# source for lab/flux/gpu_check.sh), the next calls on the warm machine the other binaries.
# The library: $SC_LIB, else /tmp/flux_work/libflux.so (lab/flux/gpu_check.sh's), else
# native/cuda/build/libmodelqual_cuda.so, else built here by lab/cuda/build_lib.sh (~130 s).
# Goldens made on this host earlier (lab/flux/gpu_check.sh's $SC_GOLDEN, default
# /tmp/flux_out/golden/*-cuda-bf16.json) are copied into fixtures/golden/ first.
# Env: SC_FAMILIES (default: every FAMILY.test present), SC_FILTER (default gpu), SC_DEADLINE
# (seconds from the start by which every suite must end; default 560).
# Results: $OUT/specs.tgz (logs and JUnit), $OUT/specs.txt (summary lines).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/specs_out}
B=/tmp/mq_specs/bin
W=/tmp/mq_specs/run.$$
mkdir -p "$OUT" "$B" "$W"
LOG=$OUT/specs.txt
T0=${SC_T0:-$(date +%s)}  # SC_T0: the device call's start, where steps ran before this script
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
for f in .devq/*.tar.xz; do
  [ -f "$f" ] && say "unpacked $(tar -xvJf "$f" -C "$B" | tr '\n' ' ')"
done
for f in .devq/*.xz; do
  [ -f "$f" ] && [ "${f%.tar.xz}" = "$f" ] || continue
  n=$(basename "$f" .xz)
  xz -dc "$f" > "$B/$n" && chmod +x "$B/$n" && say "unpacked $n"
done
LIB=${SC_LIB:-}
for l in /tmp/flux_work/libflux.so native/cuda/build/libmodelqual_cuda.so; do
  [ -z "$LIB" ] && [ -f "$l" ] && LIB=$l
done
if [ -z "$LIB" ]; then
  mkdir -p native/cuda/build
  bash lab/cuda/build_lib.sh "$ROOT" native/cuda/build/libmodelqual_cuda.so > "$W/nvcc.log" 2>&1
  say "library built: rc $?"
  LIB=$ROOT/native/cuda/build/libmodelqual_cuda.so
fi
export MODELQUAL_CUDA_LIB=$(readlink -f "$LIB") MODELQUAL_BIN=$B MODELQUAL_CACHE=/tmp/mq_specs/cache
say "library $MODELQUAL_CUDA_LIB"
for g in ${SC_GOLDEN:-/tmp/flux_out/golden}/*-cuda-bf16.json; do
  [ -f "$g" ] && cp "$g" fixtures/golden/ && say "golden $(basename "$g") from this host"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
FAMS=${SC_FAMILIES:-}
if [ -z "$FAMS" ]; then for t in "$B"/*.test; do [ -f "$t" ] && FAMS="$FAMS $(basename "$t" .test)"; done; fi
for fam in $FAMS; do
  [ -x "$B/$fam.test" ] || { say "skipped $fam: no $fam.test"; continue; }
  ts=$(date +%s)
  left=$(( ${SC_DEADLINE:-560} - (ts - T0) ))
  [ $left -gt 30 ] || { say "skipped $fam: ${left} s left before SC_DEADLINE"; continue; }
  ( cd "families/$fam" && MODELQUAL_ARTIFACTS="$W/art-$fam" timeout $left "$B/$fam.test" \
      -ginkgo.label-filter="${SC_FILTER:-gpu}" -ginkgo.no-color -ginkgo.v \
      -ginkgo.junit-report="$W/junit-gpu-$fam.xml" -test.timeout 590s ) > "$W/specs-$fam.log" 2>&1
  say "gpu specs $fam: rc $? in $(( $(date +%s) - ts )) s"
  grep -E "^Ran [0-9]+ of|^(PASS|FAIL)|SUCCESS!|FAIL!|\[FAIL\]|\[SKIPPED\]|NO GOLDEN|PSNR|Expected" "$W/specs-$fam.log" | tail -30 | tee -a "$LOG"
done
find "$W" -name '*.json' -size +2M -delete 2>/dev/null
tar -C "$W" -czf "$OUT/specs.tgz" . 2>/dev/null
say "done"
