// The host launcher of the CUDA kernels' block code (block_exec.h): walks the
// grid block by block and, inside each block, runs every phase for all
// threads in turn. Used by the emulation library of the C API
// (emulate_host.cpp, loaded by tests/test_cuda_emulation.py) and by the
// extension's emulated device backend (kernels/device_gemm.cpp).
// The one substitute: the exp-shift product's GEMMs (cuBLAS on the GPU) are a
// plain fp32 triple loop here.
#pragma once

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/api_impl.h"

namespace torch_semiring {
namespace cuda_kernels {

struct HostLauncher {
  HostLauncher(void*, void*) {}
  bool ok() const { return true; }
  int exact_fp32() { return 0; }  // the host GEMM is plain fp32

  template <class Block>
  int launch(const typename Block::Params& p) {
    const Dim3 g = Block::grid(p);
    if (g.x <= 0 || g.y <= 0 || g.z <= 0) return 0;
    if (g.x > 2147483647LL || g.y > 65535 || g.z > 65535) return TS_CUDA_ETOOLARGE;  // as the GPU launcher
    // Fresh, garbage-filled shared memory and registers per block, so a
    // kernel that reads what it did not write is likely to be caught.
    std::vector<typename Block::Smem> smem(1);
    std::vector<typename Block::Regs> regs(Block::kThreads);
    for (int64_t z = 0; z < g.z; ++z)
      for (int64_t y = 0; y < g.y; ++y)
        for (int64_t x = 0; x < g.x; ++x) {
          std::memset(static_cast<void*>(smem.data()), 0x7f, sizeof(typename Block::Smem));
          std::memset(static_cast<void*>(regs.data()), 0x7f, sizeof(typename Block::Regs) * regs.size());
          HostBlock<typename Block::Regs> block{regs.data(), Block::kThreads, Dim3{x, y, z}};
          Block::run(p, smem[0], block);
        }
    return 0;
  }
  int zero(void* p, size_t bytes) {
    std::memset(p, 0, bytes);
    return 0;
  }
  int read_i64(const int64_t* p, int64_t* out) {
    *out = *p;
    return 0;
  }
  int gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
    for (int64_t z = 0; z < batch; ++z)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          float s = 0.f;
          for (int64_t k = 0; k < K; ++k) s += A[(z * M + m) * K + k] * B[(z * K + k) * N + n];
          C[(z * M + m) * N + n] = s;
        }
    return 0;
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
