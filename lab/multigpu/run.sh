#!/bin/bash
# run.sh OUT: the proof of issue 53 on a machine with G >= 2 GPUs (nvidia-h100-x2 or -x4), from
# the repository root, with bin/multigpu.tgz carried (lab/multigpu/build.sh builds it; the GPU
# machine has no Go). Everything it keeps goes to OUT ($1; default $OUT, else /tmp/mq_multigpu).
#
#   A  ginkgo -procs=G --label-filter=gpu over the families' precompiled suites: one
#      qual-server --device cuda per Ginkgo process, each on its own GPU (nvidia-smi samples the
#      compute apps every second: compute_apps_A.csv; one_server_per_card.txt counts the
#      qual-server engine processes (a server's worker holds its CUDA context; the manifests ask
#      for one worker) per card and flags any card with two at once);
#   B  the same with -procs=1 (the wall time to compare);
#   C  qual qualify --parallel G --suite-bin: G families side by side, each on its own GPU set,
#      and the campaign's per-card table (qualify.txt).
# Then cards.txt: every process's "gpu cards" report entry of A (energy, memory high-water per
# card), and times.txt: the wall times of A, B and C.
#
# Environment: MG_FAMILIES (default "gpt2 qwen qwen3vl zimage": those whose GPU path has run),
# MG_PROCS (default: the GPU count), MG_PARALLEL (C's --parallel, default the GPU count),
# MG_PHASES (default "A B C"), MG_ROOT (the repository root, default two folders up), MG_CUDA_LIB (a
# libmodelqual_cuda.so built already; none: no library, for a rehearsal on a machine without a
# GPU; else CMake builds it here, about a minute), MG_TGZ (the binaries, default bin/multigpu.tgz),
# MG_TIMEOUT (seconds per phase, default 540).
#
# On one GPU it still runs: MG_FAMILIES="gpt2 qwen" MG_PROCS=2 MG_PARALLEL=2 MG_PHASES="A C"
# shows the shortage (process 2 holds no GPU and its gpu specs skip, saying why;
# MODELQUAL_GPU_SHORTAGE=fail turns that into a failure), qualify running one family at a time,
# and the per-card records of a real card (about 80 s with MG_CUDA_LIB given).
set -o pipefail
OUT=${1:-${OUT:-/tmp/mq_multigpu}}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
TGZ=${MG_TGZ:-bin/multigpu.tgz}
[[ $TGZ = /* ]] || TGZ=$PWD/$TGZ
cd "${MG_ROOT:-$(dirname "$0")/../..}" || exit 1
ROOT=$PWD
[ -d families ] && [ -f go.mod ] || { echo "FAIL $ROOT is not the repository root: run from lab/multigpu of a checkout or set MG_ROOT" >&2; exit 1; }
W=/tmp/mq_multigpu_work
mkdir -p "$W/bin"
LOG="$OUT/run.log"
: > "$LOG"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
FAMS=${MG_FAMILIES:-gpt2 qwen qwen3vl zimage}
TMO=${MG_TIMEOUT:-540}

[ -f "$TGZ" ] || TGZ=$ROOT/bin/multigpu.tgz
[ -f "$TGZ" ] || { say "FAIL no bin/multigpu.tgz: run lab/multigpu/build.sh on a machine with Go and carry it"; exit 1; }
tar -C "$W/bin" -xf "$TGZ" || { say "FAIL unpack $TGZ"; exit 1; }
export MODELQUAL_BIN="$W/bin" MODELQUAL_CACHE="$W/cache" MODELQUAL_NO_SOURCE_FINGERPRINT=1
nvidia-smi -L > "$OUT/nvidia-smi-L.txt" 2>&1
G=$(grep -c '^GPU ' "$OUT/nvidia-smi-L.txt")
PROCS=${MG_PROCS:-$(( G > 0 ? G : 1 ))}
PAR=${MG_PARALLEL:-$(( G > 0 ? G : 1 ))}
{ date -u; cat "$OUT/nvidia-smi-L.txt"; nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,mig.mode.current --format=csv,noheader; } 2>&1 | tee -a "$LOG"
say "$G GPU(s); Ginkgo processes for A: $PROCS; families: $FAMS"

# --- the CUDA library --------------------------------------------------------------------------
if [ "$MG_CUDA_LIB" = none ]; then
  say "no CUDA library (MG_CUDA_LIB=none: a rehearsal without a GPU)"
elif [ -n "$MG_CUDA_LIB" ]; then
  export MODELQUAL_CUDA_LIB="$MG_CUDA_LIB"
elif [ -f native/cuda/build/libmodelqual_cuda.so ]; then
  export MODELQUAL_CUDA_LIB="$ROOT/native/cuda/build/libmodelqual_cuda.so"
else
  tb=$(date +%s)
  { cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build native/cuda/build -j 16; } > "$OUT/build_cuda.log" 2>&1 || { say "FAIL build libmodelqual_cuda.so (build_cuda.log)"; exit 1; }
  export MODELQUAL_CUDA_LIB="$ROOT/native/cuda/build/libmodelqual_cuda.so"
  say "libmodelqual_cuda.so built in $(( $(date +%s) - tb )) s"
fi

# The Ginkgo CLI runs a precompiled suite in its own folder: put each beside its specs.
SUITES=()
for fam in $FAMS; do
  [ -x "$W/bin/$fam.test" ] || { say "no $fam.test in bin/multigpu.tgz: $fam left out"; continue; }
  cp "$W/bin/$fam.test" "families/$fam/$fam.test"
  SUITES+=("families/$fam/$fam.test")
done

# monitor PHASE: nvidia-smi's compute apps (pid, GPU UUID, memory) every second, until stopped.
monitor() {
  nvidia-smi --query-compute-apps=timestamp,pid,gpu_uuid,process_name,used_memory --format=csv,noheader -l 1 > "$OUT/compute_apps_$1.csv" 2>&1 &
  MON=$!
}

# ginkgo_run PHASE PROCS: the gpu specs of every suite with PROCS processes per suite.
ginkgo_run() {
  local phase=$1 procs=$2 ts rc
  mkdir -p "$OUT/$phase"
  monitor "$phase"
  ts=$(date +%s%N)
  MODELQUAL_ARTIFACTS="$W/specs-$phase" timeout "$TMO" "$W/bin/ginkgo" --procs="$procs" --label-filter=gpu --keep-going \
    --no-color --timeout=$(( TMO - 20 ))s --output-dir="$OUT/$phase" --json-report=report.json --junit-report=junit.xml \
    "${SUITES[@]}" > "$OUT/$phase/ginkgo.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || FAILED=1
  kill "$MON" 2> /dev/null
  echo "$phase procs=$procs rc=$rc wall_ms=$(( ($(date +%s%N) - ts) / 1000000 ))" | tee -a "$OUT/times.txt" | tee -a "$LOG"
  grep -E "^Ran [0-9]+ of|SUCCESS!|FAIL!|\[FAIL\]|GPU placement" "$OUT/$phase/ginkgo.log" | tail -30 | tee -a "$LOG"
}

: > "$OUT/times.txt"
FAILED=0
for phase in ${MG_PHASES:-A B C}; do
  case $phase in
    A) ginkgo_run A "$PROCS" ;;
    B) ginkgo_run B 1 ;;
    C)
      monitor C
      ts=$(date +%s%N)
      names=$(echo $FAMS | tr ' ' ',')
      MODELQUAL_GPU=1 timeout "$TMO" "$W/bin/qual" qualify --parallel "$PAR" --suite-bin "$W/bin" --family "$names" \
        --label-filter=gpu --timeout $(( TMO - 30 ))s --out "$OUT/C" > "$OUT/C.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || FAILED=1
      kill "$MON" 2> /dev/null
      echo "C parallel=$PAR rc=$rc wall_ms=$(( ($(date +%s%N) - ts) / 1000000 ))" | tee -a "$OUT/times.txt" | tee -a "$LOG"
      sed -n '/^GPU placement:/,$p' "$OUT/C/qualify.txt" 2> /dev/null | tee -a "$LOG"
      ;;
  esac
done

# --- one server per card, and each process's cards -----------------------------------------------
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import csv, glob, json, os, sys
out = sys.argv[1]
lines = []
for f in sorted(glob.glob(os.path.join(out, "compute_apps_*.csv"))):
    per_tick = {}  # (timestamp, gpu) -> server pids
    servers = {}   # gpu -> every server pid seen
    for row in csv.reader(open(f)):
        if len(row) < 4 or "qual-server" not in row[3]:
            continue
        ts, pid, gpu = row[0].strip(), row[1].strip(), row[2].strip()
        per_tick.setdefault((ts, gpu), set()).add(pid)
        servers.setdefault(gpu, set()).add(pid)
    crowded = sorted({g for (t, g), p in per_tick.items() if len(p) > 1})
    lines.append(f"{os.path.basename(f)}: servers per card {({g: len(p) for g, p in servers.items()})}; "
                 + ("cards with two servers at once: " + ", ".join(crowded) if crowded else "never two servers on one card at once"))
open(os.path.join(out, "one_server_per_card.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
rows = []
for rep in sorted(glob.glob(os.path.join(out, "*", "report.json"))):
    for suite in json.load(open(rep)):
        for sr in suite.get("SpecReports") or []:
            for e in sr.get("ReportEntries") or []:
                if e.get("Name") == "gpu cards":
                    for u in json.loads(e["Value"]["AsJSON"]):
                        rows.append(f'{os.path.basename(os.path.dirname(rep))} {u.get("family")} p{u.get("process")} GPU {u.get("index")} {u.get("uuid")}: '
                                    f'{u.get("window_s", 0):.1f} s, {u.get("energy_j", 0):.1f} J ({u.get("energy_source", "")}), '
                                    f'memory high-water {u.get("memory_high_water_bytes", 0) / 2**20:.0f} MiB {u.get("reason", "")}')
open(os.path.join(out, "cards.txt"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
rm -f "${SUITES[@]}"
say "done (a phase failed: $FAILED); results in $OUT"
exit $FAILED
