// Max over |affine| weights without the matrix: for each row r and query j,
//     out[r, j] = max_{i ≠ j} s[r, i] · |u[r, i] + v[r, i] · t[r, j]|
// (s ≥ 0). |a + b·t| = max(a + b·t, −a − b·t), so this is the upper envelope of
// 2N lines in t, evaluated at the N queries: O(N log N) a row instead of the
// N×N weight block. Normalisation Jacobians (layer / RMS / batch norm) have
// exactly this off-diagonal form; the max semirings use it.
#pragma once

#include <ATen/ATen.h>

namespace torch_semiring::kernels {

// s, u, v, t: (R, N) CPU tensors (any floating dtype); returns (R, N) float64.
at::Tensor max_abs_affine(const at::Tensor& s, const at::Tensor& u, const at::Tensor& v, const at::Tensor& t);

}  // namespace torch_semiring::kernels
