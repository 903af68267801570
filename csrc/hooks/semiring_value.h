// How a semiring value travels through the stock autograd engine.
//
// The engine checks every gradient against the metadata of the input it is
// for (shape, dtype, device, layout: validate_outputs) and keeps gradients in
// InputBuffers of plain tensors. A semiring value has C stacked components,
// shape (C, *S) (semiring.h), so it travels wrapped: a tensor whose visible
// sizes are S and whose dtype is the input's, holding the (C, *S) value — the
// way functorch's BatchedTensorImpl hides its batch dimension. The wrapper has
// no storage and its own dispatch key, whose fallback raises an error naming
// the operator: stock arithmetic (a hook, a node the harness does not
// intercept) can never silently compute on a semiring value.
#pragma once

#include <ATen/ATen.h>

#include "../semiring/semiring.h"

namespace torch_semiring {

// `value` (C, *S) of `semiring` as a tensor of sizes S and dtype `dtype`. The
// semiring must outlive the wrapper (the mode keeps it alive).
at::Tensor wrap_value(at::Tensor value, const Semiring& semiring, at::ScalarType dtype);
bool is_wrapped_value(const at::Tensor& t);
// The (C, *S) value inside a wrapper (t must be one).
const at::Tensor& unwrap_value(const at::Tensor& t);

}  // namespace torch_semiring
