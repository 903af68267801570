// kmax(k): the k largest path log-magnitudes, descending (k-best Viterbi).
// A value holds the k best scores of a tensor element in its k components.
// ⊕ merges two top-k lists, ⊗ adds scores pairwise and keeps the top k,
// lift(w) = (log|w|, −∞, …), zero all −∞, one (0, −∞, …).
#pragma once
#include "selection.h"
#include "semiring.h"
#include "zero_edges.h"

#include "kernels/cpu_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class KMaxSemiring final : public Semiring {
 public:
  explicit KMaxSemiring(int64_t k) : k_(k) {
    TORCH_CHECK(k >= 1, "torch_semiring: kmax needs k >= 1, got k=", k);
  }
  std::string name() const override { return "kmax"; }
  int64_t components() const override { return k_; }
  bool selects() const override { return true; }
  bool readout_lists_components() const override { return true; }
  Tensor readout(const Tensor& v) const override { return v.movedim(0, -1); }
  int64_t k() const { return k_; }
  // The blocked top-k merge GEMM kernel where it applies (k <= 8, float/double CPU, finite inputs).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::kmax_matmul(g, w, k_);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // The k best of a_ic + log|1 + x_i x_j|: pruned by a bound, then merged per query (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::topk_rows(a, x);
    return fast.defined() ? fast.to(a.scalar_type()) : Semiring::norm_offdiagonal(a, x);
  }
  // Path tracking (provenance.h): ⊕ merges two lists, so its selections are
  // not component by component — a result entry is any entry of either list.
  // The fused passes and kernels carry the tags beside the scores.
  Tensor oplus_select(const Tensor& a, const Tensor& b) const override {
    auto fused = kernels::fused_pair(kernels::Fused::KMaxMergeIds, a, b);  // one pass (k ≤ 8)
    if (fused.defined()) return fused;
    auto shape = at::infer_size(a.sizes(), b.sizes());
    auto A = a.expand(shape), B = b.expand(shape);
    auto s = at::cat({selection::scores(A, k_), selection::scores(B, k_)}, 0);
    auto t = at::cat({selection::tags(A, k_), selection::tags(B, k_)}, 0);
    auto order = std::get<1>(s.sort(std::optional<bool>(true), 0, /*descending=*/true)).narrow(0, 0, k_);
    return selection::tagged(s.gather(0, order), t.gather(0, order));
  }
  Tensor otimes_edge_select(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::AddLogAbsIds, a, w);  // one pass (k ≤ 8)
    return fused.defined() ? fused : Semiring::otimes_edge_select(a, w);
  }
  Tensor oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    if (dims.empty()) return a;
    auto out = kernels::kmax_reduce(a, dims, k_, /*with_ids=*/true);  // one pass, no copies
    if (!out.defined()) {  // the k best of the R·k candidates: a selection, not a sort
      auto x = selection::reduced_last(a, dims);  // (2k, *kept, R)
      auto s = selection::scores(x, k_).movedim(0, -1).flatten(-2, -1);  // (*kept, R·k)
      auto t = selection::tags(x, k_).movedim(0, -1).flatten(-2, -1);
      auto pick = std::get<1>(s.topk(k_, -1, /*largest=*/true, /*sorted=*/true));
      out = selection::tagged(s.gather(-1, pick).movedim(-1, 0), t.gather(-1, pick).movedim(-1, 0));
    }
    return selection::reduced_result(out, dims, keepdim);
  }
  Tensor matmul_select(const Tensor& g, const Tensor& w) const override {
    return selection::matmul_by_winners(g, w, k_, /*on_device=*/false, [this](const Tensor& s, const Tensor& w) {
      return kernels::kmax_matmul_argmax(s, w, k_);
    });
  }
  Tensor norm_offdiagonal_select(const Tensor& a, const Tensor& x) const override {
    Tensor winner;
    auto best = kernels::topk_rows(selection::scores(a, k_), x, &winner);  // winners as i·k + entry
    if (!best.defined()) return {};
    return selection::with_winner_tags(best.to(a.scalar_type()), winner, selection::tags(a, k_), k_);
  }

 protected:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  Tensor top(const Tensor& candidates) const {  // candidates along dim 0
    return std::get<0>(candidates.topk(k_, 0, /*largest=*/true, /*sorted=*/true));
  }
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value(std::vector<double>(k_, -kInf), s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    std::vector<double> c(k_, -kInf);
    c[0] = 0.0;
    return constant_value(c, s, o);
  }
  Tensor do_lift(const Tensor& w) const override {
    std::vector<int64_t> rest{k_ - 1};
    rest.insert(rest.end(), w.sizes().begin(), w.sizes().end());
    return at::cat({w.abs().log().unsqueeze(0), at::full(rest, -kInf, w.options())});
  }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override {
    auto sums = a.unsqueeze(1) + b.unsqueeze(0);  // (k, k, *S): every pair of scores
    // A pair with a padding slot (−∞) is no path even against +∞ (a NaN
    // otherwise); the pair of first slots keeps IEEE, as viterbi does.
    auto padding = (a.unsqueeze(1) == -kInf).logical_or(b.unsqueeze(0) == -kInf);
    padding.select(0, 0).select(0, 0).fill_(false);
    sums.masked_fill_(padding, -kInf);
    auto shape = sums.sizes().vec();
    shape.erase(shape.begin());
    shape[0] = k_ * k_;
    return top(sums.reshape(shape));
  }
  // A lifted edge has one finite score: adding it keeps the order.
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    return add_log_abs_scores(a, w);
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override {
    auto fused = kernels::fused_pair(kernels::Fused::KMaxMerge, a, b);  // bitonic merge, one pass (k ≤ 8)
    if (fused.defined()) return fused;
    auto sa = a.sizes().vec(), sb = b.sizes().vec();
    auto shape = at::infer_size(at::IntArrayRef(sa).slice(1), at::IntArrayRef(sb).slice(1));
    std::vector<int64_t> ea{k_}, eb{k_};
    ea.insert(ea.end(), shape.begin(), shape.end());
    eb.insert(eb.end(), shape.begin(), shape.end());
    return top(at::cat({a.expand(ea), b.expand(eb)}, 0));
  }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    if (dims.empty()) return a;
    auto fast = kernels::kmax_reduce(a, dims, k_, /*with_ids=*/false);  // one pass, no copies
    if (fast.defined()) {
      if (keepdim)
        for (auto d : dims) fast = fast.unsqueeze(d);  // dims ascending
      return fast;
    }
    // Bring the reduced dims next to the component dim, flatten them into the
    // candidate dim, keep the top k.
    std::vector<int64_t> order{0}, kept;
    for (auto d : dims) order.push_back(d);
    for (int64_t d = 1; d < a.dim(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
        order.push_back(d);
        kept.push_back(a.size(d));
      }
    std::vector<int64_t> flat{-1};
    flat.insert(flat.end(), kept.begin(), kept.end());
    auto best = top(a.permute(order).reshape(flat));
    if (!keepdim) return best;
    for (auto d : dims) best = best.unsqueeze(d);  // dims ascending
    return best;
  }

 private:
  int64_t k_;
};

}  // namespace torch_semiring
