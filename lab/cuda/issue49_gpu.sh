#!/bin/bash
# issue49_gpu.sh OUT: the GPU checks issue 49 still owes, in one device call (not yet run).
#   1. libmodelqual_cuda.so built from this tree (build_lib.sh; nvcc, all families);
#   2. qwen3moe on CUDA: lab/qwen3moe/gpu_check.py (bf16 parity with transformers, batched greedy,
#      routing counts; decode bench on Qwen3-30B-A3B's layer shapes, BENCH_LAYERS layers);
#   3. llama on CUDA after the shared-loader refactor: fixtures/golden/llama_cuda_parity.py parity
#      (against fixtures/golden/llama-*.json) and bench (TinyLlama-1.1B / Llama-3.2-1B shapes
#      against transformers);
#   4. llama-tiny's natural-EOS prompts (search_eos_prompts.py on the GPU) and their CPU golden.
# Needs: a qual binary built here (QUAL, to write the fixtures; the GPU host has no Go) and the
# llama snapshots with their hyper-parameters in SNAPS (<name>/<rev>/ and <name>.hparams.json from
# `go run ./lab/cuda/hparams llama <config.json>`); LIB, if set, is a libmodelqual_cuda.so already
# built from this tree (the build step is skipped). Runs from the repository root.
set -u
OUT=${1:?usage: issue49_gpu.sh OUT}; R=$PWD; W=$(mktemp -d)
QUAL=${QUAL:?QUAL: a qual binary}; SNAPS=${SNAPS:?SNAPS: llama snapshots and hparams}
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -n "${LIB:-}" ]; then cp "$LIB" "$W/lib.so"; else
  bash lab/cuda/build_lib.sh "$R" "$W/lib.so" > "$OUT/build.log" 2>&1 || { echo "build failed: $OUT/build.log"; exit 1; }
fi
"$QUAL" fixtures --cache "$W/qc" --name qwen3moe-tiny > "$W/fx.json"
snap=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[0]['snapshot_dir'])" "$W/fx.json")
(cd lab/qwen3moe && BENCH_LAYERS=${BENCH_LAYERS:-2} python3 gpu_check.py --lib "$W/lib.so" --snapshot "$snap" \
  --golden "$R/fixtures/golden/qwen3moe-tiny.json" --out "$OUT/qwen3moe_gpu.json" > "$OUT/qwen3moe_gpu.log" 2>&1)
for what in parity bench; do
  (cd lab/cuda && PYTHONPATH="$R/lab/cuda" python3 "$R/fixtures/golden/llama_cuda_parity.py" --lib "$W/lib.so" \
    --snapshots "$SNAPS" --goldens "$R/fixtures/golden" --out "$OUT/llama_$what.json" --what $what > "$OUT/llama_$what.log" 2>&1)
done
LS=$(ls -d "$SNAPS"/llama-tiny/*/)
python3 fixtures/golden/search_eos_prompts.py --snapshot "$LS" --prefix The --plain "The quick brown fox" \
  --out "$OUT/eos_corpus.jsonl" > "$OUT/eos.log" 2>&1 &&
  python3 fixtures/golden/make_golden.py --snapshot "$LS" --fixture llama-tiny --corpus "$OUT/eos_corpus.jsonl" \
    --steps 8 --out "$OUT/llama-tiny-eos.json" >> "$OUT/eos.log" 2>&1
echo "results in $OUT"
