#!/bin/bash
# lab/flux/gpu_check.sh: the flux family's CUDA pipeline in one device call (lab, not product).
#
# Runs from the repository root of a copy of the branch holding
#   qual.xz              qual built on the CPU machine (go build -trimpath -ldflags='-s -w'
#                        ./qual/cmd/qual, then xz), or bin/qual, or $QUAL;
#   diffusers-src.tar.gz `git archive 58eb52c0... src` of github.com/huggingface/diffusers (run
#                        from source, never copied into the project; .tar.xz or
#                        .cache/src/diffusers-src.tar.gz also found, or $DIFFUSERS_TGZ).
# Steps, each time-boxed and logged with its time to $OUT/log.txt as it goes:
#  1. libmodelqual_cuda.so by lab/cuda/build_lib.sh (every translation unit in parallel; or
#     $FC_LIB, a library built earlier); meanwhile the tiny fixtures, diffusers' bf16 goldens on this
#     GPU (flux_diffusers.py golden) and the FLUX.1-size random checkpoint (flux_diffusers.py
#     shape, on the GPU) are made;
#  2. flux-tiny dev and schnell: `qual generate-image --device cuda` for every golden case (and
#     dev's true-CFG case) against diffusers' FluxPipeline bf16 on the same GPU, PSNR and SSIM by
#     scikit-image; the planted flux.swap_text_image_ids and flux.drop_pooled on the GPU against
#     the same golden (must fall); ours CPU fp32 against diffusers' CPU fp32; zimage-tiny on the moved shared
#     code against its stored diffusers bf16 golden PNG (fixtures/golden/zimage-tiny-cuda-bf16-*);
#  3. FLUX.1's sizes (19 double + 38 single blocks, T5-XXL, CLIP-L; random bf16 weights) bundled
#     at bf16: diffusers bf16 and ours at $FC_SIZE (default 512) square, schnell 4 steps (or
#     FC_VARIANT=dev: 28 steps, guidance 3.5), one warmup then $FC_REPEAT timed runs each,
#     images/s and the ratio. The checkpoint goes to /dev/shm when it has room (checkpoint and
#     bundle, 2 x 34 GB, do not both fit a 64 GB disk).
#  4. with AB_BEFORE (a tarball of native/ at an older commit, e.g. `git archive cdb2629 native |
#     gzip > before-native.tgz` carried in the tree): that tree's core, flux.cu and zimage.cu are
#     built into libbefore.so alongside step 1's, and step 3's timed run is repeated with it and with
#     MQB_GRAPHS=0 on this tree's (epilogues fused, steps eager): images/s of before, after
#     without graphs and after, as ratios (lines "AB ..."), and the before image's PSNR and SSIM
#     against diffusers' (lines "AB before: ...").
# FC_KPROF=1 adds step 5: one image each of step 3's pipelines under the CUPTI kernel profiler
# (lab/cuda/kprof), device time by kernel and by kind (lines KPROF, KGROUP), idle gaps and the
# runtime-API calls inside them (KGAP, KGAPAPI, KAPI); FC_KPROF=2 also ours with MQB_GRAPHS=0.
# Env: FC_QUICK=1 keeps step 2's fox cases and faults only (no zimage, no repeat run); FC_SHAPE=0 skips step 3; FC_VARIANT schnell|dev; FC_SIZE 512|1024; FC_REPEAT (default 3);
# AB_BEFORE (step 4).
# Results: $OUT/log.txt (everything below), $OUT/results.tgz (goldens, PNGs, JSON lines).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/flux_out}
W=${FC_WORK:-/tmp/flux_work}
mkdir -p "$OUT" "$W" "$OUT/tiny" "$OUT/golden"
LOG=$OUT/log.txt
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
cd "$ROOT"
PY="python3 lab/flux/flux_diffusers.py"
VARIANT=${FC_VARIANT:-schnell}
SIZE=${FC_SIZE:-512}
REP=${FC_REPEAT:-3}

