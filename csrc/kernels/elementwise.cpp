// The fused element-wise kernels (see elementwise.h): a TensorIterator over
// the operands' component views, and per instruction set a loop that runs an
// op of fused_ops.inc on vectors where every operand is contiguous or
// broadcast (stride 0), on one lane elsewhere.
//
// Each instruction set's code is compiled under `#pragma GCC target` in a
// namespace of its own: GCC lowers wide-vector code in functions compiled for
// the baseline before inlining them into a target function (comparisons
// combined into masks come out scalar), so the ops and vector_math.h must be
// compiled in the target itself. The namespaces keep the three copies'
// symbols apart.
#include "kernels/elementwise.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu_gemm.h"  // kernel_isa
#include "kernels/cpu_vectors.h"  // VecOf, for vector_math.h
#include "kernels/device_gemm.h"  // fused_elementwise
#include "kernels/tile_arithmetic.h"  // TS_UNROLL, for fused_ops.inc

// How fused_ops.inc marks its functions here: always inlined into the loops.
#define TS_FUSED_FN inline __attribute__((always_inline))

namespace torch_semiring::kernels {

namespace {

// The loop over one run of n elements: data/strides as TensorIterator gives
// them, outputs first.
using Loop = void (*)(char** data, const int64_t* strides, int64_t n);

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma")
namespace avx512 {
constexpr int kVectorBytes = 64;
#include "kernels/vector_math.h"
#include "kernels/fused_ops.inc"
#include "kernels/elementwise_loops.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
constexpr int kVectorBytes = 32;
#include "kernels/vector_math.h"
#include "kernels/fused_ops.inc"
#include "kernels/elementwise_loops.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace portable {
constexpr int kVectorBytes = 16;
#include "kernels/vector_math.h"
#include "kernels/fused_ops.inc"
#include "kernels/elementwise_loops.inc"
}  // namespace portable

template <class T>
Loop pick_loop(Fused op, bool pair, int64_t components) {
  const std::string isa = kernel_isa();
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return avx512::pick<T>(op, pair, components);
  if (isa == "avx2") return avx2::pick<T>(op, pair, components);
#endif
  return portable::pick<T>(op, pair, components);
}

// One of a kernel's three builds, by kernel_isa().
template <class F>
F by_isa([[maybe_unused]] F avx512, [[maybe_unused]] F avx2, F portable) {
#if defined(__x86_64__) || defined(__i386__)
  const std::string isa = kernel_isa();
  if (isa == "avx512") return avx512;
  if (isa == "avx2") return avx2;
#endif
  return portable;
}
#if defined(__x86_64__) || defined(__i386__)
#define TS_BY_ISA(fn) by_isa(&avx512::fn, &avx2::fn, &portable::fn)
#else
#define TS_BY_ISA(fn) by_isa(&portable::fn, &portable::fn, &portable::fn)
#endif

using ShiftedRow = void (*)(const double*, double, double*, int64_t);
template <bool Log, bool Single>
ShiftedRow pick_shifted_row() {
  if constexpr (Single) return TS_BY_ISA(shifted_row_single<Log>);
  else return TS_BY_ISA(shifted_row<Log>);
}

bool applies(const std::vector<at::Tensor>& operands) {
  const auto dtype = operands[0].scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  for (const auto& t : operands)
    if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != dtype ||
        (at::GradMode::is_enabled() && t.requires_grad()))
      return false;
  return true;
}

// values: the value operands (C, *S) (one for ⊗ edge, two for ⊕); w: the
// plain edge weights for ⊗ (undefined for ⊕).
at::Tensor run(Fused op, const std::vector<at::Tensor>& values, const at::Tensor& w) {
  if (!values[0].device().is_cpu() || device::routes_elementwise(values[0]))
    return device::fused_elementwise(op, values, w);  // the CUDA kernel, or its emulation
  std::vector<at::Tensor> all(values);
  if (w.defined()) all.push_back(w);
  if (!applies(all)) return {};
  const int64_t C = values[0].size(0);
  for (const auto& v : values)
    if (v.dim() < 1 || v.size(0) != C) return {};
  const bool pair = !w.defined();
  Loop loop = values[0].scalar_type() == at::kFloat ? pick_loop<float>(op, pair, C) : pick_loop<double>(op, pair, C);
  if (!loop) return {};
  // Component views; the iterator config keeps references, so they live here.
  std::vector<at::Tensor> inputs;
  for (const auto& v : values)
    for (int64_t c = 0; c < C; ++c) inputs.push_back(v.select(0, c));
  if (w.defined()) inputs.push_back(w);
  std::vector<int64_t> shape = inputs[0].sizes().vec();
  for (const auto& t : inputs) shape = at::infer_size(shape, t.sizes());
  std::vector<int64_t> full{C};
  full.insert(full.end(), shape.begin(), shape.end());
  auto out = at::empty(full, values[0].options());
  std::vector<at::Tensor> outputs;
  for (int64_t c = 0; c < C; ++c) outputs.push_back(out.select(0, c));
  auto config = at::TensorIteratorConfig();
  config.set_check_mem_overlap(false).check_all_same_dtype(true).resize_outputs(false);
  for (const auto& o : outputs) config.add_output(o);
  for (const auto& t : inputs) config.add_const_input(t);
  auto iter = config.build();
  iter.for_each([loop](char** d, const int64_t* s, int64_t n) { loop(d, s, n); });
  return out;
}

// Offsets (in elements) of every index of `sizes` in row-major order.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<int64_t> out{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(out.size() * sizes[d]);
    for (auto o : out)
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(o + i * strides[d]);
    out.swap(next);
  }
  return out;
}

