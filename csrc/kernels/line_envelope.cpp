#include "line_envelope.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace torch_semiring::kernels {

namespace {

struct Line {
  double slope, intercept;
  int64_t owner;  // the i it came from
  double at(double x) const { return intercept + slope * x; }
};

// l2 never attains the maximum between l1 and l3 (slopes l1 < l2 < l3).
bool hidden(const Line& l1, const Line& l2, const Line& l3) {
  return (l1.intercept - l3.intercept) * (l2.slope - l1.slope) <= (l1.intercept - l2.intercept) * (l3.slope - l1.slope);
}

void envelope_row(const double* s, const double* u, const double* v, const double* t, double* out, int64_t N) {
  std::vector<Line> lines;
  lines.reserve(2 * N);
  for (int64_t i = 0; i < N; ++i) {
    if (!(s[i] > 0)) continue;  // no edge from i
    const double a = s[i] * u[i], b = s[i] * v[i];
    lines.push_back({b, a, i});
    lines.push_back({-b, -a, i});
  }
  std::sort(lines.begin(), lines.end(), [](const Line& x, const Line& y) {
    return x.slope < y.slope || (x.slope == y.slope && x.intercept < y.intercept);
  });
  std::vector<Line> hull;
  for (const auto& l : lines) {
    if (!hull.empty() && hull.back().slope == l.slope) hull.pop_back();  // same slope: the higher one stays
    while (hull.size() >= 2 && hidden(hull[hull.size() - 2], hull.back(), l)) hull.pop_back();
    hull.push_back(l);
  }
  std::vector<int64_t> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t[a] < t[b]; });
  size_t p = 0;
  for (int64_t j : order) {
    if (hull.empty()) {
      out[j] = 0.0;
      continue;
    }
    while (p + 1 < hull.size() && hull[p + 1].at(t[j]) >= hull[p].at(t[j])) ++p;
    if (hull[p].owner != j) {
      out[j] = std::max(hull[p].at(t[j]), 0.0);
      continue;
    }
    // The best line is j's own (the diagonal, excluded): the max over the others, directly.
    double best = 0.0;
    for (int64_t i = 0; i < N; ++i)
      if (i != j && s[i] > 0) best = std::max(best, s[i] * std::abs(u[i] + v[i] * t[j]));
    out[j] = best;
  }
}

}  // namespace

at::Tensor max_abs_affine(const at::Tensor& s, const at::Tensor& u, const at::Tensor& v, const at::Tensor& t) {
  auto as_double = [](const at::Tensor& x) { return x.to(at::kDouble).contiguous(); };
  auto S = as_double(s), U = as_double(u), V = as_double(v), T = as_double(t);
  const int64_t R = S.size(0), N = S.size(1);
  auto out = at::empty({R, N}, S.options());
  const double *ps = S.data_ptr<double>(), *pu = U.data_ptr<double>(), *pv = V.data_ptr<double>(),
               *pt = T.data_ptr<double>();
  double* po = out.data_ptr<double>();
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      envelope_row(ps + r * N, pu + r * N, pv + r * N, pt + r * N, po + r * N, N);
  });
  return out;
}

}  // namespace torch_semiring::kernels
