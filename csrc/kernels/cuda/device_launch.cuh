// The GPU side of block_exec.h: one __global__ kernel template that runs a
// block-logic struct (max_gemm_block.h, reduce_block.h, exp_shift_block.h)
// with this thread's DeviceThread, and the launcher api_impl.h uses.
#pragma once

#include <cuda_runtime.h>

#include <climits>

#include "kernels/cuda/api_impl.h"

namespace torch_semiring {
namespace cuda_kernels {

template <class Block>
__global__ void __launch_bounds__(Block::kThreads) block_kernel(const typename Block::Params p) {
  __shared__ typename Block::Smem sm;
  DeviceThread<typename Block::Regs> thread;
  Block::run(p, sm, thread);
}

struct DeviceLauncher {
  cudaStream_t stream;
  DeviceLauncher(void* s, void*) : stream(static_cast<cudaStream_t>(s)) {}
  bool ok() const { return true; }

  template <class Block>
  int launch(const typename Block::Params& p) {
    const Dim3 g = Block::grid(p);
    if (g.x <= 0 || g.y <= 0 || g.z <= 0) return 0;  // nothing to compute
    if (g.x > INT_MAX || g.y > 65535 || g.z > 65535) return TS_CUDA_ETOOLARGE;
    block_kernel<Block><<<dim3(unsigned(g.x), unsigned(g.y), unsigned(g.z)), Block::kThreads, 0, stream>>>(p);
    return int(cudaGetLastError());
  }
  int zero(void* p, size_t bytes) { return int(cudaMemsetAsync(p, 0, bytes, stream)); }
  int read_i64(const int64_t* p, int64_t* out) {
    const cudaError_t e = cudaMemcpyAsync(out, p, sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
    return int(e != cudaSuccess ? e : cudaStreamSynchronize(stream));
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
