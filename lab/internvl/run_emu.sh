#!/bin/sh
# Builds and runs emu_internvl.cc (the internvl GPU model on the CPU emulation of the CUDA
# backend) against its double-precision reference. EMU_PREC=fp32|bf16 runs one precision.
set -e
cd "$(dirname "$0")"
bin=$(mktemp "${TMPDIR:-/tmp}/emu_internvl.XXXXXX")
trap 'rm -f "$bin"' EXIT
g++ -std=c++20 -O1 -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../../native/cuda/stub -I../../native/include \
  -x c++ emu_internvl.cc ../../native/cuda/blas_pick.cc -o "$bin" -pthread
"$bin"
