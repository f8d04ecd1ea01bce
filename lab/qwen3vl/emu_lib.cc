// emu_lib: libmodelqual_cuda.so on the CPU emulation of the CUDA runtime and cuBLAS
// (native/cuda/host_test/emu_cuda.h: no GPU, no nvcc) with the vision families' GPU models
// registered as in the real library (emu_cuda.h brings qwen3vl.cu; internvl.cu here). The
// product's engine (`--device cuda`, native/cuda_backend.cc) loads it with MODELQUAL_CUDA_LIB
// pointing here: run_emu.sh compares it with the CPU fp32 backend. Built by run_emu.sh (lab,
// not product).
#include "../../native/cuda/host_test/emu_cuda.h"
#include "../../native/models/internvl.cu"
