#!/bin/bash
# lab/cuda/zimage_gpu.sh: the zimage family's CUDA pipeline in one device call (lab, not product).
#
# Runs from a copy of the branch (the `run` tool's .gpu/NAME) holding bin.tar.xz (qual, built on
# the CPU machine: go build -trimpath -ldflags='-s -w' ./qual/cmd/qual) and diffusers-src.tar.xz
# (`git archive 58eb52c0... src` of github.com/huggingface/diffusers, run from source, never
# copied into the project). Steps, each logged with its time to $OUT/log.txt:
#  1. build the core (native/cuda/backend.cu: the mqb_image_* entry points) and
#     native/models/zimage.cu alone with nvcc into libz.so (the product build, CMake of the whole
#     libmodelqual_cuda.so, runs in the background and is reported at the end);
#  2. zimage-tiny (qual fixtures --name zimage-tiny --bundle): our `qual generate-image --device
#     cuda` against diffusers' ZImagePipeline in bf16 on the same GPU, same controls, PSNR and
#     SSIM by scikit-image; also against the stored diffusers fp32 golden PNGs and our CPU fp32
#     pipeline (the intermediates' comparison needed the dumps the product no longer writes:
#     MQ_ZIMAGE_DUMP is gone with the rest of the lab's switches, so that step finds none);
#  3. Z-Image-Turbo's sizes (lab/cuda/zimage_shape_ckpt.py: random bf16 weights), bundled at bf16:
#     diffusers bf16 and ours at 512x512, 8 steps, guidance 3.5, one warmup then timed runs each,
#     images/s and the ratio.
#  4. with AB_BEFORE (a tarball of native/ at an older commit, e.g. `git archive cdb2629 native |
#     gzip > before-native.tgz` carried in the tree): that tree's core and zimage.cu are built
#     into libzbefore.so (in the background), and step 3's timed run is repeated with it and with
#     MQB_GRAPHS=0 on this tree's library: images/s before, after without graphs and after, as
#     ratios (lines "AB ...").
# Env: ZS_SHAPE=0 skips step 3; ZS_REPEAT timed runs + 1 (default 4); AB_BEFORE (step 4).
set -u
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$(cd "$HERE/../.." && pwd)  # the main tree (goldens) when HERE is .gpu/NAME
OUT=${OUT:-/tmp/zimage_out}
W=${ZS_WORK:-/tmp/zimage_work}
mkdir -p "$OUT" "$W"
LOG=$OUT/log.txt
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
cd "$HERE"
tar -xJf bin.tar.xz -C "$W" && tar -xJf diffusers-src.tar.xz -C "$W" || { say "FAIL unpack"; exit 1; }
QUAL=$W/qual
export PYTHONPATH=$W/src MODELQUAL_CACHE=$W/cache
PY=lab/cuda/zimage_diffusers.py
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
nvcc --version | tail -1 | tee -a "$LOG"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"

# 1. build
( cmake -S native/cuda -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build "$W/build" -j 16 ) > "$W/cmake.log" 2>&1 &
CMAKE=$!
# the tiny fixture first (its folder seeds the shape checkpoint, made on the GPU meanwhile);
# qual fixtures finds the tokenizer files in the main tree
( cd "$ROOT" && "$QUAL" fixtures --name zimage-tiny --bundle ) > "$W/tiny.json" 2>>"$LOG" || say "FAIL fixture zimage-tiny"
read -r TSNAP TBUN < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["bundle_path"])' "$W/tiny.json")
say "tiny: $TSNAP $TBUN"
if [ "${ZS_SHAPE:-1}" = 1 ]; then
  timeout 300 python3 lab/cuda/zimage_shape_ckpt.py "$TSNAP" "$W/shape" > "$W/shape_ckpt.json" 2> "$W/shape_ckpt.log" &
  SHAPE=$!
fi
tb=$(date +%s)
# the whole library: backend.cu registers every family, so a link of zimage.cu alone misses symbols
bash lab/cuda/build_lib.sh "$HERE" "$W/libz.so" > "$W/nvcc.log" 2>&1 ||
  { grep -E "error" -A2 "$W/nvcc.log" | head -40 | tee -a "$LOG"; say "FAIL build (lab/cuda/build_lib.sh)"; }
say "nvcc of the library: $(( $(date +%s) - tb )) s"
if [ -n "${AB_BEFORE:-}" ]; then
  ( rm -rf "$W/before" && mkdir -p "$W/before" && tar -xzf "$AB_BEFORE" -C "$W/before" &&
    bash lab/cuda/build_lib.sh "$W/before" "$W/libzbefore.so" ) > "$W/nvcc-before.log" 2>&1 &
  ABB=$!
