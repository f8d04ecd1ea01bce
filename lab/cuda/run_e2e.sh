#!/bin/bash
# run_e2e.sh: ONE device-tool call that proves the Go stack end to end on the GPU, through the
# same binaries CI builds: libmodelqual_cuda.so (built here with CMake), `qual fixtures`,
# `qual bundle build --backend cuda --precision bf16`, `qual generate --device cuda` compared
# with the transformers golden (fixtures/golden/qwen3-tiny.json), then `qual profile --gpus 0`
# which starts `qual-server --device cuda` through the process launcher and sweeps concurrency
# 1,8,32 with streaming while go-nvml samples the GPU.
#
# The GPU machine has no Go: build the binaries on the CPU machine and carry them:
#   mkdir -p bin/e2e && go build -trimpath -ldflags='-s -w' -o bin/e2e/ ./qual/cmd/qual ./server/cmd/qual-server
#   (optional: go test -c -trimpath -ldflags='-s -w' -o bin/e2e/X.test for ./families/qwen,
#    ./families/gpt2 and ./native, whose tests then run here too)
#   tar -C bin/e2e -cJf bin/e2e.tgz qual qual-server [*.test]   # then run with carry ["bin/e2e.tgz"]
#   bash lab/cuda/run_e2e.sh
# CPU rehearsal on any machine (no nvcc, no GPU; same steps with --device cpu and fp32):
#   E2E_DEVICE=cpu OUT=/tmp/e2e bash lab/cuda/run_e2e.sh
# Environment: OUT (results; at most a handful of small files), E2E_DEADLINE (seconds from the
# start after which optional steps are skipped; default 200), E2E_BIG=0 skips the
# Qwen3-0.6B-shaped run, E2E_BIG_CONC its concurrencies (default 1,8,32), E2E_BIG_REQUESTS its
# requests at each (default 48: at c32 that is mostly the first burst), E2E_OUT_STDDEV the
# profiles' output-length spread (default none: every request asks for 64 tokens, so a closed
# loop's requests end, and arrive again, in waves), E2E_TINY_PROFILE=0
# the tiny model's profile, E2E_SPECS the families whose gpu specs run (default "qwen gpt2"),
# E2E_LIB a libmodelqual_cuda.so built already (no build here).
set -o pipefail
OUT=${OUT:-/tmp/mq_e2e}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
ROOT=$PWD
DEV=${E2E_DEVICE:-cuda}
DEADLINE=${E2E_DEADLINE:-200}
T0=$(date +%s)
W=/tmp/mq_e2e_work
rm -rf "$W"; mkdir -p "$W/bin"
LOG="$OUT/e2e.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(elapsed) )); }

# --- binaries -----------------------------------------------------------------------------
if [ -f bin/e2e.tgz ]; then
  tar -C "$W/bin" -xf bin/e2e.tgz || { say "FAIL unpack bin/e2e.tgz"; exit 1; }
elif [ -x bin/qual ] && [ -x bin/qual-server ]; then
  cp bin/qual bin/qual-server "$W/bin/"
else
  say "FAIL no binaries: carry bin/e2e.tgz (see the header of this script)"; exit 1
fi
export MODELQUAL_BIN="$W/bin"
QUAL="$W/bin/qual"

