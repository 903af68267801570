// CUDA fused element-wise ops (the semirings' ⊗ edge and ⊕ in one launch).
// Block logic: elementwise_block.h; arithmetic: kernels/fused_ops.inc; C API: api.h.
#include "kernels/cuda/device_launch.cuh"

#define TS_LAUNCHER torch_semiring::cuda_kernels::DeviceLauncher
#define TS_API_FUSED
#include "kernels/cuda/api_defs.inc"