template <class T>
bool kmax_reduce_rows(const T* a, int64_t a_c, const std::vector<int64_t>& kept, const std::vector<int64_t>& reduced,
                      int64_t k, bool with_ids, T* out, int64_t out_c) {
  std::atomic<bool> nan{false};
  at::parallel_for(0, int64_t(kept.size()), 256, [&](int64_t o0, int64_t o1) {
    std::vector<T> score(k), id(k);
    bool seen_nan = false;
    for (int64_t o = o0; o < o1; ++o) {
      std::fill(score.begin(), score.end(), -std::numeric_limits<T>::infinity());
      std::fill(id.begin(), id.end(), T(-1));
      for (const int64_t r : reduced) {
        const T* list = a + kept[o] + r;
        for (int64_t e = 0; e < k; ++e) {
          const T x = list[e * a_c];
          if (!(x > score[k - 1])) {  // the list descends: no later entry enters either
            for (int64_t f = e; f < k; ++f) seen_nan |= list[f * a_c] != list[f * a_c];  // (a NaN anywhere: decline)
            break;
          }
          int64_t p = k - 1;
          for (; p > 0 && x > score[p - 1]; --p) score[p] = score[p - 1], id[p] = id[p - 1];
          score[p] = x;
          id[p] = with_ids ? list[(k + e) * a_c] : T(0);
        }
      }
      for (int64_t c = 0; c < k; ++c) {
        out[c * out_c + o] = score[c];
        if (with_ids) out[(k + c) * out_c + o] = id[c];
      }
    }
    if (seen_nan) nan = true;
  });
  return !nan;
}

}  // namespace

void exp_shifted(const double* a, double shift, double* out, int64_t n, bool in_float) {
  (in_float ? pick_shifted_row<false, true>() : pick_shifted_row<false, false>())(a, shift, out, n);
}
void log_shifted(const double* a, double shift, double* out, int64_t n, bool in_float) {
  (in_float ? pick_shifted_row<true, true>() : pick_shifted_row<true, false>())(a, shift, out, n);
}

bool exp_scaled_rows_(const at::Tensor& x, double scale, const at::Tensor& shift) {
  const int64_t n = x.dim() > 0 ? x.size(-1) : 0;
  if (n == 0 || shift.numel() * n != x.numel() || shift.scalar_type() != x.scalar_type() || !applies({x, shift}) ||
      !x.is_contiguous() || !shift.is_contiguous())
    return false;
  const int64_t rows = shift.numel();
  if (x.scalar_type() == at::kFloat)
    TS_BY_ISA(exp_scaled_rows<float>)(x.data_ptr<float>(), shift.data_ptr<float>(), float(scale), rows, n);
  else
    TS_BY_ISA(exp_scaled_rows<double>)(x.data_ptr<double>(), shift.data_ptr<double>(), scale, rows, n);
  return true;
}

bool abs_in_place_may_hold_nan(const at::Tensor& t) {
  if (!applies({t}) || !t.is_contiguous()) {
    t.abs_();
    return !t.device().is_cpu() || std::isnan(t.sum().item<double>());  // (a device tensor is not read back)
  }
  if (t.scalar_type() == at::kFloat) return TS_BY_ISA(abs_finding_nan<float>)(t.data_ptr<float>(), t.numel());
  return TS_BY_ISA(abs_finding_nan<double>)(t.data_ptr<double>(), t.numel());
}