# 0. tools
if [ -n "${QUAL:-}" ]; then :
elif [ -f qual.xz ]; then xz -dc qual.xz > "$W/qual" && chmod +x "$W/qual" && QUAL=$W/qual
elif [ -x bin/qual ]; then QUAL=$ROOT/bin/qual
elif [ -f bin.tar.xz ]; then tar -xJf bin.tar.xz -C "$W" && QUAL=$W/qual
else say "FAIL no qual (qual.xz, bin/qual or bin.tar.xz)"; exit 1; fi
TGZ=${DIFFUSERS_TGZ:-}
for f in diffusers-src.tar.gz diffusers-src.tar.xz .cache/src/diffusers-src.tar.gz; do [ -z "$TGZ" ] && [ -f "$f" ] && TGZ=$f; done
[ -n "$TGZ" ] && tar -xf "$TGZ" -C "$W" || { say "FAIL no diffusers source"; exit 1; }
export PYTHONPATH=$W/src MODELQUAL_CACHE=$W/cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
nvcc --version | tail -1 | tee -a "$LOG"
python3 -c "import torch, transformers, diffusers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__)" 2>&1 | tee -a "$LOG"

# 1. build (background), fixtures, goldens and the shape checkpoint
# the whole library (backend.cu registers every family, so a flux-only link misses symbols), or
# $FC_LIB built earlier in the same device call; with AB_BEFORE also the older tree's library
(
  set -e
  if [ -n "${FC_LIB:-}" ]; then [ "$FC_LIB" -ef "$W/libflux.so" ] || cp "$FC_LIB" "$W/libflux.so"
  else bash lab/cuda/build_lib.sh "$ROOT" "$W/libflux.so" &
  fi
  if [ -n "${AB_BEFORE:-}" ]; then
    rm -rf "$W/before" && mkdir -p "$W/before" && tar -xzf "$AB_BEFORE" -C "$W/before"
    bash lab/cuda/build_lib.sh "$W/before" "$W/libbefore.so"
  fi
  wait
  test -f "$W/libflux.so"
) > "$W/nvcc.log" 2>&1 &
NVCC=$!
bundle() { "$QUAL" fixtures --name "$1" --bundle 2>>"$LOG" > "$W/fx-$1.json"; python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["bundle_path"])' "$W/fx-$1.json"; }
read -r DSNAP DBUN < <(bundle flux-tiny-dev)
read -r SSNAP SBUN < <(bundle flux-tiny-schnell)
read -r ZSNAP ZBUN < <(bundle zimage-tiny)
say "fixtures: $DBUN $SBUN $ZBUN"
SHM=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
CK=$W/shape
[ "${SHM:-0}" -ge 40 ] && CK=/dev/shm/flux_shape
if [ "${FC_SHAPE:-1}" = 1 ]; then
  TS=$DSNAP
  [ "$VARIANT" = schnell ] && TS=$SSNAP
  timeout 200 $PY shape "$TS" "$CK" "$VARIANT" > "$W/shape_ckpt.json" 2> "$W/shape_ckpt.log" &
  SHAPE=$!
  say "shape checkpoint ($VARIANT) into $CK (/dev/shm has ${SHM:-?} GB free)"
fi
(
  timeout 150 $PY golden "$DSNAP" flux-tiny-dev 58eb52c0803ea9af3abec60841c2a093bdf1f951 "$OUT/golden" > "$W/golden-dev.log" 2>&1
  echo "golden dev rc $?" >> "$W/golden-dev.log"
  timeout 100 $PY golden "$SSNAP" flux-tiny-schnell 58eb52c0803ea9af3abec60841c2a093bdf1f951 "$OUT/golden" > "$W/golden-schnell.log" 2>&1
  echo "golden schnell rc $?" >> "$W/golden-schnell.log"
) &
GOLD=$!
wait $NVCC
rc=$?
say "library (lab/cuda/build_lib.sh, or FC_LIB) rc $rc"
[ $rc = 0 ] || { grep -E "error" -A3 "$W/nvcc.log" | head -40 | tee -a "$LOG"; say "FAIL build"; }
export MODELQUAL_CUDA_LIB=$W/libflux.so

