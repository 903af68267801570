// Edges out of "no path": the SPEC's "an edge of weight 0 does not exist" has
// a consequence IEEE arithmetic misses — nothing flows out of a value that is
// the semiring zero, so
//     zero ⊗ lift(w) = zero   for every w, NaN and ±∞ included,
// where IEEE gives NaN (−∞ + NaN, −∞ + ∞, 0·∞, 0·NaN): a NaN or infinite
// local derivative behind an edge of weight 0 (sqrt at x < 0 in the unselected
// branch of torch.where, f(x)·0) must not reach the inputs. A value on an
// existing path keeps IEEE (a NaN weight on a real path gives NaN, as stock),
// and so does a value that overflowed to +∞ in log space across an edge of
// weight 0 (+∞ + −∞: NaN; abs and max_abs split +∞ off before any rule). The
// CPU fused passes (kernels/fused_ops.inc) do the same in-pass; these are the
// ATen expressions for everything else (other devices, dtypes, create_graph).
// max_prod keeps its own (empty pairs, semiring/max_prod.h).
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "kernels/elementwise.h"

namespace torch_semiring {

// Log-space scores a (E, *S) (log, viterbi: E = 1; kmax and the path
// versions: E lists, descending) ⊗ an edge w: + log|w| on every score, −∞
// stays −∞. One fused pass where it applies (E ≤ 8, CPU float/double), else
// 5 ATen passes.
inline at::Tensor add_log_abs_scores(const at::Tensor& a, const at::Tensor& w) {
  auto fused = kernels::fused_edge(kernels::Fused::AddLogAbs, a, w);
  if (fused.defined()) return fused;
  constexpr double ninf = -std::numeric_limits<double>::infinity();
  auto out = a + w.abs().log();
  return out.masked_fill_(a == ninf, ninf);
}

// Magnitudes a (C, *S) in [0, ∞] (abs, max_abs) ⊗ an edge w: a·|w|, 0 where
// a is 0. (+∞ values never meet a rule: apply_rule splits them off, see
// Semiring::infinite_split_components.) One fused pass where it applies (one
// component, CPU float/double). Otherwise: a NaN can only come from a NaN or
// infinite w, which is rare: on the CPU one read of the product (its sum is
// NaN iff an entry is; no temporary) decides whether to mask. Elsewhere the
// mask is applied unconditionally: reading the sum would stall the device.
inline at::Tensor times_abs_edge(const at::Tensor& a, const at::Tensor& w) {
  auto fused = kernels::fused_edge(kernels::Fused::TimesAbs, a, w);
  if (fused.defined()) return fused;
  auto out = a * w.abs();
  if (out.device().is_cpu() && !std::isnan(out.sum().item<double>())) return out;
  return out.masked_fill_(a == 0, 0);
}

}  // namespace torch_semiring
