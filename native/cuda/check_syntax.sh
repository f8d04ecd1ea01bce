#!/bin/sh
# Host-only syntax check of the CUDA backend's translation units (the core, backend.cu, and every
# family's native/models/*.cu, as CMake compiles them) with g++ and the stub CUDA headers in stub/,
# for machines without nvcc. Catches C++ errors early; the real build (make cuda) still needs nvcc.
set -e
cd "$(dirname "$0")"
flags="-std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-comment -DMQB_HOST_TEST -Istub -I. -I../include"
g++ $flags -x c++ backend.cu
for f in ../models/*.cu; do
  g++ $flags -x c++ "$f"
done
g++ -std=c++17 -fsyntax-only -Wall -Wextra -DMQB_HOST_TEST -Istub blas_pick.cc
echo "syntax ok"
