#!/bin/sh
# Builds and runs the CPU emulation test of the CUDA backend (no GPU or nvcc needed).
set -e
cd "$(dirname "$0")"
g++ -std=c++20 -O1 -g -DMQB_HOST_TEST -Wno-unknown-pragmas -Wno-comment -I../stub -I../../include \
  -x c++ emu_test.cc -o /tmp/mqb_emu_test -pthread ${EMU_FLAGS}
/tmp/mqb_emu_test
