// Host emulation of the CUDA kernels, for tests/test_cuda_emulation.py: the
// same C API (api.h), the same bodies (api_impl.h via api_defs.inc) and the
// same block logic (the *_block.h headers), with a launcher that walks the
// grid block by block and, inside each block, runs every phase for all
// threads in turn (HostBlock, block_exec.h). Built with the host compiler
// alone (no CUDA), as a shared library loaded with ctypes.
// The launcher: kernels/cuda/host_launcher.h.
#include "kernels/cuda/host_launcher.h"

#define TS_LAUNCHER torch_semiring::cuda_kernels::HostLauncher
#define TS_API_GEMM
#define TS_API_REDUCE
#define TS_API_FUSED
#define TS_API_EXP_SHIFT
#define TS_API_EXP_SHIFT_MATMUL
#include "kernels/cuda/api_defs.inc"
