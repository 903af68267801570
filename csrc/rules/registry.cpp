// The rule registry (node name → rule), the one function that applies a rule,
// and the RuleContext helpers rules use.
#include <ATen/Dispatch.h>
#include <ATen/record_function.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "engine/process_heap.h"
#include "kernels/cpu_gemm.h"  // TS_CPU_CLONES
#include "rule.h"
#include "summed_within_nodes.h"

namespace torch_semiring {

namespace {
std::unordered_map<std::string, RuleEntry>& table() {
  static std::unordered_map<std::string, RuleEntry> rules;
  return rules;
}
}  // namespace

std::vector<int64_t> metadata_shape(const torch::autograd::InputMetadata& meta) {
  std::vector<int64_t> shape;
  for (const auto& s : meta.shape_as_dim_vector()) shape.push_back(s.expect_int());
  return shape;
}

bool any_value(const std::vector<at::Tensor>& values) {
  return std::any_of(values.begin(), values.end(), [](const at::Tensor& t) { return t.defined(); });
}

void register_rule(const std::string& node_name, Rule rule, const std::string& family,
                   std::function<int64_t(const Node&)> row_length) {
  // ("collective": ⊕ across ranks, never run twice — a rank alone re-running a collective would hang the others.)
  const bool moves_values =
      family == "placement" || family == "broadcast" || family == "identity" || family == "collective";
  table()[node_name] = RuleEntry{std::move(rule), family, moves_values, std::move(row_length)};
}

void unregister_rule(const std::string& node_name) { table().erase(node_name); }

const RuleEntry* find_rule(const std::string& node_name) {
  auto it = table().find(node_name);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, std::string>> registered_rules() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& kv : table()) out.emplace_back(kv.first, kv.second.family);
  std::sort(out.begin(), out.end());
  return out;
}

const RuleEntry& rule_for(const Node& node, const Semiring& sr) {
  if (sr.stock_backward_is_exact()) return stock_backward_rule();
  const RuleEntry* entry = find_rule(node.name());
  TORCH_CHECK_NOT_IMPLEMENTED(entry, "torch_semiring: no semiring rule for autograd node '", node.name(),
                              "' (forward op '", forward_op_of(node), "'). Register one with "
                              "torch_semiring.register_rule('", node.name(), "', rule) — see the "
                              "README section 'Writing a rule'.");
  return *entry;
}

namespace {
std::function<at::Tensor(const at::Tensor&)>& subclass_gatherer() {
  static std::function<at::Tensor(const at::Tensor&)> gather;
  return gather;
}
// A DTensor (or another Python tensor subclass) → through the gatherer (set_subclass_gatherer, declared
// in python/bindings.cpp); anything else as it is.
at::Tensor gathered(at::Tensor t) {
  const auto& gather = subclass_gatherer();
  if (gather && t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) return gather(t);
  return t;
}
}  // namespace

void set_subclass_gatherer(std::function<at::Tensor(const at::Tensor&)> gather) {
  subclass_gatherer() = std::move(gather);
}

namespace {
// The components a semiring splits (Semiring::infinite_split_components):
// all of a value's, or — a product of semirings — those of its parts that do,
// kept as runs of consecutive components so that taking and putting back a
// part are narrows on the value's device (no index tensor to build).
struct SplitComponents {
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first component, count)
  bool all = false;
  explicit SplitComponents(const std::vector<bool>& which) {
    for (int64_t c = 0; c < (int64_t)which.size(); ++c) {
      if (!which[c]) continue;
      if (!runs.empty() && runs.back().first + runs.back().second == c) ++runs.back().second;
      else runs.emplace_back(c, 1);
    }
    all = runs.size() == 1 && runs[0].first == 0 && runs[0].second == (int64_t)which.size();
  }
  bool any() const { return !runs.empty(); }
  at::Tensor part(const at::Tensor& v) const {
    if (all) return v;
    std::vector<at::Tensor> pieces;
    for (auto [first, count] : runs) pieces.push_back(v.narrow(0, first, count));
    return pieces.size() == 1 ? pieces[0] : at::cat(pieces, 0);
  }
  at::Tensor with_part(const at::Tensor& v, const at::Tensor& part) const {
    if (all) return part;
    auto out = v.clone();
    int64_t offset = 0;
    for (auto [first, count] : runs) {
      out.narrow(0, first, count).copy_(part.narrow(0, offset, count));
      offset += count;
    }
    return out;
  }
};

