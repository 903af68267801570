// Semiring matrix products on a device, through the CUDA kernels' C API
// (kernels/cuda/api.h): the semirings' kernel entry points (cpu_gemm.h,
// exp_shift_gemm.cpp) hand a product here when `routes` says so, and take the
// generic ATen path where these decline (an undefined result).
//
// Two backends behind the same glue:
//   - CUDA tensors in a build with the CUDA kernels (TS_WITH_CUDA_KERNELS):
//     the .cu kernels on torch's current stream (c10::Stream::native_handle,
//     so this file needs no CUDA header), workspace from torch's allocator,
//     cuBLAS for the exp-shift GEMMs with torch's handle;
//   - CPU tensors when TORCH_SEMIRING_KERNEL_BACKEND=emulate: the same kernel
//     bodies run on the host by the block emulator (cuda/host_launcher.h).
//     Slow; it exists so that this glue runs in CI without a GPU.
// The fused element-wise ops of elementwise.h (⊗ edge and ⊕ of entropy,
// max_prod, kmax, the log-space and magnitude lifts) take the same route.
// Products: max-plus (viterbi) and max-times (max_abs), with argmax for path
// extraction; the max_prod pair; kmax (k <= 8); log and entropy by exp-shift. fp32 or bf16
// values (float64 declines: the kernels accumulate in fp32), fp32 or bf16
// weights. The range checks the CPU kernels make while packing are separate
// reductions here (one host read per product).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "kernels/fused_op.h"

namespace torch_semiring {
namespace kernels {
namespace device {

// Does this product go to a device backend (CUDA kernels, or the emulation)?
bool routes(const at::Tensor& g, const at::Tensor& w);
// (C, *batch, M, N) values as cpu_gemm.h's entry points; argmax (optional):
// int32 (*batch, M, N), −1 = no path. times: max-times (max_abs), else max-plus.
at::Tensor max_matmul(bool times, const at::Tensor& g, const at::Tensor& w, at::Tensor* argmax = nullptr);
at::Tensor max_prod_matmul(const at::Tensor& g, const at::Tensor& w);
// kmax(k), k <= 8: the k best of the k·K candidates, descending (no argmax).
at::Tensor kmax_matmul(const at::Tensor& g, const at::Tensor& w, int64_t k);
// log (entropy = false: g = (ℓ)) or entropy (g = (ℓ, h)) by exp-shift.
at::Tensor exp_shift_matmul(bool entropy, const at::Tensor& g, const at::Tensor& w);
// A fused element-wise op (elementwise.h) on values like `a` goes to a device
// backend (routes_elementwise): values = {a} with w for a ⊗ lift(w),
// {a, b} for a ⊕ b, broadcast as in ATen; one launch (cuda/elementwise_block.h).
// Undefined where it does not apply: CPU tensors (unless emulating, fp32),
// dtypes other than fp32/fp64 (fp32 only when emulating), mixed devices or
// dtypes, more than 6 dims left after merging, a graph-building call.
bool routes_elementwise(const at::Tensor& a);
at::Tensor fused_elementwise(Fused op, const std::vector<at::Tensor>& values, const at::Tensor& w);
// Products (calls) and element-wise ops (elementwise_calls) computed by a
// device backend in this process (tests check the glue ran).
int64_t calls();
int64_t elementwise_calls();

}  // namespace device
}  // namespace kernels
}  // namespace torch_semiring
