#!/bin/bash
# gpu_check.sh: ONE device-tool call for the internvl family on the GPU (issue 50 item 8): builds
# libmodelqual_cuda.so from this tree (lab/cuda/build_lib.sh, every native/models/*.cu with
# internvl.cu), makes the internvl-tiny fixture with the carried `qual` while it compiles, then
# lab/internvl/gpu_check.py: transformers' InternVLForConditionalGeneration in bf16 against the
# library over the image corpus (first-step logits, 32 greedy tokens, the two-image requests, a
# planted defect) and, on internvl3.5-1b's shapes with random bf16 weights, TTFT and decode
# tokens/s against transformers and decode after an image against text-only decode.
#
# The GPU machine has no Go: build qual on the CPU machine and carry it:
#   mkdir -p bin/internvl && go build -trimpath -ldflags='-s -w' -o bin/internvl/ ./qual/cmd/qual
# then, from the repository root (carry bin/internvl):
#   OUT=$OUT bash lab/internvl/gpu_check.sh
# Outputs in $OUT: internvl_gpu.json (every figure), table.txt, gpu_check.log, build.log on failure.
set -o pipefail
OUT=${OUT:-/tmp/internvl_gpu}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
W=/tmp/internvl_gpu_work
rm -rf "$W"; mkdir -p "$W"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
el() { echo $(( $(date +%s) - T0 )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1;
  nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee -a "$LOG"

# IV_LIB: a libmodelqual_cuda.so built earlier from this tree (no build here)
LIB="${IV_LIB:-$W/libmodelqual_cuda.so}"
# the build in the background; its end is a marker file gpu_check.py waits for
if [ -n "${IV_LIB:-}" ]; then touch "$LIB.ready"; BUILD=
else
  ( if bash lab/cuda/build_lib.sh "$ROOT" "$LIB" > "$W/build.log" 2>&1; then touch "$LIB.ready"
    else touch "$LIB.ready.failed"; fi ) &
  BUILD=$!
fi

QUAL=${QUAL:-$ROOT/bin/internvl/qual}
export MODELQUAL_BIN=$(dirname "$QUAL")
if ! "$QUAL" fixtures --cache "$W/cache" --name internvl-tiny > "$W/fixture.json" 2>> "$LOG"; then
  say "FAIL qual fixtures --name internvl-tiny"; kill $BUILD; exit 1
fi
SNAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["snapshot_dir"])' "$W/fixture.json") || {
  say "FAIL reading $W/fixture.json"; head -5 "$W/fixture.json" | tee -a "$LOG"; exit 1; }
say "internvl-tiny fixture at $(el) s: $SNAP"

# transformers' side runs while nvcc compiles (gpu_check.py's phase 1); the library's side and
# every timing after the build (phase 2)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LIMIT=${GPU_CHECK_LIMIT:-285}
timeout $(( LIMIT - $(el) )) python3 lab/internvl/gpu_check.py --lib "$LIB" --lib-ready "$LIB.ready" \
  --snapshot "$SNAP" --out "$OUT" --root . --budget $(( LIMIT - 10 - $(el) )) 2> "$OUT/gpu_check.stderr" | tee -a "$LOG"
rc=$?
wait $BUILD
if [ -f "$LIB.ready.failed" ]; then
  cp "$W/build.log" "$OUT/build.log"
  grep -E "error" -A3 "$W/build.log" | head -40 | tee -a "$LOG"; say "FAIL build libmodelqual_cuda.so"
fi
grep -E "phase 1" "$OUT/gpu_check.stderr" | tee -a "$LOG"
tail -5 "$OUT/gpu_check.stderr" | tee -a "$LOG"
say "gpu_check.py exit $rc; total $(el) s"
exit $rc