fi
export MODELQUAL_CUDA_LIB=$W/libz.so


# 2. zimage-tiny parity
mkdir -p "$OUT/tiny" "$W/dump"
FOX=(--prompt "a red fox in the snow" --size 64x64 --steps 4 --guidance 3.5 --seed 42)
WIDE=(--prompt "a lighthouse at dusk, oil painting" --size 96x64 --steps 3 --guidance 0 --seed 7)
MQ_ZIMAGE_DUMP=$W/dump timeout 60 "$QUAL" generate-image --bundle "$TBUN" --device cuda "${FOX[@]}" --out "$OUT/tiny/ours-gpu-fox.png" 2>&1 | tee -a "$LOG"
timeout 60 "$QUAL" generate-image --bundle "$TBUN" --device cuda "${WIDE[@]}" --out "$OUT/tiny/ours-gpu-wide.png" 2>&1 | tee -a "$LOG"
timeout 60 "$QUAL" generate-image --bundle "$TBUN" --device cuda --repeat 3 "${FOX[@]}" --out "$W/fox-again.png" 2>&1 | tail -2 | tee -a "$LOG"
timeout 60 "$QUAL" generate-image --bundle "$TBUN" "${FOX[@]}" --out "$OUT/tiny/ours-cpu-fox.png" 2>&1 | tee -a "$LOG"
MODELQUAL_FAULTS=zimage.drop_cfg timeout 60 "$QUAL" generate-image --bundle "$TBUN" --device cuda "${FOX[@]}" --out "$OUT/tiny/ours-gpu-fox-dropcfg.png" 2>&1 | tee -a "$LOG"
G=$ROOT/fixtures/golden
mkdir -p "$OUT/golden"
timeout 150 python3 fixtures/golden/make_zimage_gpu_golden.py "$TSNAP" 58eb52c0803ea9af3abec60841c2a093bdf1f951 "$G/zimage-tiny.json" "$OUT/golden" \
  > "$OUT/golden/make.log" 2>&1 || { tail -5 "$OUT/golden/make.log" | tee -a "$LOG"; say "FAIL diffusers bf16 goldens"; }
for c in fox wide; do cp "$OUT/golden/zimage-tiny-cuda-bf16-$c.png" "$OUT/tiny/diffusers-bf16-$c.png" 2>/dev/null; done
{
  for c in fox wide; do
    python3 $PY compare "$OUT/tiny/ours-gpu-$c.png" "$OUT/tiny/diffusers-bf16-$c.png"
    python3 $PY compare "$OUT/tiny/ours-gpu-$c.png" "$G/zimage-tiny-$c.png"
    python3 $PY compare "$OUT/tiny/diffusers-bf16-$c.png" "$G/zimage-tiny-$c.png"
  done
  python3 $PY compare "$OUT/tiny/ours-gpu-fox.png" "$OUT/tiny/ours-cpu-fox.png"
  python3 $PY compare "$OUT/tiny/ours-gpu-fox-dropcfg.png" "$OUT/tiny/diffusers-bf16-fox.png"
} > "$OUT/tiny/compare.jsonl" 2>&1
cat "$OUT/tiny/compare.jsonl" | tee -a "$LOG"
python3 - "$G/zimage-tiny.json" "$W/dump" <<'PY' 2>&1 | tee -a "$LOG"
import base64, json, sys
import numpy as np
g = json.load(open(sys.argv[1]))
c = [c for c in g["cases"] if c["name"] == "fox"][0]
def arr(s): return np.frombuffer(base64.b64decode(s), "<f4")
ref = {"pe.f32": arr(c["prompt_embeds"]), "v0.f32": arr(c["first_call_out"][0]), "vae_out.f32": arr(c["vae_out"])}
for k, r in ref.items():
    try:
        m = np.fromfile(sys.argv[2] + "/" + k, "<f4")
    except Exception as e:
        print("dump", k, "missing", e); continue
    if k == "vae_out.f32":  # golden NCHW [1,3,H,W], ours HWC
        m = m.reshape(-1, 3).T.reshape(-1)
    if m.size != r.size:
        print("dump", k, "size", m.size, "golden", r.size); continue
    print("dump %s: max|d| %.4g  rel-l2 %.4g  golden max|x| %.4g" % (k, np.abs(m - r).max(), np.linalg.norm(m - r) / np.linalg.norm(r), np.abs(r).max()))
