#!/bin/bash
# build.sh OUT_SO: libkprof.so (kprof.cc) against the CUDA toolkit's CUPTI, on the GPU host.
set -eu
out=$1
cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
inc=$(dirname "$(find "$cuda"/ /usr/include -name cupti.h 2>/dev/null | head -1)")
lib=$(dirname "$(find "$cuda"/ /usr/lib -name 'libcupti.so*' 2>/dev/null | head -1)")
[ -n "$inc" ] && [ -n "$lib" ] || { echo "kprof: no cupti.h or libcupti.so under $cuda" >&2; exit 1; }
rec=$(grep -ho 'CUpti_ActivityKernel[0-9]*;' "$inc"/cupti_activity.h | tr -d ';' | sort -V | tail -1)
g++ -O2 -shared -fPIC -std=c++17 -DKREC="$rec" -I"$inc" -I"$cuda/include" "$(dirname "$0")/kprof.cc" \
  -o "$out" -L"$lib" -Wl,-rpath,"$lib" -lcupti
echo "kprof: $out ($rec, $inc, $lib)"
