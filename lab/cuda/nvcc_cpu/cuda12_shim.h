// cuda12_shim.h: the CUDA 12 tensor-map names linear.cuh and tile.cuh use, declared for an
// nvcc 11.8 compile check on a machine without a GPU (lab/cuda/nvcc_cpu/check.sh). Never run.
#include <cuda.h>
#if CUDA_VERSION < 12000
typedef struct { alignas(64) unsigned long long opaque[16]; } CUtensorMap;
enum { CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B };
template <typename... A> CUresult cuTensorMapEncodeTiled(A...) { return CUDA_SUCCESS; }
#endif
