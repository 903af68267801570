// CUDA ⊕-reductions over a dim (amax, argmax, logsumexp) and scatter-amax.
// Block logic: reduce_block.h; C API: api.h.
#include "kernels/cuda/device_launch.cuh"

#define TS_LAUNCHER torch_semiring::cuda_kernels::DeviceLauncher
#define TS_API_REDUCE
#include "kernels/cuda/api_defs.inc"
