// CUDA max-semiring GEMMs (max-plus, max-times with argmax; the max_prod
// pair), fp32 or bf16 inputs with fp32 accumulation, and the weight lifting.
// The block logic is max_gemm_block.h / exp_shift_block.h (LiftBlock); the C
// API is api.h.
#include "kernels/cuda/device_launch.cuh"

#define TS_LAUNCHER torch_semiring::cuda_kernels::DeviceLauncher
#define TS_API_GEMM
#include "kernels/cuda/api_defs.inc"
