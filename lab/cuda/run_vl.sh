#!/bin/bash
# run_vl.sh: ONE device-tool call for the qwen3vl family on the GPU (issue 38 item 8): builds
# libmodelqual_cuda.so with CMake, makes the qwen3vl-tiny fixture and its cuda bf16 bundle with
# the carried `qual` (`qual bundle build --backend cuda --precision bf16`), runs transformers'
# Qwen3-VL in bf16 on the same GPU over the 10-image corpus (lab/cuda/qwen3vl_hf.py: greedy tokens,
# top-5 logits, TTFT and output tokens/s) and then the native engine on --device cuda over the
# same images (lab/cuda/vlbench: the parity table and the ratios). With time left
# (VL_DEADLINE, seconds from the start, default 330) it does the same for qwen3vl-2b-shape.
#
# The GPU machine has no Go: build on the CPU machine and carry bin/vl.tgz:
#   mkdir -p bin/vl && go build -trimpath -ldflags='-s -w' -o bin/vl/ ./qual/cmd/qual ./lab/cuda/vlbench
#   tar -C bin/vl -cJf bin/vl.tgz qual vlbench
set -o pipefail
OUT=${OUT:-/tmp/mq_vl}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
ROOT=$PWD
DEADLINE=${VL_DEADLINE:-330}
T0=$(date +%s)
W=/tmp/mq_vl_work
rm -rf "$W"; mkdir -p "$W/bin"
LOG="$OUT/vl.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
el() { echo $(( $(date +%s) - T0 )); }
tar -C "$W/bin" -xf bin/vl.tgz || { say "FAIL unpack bin/vl.tgz"; exit 1; }
QUAL="$W/bin/qual"
export MODELQUAL_BIN="$W/bin" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee -a "$LOG"

( cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
  cmake --build native/cuda/build -j 16 ) > "$W/build.log" 2>&1 &
BUILD=$!

CACHE="$W/cache"
# bundle NAME -> fixture snapshot in $W/NAME.snap, cuda bf16 bundle at $W/NAME.mqb
bundle() {
  local name=$1 snap model rev
  "$QUAL" fixtures --cache "$CACHE" --name "$name" > "$W/$name.fixture.json" 2>>"$LOG" || return 1
  read -r snap model rev < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["model"], d["revision"])' "$W/$name.fixture.json") || return 1
  echo "$snap" > "$W/$name.snap"
  "$QUAL" bundle build --checkpoint "$snap" --model "$model" --revision "$rev" --out "$W/$name.mqb" \
    --precision bf16 --backend cuda --max-batch 4 >> "$W/bundle.log" 2>&1 || { tail -5 "$W/bundle.log" | tee -a "$LOG"; return 1; }
}
bundle qwen3vl-tiny || { say "FAIL fixture/bundle qwen3vl-tiny"; exit 1; }
say "qwen3vl-tiny fixture + cuda bf16 bundle at $(el) s"
( bundle qwen3vl-2b-shape && echo ok > "$W/2b.ok" ) > "$W/2b.log" 2>&1 &
B2=$!

if ! wait $BUILD; then
  grep -E "error" -A3 "$W/build.log" | head -40 | tee -a "$LOG"; say "FAIL build libmodelqual_cuda.so"; exit 1
fi
export MODELQUAL_CUDA_LIB="$ROOT/native/cuda/build/libmodelqual_cuda.so"
say "lib built at $(el) s"

# one FIXTURE: transformers bf16, then the engine on cuda, same GPU, one after the other
pair() {
  local name=$1 snap
  snap=$(cat "$W/$name.snap")
  python3 lab/cuda/qwen3vl_hf.py --snapshot "$snap" --fixture "$name" --corpus families/qwen3vl/corpus.jsonl \
    --out "$OUT/$name.hf_bf16.json" 2>&1 | tail -12 | tee -a "$LOG" || { say "FAIL transformers $name"; return 1; }
  say "transformers $name done at $(el) s"
  "$W/bin/vlbench" -bundle "$W/$name.mqb" -snapshot "$snap" -golden "$OUT/$name.hf_bf16.json" -root . -device cuda \
    -out "$OUT/$name.vlbench.json" 2>&1 | tee -a "$LOG" || { say "FAIL vlbench $name"; return 1; }
  say "vlbench $name done at $(el) s"
}
pair qwen3vl-tiny
# a planted defect must fail the table: DeepStack dropped on the device
MODELQUAL_FAULTS=qwen3vl.drop_deepstack "$W/bin/vlbench" -bundle "$W/qwen3vl-tiny.mqb" -snapshot "$(cat $W/qwen3vl-tiny.snap)" \
  -golden "$OUT/qwen3vl-tiny.hf_bf16.json" -root . -device cuda -reps 1 2>&1 | head -14 | sed 's/^/[fault drop_deepstack] /' | tee -a "$LOG"
if [ "$(el)" -lt "$DEADLINE" ]; then
  wait $B2
  if [ -f "$W/2b.ok" ]; then say "qwen3vl-2b-shape bundle at $(el) s"; pair qwen3vl-2b-shape
  else tail -5 "$W/2b.log" | tee -a "$LOG"; say "qwen3vl-2b-shape fixture/bundle failed"; fi
else
  say "skipped qwen3vl-2b-shape: $(el) s past VL_DEADLINE $DEADLINE"
fi
say "total $(el) s"
