#!/bin/bash
# swa_check.sh: Mistral's sliding window on the CUDA backend against transformers (issue 49 item
# 1), one device call from the repository root: builds libmodelqual_cuda.so from this tree
# (lab/cuda/build_lib.sh: nvcc -O3 -arch=sm_90 of backend.cu, blas_pick.cc and the families'
# native/models/*.cu), then lab/cuda/swa_check.py (tiny MistralForCausalLM models of
# lab/cuda/swa/, fp32 and bf16, greedy tokens and logits against transformers on the same GPU), and
# the windowed KV cache (swa_check.py's ring_check: the device memory an open saves with a ring of
# window + 63 rows a slot, and 1,500-position logits and 300 greedy steps through the ring).
# Nothing to carry (the hyper-parameters the Go resolve makes are committed in lab/cuda/swa/).
# Writes $OUT/swa.tgz: swa.json, swa.log, build.log, nvidia-smi.txt. Exit 0: every config passed.
set -u
OUT=${OUT:-${1:-/tmp/swa_out}}; R=$PWD; W=$(mktemp -d)
mkdir -p "$OUT/swa"; export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi > "$OUT/swa/nvidia-smi.txt" 2>&1
t0=$(date +%s)
if bash lab/cuda/build_lib.sh "$R" "$W/lib.so" > "$OUT/swa/build.log" 2>&1; then
  echo "build $(( $(date +%s) - t0 )) s" | tee -a "$OUT/swa/build.log"
  python3 lab/cuda/swa_check.py --lib "$W/lib.so" --out "$OUT/swa/swa.json" 2>&1 | tee "$OUT/swa/swa.log"
  rc=${PIPESTATUS[0]}
else
  echo "build failed: $OUT/swa/build.log"; tail -30 "$OUT/swa/build.log"; rc=2
fi
echo "total $(( $(date +%s) - t0 )) s, rc $rc" | tee -a "$OUT/swa/swa.log"
tar -czf "$OUT/swa.tgz" -C "$OUT" swa && rm -rf "$OUT/swa"
exit $rc
