#!/bin/sh
# Host-only syntax check of backend.cu with g++ and the stub CUDA headers in stub/, for machines
# without nvcc. Catches C++ errors early; the real build (make cuda) still needs nvcc.
set -e
cd "$(dirname "$0")"
g++ -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-comment -DMQB_HOST_TEST -Istub -I../include -x c++ backend.cu
g++ -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-comment -DMQB_HOST_TEST -Istub -I../include -x c++ zimage.cu
g++ -std=c++17 -fsyntax-only -Wall -Wextra -DMQB_HOST_TEST -Istub blas_pick.cc
echo "syntax ok"