PY
say "tiny parity done"

# 3. Z-Image-Turbo sizes
if [ "${ZS_SHAPE:-1}" = 1 ]; then
  wait $SHAPE; say "shape checkpoint: rc $? $(cat "$W/shape_ckpt.json" 2>/dev/null)"; tail -3 "$W/shape_ckpt.log" >> "$LOG"
  tb=$(date +%s)
  timeout 200 "$QUAL" bundle build --checkpoint "$W/shape" --model modelqual-lab/zimage-turbo-sizes-random --revision 0000000000000000000000000000000000000001 \
    --out "$W/shape.mqb" --precision bf16 --backend cuda > "$W/shape_bundle.log" 2>&1 || { tail -5 "$W/shape_bundle.log" | tee -a "$LOG"; say "FAIL shape bundle"; }
  say "shape bundle: $(( $(date +%s) - tb )) s, $(du -h "$W/shape.mqb" 2>/dev/null | cut -f1)"
  P="a red fox in the snow, detailed photograph"
  N=${ZS_REPEAT:-4}
  timeout 240 python3 $PY run "$W/shape" "$OUT/shape-diffusers.png" 512 512 8 3.5 42 "$P" "$N" > "$OUT/shape-diffusers.json" 2> "$W/d-shape.log" || { tail -5 "$W/d-shape.log" | tee -a "$LOG"; say "FAIL diffusers shape"; }
  cat "$OUT/shape-diffusers.json" | tee -a "$LOG"
  tb=$(date +%s)
  MQ_ZIMAGE_TIMING=1 timeout 240 "$QUAL" generate-image --bundle "$W/shape.mqb" --device cuda --prompt "$P" --size 512x512 --steps 8 --guidance 3.5 --seed 42 \
    --repeat "$N" --out "$OUT/shape-ours.png" > "$OUT/shape-ours.txt" 2>&1
  say "ours shape rc $? in $(( $(date +%s) - tb )) s (load included)"; cat "$OUT/shape-ours.txt" | tee -a "$LOG"
  python3 $PY compare "$OUT/shape-ours.png" "$OUT/shape-diffusers.png" 2>&1 | tee -a "$LOG"
  python3 - "$OUT/shape-diffusers.json" "$OUT/shape-ours.txt" <<'PY' 2>&1 | tee -a "$LOG"
import json, re, sys
d = json.load(open(sys.argv[1]))["images_per_s"]
o = float(re.search(r"images_per_s ([0-9.]+)", open(sys.argv[2]).read()).group(1))
print("RATIO images/s ours %.4f / diffusers %.4f = %.3f" % (o, d, o / d))
PY
  if [ -n "${AB_BEFORE:-}" ]; then
    wait $ABB; say "nvcc of the older tree: rc $?"
    ab() {  # ab LABEL ENV...: images/s of the shape run under ENV
      local l=$1
      shift
      env "$@" timeout 240 "$QUAL" generate-image --bundle "$W/shape.mqb" --device cuda --prompt "$P" --size 512x512 --steps 8 --guidance 3.5 \
        --seed 42 --repeat "$N" --out "$OUT/shape-$l.png" > "$OUT/shape-$l.txt" 2>&1
      sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p' "$OUT/shape-$l.txt" | tail -1
    }
    IB=$(ab before MODELQUAL_CUDA_LIB=$W/libzbefore.so)
    IE=$(ab eager MQB_GRAPHS=0)
    IA=$(sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p' "$OUT/shape-ours.txt" | tail -1)
    python3 -c 'import sys; b, e, a = (float(x or "nan") for x in sys.argv[1:4]); print("AB zimage 512x512 8 steps: images/s before %.4f, after without graphs %.4f (%.3fx), after %.4f (%.3fx)" % (b, e, e / b, a, a / b))' \
      "$IB" "$IE" "$IA" 2>&1 | tee -a "$LOG"
    cmp -s "$OUT/shape-ours.png" "$OUT/shape-eager.png" && say "AB graphs and eager: the same bytes" || say "AB graphs and eager differ"
  fi
fi
wait $CMAKE; say "product CMake build of libmodelqual_cuda.so: rc $?"; grep -E "error" "$W/cmake.log" | head -10 | tee -a "$LOG"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$LOG"
# one archive for the per-image files (the run tool returns a limited number of files)
( cd "$OUT" && tar -czf results.tgz golden tiny && rm -rf golden tiny )
say "total"
