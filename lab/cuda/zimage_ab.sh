#!/bin/bash
# lab/cuda/zimage_ab.sh: Z-Image-Turbo's images/s with two builds of the CUDA backend, in one
# device call (lab, not product): BEFORE, a tarball of native/ at an older commit (`git archive
# REV native | gzip`), and AFTER, this checkout. Both libraries are built side by side
# (lab/cuda/build_lib.sh), the checkpoint of Z-Image-Turbo's sizes and its bf16 bundle are made by
# lab/cuda/zimage_shape.sh (or reused from an earlier call on the machine), then
# `qual generate-image --repeat` runs alternately on each library, $ZA_ROUNDS rounds (default 3) of
# one warm-up and $ZA_REPEAT timed images (default 2), seed 42, 8 steps, at each "SIZE:GUIDANCE"
# of $ZA_CASES (default "1024:3.5"). Prints each round's images/s, the medians and their ratio
# (lines "AB ..."), and whether the two libraries' images are the same bytes (else their PSNR).
# Env: BEFORE (required), QUAL (default /tmp/mq_specs/bin/qual), FC_WORK (default
# /tmp/flux_work), OUT; DIFFUSERS_TGZ or .cache/src/diffusers-src.tar.gz (for the checkpoint).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/zimage_ab}
W=${FC_WORK:-/tmp/flux_work}
QUAL=${QUAL:-/tmp/mq_specs/bin/qual}
mkdir -p "$OUT" "$W"
LOG=$OUT/ablog.txt
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
cd "$ROOT"
[ -f "${BEFORE:-}" ] || { say "FAIL BEFORE must name a tarball of native/"; exit 1; }
TGZ=${DIFFUSERS_TGZ:-.cache/src/diffusers-src.tar.gz}
[ -d "$W/src/diffusers" ] || tar -xf "$TGZ" -C "$W" || { say "FAIL no diffusers source"; exit 1; }
export PYTHONPATH=$W/src MODELQUAL_CACHE=$W/cache
rm -rf "$W/ab_before" && mkdir -p "$W/ab_before" && tar -xzf "$BEFORE" -C "$W/ab_before"
bash lab/cuda/build_lib.sh "$W/ab_before" "$W/ab_before.so" > "$W/ab_before.log" 2>&1 &
B1=$!
bash lab/cuda/build_lib.sh "$ROOT" "$W/ab_after.so" > "$W/ab_after.log" 2>&1 &
B2=$!
. lab/cuda/zimage_shape.sh
zimage_shape || exit 1
wait $B1 && wait $B2 || { tail -5 "$W"/ab_*.log | tee -a "$LOG"; say "FAIL build"; exit 1; }
say "libraries built, checkpoint and bundle ready"
P="a red fox in the snow, detailed photograph"
for c in ${ZA_CASES:-1024:3.5}; do
  S=${c%%:*} G=${c#*:}
  for round in $(seq 1 "${ZA_ROUNDS:-3}"); do
    for which in before after; do
      MODELQUAL_CUDA_LIB=$W/ab_$which.so timeout 200 "$QUAL" generate-image --bundle "$W/zshape.mqb" --device cuda --prompt "$P" \
        --size "${S}x$S" --steps 8 --guidance "$G" --seed 42 --repeat $((${ZA_REPEAT:-2} + 1)) --out "$OUT/z-$S-$which.png" \
        > "$OUT/z-$S-$which-$round.txt" 2>&1 || { tail -3 "$OUT/z-$S-$which-$round.txt" | tee -a "$LOG"; say "FAIL $which $S"; }
      say "$S g$G round $round $which: $(grep -o 'images_per_s [0-9.]*' "$OUT/z-$S-$which-$round.txt")"
    done
  done
  python3 - "$OUT" "$S" "$G" <<'PY' 2>&1 | tee -a "$LOG"
import glob, re, statistics, sys
out, size, g = sys.argv[1], sys.argv[2], sys.argv[3]
med = {}
for which in ("before", "after"):
    v = [float(m.group(1)) for f in sorted(glob.glob("%s/z-%s-%s-*.txt" % (out, size, which)))
         for m in [re.search(r"images_per_s ([0-9.]+)", open(f).read())] if m]
    med[which] = statistics.median(v) if v else float("nan")
print("AB zimage %sx%s g%s: images/s median before %.4f, after %.4f: %.3fx"
      % (size, size, g, med["before"], med["after"], med["after"] / med["before"]))
PY
  if cmp -s "$OUT/z-$S-before.png" "$OUT/z-$S-after.png"; then say "AB $S: the same bytes"
  else python3 lab/cuda/zimage_diffusers.py compare "$OUT/z-$S-after.png" "$OUT/z-$S-before.png" | tee -a "$LOG"; fi
done
say total
