// emu_lib: libmodelqual_cuda.so on the CPU emulation of the CUDA runtime and cuBLAS
// (native/cuda/host_test/emu_cuda.h: no GPU, no nvcc), with the two text-to-image pipelines
// (native/models/flux.cu, native/models/zimage.cu) registered as in the real library. `qual
// generate-image --device cuda` then runs them through the product's host side (models/flux.cc's
// FluxCuda, models/zimage.cc's ZImageCuda) with MODELQUAL_CUDA_LIB pointing here: run_emu.sh
// compares their images with the CPU pipeline's. Built by run_emu.sh (lab, not product).
#include "../../native/cuda/host_test/emu_cuda.h"
#include "../../native/models/flux.cu"
#include "../../native/models/zimage.cu"

#include "emu_blas.h"
