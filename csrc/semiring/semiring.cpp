// Shared semiring machinery: rank alignment, the generic blocked matrix
// product and scatter, and the name → semiring table.
#include "semiring.h"

#include "abs.h"
#include "count.h"
#include "entropy.h"
#include "kmax.h"
#include "log.h"
#include "max_abs.h"
#include "max_prod.h"
#include "min_plus.h"
#include "product.h"
#include "provenance.h"
#include "real.h"
#include "viterbi.h"

#include <functional>
#include <map>

namespace torch_semiring {

Tensor pad_rank(const Tensor& t, int64_t rank) {
  if (t.dim() >= rank) return t;
  std::vector<int64_t> shape(rank - t.dim(), 1);
  shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
  return t.view(shape);
}

Tensor pad_value_rank(const Tensor& v, int64_t rank) {
  if (v.dim() - 1 >= rank) return v;
  std::vector<int64_t> shape{v.size(0)};
  shape.insert(shape.end(), rank - (v.dim() - 1), 1);
  shape.insert(shape.end(), v.sizes().begin() + 1, v.sizes().end());
  return v.view(shape);
}

std::vector<int64_t> value_dims(at::IntArrayRef element_dims) {
  std::vector<int64_t> out;
  for (auto d : element_dims) out.push_back(d + 1);
  return out;
}

std::vector<Tensor> components_of(const Tensor& v) { return v.unbind(0); }

// Filled on the value's device, one fill per run of equal components: no host
// tensor is built and copied over (on a GPU that would be a host→device copy
// and a stream stall per zero() / one()).
Tensor constant_value(const std::vector<double>& per_component, at::IntArrayRef shape,
                      const at::TensorOptions& opts) {
  const int64_t C = (int64_t)per_component.size();
  std::vector<int64_t> full{C};
  full.insert(full.end(), shape.begin(), shape.end());
  auto out = at::empty(full, opts);  // contiguous: callers may write into or view it freely
  for (int64_t c0 = 0, c1; c0 < C; c0 = c1) {
    for (c1 = c0 + 1; c1 < C && per_component[c1] == per_component[c0];) ++c1;
    out.narrow(0, c0, c1 - c0).fill_(per_component[c0]);
  }
  return out;
}

Tensor oplus_sum_to(const Semiring& sr, const Tensor& value, at::IntArrayRef target, const std::string& who) {
  const auto element = value.sizes().slice(1);
  if (element.equals(target)) return value;
  TORCH_CHECK(at::is_expandable_to(target, element), "torch_semiring: ", who, " returned a value of element shape ",
              element, ", which cannot be reduced to the input's shape ", target);
  const int64_t lead = (int64_t)element.size() - (int64_t)target.size();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < (int64_t)element.size(); ++d)
    if (d < lead || (target[d - lead] == 1 && element[d] != 1)) dims.push_back(d);
  std::vector<int64_t> shape{value.size(0)};
  shape.insert(shape.end(), target.begin(), target.end());
  return sr.oplus_reduce(value, dims, /*keepdim=*/true).reshape(shape);
}

// ---- public entry points: align ranks, shift dims, delegate -----------------

Tensor Semiring::zero(at::IntArrayRef shape, const at::TensorOptions& o) const { return do_zero(shape, o); }
Tensor Semiring::one(at::IntArrayRef shape, const at::TensorOptions& o) const { return do_one(shape, o); }

Tensor Semiring::otimes(const Tensor& a, const Tensor& b) const {
  auto rank = std::max(a.dim(), b.dim()) - 1;
  return do_otimes(pad_value_rank(a, rank), pad_value_rank(b, rank));
}

Tensor Semiring::otimes_edge(const Tensor& a, const Tensor& w) const {
  auto rank = std::max(a.dim() - 1, w.dim());
  return do_otimes_edge(pad_value_rank(a, rank), pad_rank(w, rank));
}

Tensor Semiring::oplus(const Tensor& a, const Tensor& b) const {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  auto rank = std::max(a.dim(), b.dim()) - 1;
  return do_oplus(pad_value_rank(a, rank), pad_value_rank(b, rank));
}

Tensor Semiring::oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const {
  std::vector<int64_t> sorted;
  for (auto d : dims) sorted.push_back(at::maybe_wrap_dim(d, a.dim() - 1) + 1);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  return do_oplus_reduce(a, sorted, keepdim);
}

