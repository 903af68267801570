// This library's side of the upstream patch series (patches/pytorch/): an
// implementation of its torch::autograd::SemiringHooks for every semiring of
// this library, registered in its registry, so that a PyTorch built with the
// series runs `torch.autograd.set_semiring("max_prod")` with this library's
// semirings and rules. The semantics are those of the LD_PRELOAD route
// (engine_hooks.h), shared function by function.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace torch_semiring {

// ⊕-accumulates the readout of a leaf's raw (C, *S) value into leaf.grad —
// the Python API's one implementation (engine.py). `components` is k for kmax.
using SeriesAccumulator =
    std::function<void(const at::Tensor& leaf, const at::Tensor& value, const std::string& semiring,
                       int64_t components)>;

// Registers every semiring of semiring_names() with the running torch's
// semiring registry; false (and nothing registered) when the running torch
// has no such registry (a stock wheel without the series).
bool register_series_semirings(SeriesAccumulator accumulate);

}  // namespace torch_semiring