# --- environment and the CUDA library -------------------------------------------------------
if [ "$DEV" = cuda ]; then
  PREC=bf16
  { date -u; nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee -a "$LOG"
  tb=$(date +%s)
  if [ -n "$E2E_LIB" ]; then  # a library built earlier in this call (issue48_gpu.sh's CMake build)
    mkdir -p native/cuda/build && cp "$E2E_LIB" native/cuda/build/libmodelqual_cuda.so
  elif ! { cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
         cmake --build native/cuda/build -j 16; } > "$W/build.log" 2>&1; then
    say "cmake build failed; trying nvcc directly"; grep -E "error" -A3 "$W/build.log" | head -30 | tee -a "$LOG"
    mkdir -p native/cuda/build
    nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -Inative/include -Inative/cuda native/cuda/backend.cu \
      native/cuda/blas_pick.cc native/models/*.cu -o native/cuda/build/libmodelqual_cuda.so -lcublas -lcublasLt -lcuda -lpthread >> "$W/build.log" 2>&1 ||
      { grep -E "error" -A3 "$W/build.log" | tail -30 | tee -a "$LOG"; say "FAIL build libmodelqual_cuda.so"; exit 1; }
  fi
  export MODELQUAL_CUDA_LIB="$ROOT/native/cuda/build/libmodelqual_cuda.so"
  say "lib built in $(( $(date +%s) - tb )) s: $MODELQUAL_CUDA_LIB"
  GPUS_FLAG=(--gpus 0)
else
  PREC=fp32
  GPUS_FLAG=()
fi

# --- fixture and bundle ---------------------------------------------------------------------
CACHE="$W/cache"
# bundle NAME PREC -> prints the bundle path; the fixture's snapshot goes to $W/NAME.snap
bundle() {
  local name=$1 prec=$2
  "$QUAL" fixtures --cache "$CACHE" --name "$name" > "$W/$name.fixture.json" 2>>"$LOG" || return 1
  local snap model rev
  read -r snap model rev < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[0]; print(d["snapshot_dir"], d["model"], d["revision"])' "$W/$name.fixture.json") || return 1
  echo "$snap" > "$W/$name.snap"
  "$QUAL" bundle build --checkpoint "$snap" --model "$model" --revision "$rev" --out "$W/$name.mqb" \
    --precision "$prec" --backend "$DEV" --max-batch 32 >> "$W/bundle.log" 2>&1 || { tail -5 "$W/bundle.log" >> "$LOG"; return 1; }
  echo "$W/$name.mqb"
}
tf=$(date +%s)
TINY=$(bundle qwen3-tiny $PREC) || { say "FAIL fixture/bundle qwen3-tiny"; exit 1; }
say "fixture + $DEV/$PREC bundle qwen3-tiny in $(( $(date +%s) - tf )) s"

# --- qual generate --device vs the transformers golden ----------------------------------------
# Golden logits are raw; generate --json prints log-softmax, so the comparison is of logits
# relative to the step's top-1 (softmax is shift-invariant): top5 ids and those differences.
python3 - "$QUAL" "$TINY" "$DEV" fixtures/golden/qwen3-tiny.json "$OUT/generate_parity.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, subprocess, sys
qual, bundle, dev, golden, out = sys.argv[1:]
g = json.load(open(golden))
res = []
for p in g["prompts"][:4]:
    n = len(p["greedy_ids"])
    cmd = [qual, "generate", "--bundle", bundle, "--device", dev, "--json", "--ignore-eos",
           "--max-tokens", str(n), "--prompt-ids", ",".join(map(str, p["prompt_ids"]))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        res.append({"name": p["name"], "error": r.stderr[-800:]}); continue
    d = json.loads(r.stdout)
    ids = d["ids"]
    agree = 0
    for a, b in zip(ids, p["greedy_ids"]):
        if a != b: break
        agree += 1
    maxdiff = 0.0
    for k in range(min(agree + 1, n)):
        mine = {t["id"]: t["logprob"] for t in d["top_logprobs"][k]}
        gs = p["steps"][k]
        g0 = gs["top5_logits"][0]; m0 = max(mine.values())
        for gid, gl in zip(gs["top5_ids"], gs["top5_logits"]):
            if gid in mine:
                maxdiff = max(maxdiff, abs((mine[gid] - m0) - (gl - g0)))
    res.append({"name": p["name"], "prompt_tokens": len(p["prompt_ids"]), "greedy_prefix_agree": agree,
                "steps": n, "max_rel_logit_diff": round(maxdiff, 6)})
json.dump(res, open(out, "w"), indent=1)
for r in res:
    print("generate", dev, json.dumps(r))
EOF

# --- native engine tests on the device: go test -c -o bin/e2e/native.test ./native ------------------
# The sampling tests run their cuda subtests where MODELQUAL_CUDA_LIB loads (NATIVE_RUN picks
# others). Every native*.test in the carried binaries runs, so a second one built with a planted
# defect shows that a test fails.
for nt in "$W"/bin/native*.test; do
  [ -x "$nt" ] || continue
  [ "$DEV" = cuda ] || break
  ( cd native && MODELQUAL_CACHE="$W/cache" timeout 120 "$nt" -test.run "${NATIVE_RUN:-TestSeededSampling|TestSamplingDistribution}" -test.v ) > "$W/$(basename "$nt").log" 2>&1
  say "$(basename "$nt"): rc $?"
  grep -E "^(=== RUN|--- |\s+--- |PASS|FAIL|ok)|native_test.go" "$W/$(basename "$nt").log" | head -20 | tee -a "$LOG"
done

# --- the families' gpu specs: `ginkgo --label-filter=gpu` as compiled test binaries -------------
# (go test -c -o bin/e2e/FAMILY.test ./families/FAMILY on the CPU machine; the suite uses the
# prebuilt qual and qual-server in MODELQUAL_BIN because this machine has no Go.)
for fam in ${E2E_SPECS:-qwen gpt2}; do
  [ -x "$W/bin/$fam.test" ] || { say "skipped the $fam gpu specs: no $fam.test in the carried binaries"; continue; }
  [ "$(left)" -gt 60 ] || { say "skipped the $fam gpu specs: $(left) s left of E2E_DEADLINE"; continue; }
  ts=$(date +%s)
  ( cd "families/$fam" && MODELQUAL_ARTIFACTS="$W/specs" timeout $(( $(left) - 20 )) "$W/bin/$fam.test" \
      -ginkgo.label-filter=gpu -ginkgo.no-color -ginkgo.junit-report="$W/junit-gpu-$fam.xml" -test.timeout 600s ) \
      > "$W/specs-$fam.log" 2>&1
  rc=$?
  say "gpu specs $fam: rc $rc in $(( $(date +%s) - ts )) s"
  grep -E "^Ran [0-9]+ of|^(PASS|FAIL)|SUCCESS!|FAIL!|\[FAIL\]|skip" "$W/specs-$fam.log" | tail -12 | tee -a "$LOG"
done

# --- qual profile through qual-server (launched by the harness on the GPU) ---------------------
# profile NAME BUNDLE CONC REQUESTS OUTTOK -> summary lines in the log, reports in $W/prof-NAME
profile() {
  local name=$1 b=$2 conc=$3 nreq=$4 otok=$5 snap
  snap=$(cat "$W/$name.snap")
  timeout $(( $(left) > 45 ? $(left) : 45 )) "$QUAL" profile --bundle "$b" "${GPUS_FLAG[@]}" --model "$name" --tokenizer "$snap" \
    --stream --concurrency "$conc" --requests "$nreq" --warmup 4 --input-tokens-mean 128 --output-tokens "$otok" ${E2E_OUT_STDDEV:+--output-tokens-stddev "$E2E_OUT_STDDEV"} \
    --server-arg=--workers=1 --startup-timeout 120s --source-root none --no-progress \
    --out "$W/prof-$name" --name "$name" > "$W/profile-$name.log" 2>&1
  local rc=$?
  tail -4 "$W/profile-$name.log" | tee -a "$LOG"
  python3 - "$W/prof-$name" "$name" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys
def pick(m, *names):
    for n in names:
        if n in m: return m[n]
    return None
for f in sorted(glob.glob(os.path.join(sys.argv[1], "**", "summary.json"), recursive=True)):
    s = json.load(open(f))
    ms = (s.get("profiling") or {}).get("metrics") or {}
    def q(tag, k):
        m = ms.get(tag) or {}
        v = m.get(k)
        return "-" if v is None else ("%.2f" % v)
    tel = s.get("gpu_telemetry") or {}
    if isinstance(tel, dict) and "devices" not in tel and len(tel) == 1:
        tel = list(tel.values())[0]
    devs = tel.get("devices") or [{}]
    d = devs[0]
    osl = ms.get("output_sequence_length") or {}
    otoks = (osl.get("avg") or 0) * (osl.get("count") or 0)
    # joules_per_output_token is filled only when the harness calls Telemetry.PerToken; derive it.
    jpt = tel.get("joules_per_output_token") or (round(tel.get("energy_j", 0) / otoks, 4) if otoks and tel.get("energy_j") else None)
    es = s.get("engine_steps") or {}
    steps = "  steps: " + ", ".join("%s %d x %.2f ms (%.0f tok)" % (k, v["steps"], 1e3 * v["seconds"] / v["steps"], v["tokens"] / v["steps"])
                                    for k, v in sorted(es.items()) if v.get("steps")) if es else ""
    print("PROFILE %s %s: ttft p50/p99 %s/%s ms  itl p50/p99 %s/%s ms  out tok/s %s  req/s %s  gpu: available=%s mem_hw=%.0f MiB util avg/max=%s/%s%% power avg/max=%s/%s W energy=%s J J/out-token=%s%s" % (
        sys.argv[2], os.path.basename(os.path.dirname(f)),
        q("time_to_first_token", "p50"), q("time_to_first_token", "p99"),
        q("inter_token_latency", "p50"), q("inter_token_latency", "p99"),
        q("output_token_throughput", "avg"), q("request_throughput", "avg"),
        tel.get("available"), (d.get("memory_high_water_bytes") or 0) / 2**20,
        d.get("gpu_utilization_avg_pct"), d.get("gpu_utilization_max_pct"), d.get("power_avg_w"), d.get("power_max_w"),
        tel.get("energy_j"), jpt, steps))
EOF
  return $rc
}
[ "${E2E_TINY_PROFILE:-1}" = 1 ] && { profile qwen3-tiny "$TINY" 1,8,32 64 64 || say "FAIL profile qwen3-tiny (rc $?); see the log tail above"; }

# --- optional: the Qwen3-0.6B-shaped bf16 fixture for realistic TTFT/ITL ----------------------
if [ "$DEV" = cuda ] && [ "${E2E_BIG:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  tb=$(date +%s)
  if BIG=$(bundle qwen3-0.6b-shape-bf16 bf16); then
    say "fixture + bundle qwen3-0.6b-shape-bf16 in $(( $(date +%s) - tb )) s"
    [ "$(left)" -gt 30 ] && { profile qwen3-0.6b-shape-bf16 "$BIG" "${E2E_BIG_CONC:-1,8,32}" "${E2E_BIG_REQUESTS:-48}" 64 || say "FAIL profile qwen3-0.6b-shape-bf16"; }
  else
    say "FAIL fixture/bundle qwen3-0.6b-shape-bf16"
  fi
else
  say "skipped the qwen3-0.6b-shape-bf16 run (device $DEV, $(left) s left of E2E_DEADLINE)"
fi

# --- what comes back: the log, parity JSON, and the reports (summaries only) ------------------
( cd "$W" && find . \( -path './prof-*' -o -path './specs/*' \) \( -name summary.json -o -name summary.md \) -print0 -o -name 'junit-gpu-*.xml' -print0 -o -name 'specs-*.log' -print0 | tar --null -czf "$OUT/reports.tgz" -T - ) 2>/dev/null
{ for f in "$W"/profile-*.log "$W/bundle.log"; do [ -f "$f" ] && { echo "== $f"; tail -15 "$f"; }; done
  [ -f "$W/build.log" ] && { echo "== build.log"; grep -iE "error|warning: .*spill" "$W/build.log" | head -10; }
  find "$W" -name 'server.stderr.log' -exec sh -c 'echo "== $1"; tail -15 "$1"' _ {} \; ; } > "$OUT/logs_tail.txt" 2>&1
say "total $(elapsed) s"