// Generic ⊕-⊗ product: walk the contraction dim in blocks, build the
// (…, M, block, N) products of one block at a time, ⊕-reduce the block and
// ⊕-accumulate. The block is sized so the temporary stays within ~16M
// elements, never M·K·N.
Tensor Semiring::matmul(const Tensor& g, const Tensor& w) const {
  TORCH_CHECK(g.dim() >= 3 && w.dim() >= 2, "torch_semiring: matmul needs a value of rank >= 2 "
              "(plus components) and a matrix, got shapes ", g.sizes(), " and ", w.sizes());
  const int64_t K = w.size(-2);
  TORCH_CHECK(g.size(-1) == K, "torch_semiring: matmul contraction mismatch ", g.sizes(), " @ ", w.sizes());
  const int64_t per_k = std::max<int64_t>(1, g.numel() / std::max<int64_t>(K, 1) * w.size(-1));
  const int64_t budget = int64_t(1) << 24;
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(K, budget / per_k));
  Tensor acc;
  for (int64_t k0 = 0; k0 < K; k0 += block) {
    const int64_t kb = std::min(block, K - k0);
    auto gb = g.narrow(-1, k0, kb).unsqueeze(-1);  // (C, …, M, kb, 1)
    auto wb = w.narrow(-2, k0, kb).unsqueeze(-3);  // (…, 1, kb, N)
    auto prod = otimes_edge(gb, wb);               // (C, …, M, kb, N)
    auto part = oplus_reduce(prod, {prod.dim() - 3}, /*keepdim=*/false);
    acc = oplus(acc, part);
  }
  if (!acc.defined()) {  // K == 0: no paths
    auto shape = at::infer_size(g.sizes().slice(1, g.dim() - 3), w.sizes().slice(0, w.dim() - 2));
    shape.push_back(g.size(-2));
    shape.push_back(w.size(-1));
    acc = zero(shape, g.options());
  }
  return acc;
}

// Generic scatter-⊕ as a segmented scan: sort the targets, ⊕ each run of
// equal targets by log-step doubling (step s folds entry j − s into entry j
// when both hit the same target) and write each run's last, complete entry.
// Binary ⊕ only, O(C·n·log m) for a largest multiplicity m, and no
// data-dependent shapes. On the CPU m is read to stop early; on a device the
// scan runs the ⌈log2 n⌉ steps n allows rather than stall on a host read.
Tensor Semiring::scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const {
  const int64_t n = index.numel();
  if (n == 0) return zero({numel}, src.options());
  auto sorted = index.sort(std::optional<bool>(true), /*dim=*/0, /*descending=*/false);
  auto keys = std::get<0>(sorted), order = std::get<1>(sorted);
  auto pos = at::arange(n, index.options());
  auto starts = at::ones({n}, index.options().dtype(at::kBool)), ends = at::ones_like(starts);
  if (n > 1) {
    auto differs = keys.narrow(0, 1, n - 1) != keys.narrow(0, 0, n - 1);
    starts.narrow(0, 1, n - 1).copy_(differs);
    ends.narrow(0, 0, n - 1).copy_(differs);
  }
  auto group_start = std::get<0>(at::where(starts, pos, at::zeros_like(pos)).cummax(0));
  auto rank = pos - group_start;  // occurrence number within its target
  const int64_t span = index.device().is_cpu() ? rank.max().item<int64_t>() + 1 : n;
  auto vals = src.index_select(1, order);
  for (int64_t s = 1; s < span; s *= 2) {
    auto reaches = rank.narrow(0, s, n - s) >= s;  // entry j − s hits j's target
    auto later = vals.narrow(1, s, n - s);
    later.copy_(at::where(reaches, oplus(later, vals.narrow(1, 0, n - s)), later));  // read in full, then written
  }
  // every entry of a run writes the run's total (its last entry): repeated
  // targets then receive one same value, whatever the order of the writes
  auto last = std::get<0>(at::where(ends, pos, at::full_like(pos, n)).flip(0).cummin(0)).flip(0);
  return zero({numel}, src.options()).index_copy_(1, keys, vals.index_select(1, last));
}

namespace {
// out[j] = t[j - s] along value dim d (zero-filled for j < s).
Tensor shifted(const Semiring& sr, const Tensor& t, int64_t s, int64_t d) {
  const int64_t n = t.size(d);
  auto shape = t.sizes().slice(1).vec();
  shape[d - 1] = std::min(s, n);
  auto fill = sr.zero(shape, t.options());
  if (s >= n) return fill;
  return at::cat({fill, t.narrow(d, 0, n - s)}, d);
}
// Inclusive prefix ⊕ along value dim d by log-step doubling (Hillis–Steele).
Tensor doubling_scan(const Semiring& sr, Tensor t, int64_t d) {
  for (int64_t s = 1; s < t.size(d); s *= 2) t = sr.oplus(t, shifted(sr, t, s, d));
  return t;
}
}  // namespace

Tensor Semiring::exclusive_oplus(const Tensor& v, int64_t dim) const {
  const int64_t d = at::maybe_wrap_dim(dim, v.dim() - 1) + 1;
  auto before = shifted(*this, doubling_scan(*this, v, d), 1, d);
  auto after = shifted(*this, doubling_scan(*this, v.flip(d), d), 1, d).flip(d);
  return oplus(before, after);
}

