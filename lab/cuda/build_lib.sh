#!/bin/bash
# build_lib.sh SRC_ROOT OUT_SO [EXTRA_SOURCES...]: libmodelqual_cuda.so of a source tree, every
# translation unit compiled in parallel by nvcc, then linked (lab drivers: before_after.sh,
# issue48_gpu.sh). The tree's sources: backend.cu and blas_pick.cc, the families'
# native/models/*.cu where the tree has them (the layout since issue 48), else zimage.cu beside
# backend.cu (the layout before); EXTRA_SOURCES are added (lab/cuda/debug_abi.cu for a lab build).
set -u
root=$1 so=$2
shift 2
srcs=("$root/native/cuda/backend.cu" "$root/native/cuda/blas_pick.cc") objs=() pids=() rc=0
if compgen -G "$root/native/models/*.cu" > /dev/null; then srcs+=("$root"/native/models/*.cu); fi
[ -f "$root/native/cuda/zimage.cu" ] && srcs+=("$root/native/cuda/zimage.cu")
srcs+=("$@")
dir=$(mktemp -d)
for s in "${srcs[@]}"; do
  o="$dir/$(basename "$s").o"
  objs+=("$o")
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DMQB_SM90A -Xcompiler -fPIC -lineinfo -I"$root/native/include" -I"$root/native/cuda" \
    -c "$s" -o "$o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || exit 1
nvcc -shared -gencode=arch=compute_90a,code=sm_90a "${objs[@]}" -o "$so" -lcublas -lcublasLt -lcuda -lpthread
