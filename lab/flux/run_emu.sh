#!/bin/bash
# lab/flux/run_emu.sh: native/models/flux.cu (and zimage.cu, through the shared
# diffusion_cuda.cuh) on the CPU emulation of the CUDA backend, through the product's own path:
# emu_lib.cc is built into an emulated libmodelqual_cuda.so, and `qual generate-image --device
# cuda` (models/flux.cc's FluxCuda: the same validation, noise and sigmas as the CPU pipeline)
# runs it with MODELQUAL_CUDA_LIB pointing there. Each image is compared with the CPU fp32
# pipeline's (`qual generate-image --device cpu`, models/flux.cc) for the same controls: PSNR and
# SSIM by qual/imagecmp (scikit-image's definitions), pass at PSNR >= $MIN_PSNR (default 44 dB:
# between the bf16 pipeline's distance from the fp32 one, 48.9-51.2 dB measured, and the weakest
# planted fault's, flux.swap_text_image_ids at 39.9 dB, which a 35 dB bound lets through:
# lab/flux/results/emu_2026-12-06_run1_min35.txt). Then the planted faults (MODELQUAL_FAULTS flux.swap_text_image_ids,
# flux.drop_pooled, read by flux.cu as by flux.cc) on the emulated GPU only, against the clean CPU
# image: each must fail the bound. Then zimage-tiny the same way (its GPU pipeline now on the
# shared code) and, when BEFORE_LIB names an emulated library built from the zimage.cu before the
# move, before against after byte for byte.
# The fused epilogues and the graphed denoising steps: with BEFORE_DIR (a run of this script on
# an older tree) every emulated image is compared byte for byte with the one of the same name
# there (the fusions keep the arithmetic: the same bytes expected); the CFG cases (two graphs a
# step) are run again with MQB_GRAPHS=0 (eager launches) and must be the same bytes as the graph
# replays; dev-fox again with EMU_LT_EPILOGUE=0 (the emulated cuBLASLt offers no epilogue: the
# unfused fallback) must be the same bytes too.
#
# Since 2026-12-07 the CUDA pipeline is diffusers' bf16 pipeline (bf16 noise for a seed, bf16
# timesteps and latents), so its images are no longer near the CPU fp32 pipeline's: the flux
# comparisons below against the CPU image fail by design, and only the byte-for-byte ones (before
# and after, graphs and eager, fused and unfused) and zimage's still hold. The reference is
# diffusers' bf16 GPU run: with the emulated library, dev fox 64x64 measured 46.3 dB against it
# (lab/flux/results/emu_2026-12-07_bf16.txt).
#
# Usage (repository root or anywhere): bash lab/flux/run_emu.sh [OUTDIR]
# Env: QUAL (a qual binary; default: built here), MIN_PSNR, BEFORE_LIB, BEFORE_DIR, EMU_QUICK=1
# (one dev case, one fault, the eager and fallback comparisons; 2: the dev case and its eager
# twin only, for planted defects), LIB (an emulated library already built, to skip the build). Takes ~1.5 min per emulated image on 2 cores.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-/tmp/flux_emu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MIN=${MIN_PSNR:-44}
export MODELQUAL_CACHE=${MODELQUAL_CACHE:-$OUT/cache}
cd "$ROOT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
if [ -z "${QUAL:-}" ]; then
  go build -trimpath -o "$OUT/qual" ./qual/cmd/qual || { say "FAIL go build qual"; exit 1; }
  QUAL=$OUT/qual
fi
go build -o "$OUT/imgcmp" ./lab/flux/imgcmp || { say "FAIL go build imgcmp"; exit 1; }
if [ -n "${LIB:-}" ]; then cp "$LIB" "$OUT/libemu.so"; else
( cd lab/flux && g++ -std=c++20 -O2 -fPIC -shared -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../../native/cuda/stub \
  -I../../native/include -x c++ emu_lib.cc ../../native/cuda/blas_pick.cc -o "$OUT/libemu.so" -pthread ) || { say "FAIL build emu lib"; exit 1; }
fi
say "built qual, imgcmp and the emulated libmodelqual_cuda.so"
bundle() { "$QUAL" fixtures --name "$1" --bundle 2>>"$OUT/fixtures.log" | sed -n 's/.*"bundle_path": "\(.*\)".*/\1/p'; }
DEV=$(bundle flux-tiny-dev)
SCH=$(bundle flux-tiny-schnell)
ZT=$(bundle zimage-tiny)
say "bundles: $DEV $SCH $ZT"

