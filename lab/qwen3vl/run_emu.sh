#!/bin/bash
# lab/qwen3vl/run_emu.sh: native/models/qwen3vl.cu (and internvl.cu) on the CPU emulation of the
# CUDA backend, through the product's engine, against the CPU fp32 backend (vlcheck/main.go: one
# and two images, logits at every image position and after, greedy tokens, vision_ns).
#   1. qwen3vl-tiny, cuda bf16 bundle on the emulated library vs the fp32 bundle on cpu: must pass.
#   2. the same with MODELQUAL_FAULTS=qwen3vl.shared_image_start on the emulated GPU only (the
#      second image's positions start where the first image's did): the one-image case still
#      passes, the two-image case must fail.
#   3. internvl-tiny the same way (two images stacked tile after tile): must pass.
# Usage: bash lab/qwen3vl/run_emu.sh [OUTDIR]   (about 5 minutes on 2 cores)
# Env: EMU_TOL (logits bound, default 0.1), EMU_STEPS (greedy tokens, default 8), EMU_LIB (an
# emulated library already built from this tree: skips the 2-10 minute compile), EMU_QUICK=1
# (qwen3vl only).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-/tmp/qwen3vl_emu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export MODELQUAL_CACHE=${MODELQUAL_CACHE:-$OUT/cache}
cd "$ROOT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
go build -trimpath -o "$OUT/qual" ./qual/cmd/qual || { say "FAIL go build qual"; exit 1; }
go build -o "$OUT/vlcheck" ./lab/qwen3vl/vlcheck || { say "FAIL go build vlcheck"; exit 1; }
[ -n "${EMU_LIB:-}" ] && cp "$EMU_LIB" "$OUT/libemu.so" || ( cd lab/qwen3vl && g++ -std=c++20 -O2 -fPIC -shared -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../../native/cuda/stub \
  -I../../native/include -x c++ emu_lib.cc ../../native/cuda/blas_pick.cc -o "$OUT/libemu.so" -pthread ) || { say "FAIL build emu lib"; exit 1; }
say "built qual, vlcheck and the emulated libmodelqual_cuda.so"
# bundles NAME: the fp32 cpu bundle and a bf16 cuda bundle of the fixture
bundles() {
  local name=$1 snap model rev
  "$OUT/qual" fixtures --name "$name" --bundle > "$OUT/$name.fixture.json" 2>>"$OUT/fixtures.log" || return 1
  read -r snap model rev cpub < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["model"], d["revision"], d["bundle_path"])' "$OUT/$name.fixture.json") || return 1
  echo "$cpub" > "$OUT/$name.cpu"
  [ -e "$OUT/$name.cuda.mqb" ] || "$OUT/qual" bundle build --checkpoint "$snap" --model "$model" --revision "$rev" --out "$OUT/$name.cuda.mqb" \
    --precision bf16 --backend cuda --max-batch 1 >> "$OUT/bundle.log" 2>&1
}
fails=0
# emu NAME WANT(pass|fail) FAULTS IMAGES
emu() {
  local name=$1 want=$2 faults=$3 images=$4 log got
  log="$OUT/$name${faults:+-$faults}.log"
  MODELQUAL_CUDA_LIB=$OUT/libemu.so timeout 1500 "$OUT/vlcheck" -cpu "$(cat "$OUT/$name.cpu")" -cuda "$OUT/$name.cuda.mqb" -root . \
    -images "$images" -faults "$faults" -tol "${EMU_TOL:-0.1}" -steps "${EMU_STEPS:-8}" > "$log" 2>&1
  got=$([ $? -eq 0 ] && echo pass || echo fail)
  sed 's/^/    /' "$log" | tee -a "$OUT/summary.txt"
  if [ "$got" = "$want" ] && grep -q "^ok   1 image" "$log"; then
    say "ok   $name ${faults:+fault $faults }(want $want)"
  else
    say "FAIL $name ${faults:+fault $faults }(want $want, got $got)"
    fails=$((fails + 1))
  fi
}
QI=fixtures/images/qwen3vl/02-scene-300x200.png,fixtures/images/qwen3vl/04-gray-96x130.png
bundles qwen3vl-tiny || { say "FAIL bundles qwen3vl-tiny: $(tail -3 "$OUT/bundle.log" "$OUT/fixtures.log")"; exit 1; }
emu qwen3vl-tiny pass "" "$QI"
emu qwen3vl-tiny fail qwen3vl.shared_image_start "$QI"
if grep -q "^FAIL 2 image" "$OUT/qwen3vl-tiny-qwen3vl.shared_image_start.log"; then
  say "ok   the planted fault fails the two-image case"
else
  say "FAIL the planted fault did not fail the two-image case"
  fails=$((fails + 1))
fi
if [ "${EMU_QUICK:-0}" != 1 ]; then
  II=fixtures/images/internvl/01-square-448x448.png,fixtures/images/internvl/09-gray-300x300.png
  bundles internvl-tiny || { say "FAIL bundles internvl-tiny"; exit 1; }
  emu internvl-tiny pass "" "$II"
fi
say "done: $fails failure(s)"
exit $((fails > 0))
