#!/bin/bash
# make qualify-foreign: qualify an engine this project did not write. Builds Ollama from its Go
# module (github.com/ollama/ollama@$OLLAMA_VERSION) into an ignored folder, imports a family's
# fixture (safetensors, `ollama create` from a Modelfile), serves it, and runs that suite's
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
# Ollama v0.13.5 converts LlamaForCausalLM from safetensors but not Qwen3ForCausalLM (its qwen3
# converter serves Qwen3-VL only), so the llama family is the default.
FAMILY=${FOREIGN_FAMILY:-llama}
FIXTURE=${FOREIGN_FIXTURE:-llama-tiny}
mkdir -p "$FOREIGN/bin" "$OUT"

for h in /usr/include/nlohmann/json.hpp /usr/include/stb/stb_image.h; do
	if [ ! -f "$h" ]; then
		echo "qualify-foreign: $h is missing; install Debian's headers: apt-get install -y nlohmann-json3-dev libstb-dev" >&2
		exit 1
	fi
done

OLLAMA=$FOREIGN/bin/ollama
# go install stamps no version into the binary (it reports 0.0.0), so read the module's from it.
if [ ! -x "$OLLAMA" ] || ! go version -m "$OLLAMA" 2>/dev/null | grep -qE "^\s+mod\s+github.com/ollama/ollama\s+$OLLAMA_VERSION\s"; then
	echo "qualify-foreign: building ollama $OLLAMA_VERSION (cgo, CPU backend; tens of minutes on 2 cores the first time)"
	GOBIN=$FOREIGN/bin CGO_CPPFLAGS="-I$ROOT/qual/launch/foreign/ollama/shim" go install "github.com/ollama/ollama@$OLLAMA_VERSION"
fi

SNAP=$(./bin/qual fixtures --name "$FIXTURE" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["snapshot_dir"])')
export OLLAMA_HOST=127.0.0.1:$PORT OLLAMA_MODELS=$FOREIGN/models OLLAMA_NOPRUNE=1
"$OLLAMA" serve > "$OUT/ollama-serve.log" 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://$OLLAMA_HOST/api/version" > /dev/null && break; sleep 1; done
# Ollama's converter reads a SentencePiece model only from tokenizer.model; a SentencePiece-style
# BPE kept in tokenizer.json alone (as llama-tiny's) it would misread as byte-level BPE. The
# import folder is the snapshot plus that tokenizer.model (spmmodel writes it from tokenizer.json).
IMPORT=$SNAP
if [ ! -f "$SNAP/tokenizer.model" ] && grep -q '"byte_fallback": *true' "$SNAP/tokenizer.json"; then
	IMPORT=$OUT/import
	rm -rf "$IMPORT" && mkdir -p "$IMPORT" && cp -L "$SNAP"/* "$IMPORT"/
	go run ./qual/launch/foreign/ollama/spmmodel --tokenizer "$SNAP/tokenizer.json" --out "$IMPORT"
fi
# Ollama's /v1/completions renders the prompt through the model's template as a user turn; the
# gates send raw completions, so the template passes the prompt through as it is (chat then uses
# the same template: its gates judge that, not the checkpoint's chat template).
printf 'FROM %s\nTEMPLATE """{{ .Prompt }}"""\nPARAMETER temperature 0\n' "$IMPORT" > "$OUT/Modelfile"
"$OLLAMA" create "$FAMILY" -f "$OUT/Modelfile" 2>&1 | tee "$OUT/ollama-create.log"

./bin/qual qualify --launcher external --url "http://$OLLAMA_HOST" --family "$FAMILY" \
	--label-filter '!gpu && !container && !slow' --out "$OUT" || true
echo "qualify-foreign: per-gate verdicts in $OUT/summary.md"