template <class T>
bool exp_shift_rows(const T* a, const T* h, const T* shift, int64_t shift_rows, T* p, T* ph, int64_t rows,
                    int64_t n) {
  return TS_BY_ISA(exp_shift_rows<T>)(a, h, shift, shift_rows, p, ph, rows, n);
}
template <class T>
void log_add_shifts(T* z, T* d, const T* s, const T* t, int64_t t_rows, int64_t rows, int64_t n) {
  TS_BY_ISA(log_add_shifts<T>)(z, d, s, t, t_rows, rows, n);
}
template <class T>
void divide_columns_and_log(T* q, T* ql, const T* m, int64_t m_rows, int64_t rows, int64_t n) {
  TS_BY_ISA(divide_columns_and_log<T>)(q, ql, m, m_rows, rows, n);
}
#define TS_ROW_PASSES(T)                                                                                  \
  template bool exp_shift_rows<T>(const T*, const T*, const T*, int64_t, T*, T*, int64_t, int64_t);       \
  template void log_add_shifts<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t);                  \
  template void divide_columns_and_log<T>(T*, T*, const T*, int64_t, int64_t, int64_t);
TS_ROW_PASSES(float)
TS_ROW_PASSES(double)
#undef TS_ROW_PASSES

at::Tensor kmax_reduce(const at::Tensor& a, at::IntArrayRef dims, int64_t k, bool with_ids) {
  if (k < 1 || !a.defined() || a.dim() < 1 || a.size(0) != (with_ids ? 2 * k : k) || !applies({a})) return {};
  std::vector<int64_t> kept_sizes, kept_strides, red_sizes, red_strides;
  for (int64_t d = 1; d < a.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    (reduced ? red_sizes : kept_sizes).push_back(a.size(d));
    (reduced ? red_strides : kept_strides).push_back(a.stride(d));
  }
  std::vector<int64_t> shape{a.size(0)};
  shape.insert(shape.end(), kept_sizes.begin(), kept_sizes.end());
  auto out = at::empty(shape, a.options());
  const auto kept = offsets_of(kept_sizes, kept_strides), reduced = offsets_of(red_sizes, red_strides);
  const int64_t out_c = int64_t(kept.size());
  const bool ok = a.scalar_type() == at::kFloat
                      ? kmax_reduce_rows(a.data_ptr<float>(), a.stride(0), kept, reduced, k, with_ids,
                                         out.data_ptr<float>(), out_c)
                      : kmax_reduce_rows(a.data_ptr<double>(), a.stride(0), kept, reduced, k, with_ids,
                                         out.data_ptr<double>(), out_c);
  return ok ? out : at::Tensor();
}

namespace {
// The new value with v's scores copied, and its id rows (E, |S|) to fill
// with fill(ids_out, ids_in) (ids_in contiguous); undefined where it does not apply.
template <class Fill>
at::Tensor with_new_ids(const at::Tensor& v, int64_t E, Fill fill) {
  if (E < 1 || !v.defined() || v.dim() < 1 || v.size(0) != 2 * E || !applies({v})) return {};
  auto out = at::empty(v.sizes(), v.options());
  out.narrow(0, 0, E).copy_(v.narrow(0, 0, E));
  const auto ids = v.narrow(0, E, E).contiguous();
  if (v.scalar_type() == at::kFloat) fill(out.data_ptr<float>() + out.stride(0) * E, ids.data_ptr<float>());
  else fill(out.data_ptr<double>() + out.stride(0) * E, ids.data_ptr<double>());
  return out;
}
}  // namespace

at::Tensor tag_ids(const at::Tensor& v, int64_t E, int64_t n, int64_t e) {
  const int64_t count = v.defined() ? v.numel() / 2 : 0;
  return with_new_ids(v, E, [&](auto* out, const auto* in) {
    using T = std::remove_pointer_t<decltype(out)>;
    at::parallel_for(0, count, 1 << 14, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) out[i] = in[i] >= T(0) ? in[i] * T(n) + T(e) : in[i];
    });
  });
}

namespace {
// out[o] = id0 + o·step for o < n. The ids are exact integers in T (the
// engine checks), so a running sum gives the products' values; it runs a
// vector at a time (the per-element int64 → float conversion of the direct
// form stays scalar at -O2: ~5 % of a top_paths(k=5) pass in perf).
template <class T>
void write_ramp(T* out, int64_t n, int64_t id0, int64_t step) {
  using V = typename VecOf<T, 64>::type;  // split into the baseline's registers by GCC
  constexpr int64_t L = 64 / sizeof(T);
  V v;
  for (int64_t l = 0; l < L; ++l) v[l] = T(id0 + l * step);
  const V stride = V{} + T(L * step);
  int64_t o = 0;
  for (; o + L <= n; o += L, v += stride) std::memcpy(out + o, &v, sizeof(V));
  for (; o < n; ++o) out[o] = T(id0 + o * step);
}
}  // namespace

