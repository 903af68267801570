// The product of several semirings, so one graph walk serves them all
// (`semiring=("viterbi", "entropy")`). A value is the parts' values
// concatenated along the component dim; every operation splits, delegates and
// concatenates.
#pragma once
#include "semiring.h"

namespace torch_semiring {

class ProductSemiring final : public Semiring {
 public:
  explicit ProductSemiring(std::vector<SemiringPtr> parts) : parts_(std::move(parts)) {
    for (auto& p : parts_) sizes_.push_back(p->components());
  }
  std::string name() const override {
    std::string n = "product(";
    for (size_t i = 0; i < parts_.size(); ++i) n += (i ? "," : "") + parts_[i]->name();
    return n + ")";
  }
  int64_t components() const override {
    int64_t c = 0;
    for (auto s : sizes_) c += s;
    return c;
  }
  Tensor readout(const Tensor&) const override {
    TORCH_CHECK(false, "torch_semiring: read out each part of a product semiring separately");
  }
  std::vector<bool> infinite_split_components() const override {
    std::vector<bool> out;
    for (size_t i = 0; i < parts_.size(); ++i) {
      auto part = parts_[i]->infinite_split_components();
      if (part.empty()) part.assign(sizes_[i], false);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }
  const std::vector<SemiringPtr>& parts() const { return parts_; }
  std::vector<Tensor> split(const Tensor& v) const { return v.split_with_sizes(sizes_, 0); }

  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    return map1(g, [&](const Semiring& s, const Tensor& x) { return s.matmul(x, w); });
  }
  Tensor matmul_nonnegative(const Tensor& g, const Tensor& w) const override {
    return map1(g, [&](const Semiring& s, const Tensor& x) { return s.matmul_nonnegative(x, w); });
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return map1(src, [&](const Semiring& s, const Tensor& x) { return s.scatter_oplus(x, index, numel); });
  }
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    return map1(a, [&](const Semiring& s, const Tensor& v) { return s.norm_offdiagonal(v, x); });
  }
  Tensor exclusive_oplus(const Tensor& v, int64_t dim) const override {
    return map1(v, [&](const Semiring& s, const Tensor& p) { return s.exclusive_oplus(p, dim); });
  }
  Tensor prefix_oplus(const Tensor& v, int64_t dim, bool reverse) const override {
    return map1(v, [&](const Semiring& s, const Tensor& p) { return s.prefix_oplus(p, dim, reverse); });
  }

 protected:
  template <class F>
  Tensor map1(const Tensor& a, F f) const {
    auto pa = split(a);
    std::vector<Tensor> out;
    for (size_t i = 0; i < parts_.size(); ++i) out.push_back(f(*parts_[i], pa[i]));
    return at::cat(out, 0);
  }
  template <class F>
  Tensor map2(const Tensor& a, const Tensor& b, F f) const {
    auto pa = split(a), pb = split(b);
    std::vector<Tensor> out;
    for (size_t i = 0; i < parts_.size(); ++i) out.push_back(f(*parts_[i], pa[i], pb[i]));
    return at::cat(out, 0);
  }
  template <class F>
  Tensor make(F f) const {
    std::vector<Tensor> out;
    for (auto& p : parts_) out.push_back(f(*p));
    return at::cat(out, 0);
  }
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return make([&](const Semiring& p) { return p.zero(s, o); });
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return make([&](const Semiring& p) { return p.one(s, o); });
  }
  Tensor do_lift(const Tensor& w) const override {
    return make([&](const Semiring& p) { return p.lift(w); });
  }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override {
    return map2(a, b, [](const Semiring& s, const Tensor& x, const Tensor& y) { return s.otimes(x, y); });
  }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    return map1(a, [&](const Semiring& s, const Tensor& x) { return s.otimes_edge(x, w); });
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override {
    return map2(a, b, [](const Semiring& s, const Tensor& x, const Tensor& y) { return s.oplus(x, y); });
  }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    std::vector<int64_t> element_dims;
    for (auto d : dims) element_dims.push_back(d - 1);
    return map1(a, [&](const Semiring& s, const Tensor& x) {
      return s.oplus_reduce(x, element_dims, keepdim);
    });
  }

 private:
  std::vector<SemiringPtr> parts_;
  std::vector<int64_t> sizes_;
};

}  // namespace torch_semiring