// The two element-wise passes of the split below, vectorised (-O3, a clone per
// ISA picked at load time, as the kernels' packing loops): a count that
// overflowed early goes through both at every node, where scalar loops cost
// ~10 % of the whole backward. Branch-free selects, one or-reduction.
#pragma GCC push_options
#pragma GCC optimize("O3")
template <class T>
inline __attribute__((always_inline)) bool split_impl(const T* x, T* indicator, T* finite, int64_t n) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  int any = 0;  // a finite nonzero entry (NaN counts: it is not infinite); no && (it would branch)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const bool infinite = std::abs(v) == inf;
    indicator[i] = infinite ? T(1) : T(0);
    finite[i] = infinite ? T(0) : v;
    any |= int(!infinite) & int(v != T(0));
  }
  return any != 0;
}
TS_CPU_CLONES bool split_pass(const float* x, float* indicator, float* finite, int64_t n) {
  return split_impl(x, indicator, finite, n);
}
TS_CPU_CLONES bool split_pass(const double* x, double* indicator, double* finite, int64_t n) {
  return split_impl(x, indicator, finite, n);
}
template <class T>
inline __attribute__((always_inline)) void infinite_where_impl(const T* out, const T* reached, T* result, int64_t n) {
  for (int64_t i = 0; i < n; ++i) result[i] = reached[i] > T(0) ? std::numeric_limits<T>::infinity() : out[i];
}
TS_CPU_CLONES void infinite_where_pass(const float* out, const float* reached, float* result, int64_t n) {
  infinite_where_impl(out, reached, result, n);
}
TS_CPU_CLONES void infinite_where_pass(const double* out, const double* reached, double* result, int64_t n) {
  infinite_where_impl(out, reached, result, n);
}
// Whether +∞ is among x[0..n): the per-node check of may_hold_infinite, which
// at::max (NaN-propagating, AVX2 in the CPU wheel) and a host read made ~2 %
// of an abs backward. One compare and an or per element, branch-free.
template <class T>
inline __attribute__((always_inline)) bool any_infinite_impl(const T* x, int64_t n) {
  int any = 0;
  for (int64_t i = 0; i < n; ++i) any |= int(x[i] == std::numeric_limits<T>::infinity());
  return any != 0;
}
TS_CPU_CLONES bool any_positive_infinity(const float* x, int64_t n) { return any_infinite_impl(x, n); }
TS_CPU_CLONES bool any_positive_infinity(const double* x, int64_t n) { return any_infinite_impl(x, n); }
#pragma GCC pop_options

// +∞ among the entries of a CPU tensor (any dtype: other than contiguous float32/float64 by at::max).
bool holds_positive_infinity(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  if (t.is_contiguous() && dtype == at::kFloat) return any_positive_infinity(t.data_ptr<float>(), t.numel());
  if (t.is_contiguous() && dtype == at::kDouble) return any_positive_infinity(t.data_ptr<double>(), t.numel());
  return t.max().item<double>() == std::numeric_limits<double>::infinity();
}

// A split part (CPU, float/double): the 0/1 indicator of the infinite entries,
// the finite part (±∞ → 0) and whether a finite nonzero (or NaN) entry exists,
// in one pass; the finite part is returned only if there is one (once a
// float32 count has overflowed, most values are +∞ or 0: no finite run).
// Elsewhere the same from ATen operations, and off the CPU a finite entry is
// assumed (reading it back would stall the device).
struct SplitValue {
  at::Tensor finite, indicator;  // finite: undefined when nothing finite and nonzero
};
SplitValue split_value(const at::Tensor& v) {
  const auto dtype = v.scalar_type();
  if (!v.device().is_cpu() || (dtype != at::kFloat && dtype != at::kDouble)) {
    const auto infinite = v.isinf();
    auto finite = v.masked_fill(infinite, 0);
    const bool any = !v.device().is_cpu() || (finite.numel() > 0 && finite.max().item<double>() != 0);  // NaN: finite
    return {any ? finite : at::Tensor(), infinite.to(dtype)};
  }
  const auto in = v.contiguous();
  auto indicator = at::empty_like(in);
  auto finite = at::empty_like(in);
  const bool any = dtype == at::kFloat
                       ? split_pass(in.data_ptr<float>(), indicator.data_ptr<float>(), finite.data_ptr<float>(),
                                    in.numel())
                       : split_pass(in.data_ptr<double>(), indicator.data_ptr<double>(), finite.data_ptr<double>(),
                                    in.numel());
  return {any ? finite : at::Tensor(), indicator};
}

