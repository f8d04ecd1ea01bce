#!/bin/sh
# Builds and runs emu_moe.cc (the qwen3moe GPU model on the CPU emulation of the CUDA backend).
set -e
cd "$(dirname "$0")"
bin=$(mktemp "${TMPDIR:-/tmp}/emu_moe.XXXXXX")
trap 'rm -f "$bin"' EXIT
g++ -std=c++20 -O1 -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../../native/cuda/stub -I../../native/include \
  -x c++ emu_moe.cc ../../native/cuda/blas_pick.cc -o "$bin" -pthread
"$bin"
