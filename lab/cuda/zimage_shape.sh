# lab/cuda/zimage_shape.sh, sourced by zimage_ratio.sh and zimage_ab.sh (lab, not product):
# zimage_shape makes the checkpoint of Z-Image-Turbo's sizes with random bf16 weights from the
# zimage-tiny fixture's folder (lab/cuda/zimage_shape_ckpt.py, on the GPU; into /dev/shm when it
# has room) and its bf16 bundle $W/zshape.mqb (`qual bundle build --backend cuda`), each only if an
# earlier call on this machine did not. Uses QUAL, W, OUT, LOG and say(); sets TSNAP, TBUN (the
# fixture's snapshot and bundle) and CK (the checkpoint's folder). Returns 1 on failure.
zimage_shape() {
  read -r TSNAP TBUN < <("$QUAL" fixtures --name zimage-tiny --bundle 2>>"$LOG" |
    python3 -c 'import json,sys; d=json.load(sys.stdin)[0]; print(d["snapshot_dir"], d["bundle_path"])')
  CK=$W/zshape
  local shm tb
  shm=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
  [ "${shm:-0}" -ge 30 ] && CK=/dev/shm/zimage_shape
  if [ ! -f "$CK/done" ]; then
    timeout 240 python3 lab/cuda/zimage_shape_ckpt.py "$TSNAP" "$CK" > "$OUT/zshape_ckpt.json" 2> "$W/zshape_ckpt.log" ||
      { tail -5 "$W/zshape_ckpt.log" | tee -a "$LOG"; say "FAIL shape checkpoint"; return 1; }
    touch "$CK/done"
    say "shape checkpoint: $(cat "$OUT/zshape_ckpt.json")"
  fi
  if [ ! -f "$W/zshape.mqb.done" ]; then
    tb=$(date +%s)
    timeout 200 "$QUAL" bundle build --checkpoint "$CK" --model modelqual-lab/zimage-turbo-sizes-random \
      --revision 0000000000000000000000000000000000000001 --out "$W/zshape.mqb" --precision bf16 --backend cuda > "$W/zshape_bundle.log" 2>&1 ||
      { tail -5 "$W/zshape_bundle.log" | tee -a "$LOG"; say "FAIL shape bundle"; return 1; }
    touch "$W/zshape.mqb.done"
    say "shape bundle: $(($(date +%s) - tb)) s, $(du -h "$W/zshape.mqb" | cut -f1)"
  fi
}