// +∞ where reached > 0, else out's entry (a new tensor: out may alias others).
at::Tensor infinite_where_reached(const at::Tensor& out, const at::Tensor& reached) {
  const auto dtype = out.scalar_type();
  if (!out.device().is_cpu() || (dtype != at::kFloat && dtype != at::kDouble) || reached.scalar_type() != dtype ||
      !out.sizes().equals(reached.sizes()))
    return out.masked_fill(reached.gt(0), std::numeric_limits<double>::infinity());
  const auto o = out.contiguous(), r = reached.contiguous();
  auto result = at::empty_like(o);
  if (dtype == at::kFloat)
    infinite_where_pass(o.data_ptr<float>(), r.data_ptr<float>(), result.data_ptr<float>(), o.numel());
  else
    infinite_where_pass(o.data_ptr<double>(), r.data_ptr<double>(), result.data_ptr<double>(), o.numel());
  return result;
}

// Whether a value's split components (≥ 0 or NaN) may hold +∞: one reduction
// per value and a host read — on the CPU a read per value, on a device one read
// per node for all its values (a stream stall). On an H100 that measured as
// fast as or faster than the read-free alternative, answering "yes" on a
// device, which ran every rule of abs / count / max_abs twice (the split run
// below is exact either way): benchmarks/README.md, 2026-11-27. (Meta tensors
// have no data: "yes".)
bool may_hold_infinite(const std::vector<at::Tensor>& values, const SplitComponents& split) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<at::Tensor> device_maxima;
  for (const auto& v : values) {
    if (!v.defined() || v.numel() == 0) continue;
    if (!v.device().is_cpu()) {
      if (v.is_meta()) return true;  // no data to read
      device_maxima.push_back(split.part(v).max().to(at::kFloat));
    } else if (holds_positive_infinity(split.part(v))) {
      return true;
    }
  }
  if (device_maxima.empty()) return false;
  const auto top = device_maxima.size() == 1 ? device_maxima[0] : at::stack(device_maxima).max();  // launches
  return top.item<double>() == inf;
}

// A rule is ⊕-linear in its values, and in these semirings g = f ⊕ ∞·[g = ∞]
// with f = g where finite, else 0. So rule(g) = rule(f) ⊕ ∞·[rule(i) > 0],
// i the 0/1 indicator of the +∞ entries: an output is +∞ exactly where an
// existing edge leads from an infinite value, and both runs are finite. The
// cost is a second run of the rule, only while some value is infinite. (In a
// product the other parts' components go through both runs unchanged.)
std::vector<at::Tensor> rule_with_infinite_values(const RuleEntry& entry, const RuleContext& ctx,
                                                  const std::vector<at::Tensor>& values,
                                                  const SplitComponents& split) {
  std::vector<at::Tensor> finite(values.size()), indicator(values.size()), finite_parts(values.size());
  bool any_finite = !split.all;  // once a float32 count overflowed, often every value is +∞ (or 0)
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) continue;
    auto parts = split_value(split.part(values[i]));
    indicator[i] = split.with_part(values[i], parts.indicator);
    finite_parts[i] = parts.finite;
    any_finite = any_finite || parts.finite.defined();
  }
  if (any_finite)  // a part with nothing finite has the zero (0 in these semirings) as its finite part
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i].defined())
        finite[i] = split.with_part(values[i], finite_parts[i].defined() ? finite_parts[i]
                                                                         : at::zeros_like(split.part(values[i])));
  auto out = any_finite ? entry.rule(ctx, finite) : std::vector<at::Tensor>{};
  auto reached = entry.rule(ctx, indicator);
  out.resize(std::max(out.size(), reached.size()));
  for (size_t j = 0; j < reached.size(); ++j) {
    if (!reached[j].defined()) continue;
    if (!out[j].defined()) out[j] = at::zeros_like(reached[j]);
    out[j] = split.with_part(out[j], infinite_where_reached(split.part(out[j]), split.part(reached[j])));
  }
  return out;
}
}  // namespace

