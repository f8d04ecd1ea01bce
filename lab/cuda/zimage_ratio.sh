#!/bin/bash
# lab/cuda/zimage_ratio.sh: zimage's images/s against diffusers' ZImagePipeline at Z-Image-Turbo's
# sizes, on one GPU, in one device call (lab, not product). Meant for a machine that
# lab/flux/gpu_check.sh has just run on: it reuses that call's library ($FC_WORK/libflux.so, the
# whole libmodelqual_cuda.so), qual, diffusers' source and the tiny fixtures' cache.
#   1. the zimage-tiny fixture's folder seeds a checkpoint of Z-Image-Turbo's sizes with random
#      bf16 weights (lab/cuda/zimage_shape_ckpt.py, on the GPU), into /dev/shm when it has room;
#   2. `qual bundle build --precision bf16 --backend cuda` of it;
#   3. for each "SIZE:GUIDANCE" of $ZR_CASES (default "512:3.5 1024:3.5 1024:0"), 8 steps, seed
#      42: diffusers bf16 and ours, one warm-up then $ZR_REPEAT timed images each (default 3),
#      PSNR between the two images, a RATIO line and each step's achieved TFLOP/s (a lower bound:
#      the 30 main layers' products and attention over the image rows plus 32 caption rows per
#      sequence, two sequences a step with guidance) against the card's measured bf16 GEMM rate.
# Env: QUAL (default /tmp/mq_specs/bin/qual), FC_WORK (default /tmp/flux_work), OUT.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/zimage_ratio}
W=${FC_WORK:-/tmp/flux_work}
QUAL=${QUAL:-/tmp/mq_specs/bin/qual}
REP=${ZR_REPEAT:-3}
mkdir -p "$OUT"
LOG=$OUT/zlog.txt
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
cd "$ROOT"
export PYTHONPATH=$W/src MODELQUAL_CACHE=$W/cache MODELQUAL_CUDA_LIB=$W/libflux.so
[ -f "$W/libflux.so" ] || { say "FAIL no $W/libflux.so (run lab/flux/gpu_check.sh first)"; exit 1; }
PY=lab/cuda/zimage_diffusers.py
. lab/cuda/zimage_shape.sh
zimage_shape || exit 1
[ -f "$OUT/gemmrate.json" ] || timeout 30 python3 lab/flux/flux_diffusers.py gemmrate > "$OUT/gemmrate.json" 2>>"$LOG"
P="a red fox in the snow, detailed photograph"
N=$((REP + 1))
for c in ${ZR_CASES:-512:3.5 1024:3.5 1024:0}; do
  S=${c%%:*} G=${c#*:}
  tag=${S}-g$G
  timeout 200 python3 $PY run "$CK" "$OUT/z-$tag-diffusers.png" "$S" "$S" 8 "$G" 42 "$P" "$N" > "$OUT/z-$tag-diffusers.json" 2> "$W/zd-$tag.log" ||
    { tail -3 "$W/zd-$tag.log" | tee -a "$LOG"; say "FAIL diffusers $tag"; continue; }
  timeout 200 "$QUAL" generate-image --bundle "$W/zshape.mqb" --device cuda --prompt "$P" --size "${S}x$S" --steps 8 --guidance "$G" \
    --seed 42 --repeat "$N" --out "$OUT/z-$tag-ours.png" > "$OUT/z-$tag-ours.txt" 2>&1 || { tail -3 "$OUT/z-$tag-ours.txt" | tee -a "$LOG"; say "FAIL ours $tag"; continue; }
  python3 $PY compare "$OUT/z-$tag-ours.png" "$OUT/z-$tag-diffusers.png" | tee -a "$LOG"
  python3 - "$OUT/z-$tag-diffusers.json" "$OUT/z-$tag-ours.txt" "$S" "$G" "$OUT/gemmrate.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, re, sys
d = json.load(open(sys.argv[1]))["images_per_s"]
o = float(re.search(r"images_per_s ([0-9.]+)", open(sys.argv[2]).read()).group(1))
size, g = int(sys.argv[3]), float(sys.argv[4])
print("RATIO zimage %dx%d 8 steps guidance %g: images/s ours %.4f / diffusers %.4f = %.3f" % (size, size, g, o, d, o / d))
# Per step, each sequence: 30 layers of q|k|v|o (4 D^2) and the SwiGLU feed-forward (3 D F)
# products, 2 flops a multiply-add, plus attention (4 L^2 D); the refiners, embedders, text
# encoder and VAE left out, over the whole image's time: a lower bound of each step's rate.
D, F = 3840, 10240
L = (size // 16) ** 2 + 32
seqs = 2 if g > 1 else 1
f = seqs * 30 * (2 * (4 * D * D + 3 * D * F) * L + 4 * L * L * D)
try:
    rate = json.load(open(sys.argv[5]))["bf16_gemm_tflops"]
except Exception:
    rate = float("nan")
for who, ips in (("ours", o), ("diffusers", d)):
    t = f * 8 * ips / 1e12
    print("TFLOPS zimage %dx%d g%g %s: %.1f TFLOP/s per step (>= %.2f TFLOP a step), card bf16 GEMM %.0f TFLOP/s: %.0f%%"
          % (size, size, g, who, t, f / 1e12, rate, 100 * t / rate))
PY
done
say "total"
