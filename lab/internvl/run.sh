#!/bin/bash
# Makes the internvl-tiny transformers golden on the GPU host (CPU fp32; no network, no Go).
# Usage: run.sh OUTDIR   (cwd: the repository root, or this folder's copy in /work/devq/internvl)
# Needs: python3 with torch, torchvision, transformers 5.17, pillow; a qual binary built from the
# internvl branch ($QUAL, default ./qual) that writes the fixture (qual fixtures --name internvl-tiny).
# Writes OUTDIR/internvl-tiny.json, OUTDIR/internvl-tiny/*.png, OUTDIR/log.txt, OUTDIR/versions.txt.
set -euo pipefail
OUT=${1:?usage: run.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=${ROOT:-$(pwd)}
QUAL=${QUAL:-$ROOT/qual}
cd "$ROOT"
python3 -c 'import torch, torchvision, transformers, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__, "pillow", PIL.__version__)' | tee "$OUT/versions.txt"
"$QUAL" fixtures --cache "$OUT/cache" --name internvl-tiny > "$OUT/fixture.json"
SNAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["snapshot_dir"])' "$OUT/fixture.json")
set +e
timeout 480 python3 fixtures/golden/make_internvl_golden.py --snapshot "$SNAP" \
  --corpus families/internvl/corpus.jsonl --pairs families/internvl/corpus-pairs.jsonl --root . \
  --out "$OUT/internvl-tiny.json" --images-out "$OUT/internvl-tiny" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
set -e
cp "$SNAP/config.json" "$OUT/fixture-config.json"
rm -rf "$OUT/cache"
echo "make_internvl_golden.py exit $rc" | tee -a "$OUT/log.txt"
exit "$rc"
