// The shared steps of selections on tagged values (selection.h) and the
// component-by-component defaults of Semiring's *_select operations.
#include "selection.h"

#include "semiring.h"

#include "kernels/cpu_gemm.h"
#include "kernels/device_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace torch_semiring {
namespace selection {

Tensor with_winner_tags(const Tensor& values, const Tensor& winner, const Tensor& candidate_tags, int64_t C) {
  auto fast = kernels::winners_with_ids(values, winner, candidate_tags, C);  // one pass (CPU)
  if (fast.defined()) return fast;
  auto candidates = candidate_tags.movedim(0, -1).flatten(-2, -1);  // (*B, M, K·C): column k·C + entry
  auto index = winner.to(at::kLong).clamp_min(0);
  auto shape = index.sizes().vec();
  shape.back() = candidates.size(-1);
  auto picked = candidates.unsqueeze(0).expand(shape).gather(-1, index);
  picked = at::where(winner < 0, -1.0, picked);
  return tagged(values, picked.to(values.scalar_type()));
}

Tensor matmul_by_winners(const Tensor& g, const Tensor& w, int64_t C, bool on_device, const WinnerKernel& kernel) {
  auto s = scores(g, C), t = tags(g, C);
  kernels::BatchedOperands ops, tag_ops;
  if (!(kernels::kernel_dtype(s, w) || on_device) || !kernels::broadcast_operands(s, w, ops) ||
      !kernels::broadcast_operands(t, w, tag_ops) || ops.g.size(-1) == 0)
    return {};
  for (auto d : ops.out_shape)
    if (d == 0) return {};
  auto [values, winner] = kernel(s, w);
  if (!values.defined()) return {};
  return with_winner_tags(values, winner, tag_ops.g, C);
}

Tensor reduced_last(const Tensor& a, at::IntArrayRef dims) {
  std::vector<int64_t> order{0}, kept;
  for (int64_t d = 1; d < a.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      order.push_back(d);
      kept.push_back(a.size(d));
    }
  for (auto d : dims) order.push_back(d);
  std::vector<int64_t> flat{a.size(0)};
  flat.insert(flat.end(), kept.begin(), kept.end());
  flat.push_back(-1);
  return a.permute(order).reshape(flat);
}

Tensor reduced_result(Tensor out, at::IntArrayRef dims, bool keepdim) {
  if (keepdim)
    for (auto d : dims) out = out.unsqueeze(d);  // dims ascending
  return out;
}

Tensor reduce_by_pick(const Tensor& a, at::IntArrayRef dims, bool keepdim, int64_t C, const Pick& pick) {
  if (dims.empty()) return a;
  auto x = reduced_last(a, dims);  // (2C, *kept, R)
  auto s = scores(x, C), t = tags(x, C);
  auto index = pick(s);
  return reduced_result(tagged(s.gather(-1, index), t.gather(-1, index)).squeeze(-1), dims, keepdim);
}

Tensor max_matmul_select(bool times, const Tensor& g, const Tensor& w) {
  const bool on_device = kernels::device::routes(scores(g, 1), w);  // argmax GEMMs there too
  return matmul_by_winners(g, w, 1, on_device, [times](const Tensor& s, const Tensor& w) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const auto wr = kernels::range_of(w), sr = kernels::range_of(s);  // the kernel raises outside its range
    if (!std::isfinite(wr.first) || !std::isfinite(wr.second) || !(sr.second < kInf) || (times && !(sr.first >= 0)))
      return std::tuple<Tensor, Tensor>{};  // NaN fails too
    auto [values, winner] = kernels::max_matmul_argmax(times ? "max_abs" : "viterbi", s, w);
    return std::tuple<Tensor, Tensor>{values, winner.unsqueeze(0)};
  });
}

Tensor max_rows_select(bool log_space, const Tensor& a, const Tensor& x) {
  Tensor winner;
  auto best = kernels::max_rows(scores(a, 1).select(0, 0), x, log_space, &winner);
  if (!best.defined()) return {};
  return with_winner_tags(best.to(a.scalar_type()).unsqueeze(0), winner.unsqueeze(0), tags(a, 1), 1);
}

}  // namespace selection

// ---- the defaults: component c of a result is component c of a candidate ----

using selection::scores;
using selection::tagged;
using selection::tags;

// Where the ⊕ of the scores differs from a's it is b's (a NaN in a stays a's).
Tensor Semiring::oplus_select(const Tensor& a, const Tensor& b) const {
  const int64_t C = components();
  auto shape = at::infer_size(a.sizes(), b.sizes());
  auto A = a.expand(shape), B = b.expand(shape);
  auto sa = scores(A, C);
  auto value = do_oplus(sa, scores(B, C));
  auto take_b = value.ne(sa).logical_and_(sa.eq(sa));
  return tagged(value, at::where(take_b, tags(B, C), tags(A, C)));
}

Tensor Semiring::otimes_edge_select(const Tensor& a, const Tensor& w) const {
  const int64_t C = components();
  auto value = do_otimes_edge(scores(a, C), w);
  auto t = tags(a, C);
  std::vector<int64_t> shape{C};
  shape.insert(shape.end(), value.sizes().begin() + 1, value.sizes().end());
  return tagged(value, t.expand(shape));
}

// The first reduced element whose component equals the ⊕ of them all.
Tensor Semiring::oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const {
  return selection::reduce_by_pick(a, dims, keepdim, components(), [this](const Tensor& s) {
    auto best = do_oplus_reduce(s, {s.dim() - 1}, /*keepdim=*/true);
    return s.eq(best).view(at::kByte).argmax(-1, /*keepdim=*/true);  // NaN matches nothing: the first
  });
}

}  // namespace torch_semiring
