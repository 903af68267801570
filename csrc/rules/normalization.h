// Test support for the batch-norm rules (rules/normalization.cpp).
#pragma once

#include <ATen/ATen.h>

namespace torch_semiring {

// A stand-in for CUDA's cuDNN batch-norm node on CPU tensors: `out` (a copy)
// whose grad_fn is a CudnnBatchNormBackward0 holding what cudnn_batch_norm's
// forward saves (input, weight, running statistics, save_mean, save_invstd,
// ε, training), with next edges to input, weight and bias. The engine then
// runs that node's rule as it would on a GPU graph.
at::Tensor cudnn_batch_norm_node_standin(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                         const at::Tensor& running_mean, const at::Tensor& running_var,
                                         const at::Tensor& out, const at::Tensor& save_mean,
                                         const at::Tensor& save_invstd, bool training, double eps);

}  // namespace torch_semiring
