// Test support for the fused-attention rule (rules/attention.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace torch_semiring {

// A stand-in for a CUDA fused attention node on CPU tensors: `out` (a copy)
// whose grad_fn is a ScaledDotProduct{Flash,Efficient,Cudnn}AttentionBackward0
// node (kind "flash", "efficient", "cudnn") holding q, k, v, out, lse (in that
// node's own layout: efficient pads T to a multiple of 32, cuDNN adds a
// trailing 1), the bias and flags as CUDA's forward saves them, with next
// edges to q, k, v. The semiring engine then runs the node's rule exactly as it
// would on a GPU graph — the only way to execute those rules without one.
at::Tensor attention_node_standin(const std::string& kind, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const std::optional<at::Tensor>& bias, bool causal, std::optional<double> scale,
                                  double dropout_p);

}  // namespace torch_semiring