# 2. tiny parity
wait $GOLD
tail -2 "$W/golden-dev.log" "$W/golden-schnell.log" | tee -a "$LOG"
PAIRS=$W/pairs.txt
: > "$PAIRS"
gen() {  # gen OUT.png BUNDLE DEVICE ARGS...
  local o=$1 b=$2 d=$3
  shift 3
  timeout 60 "$QUAL" generate-image --bundle "$b" --device "$d" "$@" --out "$o" >> "$W/gen.log" 2>&1 || say "FAIL generate $o: $(tail -1 "$W/gen.log")"
}
for v in dev schnell; do
  G=$OUT/golden/flux-tiny-$v-cuda-bf16.json
  [ -f "$G" ] || { say "no golden $G"; continue; }
  B=$DBUN
  [ $v = schnell ] && B=$SBUN
  python3 -c 'import json,sys; [print(c["name"], c["width"], c["height"], c["steps"], c["guidance"], c["seed"], c["prompt"]) for c in json.load(open(sys.argv[1]))["cases"]]' "$G" |
    while read -r name w h st g sd p; do
      [ "${FC_QUICK:-0}" = 1 ] && [ "${name#fox}" = "$name" ] && continue
      gen "$OUT/tiny/ours-$v-$name.png" "$B" cuda --prompt "$p" --size "${w}x$h" --steps "$st" --guidance "$g" --seed "$sd"
      echo "$OUT/tiny/ours-$v-$name.png $OUT/golden/flux-tiny-$v-cuda-bf16-$name.png" >> "$PAIRS"
    done
done
FOX=(--prompt "a red fox in the snow" --size 64x64 --steps 4 --guidance 3.5 --seed 42)
gen "$OUT/tiny/ours-dev-fox-truecfg.png" "$DBUN" cuda "${FOX[@]}" --negative-prompt "blurry, dark" --true-cfg 2
echo "$OUT/tiny/ours-dev-fox-truecfg.png $OUT/golden/flux-tiny-dev-cuda-bf16-fox-truecfg.png" >> "$PAIRS"
for f in flux.swap_text_image_ids flux.drop_pooled; do
  MODELQUAL_FAULTS=$f gen "$OUT/tiny/fault-$f-dev-fox-64x64.png" "$DBUN" cuda "${FOX[@]}"
  echo "$OUT/tiny/fault-$f-dev-fox-64x64.png $OUT/golden/flux-tiny-dev-cuda-bf16-fox-64x64.png" >> "$PAIRS"
done
gen "$OUT/tiny/ours-cpu-dev-fox-64x64.png" "$DBUN" cpu "${FOX[@]}"
# the CPU fp32 pipeline against diffusers' CPU fp32 golden (the GPU pipeline follows the bf16 one)
echo "$OUT/tiny/ours-cpu-dev-fox-64x64.png $ROOT/fixtures/golden/flux-tiny-dev-fox-64x64.png" >> "$PAIRS"
# diffusers' bf16 pipeline on the fp32 pipeline's noise (latents=): expected unrelated to ours,
# which draws the bf16 stream as diffusers' bf16 pipeline does
echo "$OUT/tiny/ours-dev-fox-64x64.png $OUT/golden/flux-tiny-dev-cuda-bf16-fox-fp32noise.png" >> "$PAIRS"
[ "${FC_QUICK:-0}" = 1 ] || gen "$OUT/tiny/zimage-fox.png" "$ZBUN" cuda --prompt "a red fox in the snow" --size 64x64 --steps 4 --guidance 3.5 --seed 42
echo "$OUT/tiny/zimage-fox.png $ROOT/fixtures/golden/zimage-tiny-cuda-bf16-fox.png" >> "$PAIRS"
[ "${FC_QUICK:-0}" = 1 ] || "$QUAL" generate-image --bundle "$DBUN" --device cuda --repeat 3 "${FOX[@]}" --out "$W/again.png" 2>&1 | tail -1 | tee -a "$LOG"
if [ "${FC_QUICK:-0}" != 1 ]; then
  cmp -s "$W/again.png" "$OUT/tiny/ours-dev-fox-64x64.png" && say "dev fox: a second run gives the same bytes" || say "dev fox: a second run differs"
fi
timeout 60 $PY comparemany "$PAIRS" > "$OUT/tiny/compare.jsonl" 2> "$W/compare.log"
python3 - "$OUT/tiny/compare.jsonl" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
for l in open(sys.argv[1]):
    try:
        r = json.loads(l)
    except Exception:
        print("?", l.strip()); continue
    print("%-42s vs %-42s PSNR %6.2f dB  SSIM %.5f  max|d| %s" % (r["a"], r["b"], r.get("psnr", float("nan")), r.get("ssim", float("nan")), r.get("max_abs_diff", r.get("error"))))
