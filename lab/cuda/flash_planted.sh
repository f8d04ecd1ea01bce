#!/bin/sh
# lab/cuda/flash_planted.sh: shows that emu_test's flash_products (EMU_ONLY=flash:bf16) catches
# defects planted in native/cuda/ops/flash_attn.cuh. For each defect: a copy of native/ in a
# temporary folder, the defect applied by sed (the script stops if the line is not found), the
# emulation test run there; it must FAIL. Defects:
#   rescale  the running-max correction of the accumulators and the sum dropped (corr = 1)
#   causal   the causal mask one key late (key > row + 1)
#   tail     the keys past Lk left unmasked
# CPU only (no GPU): about a minute a defect on 2 cores.
set -u
cd "$(dirname "$0")/../.."
fails=0
plant() {  # name, sed expression, the line it must change
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/flash_planted.XXXXXX")
  cp -r native "$tmp/"
  f="$tmp/native/cuda/ops/flash_attn.cuh"
  sed -i "$2" "$f"
  if cmp -s native/cuda/ops/flash_attn.cuh "$f"; then
    echo "planted $1: the sed expression matched nothing"; fails=$((fails + 1)); rm -rf "$tmp"; return
  fi
  if EMU_ONLY=flash:bf16 sh "$tmp/native/cuda/host_test/run.sh" > "$tmp/log" 2>&1; then
    echo "planted $1: NOT caught"; fails=$((fails + 1))
  else
    echo "planted $1: caught:"; grep FAIL "$tmp/log" | sed 's/^/  /'
  fi
  rm -rf "$tmp"
}
plant rescale 's/const float corr = exp2f(fmaf(mrow\[mt\]\[r\], sl2, -ms));/const float corr = 1.f;/'
plant causal 's/(causal \&\& key > row)/(causal \&\& key > row + 1)/'
plant tail 's/if (key >= Lk || (causal/if ((causal/'
[ $fails = 0 ] && echo "flash_planted: every defect caught" || { echo "flash_planted: $fails defect(s) not caught"; exit 1; }
