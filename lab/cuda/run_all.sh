#!/bin/bash
# run_all.sh: everything one device-tool call does for the CUDA backend, in priority order and
# within one command's 10 minutes: build + parity + engine benchmark (run_device.sh all), then
# the families' gpu specs and the served profile (run_e2e.sh). Results: $OUT/all.tgz and
# $OUT/summary.txt (the lines worth reading). Carry bin/e2e.tgz (see run_e2e.sh's header).
set -o pipefail
OUT=${OUT:-/tmp/mq_all}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/d" "$OUT/e"
T0=$(date +%s)
OUT="$OUT/d" PY_DEADLINE=${DEVICE_DEADLINE:-330} bash lab/cuda/run_device.sh ${DEVICE_WHAT:-all} 2>&1 | tee "$OUT/d/console.txt" | grep -E "BENCH|SAMPLING|PROFILE|SUMMARY|PARITY|decode max|graph==eager|FAIL|rror|total|build ok|spill" | head -80
left=$(( ${ALL_DEADLINE:-560} - ($(date +%s) - T0) ))
echo "== e2e with $left s left"
if [ "$left" -gt 60 ]; then
  OUT="$OUT/e" E2E_DEADLINE=$left bash lab/cuda/run_e2e.sh 2>&1 | tail -40
fi
( cd "$OUT" && tar -czf all.tgz d e ) && rm -rf "$OUT/d" "$OUT/e"
echo "all done in $(( $(date +%s) - T0 )) s"
