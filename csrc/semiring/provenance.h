// Provenance versions of the selective semirings (viterbi, max_abs, max_prod,
// kmax): "Viterbi with back-pointers". A value holds E selected entries per
// element (viterbi/max_abs: the best score; max_prod: M and m; kmax: the k
// best scores) followed by E ids saying where each entry came from:
//     layout (2E, *S) = (score_0 … score_{E−1}, id_0 … id_{E−1})
// ⊕ selects entries (ids travel with them; ties keep the left operand, so the
// first contribution delivered wins), ⊗ by an edge transforms scores and keeps
// ids (max_prod swaps M and m — and their ids — on a negative edge). The
// engine re-seeds ids at every node (with_origin) and tags them with the
// contribution they arrive as (tag_contributor); following them back from an
// input element walks the best path(s). ids are stored in the value's dtype:
// the engine checks they stay exactly representable.
#pragma once
#include "kmax.h"
#include "semiring.h"

#include "kernels/cpu_gemm.h"
#include "kernels/device_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class ProvenanceSemiring final : public Semiring {
 public:
  enum class Kind { MaxPlus, MaxTimes, Signed, TopK };
  ProvenanceSemiring(Kind kind, int64_t k) : kind_(kind), E_(kind == Kind::Signed ? 2 : kind == Kind::TopK ? k : 1) {
    TORCH_CHECK(E_ >= 1, "torch_semiring: kmax paths need k >= 1");
  }
  std::string name() const override {
    switch (kind_) {
      case Kind::MaxPlus: return "viterbi+paths";
      case Kind::MaxTimes: return "max_abs+paths";
      case Kind::Signed: return "max_prod+paths";
      default: return "kmax+paths";
    }
  }
  Kind kind() const { return kind_; }
  int64_t components() const override { return 2 * E_; }
  bool tracks_origin() const override { return true; }
  int64_t origin_entries() const override { return E_; }
  Tensor readout(const Tensor& v) const override {
    return kind_ == Kind::TopK ? scores(v).movedim(0, -1) : scores(v).select(0, 0);
  }
  // At kernel speed: the max-plus / max-times / max_prod / kmax GEMMs report
  // which term won each entry, and the ids are gathered from that (the
  // generic block versions select with argmax too).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = matmul_with_ids(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    if (kind_ == Kind::TopK) {  // winners as i·E + entry
      Tensor winner;
      auto best = kernels::topk_rows(scores(a), x, &winner);
      if (best.defined()) {
        auto fast = kernels::winners_with_ids(best.to(a.scalar_type()), winner, ids(a), E_);  // one pass (CPU)
        if (fast.defined()) return fast;
        auto id = ids(a);  // (E, R, N) → (R, N·E) with column i·E + e
        auto flat = id.permute({1, 2, 0}).reshape({id.size(1), -1});
        auto index = winner.to(at::kLong).clamp_min(0);  // (E, R, N)
        auto picked = flat.unsqueeze(0).expand({E_, -1, -1}).gather(2, index);
        picked = at::where(winner < 0, -1.0, picked);
        return at::cat({best.to(a.scalar_type()), picked.to(a.scalar_type())}, 0);
      }
    }
    if (single_entry()) {
      Tensor winner;
      auto best = kernels::max_rows(scores(a).select(0, 0), x, /*log_space=*/kind_ == Kind::MaxPlus, &winner);
      if (best.defined()) {
        auto fast = kernels::winners_with_ids(best.to(a.scalar_type()).unsqueeze(0), winner.unsqueeze(0), ids(a), 1);
        if (fast.defined()) return fast;
        auto index = winner.to(at::kLong).clamp_min(0);
        auto picked = at::where(winner < 0, -1.0, ids(a).select(0, 0).gather(1, index));
        return at::stack({best.to(a.scalar_type()), picked.to(a.scalar_type())});
      }
    }
    return Semiring::norm_offdiagonal(a, x);
  }
  Tensor with_origin(const Tensor& v, int64_t first) const override {
    auto fast = kernels::origin_ids(v, E_, first);  // one pass (CPU)
    if (fast.defined()) return fast;
    auto elements = v.numel() / v.size(0);
    auto flat = at::arange(first, first + elements, v.options()).view(v.sizes().slice(1));
    auto entry = at::arange(E_, v.options()).view(pad_shape(v.dim()));
    return at::cat({scores(v), flat.unsqueeze(0) * E_ + entry}, 0);
  }
  Tensor tag_contributor(const Tensor& v, int64_t e, int64_t n) const override {
    auto fast = kernels::tag_ids(v, E_, n, e);  // one pass (CPU)
    if (fast.defined()) return fast;
    return at::cat({scores(v), at::where(ids(v) >= 0, ids(v) * n + e, ids(v))}, 0);
  }

 protected:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  bool single_entry() const { return kind_ == Kind::MaxPlus || kind_ == Kind::MaxTimes; }
  // The GEMM kernel with argmax where its preconditions hold (else
  // undefined). A winner is k·E + entry (the term of entry `entry` of g[…, k];
  // −1: no path), so the ids of g, flattened to columns k·E + entry, are
  // gathered by it for every kind.
  Tensor matmul_with_ids(const Tensor& g, const Tensor& w) const {
    auto s = scores(g), id = ids(g);
    kernels::BatchedOperands ops, id_ops;
    const bool on_device = single_entry() && kernels::device::routes(s, w);  // argmax GEMMs there: max-plus/-times
    if (!(kernels::kernel_dtype(s, w) || on_device) || !kernels::broadcast_operands(s, w, ops) ||
        !kernels::broadcast_operands(id, w, id_ops) || ops.g.size(-1) == 0)
      return {};
    for (auto d : ops.out_shape)
      if (d == 0) return {};
    Tensor values, winner;  // (E, *batch, M, N) each
    if (kind_ == Kind::Signed) {
      std::tie(values, winner) = kernels::max_prod_matmul_argmax(s, w);
    } else if (kind_ == Kind::TopK) {
      std::tie(values, winner) = kernels::kmax_matmul_argmax(s, w, E_);
    } else {  // max_matmul_argmax raises outside its range: check first
      const auto wr = kernels::range_of(w), sr = kernels::range_of(s);
      if (!std::isfinite(wr.first) || !std::isfinite(wr.second) || !(sr.second < kInf)) return {};  // NaN fails too
      if (kind_ == Kind::MaxTimes && !(sr.first >= 0)) return {};
      std::tie(values, winner) = kernels::max_matmul_argmax(kind_ == Kind::MaxPlus ? "viterbi" : "max_abs", s, w);
      winner = winner.unsqueeze(0);
    }
    if (!values.defined()) return {};
    auto fast = kernels::winners_with_ids(values, winner, id_ops.g, E_);  // one pass (CPU)
    if (fast.defined()) return fast;
    auto candidates = id_ops.g.movedim(0, -1).flatten(-2, -1);  // (*batch, M, K·E): column k·E + entry
    auto index = winner.to(at::kLong).clamp_min(0);
    auto shape = index.sizes().vec();
    shape.back() = candidates.size(-1);
    auto picked = candidates.unsqueeze(0).expand(shape).gather(-1, index);
    picked = at::where(winner < 0, -1.0, picked);
    return at::cat({values, picked.to(values.scalar_type())}, 0);
  }
  Tensor scores(const Tensor& v) const { return v.narrow(0, 0, E_); }
  Tensor ids(const Tensor& v) const { return v.narrow(0, E_, E_); }
  std::vector<int64_t> pad_shape(int64_t dim) const {
    std::vector<int64_t> s(dim, 1);
    s[0] = E_;
    return s;
  }
  Tensor pack(const Tensor& s, const Tensor& i) const { return at::cat({s, i}, 0); }
  Tensor no_ids(const Tensor& s) const { return at::full_like(s, -1); }

  Tensor do_zero(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    std::vector<double> c(2 * E_, -1.0);
    double z = kind_ == Kind::MaxTimes ? 0.0 : -kInf;
    for (int64_t r = 0; r < E_; ++r) c[r] = z;
    if (kind_ == Kind::Signed) c[1] = kInf;
    return constant_value(c, shape, o);
  }
  Tensor do_one(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    std::vector<double> c(2 * E_, -1.0);
    for (int64_t r = 0; r < E_; ++r) c[r] = kind_ == Kind::TopK && r > 0 ? -kInf : (kind_ == Kind::MaxPlus || kind_ == Kind::TopK ? 0.0 : 1.0);
    return constant_value(c, shape, o);
  }
  Tensor do_lift(const Tensor& w) const override {
    std::vector<int64_t> shape(w.sizes().begin(), w.sizes().end());
    auto s = one(shape, w.options());
    return do_otimes_edge(s, w);
  }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override {
    TORCH_CHECK(false, "torch_semiring: ", name(), " combines values with edges only (value ⊗ value has no "
                "single back-pointer); this rule needs a rule written with otimes_edge");
  }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    auto s = scores(a);
    auto id = ids(a);
    switch (kind_) {
      case Kind::MaxPlus:
      case Kind::TopK: {
        auto fused = kernels::fused_edge(kernels::Fused::AddLogAbsIds, a, w);  // scores and ids, one pass (E ≤ 8)
        if (fused.defined()) return fused;
        auto lifted = add_log_abs_scores(s, w);
        return pack(lifted, id.expand(at::infer_size(id.sizes(), lifted.sizes())));
      }
      case Kind::MaxTimes: {
        auto out = times_abs_edge(s, w);
        return pack(out, id.expand(out.sizes()));
      }
      default: {
        auto M = s.select(0, 0), m = s.select(0, 1);
        auto hi = M * w, lo = m * w;
        auto negative = (w < 0).expand_as(hi);
        auto empty = (M == -kInf).logical_or(w == 0);
        auto newM = at::where(empty, -kInf, at::where(negative, lo, hi));
        auto newm = at::where(empty, kInf, at::where(negative, hi, lo));
        auto idM = id.select(0, 0).expand_as(hi), idm = id.select(0, 1).expand_as(hi);
        auto newIdM = at::where(empty, -1.0, at::where(negative, idm, idM));
        auto newIdm = at::where(empty, -1.0, at::where(negative, idM, idm));
        return at::stack({newM, newm, newIdM, newIdm});
      }
    }
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override {
    auto shape = at::infer_size(a.sizes(), b.sizes());
    auto A = a.expand(shape), B = b.expand(shape);
    if (kind_ == Kind::TopK) {
      auto fused = kernels::fused_pair(kernels::Fused::KMaxMergeIds, a, b);  // one pass (E ≤ 8)
      if (fused.defined()) return fused;
      auto s = at::cat({scores(A), scores(B)}, 0), i = at::cat({ids(A), ids(B)}, 0);
      auto order = std::get<1>(s.sort(std::optional<bool>(true), 0, /*descending=*/true)).narrow(0, 0, E_);
      return pack(s.gather(0, order), i.gather(0, order));
    }
    auto sa = scores(A), sb = scores(B);
    Tensor take_b;
    if (kind_ == Kind::Signed) {
      take_b = at::stack({sb.select(0, 0) > sa.select(0, 0), sb.select(0, 1) < sa.select(0, 1)});
    } else {
      take_b = sb > sa;
    }
    return pack(at::where(take_b, sb, sa), at::where(take_b, ids(B), ids(A)));
  }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    if (dims.empty()) return a;
    if (kind_ == Kind::TopK) {  // one pass, no copies (kernels/elementwise.h)
      auto out = kernels::kmax_reduce(a, dims, E_, /*with_ids=*/true);
      if (out.defined()) {
        if (keepdim)
          for (auto d : dims) out = out.unsqueeze(d);
        return out;
      }
    }
    // reduced dims to the end, flattened: select there, gather the ids.
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
    auto x = a.permute(order).reshape(flat);  // (2E, *kept, R)
    auto s = scores(x), id = ids(x);
    Tensor best_s, best_id;
    if (kind_ == Kind::TopK) {
      auto cand_s = s.movedim(0, -1).flatten(-2, -1);  // (*kept, E·R)
      auto cand_i = id.movedim(0, -1).flatten(-2, -1);
      // E of the E·R candidates: a selection, not a sort
      auto pick = std::get<1>(cand_s.topk(E_, -1, /*largest=*/true, /*sorted=*/true));
      best_s = cand_s.gather(-1, pick).movedim(-1, 0);
      best_id = cand_i.gather(-1, pick).movedim(-1, 0);
    } else if (kind_ == Kind::Signed) {
      auto iM = s.select(0, 0).argmax(-1, true), im = s.select(0, 1).argmin(-1, true);
      best_s = at::stack({s.select(0, 0).gather(-1, iM).squeeze(-1), s.select(0, 1).gather(-1, im).squeeze(-1)});
      best_id = at::stack({id.select(0, 0).gather(-1, iM).squeeze(-1), id.select(0, 1).gather(-1, im).squeeze(-1)});
    } else {
      auto i = s.argmax(-1, true);  // first maximum: deterministic ties
      best_s = s.gather(-1, i).squeeze(-1);
      best_id = id.gather(-1, i).squeeze(-1);
    }
    auto out = pack(best_s, best_id);
    if (keepdim)
      for (auto d : dims) out = out.unsqueeze(d);
    return out;
  }

 private:
  Kind kind_;
  int64_t E_;
};

}  // namespace torch_semiring
