// Arithmetic over [0, +∞] with 0 annihilating: 0·∞ = 0.
//
// abs, count and max_abs carry values in [0, +∞]. On a deep model a value can
// overflow to +∞ (the number of paths through a 6-layer MiniLM exceeds
// float32's range), and IEEE 0·∞ is NaN, while in these semirings a zero is
// "no path" (or an edge that does not exist: SPEC §1) and annihilates
// everything. These helpers compute the plain product and repair only the
// entries where an IEEE NaN came from 0·∞; a NaN that came from a NaN operand
// stays NaN. Cost: the plain operation plus one isnan pass over its result on
// the CPU (the repair runs only when a NaN appeared); on other devices the
// repair's masks are always built (no host read on the hot path).
#pragma once
#include <ATen/ATen.h>

namespace torch_semiring {

// a·b, element-wise and broadcast, a, b ≥ 0 (or NaN).
at::Tensor annihilating_product(const at::Tensor& a, const at::Tensor& b);

// at::matmul(g, l), g, l ≥ 0 (or NaN), where a term 0·∞ contributes 0: the
// finite terms by one GEMM, +∞ wherever an ∞ meets a nonzero.
at::Tensor annihilating_matmul(const at::Tensor& g, const at::Tensor& l);

// Σ over dim (1-based: dim 0 holds the components) of everything but me, with
// +∞ entries (total − me would give ∞ − ∞).
at::Tensor exclusive_sum(const at::Tensor& v, int64_t dim);

}  // namespace torch_semiring