Tensor Semiring::norm_offdiagonal(const Tensor& a, const Tensor& x) const {
  const int64_t R = a.size(1), N = a.size(2);
  TORCH_CHECK_NOT_IMPLEMENTED(N <= 4096, "torch_semiring: semiring ", name(), " builds the ", N, "×", N,
                              " Jacobian block of each normalised row, too large here; the built-in semirings "
                              "have a kernel for it, or normalise fewer elements together (for batch norm: "
                              "model.eval() normalises with running statistics, a diagonal Jacobian)");
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(N * N, 1));
  auto diagonal = at::eye(N, x.options().dtype(at::kBool));
  std::vector<Tensor> parts;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t rows = std::min(chunk, R - r0);
    auto xr = x.narrow(0, r0, rows);
    auto w = (xr.unsqueeze(2) * xr.unsqueeze(1) + 1).masked_fill(diagonal, 0);  // weight 0: no edge i → i here
    parts.push_back(matmul(a.narrow(1, r0, rows).unsqueeze(2), w).squeeze(2));   // (C, rows, N): ⊕ over i
  }
  return at::cat(parts, 1);
}

Tensor Semiring::prefix_oplus(const Tensor& v, int64_t dim, bool reverse) const {
  const int64_t d = at::maybe_wrap_dim(dim, v.dim() - 1) + 1;
  if (!reverse) return doubling_scan(*this, v, d);
  return doubling_scan(*this, v.flip(d), d).flip(d);
}

Tensor Semiring::with_origin(const Tensor&, int64_t) const {
  TORCH_CHECK(false, "torch_semiring: semiring ", name(), " does not track path origins");
}
Tensor Semiring::tag_contributor(const Tensor&, int64_t, int64_t) const {
  TORCH_CHECK(false, "torch_semiring: semiring ", name(), " does not track path origins");
}

// ---- registry ----------------------------------------------------------------

namespace {
using Factory = std::function<SemiringPtr(int64_t k)>;
const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> table = {
      {"real", [](int64_t) { return std::make_shared<RealSemiring>(); }},
      {"abs", [](int64_t) { return std::make_shared<AbsSemiring>(); }},
      {"count", [](int64_t) { return std::make_shared<CountSemiring>(); }},
      {"log", [](int64_t) { return std::make_shared<LogSemiring>(); }},
      {"max_abs", [](int64_t) { return std::make_shared<MaxAbsSemiring>(); }},
      {"viterbi", [](int64_t) { return std::make_shared<ViterbiSemiring>(); }},
      {"max_prod", [](int64_t) { return std::make_shared<MaxProdSemiring>(); }},
      {"min_plus", [](int64_t) { return std::make_shared<MinPlusSemiring>(); }},
      {"entropy", [](int64_t) { return std::make_shared<EntropySemiring>(); }},
      {"kmax", [](int64_t k) { return std::make_shared<KMaxSemiring>(k); }},
  };
  return table;
}
}  // namespace

std::vector<std::string> semiring_names() {
  std::vector<std::string> names;
  for (auto& kv : factories()) names.push_back(kv.first);
  return names;
}

SemiringPtr make_semiring(const std::string& name, int64_t k) {
  auto it = factories().find(name);
  if (it == factories().end()) {
    std::string valid;
    for (auto& n : semiring_names()) valid += (valid.empty() ? "" : ", ") + n;
    TORCH_CHECK_VALUE(false, "torch_semiring: unknown semiring '", name, "'. Valid names: ", valid,
                      " (or pass a Python semiring object).");
  }
  return it->second(k);
}

SemiringPtr make_product(std::vector<SemiringPtr> parts) {
  return std::make_shared<ProductSemiring>(std::move(parts));
}

SemiringPtr make_provenance(const std::string& base, int64_t k) {
  auto semiring = make_semiring(base, k);
  if (!semiring->selects()) {
    std::string selecting;
    for (auto& kv : factories())
      if (kv.second(1)->selects()) selecting += (selecting.empty() ? "" : ", ") + kv.first;
    TORCH_CHECK_VALUE(false, "torch_semiring: semiring '", base, "' has no paths to extract (⊕ must select one "
                      "path: use one of ", selecting, ")");
  }
  return std::make_shared<ProvenanceSemiring>(std::move(semiring));
}

std::vector<Tensor> split_product_value(const Semiring& product, const Tensor& v) {
  auto p = dynamic_cast<const ProductSemiring*>(&product);
  TORCH_CHECK(p, "torch_semiring: ", product.name(), " is not a product semiring");
  return p->split(v);
}

std::vector<SemiringPtr> product_parts(const Semiring& s) {
  auto p = dynamic_cast<const ProductSemiring*>(&s);
  return p ? p->parts() : std::vector<SemiringPtr>{};
}

}  // namespace torch_semiring