at::Tensor origin_ids(const at::Tensor& v, int64_t E, int64_t first) {
  const int64_t elements = v.defined() && v.dim() >= 1 && v.size(0) > 0 ? v.numel() / v.size(0) : 0;
  return with_new_ids(v, E, [&](auto* out, const auto*) {
    for (int64_t entry = 0; entry < E; ++entry)
      at::parallel_for(0, elements, 1 << 14, [&](int64_t o0, int64_t o1) {
        write_ramp(out + entry * elements + o0, o1 - o0, (first + o0) * E + entry, E);
      });
  });
}

at::Tensor winners_with_ids(const at::Tensor& values, const at::Tensor& winner, const at::Tensor& ids, int64_t E) {
  if (E < 1 || !values.defined() || !winner.defined() || !ids.defined() || !applies({values, ids}) ||
      winner.scalar_type() != at::kInt || !winner.device().is_cpu() || !winner.sizes().equals(values.sizes()) ||
      values.dim() < 3 || ids.dim() != values.dim() || ids.size(0) != E)
    return {};
  const int64_t d = values.dim();
  for (int64_t i = 1; i < d - 1; ++i)
    if (ids.size(i) != values.size(i)) return {};
  const int64_t C = values.size(0), N = values.size(-1), K = ids.size(-1);
  std::vector<int64_t> row_sizes, row_strides;  // (*B, M) of ids
  for (int64_t i = 1; i < d - 1; ++i) row_sizes.push_back(ids.size(i)), row_strides.push_back(ids.stride(i));
  const auto rows = offsets_of(row_sizes, row_strides);
  const int64_t R = int64_t(rows.size());
  const auto win = winner.contiguous();
  auto out_sizes = values.sizes().vec();
  out_sizes[0] = 2 * C;
  auto out = at::empty(out_sizes, values.options());
  out.narrow(0, 0, C).copy_(values);
  std::atomic<bool> bad{false};
  // x / E and x % E with E a constant where it is small (the usual k ≤ 8): a
  // 64-bit division per output was the larger part of this pass in perf.
  auto fill = [&](auto* o, const auto* id, auto entries) {
    using T = std::remove_pointer_t<decltype(o)>;
    const int64_t EE = entries.value ? int64_t(entries.value) : E;
    const int32_t* w = win.data_ptr<int32_t>();
    const int64_t e_stride = ids.stride(0), k_stride = ids.stride(-1), limit = K * EE;
    at::parallel_for(0, C * R, 16, [&](int64_t q0, int64_t q1) {
      bool ok = true;
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t r = q % R;
        const int32_t* wr = w + q * N;
        T* orow = o + q * N;
        for (int64_t n = 0; n < N; ++n) {
          const int64_t x = wr[n];
          ok &= x >= -1 && x < limit;
          orow[n] = x >= 0 && x < limit ? id[rows[r] + x % EE * e_stride + x / EE * k_stride] : T(-1);
        }
      }
      if (!ok) bad = true;
    });
  };
  auto by_entries = [&](auto* o, const auto* id) {
    switch (E) {
      case 1: return fill(o, id, std::integral_constant<int, 1>{});
      case 2: return fill(o, id, std::integral_constant<int, 2>{});
      case 3: return fill(o, id, std::integral_constant<int, 3>{});
      case 4: return fill(o, id, std::integral_constant<int, 4>{});
      case 5: return fill(o, id, std::integral_constant<int, 5>{});
      case 6: return fill(o, id, std::integral_constant<int, 6>{});
      case 7: return fill(o, id, std::integral_constant<int, 7>{});
      case 8: return fill(o, id, std::integral_constant<int, 8>{});
      default: return fill(o, id, std::integral_constant<int, 0>{});  // 0: E at run time
    }
  };
  if (values.scalar_type() == at::kFloat) by_entries(out.data_ptr<float>() + C * R * N, ids.data_ptr<float>());
  else by_entries(out.data_ptr<double>() + C * R * N, ids.data_ptr<double>());
  return bad ? at::Tensor() : out;
}

at::Tensor fused_edge(Fused op, const at::Tensor& a, const at::Tensor& w) { return run(op, {a}, w); }
at::Tensor fused_pair(Fused op, const at::Tensor& a, const at::Tensor& b) { return run(op, {a, b}, at::Tensor()); }

}  // namespace torch_semiring::kernels
