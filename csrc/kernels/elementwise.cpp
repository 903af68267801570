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

#include <ATen/TensorIterator.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu_gemm.h"  // kernel_isa

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

}  // namespace

at::Tensor fused_edge(Fused op, const at::Tensor& a, const at::Tensor& w) { return run(op, {a}, w); }
at::Tensor fused_pair(Fused op, const at::Tensor& a, const at::Tensor& b) { return run(op, {a, b}, at::Tensor()); }

}  // namespace torch_semiring::kernels
