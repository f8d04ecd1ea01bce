#!/bin/bash
# ncu_kernels.sh: single decode-step kernels of the Qwen3-0.6B shape in isolation under Nsight
# Compute (GPU machine, after the library is built): duration, DRAM and L2 bytes, occupancy and
# the top warp stall reasons, one line per kernel instance. Usage:
#   NCU_KERNELS='attention_kernel|qkv_post' NCU_COUNT=8 DECODE_B=32 bash native/cuda/probe/ncu_kernels.sh [label]
# DECODE_* switches as mqb_bench.py decode takes them (DECODE_TILE_MAX_B=32 ...). Writes
# $OUT/ncu_<label>.csv.
set -o pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/ncu_out}
mkdir -p "$OUT"
label=${1:-default}
lib=native/cuda/build/libmodelqual_cuda.so
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
stalls="long_scoreboard barrier membar short_scoreboard wait mio_throttle lg_throttle math_pipe_throttle no_instruction dispatch_stall branch_resolving sleeping drain imc_miss tex_throttle selected not_selected"
for r in $stalls; do metrics="$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
csv="$OUT/ncu_$label.csv"
DECODE_STEPS=${DECODE_STEPS:-3} timeout ${NCU_TIMEOUT:-120} ncu --clock-control none -k "regex:${NCU_KERNELS:-attention_kernel}" \
  --launch-skip ${NCU_SKIP:-60} --launch-count ${NCU_COUNT:-4} --metrics "$metrics" --csv --page raw --print-units base \
  python3 native/cuda/mqb_bench.py decode --lib $lib --out /dev/null > "$csv" 2> "$OUT/ncu_$label.err" || tail -3 "$OUT/ncu_$label.err"
python3 - "$csv" "$label" $stalls <<'EOF'
import csv, sys
path, label, stalls = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [l for l in open(path) if l.startswith('"')]
if len(rows) < 3:
    sys.exit("NCU %s: no rows (%s)" % (label, path))
rd = list(csv.DictReader(rows))
for r in rd[1:]:  # rd[0] is the units row
    def f(k):
        try: return float(r.get(k, "nan").replace(",", ""))
        except ValueError: return float("nan")
    st = sorted(((f("smsp__average_warps_issue_stalled_%s_per_issue_active.ratio" % s), s) for s in stalls), reverse=True)[:4]
    print("NCU %s %-28s %7.2f us grid %5d x %4d regs %3d smem-limit %s occ %5.1f%% dram %6.2f MB r %5.2f w, L2 %6.2f MB, inst %8.0f; stalls/issue %s"
          % (label, r["Kernel Name"].split("(")[0].split("<")[0][-28:], f("gpu__time_duration.sum") / 1e3,
             f("launch__grid_size"), f("launch__block_size"), f("launch__registers_per_thread"),
             r.get("launch__occupancy_limit_shared_mem"), f("sm__warps_active.avg.pct_of_peak_sustained_active"),
             f("dram__bytes_read.sum") / 1e6, f("dram__bytes_write.sum") / 1e6, f("lts__t_bytes.sum") / 1e6,
             f("smsp__inst_executed.sum"), ", ".join("%s %.2f" % (s, v) for v, s in st)))
EOF
