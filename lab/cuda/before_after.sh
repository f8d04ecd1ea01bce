#!/bin/bash
# before_after.sh: one device-tool call that builds the CUDA backend twice -- BEFORE from a source
# tree given as $BEFORE (native/cuda, native/include and native/models of an older commit, e.g.
#   git archive 32b7216 native/cuda native/include native/models | tar -x -C .before   # then carry .before)
# and AFTER from this checkout (the product build; LAB_DEBUG=1 compiles lab/cuda/debug_abi.cu in)
# -- then runs before_after.py (alternating rounds, medians, ratio) and mqb_bench.py parity on
# both. Results in $OUT: ab.json, ab.log, parity_{after,before}.{json,log}.
set -o pipefail
OUT=${OUT:-/tmp/mq_ab}
BEFORE=${BEFORE:-.before}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
build() { bash lab/cuda/build_lib.sh "$@"; }  # every TU in parallel, then linked
t0=$(date +%s)
if [ -n "$REUSE_BUILDS" ] && [ -f /tmp/before.so ] && [ -f /tmp/after.so ]; then s1=0; s2=0; echo "reusing /tmp/{before,after}.so"; else
build "$BEFORE" /tmp/before.so > "$OUT/build_before.log" 2>&1 &
b1=$!
build . /tmp/after.so ${LAB_DEBUG:+lab/cuda/debug_abi.cu} > "$OUT/build_after.log" 2>&1
s2=$?
wait $b1; s1=$?
fi
echo "builds: before rc $s1, after rc $s2, $(( $(date +%s) - t0 )) s"
[ $s1 -eq 0 ] && [ $s2 -eq 0 ] || { tail -20 "$OUT"/build_*.log; exit 1; }
export PYTHONUNBUFFERED=1
cd lab/cuda
timeout ${AB_TIMEOUT:-240} python3 before_after.py --before /tmp/before.so --after /tmp/after.so \
  --rounds ${AB_ROUNDS:-5} --families ${AB_FAMILIES:-qwen3,gpt2} --out "$OUT/ab.json" 2>&1 | grep -v warn | tee "$OUT/ab.log" | grep -E "^\||rror"
for which in after before; do  # parity against transformers, after first (the one that matters)
  timeout ${PARITY_TIMEOUT:-150} python3 mqb_bench.py parity --lib /tmp/$which.so --out "$OUT/parity_$which.json" 2>&1 \
    | grep -v warn > "$OUT/parity_$which.log"
  echo "== parity $which"; grep -E "PARITY|SUMMARY|FAIL|rror" "$OUT/parity_$which.log" | head -30
done
echo "total $(( $(date +%s) - t0 )) s"
