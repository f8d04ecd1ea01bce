#!/bin/bash
# issue48_gpu.sh: the GPU proof of issue 48 (CUDA laid out as the CPU side: a core that names no
# family, ops under native/cuda/ops, each family's GPU model in native/models/<f>.cu): behaviour
# and speed unchanged against BEFORE (the tree of commit 32b7216, carried as .before:
#   git archive 32b7216 native/cuda native/include native/models | tar -x -C .before), and the
# families' gpu specs pass. Two device calls, PHASE=a then PHASE=b (each within 10 minutes); each
# builds BEFORE with build_lib.sh and AFTER with CMake (its glob of native/models/*.cu; with the
# carried qual, a family scaffolded by `qual new-family demo` first, which must register on the
# CUDA side), unless a warm machine still has both:
#   a: before_after.py (qwen3, gpt2: decode tok/s at batch 1 and 32, same greedy tokens,
#      alternating rounds in one process, medians), then mqb_bench.py parity of both libraries
#      against transformers (needs no Go binaries).
#   b: the scaffolded family's registration, abdrive (qwen3vl image requests at batch 1 and 32,
#      zimage images/s; same tokens and bytes; alternating rounds in one process, medians), the
#      parity again (B_PARITY=0: not), then run_e2e.sh's gpu specs of gpt2, qwen, qwen3vl and
#      zimage on AFTER.
# Carry .before and, for b, bin/e2e.tgz (built here: qual, qual-server, abdrive and the four
# families' test binaries; see run_e2e.sh). Results in $OUT (a.log / b.log and the JSON).
set -o pipefail
OUT=${OUT:-/tmp/mq_48}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PHASE=${PHASE:-a}
W=/tmp/mq48
mkdir -p "$W/bin"
LOG="$OUT/$PHASE.log"
: > "$LOG"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
if [ -f bin/e2e.tgz ]; then tar -C "$W/bin" -xf bin/e2e.tgz || { say "FAIL unpack bin/e2e.tgz"; exit 1; }; fi
QUAL="$W/bin/qual"
export MODELQUAL_BIN="$W/bin" PYTHONUNBUFFERED=1 MODELQUAL_CACHE="$W/cache"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee -a "$LOG"

# bundle NAME: a cuda bf16 bundle of the fixture NAME at $W/NAME.mqb, its snapshot's path in $W/NAME.snap
bundle() {
  local name=$1 snap model rev
  [ -d "$W/$name.mqb" ] && return 0
  "$QUAL" fixtures --cache "$W/cache" --name "$name" > "$W/$name.fixture.json" 2>> "$W/fixtures.log" || return 1
  read -r snap model rev < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["model"], d["revision"])' "$W/$name.fixture.json") || return 1
  echo "$snap" > "$W/$name.snap"
  "$QUAL" bundle build --checkpoint "$snap" --model "$model" --revision "$rev" --out "$W/$name.mqb" \
    --precision bf16 --backend cuda --max-batch 32 >> "$W/bundle.log" 2>&1
}

# libs builds /tmp/before.so and /tmp/after.so unless both are there (a warm machine).
libs() {
  if [ -f /tmp/before.so ] && [ -f /tmp/after.so ]; then say "reusing /tmp/before.so and /tmp/after.so"; return 0; fi
  local tb brc arc bpid
  tb=$(date +%s)
  bash lab/cuda/build_lib.sh .before /tmp/before.so > "$OUT/build_before.log" 2>&1 &
  bpid=$!
  # AFTER through CMake, as make cuda builds it, with a scaffolded family beside the real ones.
  if [ -x "$QUAL" ]; then "$QUAL" new-family demo --architecture DemoForCausalLM >> "$LOG" 2>&1 || say "FAIL qual new-family demo"; fi
  rm -rf native/cuda/build
  { cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build native/cuda/build -j 16; } > "$OUT/build_after.log" 2>&1
  arc=$?
  cp native/cuda/build/libmodelqual_cuda.so /tmp/after.so 2> /dev/null
  say "cmake compiled: $(grep -o "models/[a-z0-9]*\.cu" "$OUT/build_after.log" | sort -u | tr '\n' ' ')"
  rm -rf families/demo native/models/demo.cc native/models/demo.cu
  wait $bpid
  brc=$?
  say "builds: before rc $brc, after (cmake) rc $arc, $(( $(date +%s) - tb )) s"
  if [ $brc -ne 0 ] || [ $arc -ne 0 ]; then
    grep -E "error" -A3 "$OUT"/build_*.log | head -40 | tee -a "$LOG"
    return 1
  fi
  grep -hE "[1-9][0-9]* bytes spill" "$OUT"/build_*.log | sort | uniq -c | head -5 | tee -a "$LOG"
  return 0
}

