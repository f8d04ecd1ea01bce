#!/bin/sh
# Builds and runs the CPU emulation test of the CUDA backend (no GPU or nvcc needed).
# EMU_ONLY=family:precision runs one configuration (make cuda-host runs qwen3:bf16).
set -e
cd "$(dirname "$0")"
bin=$(mktemp "${TMPDIR:-/tmp}/mqb_emu_test.XXXXXX")
trap 'rm -f "$bin"' EXIT
g++ -std=c++20 -O1 -g -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../stub -I../../include \
  -x c++ emu_test.cc ../blas_pick.cc -o "$bin" -pthread ${EMU_FLAGS}
"$bin"