fails=0
# run NAME BUNDLE FAULTS ARGS...: the CPU image (no faults) and the emulated GPU image.
gen() {
  local dev=$1 out=$2 faults=$3 b=$4
  shift 4
  if [ "$dev" = cpu ]; then
    "$QUAL" generate-image --bundle "$b" --device cpu "$@" --out "$out" > "$out.log" 2>&1
  else
    MODELQUAL_FAULTS=$faults MODELQUAL_CUDA_LIB=$OUT/libemu.so timeout 1200 "$QUAL" generate-image --bundle "$b" --device cuda "$@" \
      --out "$out" > "$out.log" 2>&1
  fi
}
# check NAME WANT(pass|fail) BUNDLE FAULTS ARGS...
check() {
  local name=$1 want=$2 b=$3 faults=$4
  shift 4
  [ -f "$OUT/$name-cpu.png" ] || gen cpu "$OUT/$name-cpu.png" "" "$b" "$@"
  if ! gen cuda "$OUT/$name-emu$faults.png" "$faults" "$b" "$@"; then
    say "FAIL $name ($faults): the emulated run failed: $(tail -2 "$OUT/$name-emu$faults.png.log")"
    fails=$((fails + 1))
    return
  fi
  local m got
  m=$("$OUT/imgcmp" "$OUT/$name-cpu.png" "$OUT/$name-emu$faults.png" "$MIN")
  got=$([ $? -eq 0 ] && echo pass || echo fail)
  if [ "$got" = "$want" ]; then
    say "ok   $name ${faults:+fault $faults }emulated GPU vs CPU: $m (want $want at >= $MIN dB)"
  else
    say "FAIL $name ${faults:+fault $faults }emulated GPU vs CPU: $m (want $want at >= $MIN dB)"
    fails=$((fails + 1))
  fi
  if [ -n "${BEFORE_DIR:-}" ] && [ -f "$BEFORE_DIR/$name-emu$faults.png" ]; then
    if cmp -s "$BEFORE_DIR/$name-emu$faults.png" "$OUT/$name-emu$faults.png"; then
      say "ok   $name ${faults:+fault $faults }the same bytes as $BEFORE_DIR's"
    else
      say "DIFF $name ${faults:+fault $faults }against $BEFORE_DIR's: $("$OUT/imgcmp" "$BEFORE_DIR/$name-emu$faults.png" "$OUT/$name-emu$faults.png")"
    fi
  fi
}
# same NAME ENV LABEL BUNDLE ARGS...: the emulated image again under ENV (VAR=value) must be the
# same bytes as NAME's.
same() {
  local name=$1 env=$2 label=$3 b=$4
  shift 4
  if ! env "$env" MODELQUAL_CUDA_LIB=$OUT/libemu.so timeout 1200 "$QUAL" generate-image --bundle "$b" --device cuda "$@" \
    --out "$OUT/$name-$label.png" > "$OUT/$name-$label.png.log" 2>&1; then
    say "FAIL $name $label: the emulated run failed: $(tail -2 "$OUT/$name-$label.png.log")"
    fails=$((fails + 1))
  elif cmp -s "$OUT/$name-emu.png" "$OUT/$name-$label.png"; then
    say "ok   $name: $label ($env) gives the same bytes"
  else
    say "FAIL $name: $label ($env) differs: $("$OUT/imgcmp" "$OUT/$name-emu.png" "$OUT/$name-$label.png")"
    fails=$((fails + 1))
  fi
}
FOX=(--prompt "a red fox in the snow" --size 64x64 --steps 4 --seed 42)
WIDE=(--prompt "a lighthouse at dusk, oil painting" --size 96x64 --steps 3 --seed 43)
check dev-fox pass "$DEV" "" "${FOX[@]}" --guidance 3.5
[ "${EMU_QUICK:-0}" = 2 ] || check dev-fox fail "$DEV" flux.swap_text_image_ids "${FOX[@]}" --guidance 3.5
same dev-fox MQB_GRAPHS=0 eager "$DEV" "${FOX[@]}" --guidance 3.5
[ "${EMU_QUICK:-0}" = 2 ] || same dev-fox EMU_LT_EPILOGUE=0 unfused "$DEV" "${FOX[@]}" --guidance 3.5
if [ "${EMU_QUICK:-0}" = 0 ]; then
  check dev-fox fail "$DEV" flux.drop_pooled "${FOX[@]}" --guidance 3.5
  check dev-truecfg pass "$DEV" "" "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry, dark" --true-cfg 2
  same dev-truecfg MQB_GRAPHS=0 eager "$DEV" "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry, dark" --true-cfg 2
  check schnell-wide pass "$SCH" "" "${WIDE[@]}" --guidance 0
  check zimage-fox pass "$ZT" "" "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry"
  same zimage-fox MQB_GRAPHS=0 eager "$ZT" "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry"
  if [ -n "${BEFORE_LIB:-}" ]; then
    MODELQUAL_CUDA_LIB=$BEFORE_LIB timeout 1200 "$QUAL" generate-image --bundle "$ZT" --device cuda "${FOX[@]}" --guidance 3.5 \
      --negative-prompt "blurry" --out "$OUT/zimage-fox-before.png" > "$OUT/zimage-fox-before.log" 2>&1
    if cmp -s "$OUT/zimage-fox-before.png" "$OUT/zimage-fox-emu.png"; then
      say "ok   zimage-fox: the emulated image before the move and after it are the same bytes"
    else
      say "FAIL zimage-fox: before and after the move differ: $("$OUT/imgcmp" "$OUT/zimage-fox-before.png" "$OUT/zimage-fox-emu.png")"
      fails=$((fails + 1))
    fi
  fi
fi
say "done: $fails failure(s)"
exit $((fails > 0))
