#!/bin/bash
# one_call.sh: the GPU checks issues 49, 50 and 51 still wait for, in ONE device-tool call (the
# device is hard to get: one call has to carry everything). Run from the repository root with
#   BINS   a tar.xz of qual, qual-server and vlcheck built on the CPU machine:
#          go build -trimpath -ldflags='-s -w' -o .devq/e2e/ ./qual/cmd/qual ./server/cmd/qual-server \
#            ./lab/qwen3vl/vlcheck && tar -C .devq/e2e -cf - qual qual-server vlcheck | xz -9 > .devq/bins.tar.xz
#   .cache/src/diffusers-src.tar.gz  (see fixtures/golden/run_flux_golden.sh)
# both carried. Steps:
#   0. (background) the flux-tiny CPU fp32 goldens of diffusers (fixtures/golden/run_flux_golden.sh);
#      lab/flux/randn_check.py (torch's bf16 and fp32 randn against native/models/torch_randn.cc);
#   1. libmodelqual_cuda.so of this tree (lab/cuda/build_lib.sh);
#   2. in parallel on the one GPU, each time-boxed: lab/cuda/swa_check.py (issue 49: the window and
#      its ring cache against transformers), lab/flux/gpu_check.sh FC_SHAPE=0 (issue 51: the tiny
#      pipelines against diffusers bf16), lab/internvl/gpu_check.sh and lab/qwen3vl/gpu_check.sh
#      (issue 50), all on step 1's library.
# Writes $OUT/one.tgz (every log and result) and prints the lines worth reading.
set -u
OUT=${OUT:?set OUT}
R=$PWD W=/tmp/one_call
rm -rf "$W"; mkdir -p "$W/bin" "$W/res" "$OUT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$W/res/one.log"; }
tar -xJf "${BINS:-.devq/bins.tar.xz}" -C "$W/bin" || { say "FAIL unpack $BINS"; exit 1; }
Q=$W/bin/qual
mkdir -p bin && tar -C "$W/bin" -cf bin/vlcuda.tgz qual qual-server vlcheck
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$W/res/one.log"
( QUAL=$Q FIXTURES=/nonexistent OMP_NUM_THREADS=4 timeout 480 bash fixtures/golden/run_flux_golden.sh "$W/res/cpugold" \
    > "$W/res/cpugold.log" 2>&1; echo "cpu golden rc $?" >> "$W/res/cpugold.log" ) &
GOLD=$!
( timeout 120 python3 lab/flux/randn_check.py "$W/res/randn.json" > "$W/res/randn.log" 2>&1; echo "randn rc $?" >> "$W/res/randn.log" ) &
bash lab/cuda/build_lib.sh "$R" "$W/lib.so" > "$W/res/build.log" 2>&1 || { say "FAIL build"; grep -A3 error "$W/res/build.log" | head -30; }
say "library built"
if [ -f "$W/lib.so" ]; then
  ( timeout 300 python3 lab/cuda/swa_check.py --lib "$W/lib.so" --out "$W/res/swa.json" > "$W/res/swa.log" 2>&1
    echo "swa rc $?" >> "$W/res/swa.log" ) &
  ( OUT=$W/res/flux FC_WORK=$W/fluxw QUAL=$Q FC_LIB=$W/lib.so FC_SHAPE=0 timeout 330 bash lab/flux/gpu_check.sh \
      > "$W/res/flux.console" 2>&1; echo "flux rc $?" >> "$W/res/flux.console" ) &
  ( OUT=$W/res/internvl IV_LIB=$W/lib.so QUAL=$Q GPU_CHECK_LIMIT=300 timeout 330 bash lab/internvl/gpu_check.sh \
      > "$W/res/internvl.console" 2>&1; echo "internvl rc $?" >> "$W/res/internvl.console" ) &
  ( OUT=$W/res/vl VL_LIB=$W/lib.so timeout 330 bash lab/qwen3vl/gpu_check.sh \
      > "$W/res/vl.console" 2>&1; echo "vl rc $?" >> "$W/res/vl.console" ) &
fi
wait
say "all steps ended"
for f in randn.log cpugold.log swa.log flux.console internvl.console vl.console; do
  echo "== $f"; grep -vE "Warning|warn\(" "$W/res/$f" 2>/dev/null | tail -25
done
tar -czf "$OUT/one.tgz" -C "$W" res
say "total"
