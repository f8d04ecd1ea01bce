#!/bin/bash
# lab/flux/emu_chain.sh OUT LIB CASE...: the emulated `qual generate-image --device cuda` images of
# the named cases (dev-fox, dev-fox-eager, dev-fox-unfused, dev-fox-swap, truecfg, truecfg-eager,
# schnell, zimage, zimage-eager) with the emulated library LIB, one after another, into OUT (a
# line per case in OUT/chain.txt). The pieces of run_emu.sh, for a machine too loaded to run it
# whole (2026-12-07: load average 400-870 on 2 cores, 18-31 min per emulated flux image); the
# bundles and qual are those a run_emu.sh run into /tmp/epi_before left (QUAL_DIR to change).

OUT=$1; LIB=$2; shift 2
mkdir -p $OUT
D=${QUAL_DIR:-/tmp/epi_before}
Q=$D/qual
export MODELQUAL_CACHE=$D/cache
B=$D/cache/bundles
DEV=$B/flux-tiny-dev-e49d45d44db2-v2.mqb; ZT=$B/zimage-tiny-3c69c6436b82-v2.mqb; SCH=$B/flux-tiny-schnell-026be93bdc77-v2.mqb
FOX=(--prompt "a red fox in the snow" --size 64x64 --steps 4 --seed 42)
WIDE=(--prompt "a lighthouse at dusk, oil painting" --size 96x64 --steps 3 --seed 43)
run() { local name=$1 env=$2 b=$3; shift 3; local t=$(date +%s)
  env $env MODELQUAL_CUDA_LIB=$LIB timeout 3000 nice $Q generate-image --bundle "$b" --device cuda "$@" --out $OUT/$name.png > $OUT/$name.log 2>&1
  local rc=$?
  echo "$(date +%T) $name rc $rc $(( $(date +%s) - t ))s" >> $OUT/chain.txt; }
for c in "$@"; do
  case $c in
    dev-fox) run dev-fox "X=1" $DEV "${FOX[@]}" --guidance 3.5 ;;
    dev-fox-eager) run dev-fox-eager "MQB_GRAPHS=0" $DEV "${FOX[@]}" --guidance 3.5 ;;
    dev-fox-unfused) run dev-fox-unfused "EMU_LT_EPILOGUE=0" $DEV "${FOX[@]}" --guidance 3.5 ;;
    dev-fox-swap) run dev-fox-swap "MODELQUAL_FAULTS=flux.swap_text_image_ids" $DEV "${FOX[@]}" --guidance 3.5 ;;
    truecfg) run dev-truecfg "X=1" $DEV "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry, dark" --true-cfg 2 ;;
    truecfg-eager) run dev-truecfg-eager "MQB_GRAPHS=0" $DEV "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry, dark" --true-cfg 2 ;;
    schnell) run schnell-wide "X=1" $SCH "${WIDE[@]}" --guidance 0 ;;
    zimage) run zimage-fox "X=1" $ZT "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry" ;;
    zimage-eager) run zimage-fox-eager "MQB_GRAPHS=0" $ZT "${FOX[@]}" --guidance 3.5 --negative-prompt "blurry" ;;
  esac
done
echo "$(date +%T) done" >> $OUT/chain.txt