# parity: mqb_bench.py parity of both libraries against transformers (qwen3, gpt2 tiny models).
parity() {
  local which
  for which in after before; do
    ( cd lab/cuda && timeout "${PARITY_TIMEOUT:-150}" python3 mqb_bench.py parity --lib /tmp/$which.so \
        --out "$OUT/parity_$which.json" ) 2>&1 | grep -v -i warn > "$W/parity_$which.log"
    say "parity $which: rc $?"
    grep -E "PARITY|SUMMARY|FAIL|rror" "$W/parity_$which.log" | head -20 | tee -a "$LOG"
    cp "$W/parity_$which.log" "$OUT/" 2> /dev/null
  done
}

if [ "$PHASE" = a ]; then
  libs || { say "FAIL build"; exit 1; }
  say "before_after.py (qwen3, gpt2)"
  ( cd lab/cuda && timeout 300 python3 before_after.py --before /tmp/before.so --after /tmp/after.so \
      --rounds "${AB_ROUNDS:-5}" --families qwen3,gpt2 --out "$OUT/ab_text.json" ) 2>&1 | grep -v -i warn > "$W/ab_text.log"
  grep -E "^\||rror|Trace" "$W/ab_text.log" | tee -a "$LOG"
  cp "$W/ab_text.log" "$OUT/" 2> /dev/null
  parity
fi

if [ "$PHASE" = b ]; then
  ( bundle qwen3vl-tiny; bundle zimage-tiny ) > "$W/bundles.out" 2>&1 &
  BUNDLES=$!
  libs || { say "FAIL build"; exit 1; }
  # The scaffolded family registered on the CUDA side: listed, and opening it reaches its own
  # load hook's refusal.
  python3 lab/cuda/registry_check.py /tmp/after.so demo 2>&1 | tee -a "$LOG"
  wait $BUNDLES
  cat "$W/bundles.out" >> "$LOG"
  say "abdrive (qwen3vl, zimage)"
  timeout 180 "$W/bin/abdrive" -before /tmp/before.so -after /tmp/after.so -vl-bundle "$W/qwen3vl-tiny.mqb" \
    -vl-snapshot "$(cat "$W/qwen3vl-tiny.snap")" -z-bundle "$W/zimage-tiny.mqb" -rounds "${AB_ROUNDS:-5}" \
    -out "$OUT/ab_vl_zimage.json" 2>&1 | tee -a "$LOG"
  [ "${B_PARITY:-1}" = 1 ] && parity
  left=$(( ${B_BUDGET:-560} - ($(date +%s) - T0) ))
  say "gpu specs (run_e2e.sh), $left s left"
  OUT="$W/e2e" E2E_LIB=/tmp/after.so E2E_SPECS="${SPECS:-gpt2 qwen qwen3vl zimage}" E2E_BIG=0 E2E_TINY_PROFILE=0 \
    E2E_DEADLINE=$left bash lab/cuda/run_e2e.sh > "$W/e2e.out" 2>&1
  grep -E "gpu specs|Ran [0-9]+ of|SUCCESS|FAIL|generate|rc " "$W/e2e/e2e.log" | tee -a "$LOG"
  cp "$W/e2e/e2e.log" "$OUT/e2e.log" 2> /dev/null
fi
say "phase $PHASE done"