std::vector<at::Tensor> apply_rule(Node& node, const Semiring& sr, const std::function<bool(size_t)>& wanted,
                                   const std::vector<at::Tensor>& values, bool create_graph) {
  keep_freed_heap_for_reuse();  // once per process (engine/process_heap.cpp)
  const auto& next = node.next_edges();
  const size_t edges = next.size();
  if (!any_value(values)) return std::vector<at::Tensor>(edges);
  std::vector<bool> needed(edges, false);
  for (size_t j = 0; j < edges; ++j) needed[j] = next[j].is_valid() && wanted(j);
  if (sums_within_nodes(sr))  // within_node_oplus="sum": the node runs in the semiring's sum twin
    return apply_summed_within_node(node, sr, std::move(needed), values, create_graph);
  const RuleEntry& entry = rule_for(node, sr);
  at::RecordFunction range(at::RecordScope::USER_SCOPE);
  if (range.isActive()) range.before("ts::" + entry.family + "::" + node.name());
  RuleContext ctx{node, sr, create_graph, std::move(needed)};
  const SplitComponents split(sr.infinite_split_components());
  auto out = split.any() && !entry.moves_values && may_hold_infinite(values, split)
                 ? rule_with_infinite_values(entry, ctx, values, split)
                 : entry.rule(ctx, values);
  TORCH_CHECK(out.size() <= edges, "torch_semiring: the rule of ", node.name(), " returned ", out.size(),
              " values for ", edges, " inputs");
  out.resize(edges);
  for (size_t j = 0; j < edges; ++j)
    if (!next[j].is_valid()) out[j] = at::Tensor();  // nothing to deliver it to
  return out;
}

const RuleEntry& stock_backward_rule() {
  static const RuleEntry entry{
      [](const RuleContext& ctx, const std::vector<at::Tensor>& grads) {
        std::vector<at::Tensor> plain;
        for (const auto& g : grads) plain.push_back(g.defined() ? g.select(0, 0) : g);
        auto out = ctx.call_backward(std::move(plain));
        for (auto& t : out)
          if (t.defined()) t = t.unsqueeze(0);
        return out;
      },
      "stock backward"};
  return entry;
}

bool RuleContext::needs_any() const { return std::any_of(needed.begin(), needed.end(), [](bool b) { return b; }); }

std::vector<int64_t> RuleContext::input_shape(size_t i) const {
  const auto& e = node.next_edge(i);
  TORCH_CHECK(e.is_valid(), "torch_semiring: input ", i, " of ", node.name(), " is not differentiable");
  return metadata_shape(e.function->input_metadata(e.input_nr));
}

at::TensorOptions RuleContext::input_options(size_t i) const {
  const auto& e = node.next_edge(i);
  TORCH_CHECK(e.is_valid(), "torch_semiring: input ", i, " of ", node.name(), " is not differentiable");
  return e.function->input_metadata(e.input_nr).options();
}

std::vector<int64_t> RuleContext::output_shape(size_t j) const { return metadata_shape(node.input_metadata(j)); }

at::TensorOptions RuleContext::output_options(size_t j) const { return node.input_metadata(j).options(); }

// A saved bf16/fp16 tensor comes out in the dtype the semiring's values take
// for it (Semiring::value_dtype: float32 outside real), so every rule's
// arithmetic — ATen matmuls included, which do not promote — runs in it.
at::Tensor RuleContext::unpack(const torch::autograd::SavedVariable& saved) const {
  auto t = gathered(saved.unpack(hold_node(&node)));
  if (t.defined()) {
    const auto wide = semiring.value_dtype(t.scalar_type());
    if (wide != t.scalar_type()) t = t.to(wide);
  }
  return t;
}

// Inputs nobody asked for are hidden from the node while it runs (their edges
// swapped out), so its backward skips them as it does under the stock engine's
// pruning (task_should_compute_output) — e.g. no weight gradients when only
// the input embeddings are wanted. The edges are put back, also on error.
std::vector<at::Tensor> RuleContext::call_backward(std::vector<at::Tensor> grads) const {
  struct HiddenEdges {
    Node& node;
    std::vector<std::pair<size_t, torch::autograd::Edge>> hidden;
    ~HiddenEdges() {
      for (auto& [i, edge] : hidden) node.next_edges()[i] = std::move(edge);
    }
  } guard{node, {}};
  auto& edges = node.next_edges();
  for (size_t i = 0; i < edges.size(); ++i)
    if (edges[i].is_valid() && i < needed.size() && !needed[i]) {
      guard.hidden.emplace_back(i, std::move(edges[i]));
      edges[i] = torch::autograd::Edge();
    }
  auto out = node(std::move(grads));
  for (auto& t : out) t = gathered(std::move(t));
  return out;
}

}  // namespace torch_semiring
