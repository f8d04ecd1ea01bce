#!/bin/bash
# gpu_check.sh: ONE device-tool call (issue 50 items 3 and 7 on the GPU) for both vision
# families on --device cuda, with one and with two images a request:
#   1. builds libmodelqual_cuda.so from this tree (lab/cuda/build_lib.sh) in the background (or
#      takes $VL_LIB, one built earlier in the call);
#   2. makes qwen3vl-tiny and internvl-tiny and their cuda bf16 bundles with the carried `qual`;
#   3. transformers bf16 on the same GPU (hf_multi.py): each family's first three corpus images
#      and every two-image request of its corpus-pairs.jsonl: prompt ids, 16 greedy tokens, top-5;
#   4. the engine on cuda against those (vlcheck -golden: greedy tokens matched, first-step top-5
#      max|diff|, the done event's vision_ns);
#   5. qual-server --device cuda --records --max-images-per-request 2 per family, one chat request
#      with one image and one with two, and prints each record's vision_ns beside its preprocess,
#      task TTFT and TTFT (the TTFT split the records carry).
#
# The GPU machine has no Go: build on the CPU machine and carry bin/vlcuda.tgz:
#   mkdir -p bin/vlcuda && go build -trimpath -ldflags='-s -w' -o bin/vlcuda/ ./qual/cmd/qual \
#     ./server/cmd/qual-server ./lab/qwen3vl/vlcheck && tar -C bin/vlcuda -cJf bin/vlcuda.tgz qual qual-server vlcheck
# then from the repository root (carry bin/vlcuda.tgz): OUT=$OUT bash lab/qwen3vl/gpu_check.sh
# Outputs in $OUT: gpu_check.log (everything below), *.hf.json, *.records.jsonl, build.log on failure.
set -o pipefail
OUT=${OUT:-/tmp/vl_gpu}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
W=/tmp/vl_gpu_work
rm -rf "$W"; mkdir -p "$W/bin"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
el() { echo $(( $(date +%s) - T0 )); }
tar -C "$W/bin" -xf bin/vlcuda.tgz || { say "FAIL unpack bin/vlcuda.tgz"; exit 1; }
export MODELQUAL_BIN="$W/bin" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee -a "$LOG"

# VL_LIB: a libmodelqual_cuda.so built earlier from this tree (no build here)
LIB="${VL_LIB:-$W/libmodelqual_cuda.so}"
BUILD=
if [ -z "${VL_LIB:-}" ]; then
  bash lab/cuda/build_lib.sh "$ROOT" "$LIB" > "$W/build.log" 2>&1 &
  BUILD=$!
fi

# bundle NAME: the fixture's snapshot in $W/NAME.snap, its cuda bf16 bundle at $W/NAME.mqb
bundle() {
  local name=$1 snap model rev
  "$W/bin/qual" fixtures --cache "$W/cache" --name "$name" > "$W/$name.fixture.json" 2>>"$LOG" || return 1
  read -r snap model rev < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["model"], d["revision"])' "$W/$name.fixture.json") || return 1
  echo "$snap" > "$W/$name.snap"
  "$W/bin/qual" bundle build --checkpoint "$snap" --model "$model" --revision "$rev" --out "$W/$name.mqb" \
    --precision bf16 --backend cuda --max-batch 2 >> "$W/bundle.log" 2>&1 || { tail -5 "$W/bundle.log" | tee -a "$LOG"; return 1; }
}
FAM=(qwen3vl internvl)
for f in "${FAM[@]}"; do
  bundle "$f-tiny" || { say "FAIL fixture/bundle $f-tiny"; exit 1; }
  python3 lab/qwen3vl/hf_multi.py --snapshot "$(cat "$W/$f-tiny.snap")" --family "$f" --root . --out "$OUT/$f.hf.json" \
    2> "$W/$f.hf.log" || { tail -8 "$W/$f.hf.log" | tee -a "$LOG"; say "FAIL transformers $f"; }
  tail -n +1 "$W/$f.hf.log" | grep -v Warning | tail -8 | sed "s/^/[hf $f] /" | tee -a "$LOG"
  say "$f: bundle and transformers at $(el) s"
done

if [ -n "$BUILD" ] && ! wait $BUILD; then
  cp "$W/build.log" "$OUT/build.log"
  grep -E "error" -A3 "$W/build.log" | head -40 | tee -a "$LOG"; say "FAIL build libmodelqual_cuda.so"; exit 1
fi
export MODELQUAL_CUDA_LIB="$LIB"
say "lib built at $(el) s"

fails=0
for f in "${FAM[@]}"; do
  [ -f "$OUT/$f.hf.json" ] || { fails=$((fails + 1)); continue; }
  "$W/bin/vlcheck" -golden "$OUT/$f.hf.json" -cuda "$W/$f-tiny.mqb" -root . -gate-steps 12 -tol 0.05 2>&1 | tee -a "$LOG" ||
    fails=$((fails + 1))
  say "$f: vlcheck at $(el) s"
done

# qual-server on cuda: one request with one image, one with two; the records' vision_ns
for f in "${FAM[@]}"; do
  port=$((18400 + RANDOM % 1000))
  rec="$OUT/$f.records.jsonl"
  "$W/bin/qual-server" --bundle "$W/$f-tiny.mqb" --model-name m --port $port --device cuda --records "$rec" \
    --max-images-per-request 2 > "$W/$f.server.log" 2>&1 &
  SRV=$!
  python3 - "$port" "$f" <<'EOF' 2>&1 | tee -a "$LOG"
import base64, json, sys, time, urllib.request
port, fam = sys.argv[1], sys.argv[2]
imgs = {"qwen3vl": ["fixtures/images/qwen3vl/02-scene-300x200.png", "fixtures/images/qwen3vl/04-gray-96x130.png"],
        "internvl": ["fixtures/images/internvl/01-square-448x448.png", "fixtures/images/internvl/03-wide-1350x450.png"]}[fam]
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
        break
    except Exception:
        time.sleep(0.5)
def part(p):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(open(p, "rb").read()).decode()}}
for n in (1, 1, 2, 2):  # each twice: the first pays first-use costs
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": [part(p) for p in imgs[:n]] + [{"type": "text", "text": "Describe."}]}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=120))
        print(f"[server {fam}] {n} image(s): {r['usage']}")
    except Exception as e:
        print(f"[server {fam}] {n} image(s): FAIL {e} {getattr(e, 'read', lambda: b'')()[:300]}")
EOF
  kill $SRV; wait $SRV 2>/dev/null
  python3 - "$rec" "$f" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    v = r.get("vision") or {}
    n = len(r.get("vision_images") or []) or (1 if v else 0)
    ms = lambda k: (r.get(k) or 0) / 1e6
    print(f"[records {sys.argv[2]}] status {r.get('status')} images {n} input_tokens {r.get('input_tokens')}: "
          f"vision_ns {r.get('vision_ns')} ({ms('vision_ns'):.3f} ms), preprocess {ms('preprocess_ns'):.3f} ms, "
          f"task_ttft {ms('task_ttft_ns'):.3f} ms, ttft {ms('ttft_ns'):.3f} ms")
EOF
  grep -c '"vision_ns"' "$rec" | sed "s/^/[records $f] records with vision_ns: /" | tee -a "$LOG"
done
say "done at $(el) s: $fails failure(s)"
exit $((fails > 0))
