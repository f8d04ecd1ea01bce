#!/bin/bash
# make qualify-foreign: qualify an engine this project did not write. Builds Ollama from its Go
# module (github.com/ollama/ollama@$OLLAMA_VERSION) into an ignored folder, imports the qwen
# fixture (safetensors, `ollama create` from a Modelfile), serves it, and runs the qwen suite's
# portable gates and premerge load profiles against it through the external launcher. The
# per-gate verdicts land in $OUT/summary.md.
#
# Ollama's module zip leaves out llama.cpp's vendor/ folder: nlohmann/json comes from Debian's
# nlohmann-json3-dev, stb_image from libstb-dev, and miniaudio (no registry ships it) from the
# stand-in header beside this script, which only refuses audio.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$ROOT"
OLLAMA_VERSION=${OLLAMA_VERSION:-v0.13.5}
FOREIGN=${FOREIGN:-$ROOT/.cache/foreign}
OUT=${OUT:-$ROOT/artifacts/qualify-foreign}
PORT=${OLLAMA_PORT:-18434}
mkdir -p "$FOREIGN/bin" "$OUT"

for h in /usr/include/nlohmann/json.hpp /usr/include/stb/stb_image.h; do
	if [ ! -f "$h" ]; then
		echo "qualify-foreign: $h is missing; install Debian's headers: apt-get install -y nlohmann-json3-dev libstb-dev" >&2
		exit 1
	fi
done

OLLAMA=$FOREIGN/bin/ollama
if [ ! -x "$OLLAMA" ] || ! "$OLLAMA" --version 2>/dev/null | grep -q "${OLLAMA_VERSION#v}"; then
	echo "qualify-foreign: building ollama $OLLAMA_VERSION (cgo, CPU backend; tens of minutes on 2 cores the first time)"
	GOBIN=$FOREIGN/bin CGO_CPPFLAGS="-I$ROOT/qual/launch/foreign/ollama/shim" go install "github.com/ollama/ollama@$OLLAMA_VERSION"
fi

SNAP=$(./bin/qual fixtures --name qwen3-tiny | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["snapshot_dir"])')
export OLLAMA_HOST=127.0.0.1:$PORT OLLAMA_MODELS=$FOREIGN/models OLLAMA_NOPRUNE=1
"$OLLAMA" serve > "$OUT/ollama-serve.log" 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://$OLLAMA_HOST/api/version" > /dev/null && break; sleep 1; done
printf 'FROM %s\nPARAMETER temperature 0\n' "$SNAP" > "$OUT/Modelfile"
"$OLLAMA" create qwen -f "$OUT/Modelfile" 2>&1 | tee "$OUT/ollama-create.log"

./bin/qual qualify --launcher external --url "http://$OLLAMA_HOST" --family qwen \
	--label-filter '!gpu && !container && !slow' --out "$OUT" || true
echo "qualify-foreign: per-gate verdicts in $OUT/summary.md"