PY
say "tiny parity done"

# 3. FLUX.1's sizes
if [ "${FC_SHAPE:-1}" = 1 ]; then
  wait $SHAPE
  say "shape checkpoint: rc $? $(cat "$W/shape_ckpt.json" 2>/dev/null)"
  tail -3 "$W/shape_ckpt.log" >> "$LOG"
  FREE=$(df -BG --output=avail "$W" | tail -1 | tr -dc 0-9)
  tb=$(date +%s)
  timeout 200 "$QUAL" bundle build --checkpoint "$CK" --model modelqual-lab/flux-$VARIANT-sizes-random \
    --revision 0000000000000000000000000000000000000001 --out "$W/shape.mqb" --precision bf16 --backend cuda > "$W/shape_bundle.log" 2>&1 ||
    { tail -5 "$W/shape_bundle.log" | tee -a "$LOG"; say "FAIL shape bundle (disk had ${FREE} GB free)"; }
  say "shape bundle: $(($(date +%s) - tb)) s, $(du -h "$W/shape.mqb" 2>/dev/null | cut -f1)"
  P="a red fox in the snow, detailed photograph"
  if [ "$VARIANT" = dev ]; then ST=28 GS=3.5 MS=512; else ST=4 GS=0 MS=256; fi
  N=$((REP + 1))
  timeout 150 $PY run "$CK" "$OUT/shape-diffusers.png" "$SIZE" "$SIZE" $ST $GS 42 "$P" $N $MS > "$OUT/shape-diffusers.json" 2> "$W/d-shape.log" ||
    { tail -5 "$W/d-shape.log" | tee -a "$LOG"; say "FAIL diffusers shape"; }
  tee -a "$LOG" < "$OUT/shape-diffusers.json"
  tb=$(date +%s)
  timeout 150 "$QUAL" generate-image --bundle "$W/shape.mqb" --device cuda --prompt "$P" --size "${SIZE}x$SIZE" --steps $ST --guidance $GS \
    --seed 42 --repeat $N --out "$OUT/shape-ours.png" > "$OUT/shape-ours.txt" 2>&1
  say "ours shape rc $? in $(($(date +%s) - tb)) s (load included)"
  tee -a "$LOG" < "$OUT/shape-ours.txt"
  $PY compare "$OUT/shape-ours.png" "$OUT/shape-diffusers.png" 2>&1 | tee -a "$LOG"
  if [ -n "${AB_BEFORE:-}" ]; then
    # 4. the same timed run on the older tree's library and without graphs
    ab() {  # ab LABEL ENV...: images/s of the shape run under ENV
      local l=$1
      shift
      env "$@" timeout 150 "$QUAL" generate-image --bundle "$W/shape.mqb" --device cuda --prompt "$P" --size "${SIZE}x$SIZE" --steps $ST \
        --guidance $GS --seed 42 --repeat $N --out "$OUT/shape-$l.png" > "$OUT/shape-$l.txt" 2>&1
      sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p' "$OUT/shape-$l.txt" | tail -1
    }
    IB=$(ab before MODELQUAL_CUDA_LIB=$W/libbefore.so)
    $PY compare "$OUT/shape-before.png" "$OUT/shape-diffusers.png" 2>&1 | sed 's/^/AB before: /' | tee -a "$LOG"
    IE=$(ab eager MQB_GRAPHS=0)
    IA=$(sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p' "$OUT/shape-ours.txt" | tail -1)
    python3 -c 'import sys; b, e, a = (float(x or "nan") for x in sys.argv[1:4]); print("AB flux %s %s: images/s before %.4f, after without graphs %.4f (%.3fx), after %.4f (%.3fx)" % (sys.argv[4], sys.argv[5], b, e, e / b, a, a / b))' \
      "$IB" "$IE" "$IA" "$VARIANT" "${SIZE}x$SIZE" 2>&1 | tee -a "$LOG"
    cmp -s "$OUT/shape-ours.png" "$OUT/shape-eager.png" && say "AB graphs and eager: the same bytes" || say "AB graphs and eager differ"
  fi
  if [ "${FC_KPROF:-0}" != 0 ]; then
    # 5. one image each (after a warm-up) under the CUPTI kernel profiler (lab/cuda/kprof): device
    # time by kernel and by kind, ours and diffusers', the first kernel to the last
    if bash lab/cuda/kprof/build.sh "$W/libkprof.so" >> "$LOG" 2>&1; then
      CUDA_INJECTION64_PATH=$W/libkprof.so KPROF_OUT=$OUT/kprof-ours.txt timeout 150 "$QUAL" generate-image --bundle "$W/shape.mqb" \
        --device cuda --prompt "$P" --size "${SIZE}x$SIZE" --steps $ST --guidance $GS --seed 42 --repeat 3 --out "$W/kprof.png" > "$W/kprof-ours.log" 2>&1
      tail -3 "$W/kprof-ours.log" >> "$LOG"
      if [ "${FC_KPROF}" = 2 ]; then  # and ours with the steps eager, to check the graphed figures
        MQB_GRAPHS=0 CUDA_INJECTION64_PATH=$W/libkprof.so KPROF_OUT=$OUT/kprof-ours-eager.txt timeout 150 "$QUAL" generate-image \
          --bundle "$W/shape.mqb" --device cuda --prompt "$P" --size "${SIZE}x$SIZE" --steps $ST --guidance $GS --seed 42 --repeat 3 \
          --out "$W/kprof-e.png" > "$W/kprof-ours-e.log" 2>&1
        tail -1 "$W/kprof-ours-e.log" >> "$LOG"
        python3 lab/cuda/kprof/group.py "$OUT/kprof-ours-eager.txt" 2>&1 | tee -a "$LOG"
        grep -h "^KPROF " "$OUT/kprof-ours-eager.txt" | head -25 >> "$LOG"
      fi
      CUDA_INJECTION64_PATH=$W/libkprof.so KPROF_OUT=$OUT/kprof-diffusers.txt timeout 150 $PY run "$CK" "$W/kprof-d.png" "$SIZE" "$SIZE" \
        $ST $GS 42 "$P" 2 $MS > "$W/kprof-d.json" 2> "$W/kprof-d.log"
      python3 lab/cuda/kprof/group.py "$OUT/kprof-ours.txt" "$OUT/kprof-diffusers.txt" 2>&1 | tee -a "$LOG"
      grep -h "^KGAP\|^KAPI" "$OUT/kprof-ours.txt" "$OUT/kprof-diffusers.txt" | tee -a "$LOG"
      grep -h "^KPROF " "$OUT/kprof-ours.txt" "$OUT/kprof-diffusers.txt" | head -60 >> "$LOG"
    else
      say "FAIL kprof build"
    fi
  fi
  timeout 30 $PY gemmrate > "$OUT/gemmrate.json" 2>>"$LOG"
  python3 - "$OUT/shape-diffusers.json" "$OUT/shape-ours.txt" "$VARIANT" "$SIZE" "$ST" $MS "$OUT/gemmrate.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, re, sys
d = json.load(open(sys.argv[1]))["images_per_s"]
o = float(re.search(r"images_per_s ([0-9.]+)", open(sys.argv[2]).read()).group(1))
size, steps, T = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
print("RATIO flux %s %sx%s %s steps: images/s ours %.4f / diffusers %.4f = %.3f" % (sys.argv[3], size, size, steps, o, d, o / d))
# The transformer's products per step (57 blocks of 24 D^2 flops per row plus 4 L^2 D of
# attention; embedders, encoders and the VAE left out), over the whole image's time: a lower
# bound of each step's achieved rate.
D, N = 3072, (size // 16) ** 2
L = T + N
f = 57 * (24 * D * D * L + 4 * L * L * D)
try:
    g = json.load(open(sys.argv[7]))["bf16_gemm_tflops"]
except Exception:
    g = float("nan")
for who, ips in (("ours", o), ("diffusers", d)):
    t = f * steps * ips / 1e12
    print("TFLOPS %s: %.1f TFLOP/s per step (>= %.2f TFLOP a step, %d rows), card bf16 GEMM %.0f TFLOP/s: %.0f%%" % (who, t, f / 1e12, L, g, 100 * t / g))
PY
  rm -rf /dev/shm/flux_shape
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$LOG"
# one archive for the per-image files (the run tool returns a limited number of files)
(cd "$OUT" && tar -czf results.tgz golden tiny && rm -rf golden tiny)
say "total"
