// Generic rules that cover whole families of autograd nodes, each defined by
// the structure of its Jacobian rather than by op (JAX's deflinear-style
// combinators). Which node belongs to which family is data: the pointwise list
// is generated from native_functions.yaml tags at build time, the others are
// the tables at the bottom of this file.
#include <torch/csrc/autograd/generated/Functions.h>

#include <algorithm>

#include "kernels/elementwise.h"  // abs_in_place_may_hold_nan
#include "pointwise_nodes.h"  // generated: kPointwiseNodes
#include "rule.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

std::vector<Tensor> ones_where_defined(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  std::vector<Tensor> ones(grads.size());
  for (size_t j = 0; j < grads.size(); ++j)
    if (grads[j].defined()) ones[j] = at::ones(ctx.output_shape(j), ctx.output_options(j));
  return ones;
}

}  // namespace

// ---- pointwise: diagonal Jacobian (rule.h) ---------------------------------------
// The node's own backward applied to ones is the diagonal of its Jacobian, at
// the broadcast shape (the engine ⊕-reduces broadcast dims afterwards).
// The general way: the node's backward of ones is the diagonal, ⊗ the value.
std::vector<Tensor> diagonal_rule_by_ones(const RuleContext& ctx, const std::vector<Tensor>& grads);

namespace {
void check_one_value_arrives(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  for (size_t j = 1; j < grads.size(); ++j)
    TORCH_CHECK(!grads[j].defined(), "torch_semiring: ", ctx.node.name(), " has a value arriving at its output ",
                j, ", which its diagonal (element-wise) rule does not read; register a rule with "
                "ts.register_rule");
}

// Semirings whose ⊗ by an edge scales a magnitude (abs, max_abs:
// Semiring::edge_scales_magnitude): a·|d| = |a·d|, and a·d is what the
// node's own backward returns for the incoming value a — a backward is linear
// in its gradient, element by element here. So the backward runs on the value
// itself and |·| is taken in place: one pass over the output where ones, the
// backward of ones and the ⊗ pass took three (a MiniLM-128 GELU: ~50 µs of
// ~450). Rounding: one product where the ⊗ rounded d and then a·|d| (a
// backward of several factors, grad·(1 − y)·y, rounds them in its own order).
// A zero value meeting a NaN or infinite d gives NaN here, where the edge
// semantics give 0 (semiring/zero_edges.h): those entries are masked as
// times_abs_edge masks them. Undefined where it does not apply: another
// semiring, a graph-building call, a value in a dtype other than the
// output's (bf16 models carry float32 values), weights that come back in
// another dtype (complex inputs).
std::vector<Tensor> diagonal_by_scaled_backward(const RuleContext& ctx, const Tensor& g) {
  if (!ctx.semiring.edge_scales_magnitude() || ctx.create_graph || g.size(0) != 1) return {};
  const auto opts = ctx.output_options(0);
  if (g.scalar_type() != c10::typeMetaToScalarType(opts.dtype()) || g.device() != opts.device()) return {};
  const auto O = ctx.output_shape(0);
  const Tensor a = g.select(0, 0);
  if (a.sizes() != at::IntArrayRef(O)) return {};
  auto w = ctx.call_backward({a});
  std::vector<Tensor> out(ctx.node.num_outputs());
  for (size_t i = 0; i < w.size() && i < out.size(); ++i) {
    if (!ctx.needs(i) || !w[i].defined()) continue;
    if (w[i].scalar_type() != g.scalar_type() || w[i].sizes() != at::IntArrayRef(O) ||
        !at::is_expandable_to(ctx.input_shape(i), O))
      return {};  // (the general rule decides, and names what is wrong)
    bool shared = w[i].is_alias_of(a);  // (a backward may return its grad, or one tensor twice)
    for (size_t e = 0; e < i; ++e) shared = shared || (out[e].defined() && w[i].is_alias_of(out[e]));
    Tensor m = shared ? w[i].clone() : w[i];
    if (kernels::abs_in_place_may_hold_nan(m)) m.masked_fill_(a == 0, 0);
    out[i] = m.unsqueeze(0);
  }
  return out;
}
}  // namespace

std::vector<Tensor> diagonal_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  check_one_value_arrives(ctx, grads);
  const Tensor& g = grads[0];
  if (g.defined() && c10::multiply_integers(ctx.output_shape(0)) != 1) {
    auto scaled = diagonal_by_scaled_backward(ctx, g);
    if (!scaled.empty()) return scaled;
  }
  return diagonal_rule_by_ones(ctx, grads);
}

std::vector<Tensor> diagonal_rule_by_ones(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  std::vector<Tensor> out(ctx.node.num_outputs());
  const Tensor& g = grads[0];
  check_one_value_arrives(ctx, grads);
  if (!g.defined()) return out;
  std::vector<Tensor> ones(grads.size());
  const auto O = ctx.output_shape(0);
  ones[0] = at::ones(O, ctx.output_options(0));
  auto w = ctx.call_backward(std::move(ones));
  const bool single = c10::multiply_integers(O) == 1;
  const Tensor v = single ? g.reshape({g.size(0)}) : g;
  for (size_t i = 0; i < w.size() && i < out.size(); ++i) {
    if (!ctx.needs(i) || !w[i].defined()) continue;
    const auto I = ctx.input_shape(i);
    const auto W = w[i].sizes().vec();
    const bool exact = single ? W == I : (W == O && at::is_expandable_to(I, O));
    TORCH_CHECK(exact, "torch_semiring: element-wise rule of ", ctx.node.name(), ": backward weights of shape ",
                at::IntArrayRef(W), " for input ", i, " of shape ", at::IntArrayRef(I), " and output of shape ",
                at::IntArrayRef(O), " are not one edge per element pair; register a rule with ts.register_rule");
    out[i] = ctx.semiring.otimes_edge(v, w[i].scalar_type() == v.scalar_type() ? w[i] : w[i].to(v.scalar_type()));
  }
  return out;
}

// MulBackward0, the commonest element-wise node of transformers (gates,
// norm scales, rotary embeddings): its diagonal is the other operand, which
// the node saved — read off directly instead of running the backward on a
// tensor of ones (an allocation, a fill and a product per operand: half the
// cost of a max_abs or count Mul node at 64×1376). The weight takes the dtype
// the stock backward's grad·other has (mul_tensor_backward), then the value's.
// Complex operands and one-element outputs take the general diagonal rule.
std::vector<Tensor> mul_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  const auto O = ctx.output_shape(0);
  if (grads.empty() || !grads[0].defined() || c10::multiply_integers(O) == 1) return diagonal_rule(ctx, grads);
  for (size_t j = 1; j < grads.size(); ++j)
    if (grads[j].defined()) return diagonal_rule(ctx, grads);  // (its error message)
  auto& node = static_cast<MulBackward0&>(ctx.node);
  const Tensor& g = grads[0];
  const auto out_opts = ctx.output_options(0);
  std::vector<Tensor> weights(2);
  for (size_t i = 0; i < 2; ++i) {
    if (!ctx.needs(i)) continue;
    Tensor w = ctx.unpack(i == 0 ? node.other_ : node.self_);
    if (!w.defined() || w.is_complex() || !at::is_expandable_to(w.sizes(), O)) return diagonal_rule(ctx, grads);
    w = w.to(at::result_type(at::empty({0}, out_opts), w));  // as grad·w in the output's dtype
    if (w.device() != g.device()) w = w.to(g.device());  // a Python number (a CPU 0-dim tensor) times a device tensor
    weights[i] = w.scalar_type() == g.scalar_type() ? w : w.to(g.scalar_type());
  }
  std::vector<Tensor> out(ctx.node.num_outputs());
  for (size_t i = 0; i < 2 && i < out.size(); ++i)
    if (weights[i].defined()) out[i] = ctx.semiring.otimes_edge(g, weights[i].expand(O));
  return out;
}

// AddBackward0 with alpha = 1 (residual connections): both weights are 1 and
// ⊗ lift(1) is the identity in every semiring, so the value at the output is
// each input's value, as is — no tensor of ones, no backward call, no ⊗ pass
// (for viterbi or log that pass takes a logarithm per element). Other alphas
// take the general diagonal rule.
std::vector<Tensor> add_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  const auto& alpha = static_cast<AddBackward0&>(ctx.node).alpha;
  const bool unit = !alpha.isComplex() && alpha.toDouble() == 1.0;
  if (!unit || grads.empty() || !grads[0].defined() || c10::multiply_integers(ctx.output_shape(0)) == 1)
    return diagonal_rule(ctx, grads);
  for (size_t j = 1; j < grads.size(); ++j)
    if (grads[j].defined()) return diagonal_rule(ctx, grads);  // (its error message)
  std::vector<Tensor> out(ctx.node.num_outputs());
  for (size_t i = 0; i < out.size(); ++i)
    if (ctx.needs(i)) out[i] = grads[0];
  return out;
}

std::vector<Tensor> declared_diagonal_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  const auto O = ctx.output_shape(0);
  // One output element: J is one row, which diagonal_rule reads off exactly.
  if (grads.empty() || !grads[0].defined() || c10::multiply_integers(O) == 1) return diagonal_rule(ctx, grads);
  const auto opts = ctx.output_options(0);
  const auto dtype = c10::typeMetaToScalarType(opts.dtype());
  // Distinct values in [0.5, 1.5) without touching the RNG: the fractional
  // parts of k·(golden ratio).
  const Tensor probe = at::arange(c10::multiply_integers(O), opts.dtype(at::kDouble))
                           .mul_(0.6180339887498949).frac_().add_(0.5).to(dtype).reshape(O);
  std::vector<Tensor> with_probe(grads.size()), with_ones(grads.size());
  with_probe[0] = probe;
  with_ones[0] = at::ones(O, opts);
  const auto by_probe = ctx.call_backward(std::move(with_probe));
  const auto by_ones = ctx.call_backward(std::move(with_ones));
  const bool reduced = dtype == at::kHalf || dtype == at::kBFloat16;
  const double rtol = dtype == at::kDouble ? 1e-9 : reduced ? 1e-2 : 1e-5;
  for (size_t i = 0; i < by_probe.size() && i < by_ones.size(); ++i) {
    if (!ctx.needs(i) || !by_probe[i].defined() || !by_ones[i].defined()) continue;
    const bool same_shape = by_probe[i].sizes() == by_ones[i].sizes() && by_ones[i].sizes() == at::IntArrayRef(O);
    const Tensor expected = same_shape ? probe * by_ones[i] : Tensor();
    const bool diagonal = same_shape && at::allclose(by_probe[i], expected, rtol, rtol * 1e-3, /*equal_nan=*/true);
    TORCH_CHECK(diagonal, "torch_semiring: ", ctx.node.name(), " was declared pointwise (ts.register_pointwise), "
                "but its backward is not element-wise for input ", i, ": the backward of a probe r differs from "
                "r times the backward of ones, so its Jacobian is not diagonal. Register a rule for its true "
                "Jacobian with ts.register_rule instead");
  }
  return diagonal_rule_by_ones(ctx, grads);  // (one probe shows the backward diagonal, not linear in general)
}

Tensor zero_where_unreached(const Semiring& sr, const Tensor& moved, const Tensor& reached) {
  return at::where(reached != 0, moved, sr.zero(reached.sizes(), moved.options()));
}

namespace {

// ---- placement: every input element takes the value of at most one output
// element, with weight 1 (views, permutations, slices, cat/split, scatter of
// values …). The node's own backward moves each component into place; where it
// fills unreached positions with 0 we put the semiring zero instead.
std::vector<Tensor> place(const RuleContext& ctx, const std::vector<Tensor>& grads, bool injective) {
  const auto& sr = ctx.semiring;
  const int64_t C = sr.components();
  std::vector<std::vector<Tensor>> moved(C);
  for (int64_t c = 0; c < C; ++c) {
    std::vector<Tensor> part(grads.size());
    for (size_t j = 0; j < grads.size(); ++j)
      if (grads[j].defined()) part[j] = grads[j].select(0, c);
    moved[c] = ctx.call_backward(std::move(part));
  }
  std::vector<Tensor> reached;
  if (injective && !sr.zero_is_numeric_zero()) reached = ctx.call_backward(ones_where_defined(ctx, grads));
  std::vector<Tensor> out(moved[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!ctx.needs(i) || !moved[0][i].defined()) continue;
    std::vector<Tensor> comps;
    for (int64_t c = 0; c < C; ++c) comps.push_back(moved[c][i]);
    out[i] = at::stack(comps);
    if (!reached.empty()) out[i] = zero_where_unreached(sr, out[i], reached[i]);
  }
  return out;
}
std::vector<Tensor> bijective_rule(const RuleContext& ctx, const std::vector<Tensor>& g) { return place(ctx, g, false); }

// The commonest placements by their own index arithmetic on the whole
// (C, *S) value — a view, or one fill with the zero and one copy — instead of
// C calls of the node's backward, a stack and a reach mask (3–6 passes).
std::vector<int64_t> value_shape(const RuleContext& ctx, size_t input) {
  auto shape = ctx.input_shape(input);
  shape.insert(shape.begin(), ctx.semiring.components());
  return shape;
}
int64_t value_dim(int64_t dim, const std::vector<int64_t>& value_shape) {  // an element dim, in the value
  return at::maybe_wrap_dim(dim, int64_t(value_shape.size()) - 1) + 1;
}
std::optional<int64_t> as_int(const std::optional<c10::SymInt>& v) {
  return v ? std::optional<int64_t>(v->expect_int()) : std::nullopt;
}
// view / reshape / _unsafe_view: the same elements in another shape.
std::vector<Tensor> reshape_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0) || !grads[0].defined()) return {};
  return {grads[0].reshape(value_shape(ctx, 0))};
}
// x[..., start:end:step, ...]: the zero, the slice's value copied in.
std::vector<Tensor> slice_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0) || !grads[0].defined()) return {};
  auto& n = static_cast<SliceBackward0&>(ctx.node);
  const auto shape = value_shape(ctx, 0);
  auto out = ctx.semiring.zero(std::vector<int64_t>(shape.begin() + 1, shape.end()), grads[0].options());
  out.slice(value_dim(n.dim, shape), as_int(n.start), as_int(n.end), n.step.expect_int()).copy_(grads[0]);
  return {out};
}
// x.select(dim, index): the zero, the selected value copied in.
std::vector<Tensor> select_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0) || !grads[0].defined()) return {};
  auto& n = static_cast<SelectBackward0&>(ctx.node);
  const auto shape = value_shape(ctx, 0);
  auto out = ctx.semiring.zero(std::vector<int64_t>(shape.begin() + 1, shape.end()), grads[0].options());
  out.select(value_dim(n.dim, shape), n.index.expect_int()).copy_(grads[0]);
  return {out};
}
// cat: every input is a narrow of the output (views; legacy 1-D empty inputs
// are skipped by cat and get an empty value).
std::vector<Tensor> cat_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<CatBackward0&>(ctx.node);
  const auto& g = grads[0];
  std::vector<Tensor> out(n.tensors_args_sizes_symint.size());
  if (!g.defined()) return out;
  const std::vector<int64_t> g_shape(g.sizes().begin(), g.sizes().end());
  const int64_t dim = value_dim(n.dim, g_shape);
  int64_t offset = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto& sizes = n.tensors_args_sizes_symint[i];
    if (sizes.size() == 1 && sizes[0] == 0) {
      if (ctx.needs(i)) out[i] = at::empty({g.size(0), 0}, g.options());
      continue;
    }
    const int64_t size = sizes[dim - 1].expect_int();
    if (ctx.needs(i)) out[i] = g.narrow(dim, offset, size);
    offset += size;
  }
  return out;
}
std::vector<Tensor> injective_rule(const RuleContext& ctx, const std::vector<Tensor>& g) { return place(ctx, g, true); }

// ---- broadcast: expand's backward is a sum over the broadcast dims, which is
// exactly the engine's ⊕-reduction to the input shape.
std::vector<Tensor> broadcast_rule(const RuleContext&, const std::vector<Tensor>& grads) { return {grads[0]}; }

// ---- identity: output j is input j, weight 1 (torch.nn.modules._functions.
// BackwardHookFunction, which module full backward hooks put around a module's
// inputs and outputs so that their node hooks see the gradients; the hooks
// themselves are called by the engine, engine/node_hooks.h).
std::vector<Tensor> identity_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  std::vector<Tensor> out(std::min(grads.size(), ctx.node.next_edges().size()));
  for (size_t j = 0; j < out.size(); ++j)
    if (ctx.needs(j)) out[j] = grads[j];
  return out;
}

// ---- reductions: every input element feeds exactly one output element (sum,
// mean, amax, max.dim, prod, norm, logsumexp, var …). The weight of that one
// edge is the node's backward applied to ones; the value arriving is the
// output's, broadcast back over the reduced dims.
struct Reduced {
  std::vector<int64_t> dims;  // empty: all dims
  bool keepdim;
};
std::vector<int64_t> as_dims(int64_t d) { return {d}; }
std::vector<int64_t> as_dims(const std::vector<int64_t>& d) { return d; }
std::vector<int64_t> as_dims(const c10::OptionalArray<int64_t>& d) { return d.list ? *d.list : std::vector<int64_t>{}; }
template <class N>
Reduced reduced_by_fields(Node& n) {
  auto& f = static_cast<N&>(n);
  return {as_dims(f.dim), f.keepdim};
}
Reduced reduced_all(Node&) { return {{}, false}; }
// nll_loss: each log-probability feeds the loss of its own sample (reduction
// 'none': the class dim is reduced) or the single scalar loss.
template <class N>
Reduced reduced_by_nll_loss(Node& n) {
  auto& f = static_cast<N&>(n);
  if (f.reduction != 0 || f.self_.unpack().dim() == 1) return {{}, false};
  return {{1}, false};
}

Rule reduction_rule(Reduced (*reduced)(Node&)) {
  return [reduced](const RuleContext& ctx, const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    if (!ctx.needs(0)) return {};
    auto weights = ctx.call_backward(ones_where_defined(ctx, grads));
    const auto in_shape = ctx.input_shape(0);
    const int64_t rank = in_shape.size();
    auto r = reduced(ctx.node);
    Tensor g = grads[0];
    if (!r.keepdim) {
      std::vector<int64_t> dims;
      if (r.dims.empty())
        for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
      else
        for (auto d : r.dims) dims.push_back(at::maybe_wrap_dim(d, std::max<int64_t>(rank, 1)));
      std::sort(dims.begin(), dims.end());
      for (auto d : dims)
        if (d < rank && g.dim() - 1 < rank) g = g.unsqueeze(d + 1);
    }
    std::vector<int64_t> full{g.size(0)};
    full.insert(full.end(), in_shape.begin(), in_shape.end());
    return {ctx.semiring.otimes_edge(g.expand(full), weights[0])};
  };
}

// ---- selection: every output element copies one input element (indexing,
// index_select, gather, embedding); inputs may be picked several times, so
// their values are ⊕-scattered. Which input element each output copies is
// found by running the forward selection on the input's flat positions. An
// optional per-output weight covers embedding's padding_idx (weight 0: no
// edge) and scale_grad_by_freq.
using Positions = Tensor (*)(Node&, const Tensor& positions);
using Weights = Tensor (*)(const RuleContext&);
Rule selection_rule(Positions select, Weights weigh = nullptr) {
  return [select, weigh](const RuleContext& ctx, const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    if (!ctx.needs(0)) return {};
    const auto in_shape = ctx.input_shape(0);
    const int64_t numel = c10::multiply_integers(in_shape);
    Tensor g = grads[0];
    auto positions = at::arange(numel, g.options().dtype(at::kLong)).view(in_shape);  // on the value's device
    auto source = select(ctx.node, positions).reshape(-1);
    if (weigh) g = ctx.semiring.otimes_edge(g, weigh(ctx).to(g.scalar_type()));
    auto out = ctx.semiring.scatter_oplus(g.reshape({g.size(0), -1}), source, numel);
    std::vector<int64_t> shape{g.size(0)};
    shape.insert(shape.end(), in_shape.begin(), in_shape.end());
    return {out.view(shape)};
  };
}
Tensor embedding_positions(Node& n, const Tensor& p) {
  auto indices = static_cast<EmbeddingBackward0&>(n).indices_.unpack();
  auto shape = indices.sizes().vec();
  shape.push_back(p.size(1));
  return p.index_select(0, indices.reshape(-1)).view(shape);
}
Tensor embedding_weights(const RuleContext& ctx) {
  auto& n = static_cast<EmbeddingBackward0&>(ctx.node);
  auto indices = n.indices_.unpack();
  auto w = indices.ne(n.padding_idx.expect_int()).to(ctx.output_options(0).dtype());
  if (n.scale_grad_by_freq) {
    // counted with index_add, not bincount: bincount's length depends on the data (a host read)
    auto flat = indices.reshape(-1);
    auto counts = at::zeros({n.weight_sym_argsize_0.expect_int()}, flat.options().dtype(at::kLong))
                      .index_add_(0, flat, at::ones_like(flat, at::kLong));
    w = w / counts.index_select(0, flat).view(indices.sizes()).to(w.scalar_type());
  }
  return w.unsqueeze(-1);
}
Tensor index_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<IndexBackward0&>(n);
  c10::List<std::optional<Tensor>> indices;
  for (auto& s : f.indices_) {
    auto t = s.unpack();
    indices.push_back(t.defined() ? std::optional<Tensor>(t) : std::nullopt);
  }
  return at::index(p, indices);
}
Tensor index_select_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<IndexSelectBackward0&>(n);
  return p.index_select(f.dim, f.index_.unpack());
}
Tensor gather_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<GatherBackward0&>(n);
  return p.gather(f.dim, f.index_.unpack());
}

// More selections: where each output element copies one input element, found
// by running the op (or its saved argmax indices) on the flat positions.
Tensor saved_of(Node& n, const torch::autograd::SavedVariable& v) {
  return v.unpack(hold_node(&n));
}
Tensor repeat_positions(Node& n, const Tensor& p) {
  return p.repeat_symint(static_cast<RepeatBackward0&>(n).repeats);
}
Tensor take_positions(Node& n, const Tensor& p) { return p.take(static_cast<TakeBackward0&>(n).index_.unpack()); }
Tensor masked_select_positions(Node& n, const Tensor& p) {
  return p.masked_select(static_cast<MaskedSelectBackward0&>(n).mask_.unpack());
}
template <class N>
Tensor unfold_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<N&>(n);
  return p.unfold(f.dimension, f.size, f.step);
}
template <class N>
Tensor cummaxmin_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<N&>(n);
  return p.gather(f.dim, saved_of(n, f.indices_));
}
// max pooling: result1 holds each output's argmax as a flat index into its
// plane of `spatial` dims.
template <class N, int spatial>
Tensor pool_positions(Node& n, const Tensor& p) {
  auto idx = saved_of(n, static_cast<N&>(n).result1_);
  return p.flatten(-spatial).gather(-1, idx.flatten(-spatial)).view(idx.sizes());
}

// Nearest upsampling and reflection / replication padding copy one input
// element into each output: run the same forward, on the positions as float64
// (exact below 2^53), and read them back.
Tensor as_positions(const Tensor& copied) { return copied.round().to(at::kLong); }
Tensor upsample_nearest1d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearest1DBackward0&>(n);
  return as_positions(at::upsample_nearest1d_symint(p.to(at::kDouble), f.output_size, f.scales));
}
Tensor upsample_nearest_exact1d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearestExact1DBackward0&>(n);
  return as_positions(at::_upsample_nearest_exact1d_symint(p.to(at::kDouble), f.output_size, f.scales));
}
Tensor upsample_nearest2d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearest2DBackward0&>(n);
  return as_positions(at::upsample_nearest2d_symint(p.to(at::kDouble), f.output_size, f.scales_h, f.scales_w));
}
Tensor upsample_nearest_exact2d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearestExact2DBackward0&>(n);
  return as_positions(
      at::_upsample_nearest_exact2d_symint(p.to(at::kDouble), f.output_size, f.scales_h, f.scales_w));
}
Tensor upsample_nearest3d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearest3DBackward0&>(n);
  return as_positions(
      at::upsample_nearest3d_symint(p.to(at::kDouble), f.output_size, f.scales_d, f.scales_h, f.scales_w));
}
Tensor upsample_nearest_exact3d_positions(Node& n, const Tensor& p) {
  auto& f = static_cast<UpsampleNearestExact3DBackward0&>(n);
  return as_positions(
      at::_upsample_nearest_exact3d_symint(p.to(at::kDouble), f.output_size, f.scales_d, f.scales_h, f.scales_w));
}
#define TS_PAD_POSITIONS(Node_, op)                                          \
  Tensor op##_positions(Node& n, const Tensor& p) {                          \
    return as_positions(at::op##_symint(p.to(at::kDouble), static_cast<Node_&>(n).padding)); \
  }
TS_PAD_POSITIONS(ReflectionPad1DBackward0, reflection_pad1d)
TS_PAD_POSITIONS(ReflectionPad2DBackward0, reflection_pad2d)
TS_PAD_POSITIONS(ReflectionPad3DBackward0, reflection_pad3d)
TS_PAD_POSITIONS(ReplicationPad1DBackward0, replication_pad1d)
TS_PAD_POSITIONS(ReplicationPad2DBackward0, replication_pad2d)
TS_PAD_POSITIONS(ReplicationPad3DBackward0, replication_pad3d)
#undef TS_PAD_POSITIONS

// ---- scans: cumsum's Jacobian is 1 for every j <= i along dim, so input j
// collects ⊕_{i>=j} g_i, a reverse inclusive prefix-⊕.
std::vector<Tensor> cumsum_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0) || !grads[0].defined()) return {Tensor()};
  const auto& g = grads[0];
  if (g.dim() == 1) return {g};  // a 0-d input: cumsum is the identity
  return {ctx.semiring.prefix_oplus(g, static_cast<CumsumBackward0&>(ctx.node).dim, /*reverse=*/true)};
}

// _ctc_loss: log_probs (T, N, C) (always batched; ctc_loss unsqueezes an
// unbatched input) feeds only the loss of its own sample n (the log_alpha
// output is not differentiable): a reduction over dims {0, 2}. Frames past
// input_lengths[n] get weight 0, i.e. no edge.
Reduced reduced_by_ctc_loss(Node&) { return {{0, 2}, false}; }

// ---- the tables ---------------------------------------------------------------
// Views, permutations and copies: every input element is reached.
const char* const kBijective[] = {
    "PermuteBackward0",
    "TransposeBackward0", "TransposeBackward1",  "TBackward0",            "UnsqueezeBackward0",
    "UnsqueezeBackward1", "SqueezeBackward0",    "SqueezeBackward1",      "SqueezeBackward2",
    "SqueezeBackward3",   "SqueezeBackward4",    "AliasBackward0",        "FlipBackward0",
    "RollBackward0",      "StackBackward0",      "ToCopyBackward0",
    // the *_copy variants, shuffles, sort (a permutation along dim), and the
    // double backward of nearest upsampling (each grad_output element is summed
    // into exactly one input pixel: its backward gathers it back)
    "PermuteBackward0_copy", "SqueezeBackward0_copy", "SqueezeBackward1_copy", "SqueezeBackward2_copy",
    "SqueezeBackward5", "PixelShuffleBackward0", "PixelUnshuffleBackward0", "ChannelShuffleBackward0",
    "SortBackward0", "SortBackward1",
    "UpsampleNearest1DBackwardBackward0", "UpsampleNearest2DBackwardBackward0", "UpsampleNearest3DBackwardBackward0",
    "UpsampleNearestExact1DBackwardBackward0", "UpsampleNearestExact2DBackwardBackward0",
    "UpsampleNearestExact3DBackwardBackward0",
};
// Injective placements: some input positions may receive nothing.
const char* const kInjective[] = {
    "SplitBackward0",
    "SplitWithSizesBackward0", "UnbindBackward0",      "DiagonalBackward0",     "TrilBackward0",
    "TriuBackward0",         "ConstantPadNdBackward0", "NarrowCopyBackward0",   "SliceScatterBackward0",
    "SelectScatterBackward0", "ScatterBackward0",      "ScatterBackward1",      "IndexFillBackward0",
    "MaskedScatterBackward0",
    // copy_ into a tensor: the source moves over, the overwritten self gets nothing
    "torch::autograd::CopyBackwards",
    "SelectBackward0_copy", "SliceBackward0_copy", "DiagonalBackward0_copy", "SplitBackward0_copy",
    "SplitWithSizesBackward0_copy", "UnbindBackward0_copy", "UnsafeSplitBackward0", "UnsafeSplitWithSizesBackward0",
    // value-selecting reductions: the selected element takes its output's value, the rest none
    "TopkBackward0", "KthvalueBackward0", "ModeBackward0", "MedianBackward1", "NanmedianBackward1",
    // col2im sums patches into pixels: each patch entry feeds one pixel (padding: none); backward = im2col
    "Col2ImBackward0",
    // max_unpool writes each input at its index; the double backward of max pooling (and of the
    // padding / embedding kernels) scatters each grad_output element into one position: their
    // backward gathers it back, and the original input (formula zero) gets no edge
    "MaxUnpool2DBackward0", "MaxUnpool3DBackward0",
    "MaxPool2DWithIndicesBackwardBackward0", "MaxPool3DWithIndicesBackwardBackward0",
    "AdaptiveMaxPool2DBackwardBackward0", "AdaptiveMaxPool3DBackwardBackward0",
    "FractionalMaxPool2DBackwardBackward0", "FractionalMaxPool3DBackwardBackward0",
    "ReflectionPad1DBackwardBackward0", "ReflectionPad2DBackwardBackward0", "ReflectionPad3DBackwardBackward0",
    "ReplicationPad1DBackwardBackward0", "ReplicationPad2DBackwardBackward0", "ReplicationPad3DBackwardBackward0",
    "EmbeddingDenseBackwardBackward0", "MaskedScatterBackwardBackward0",
};

}  // namespace

// hand-written rules, one file per concept
void register_linear_algebra_rules();  // linear_algebra.cpp
void register_softmax_rules();         // softmax.cpp
void register_in_place_rules();        // in_place.cpp
void register_convolution_rules();     // convolution.cpp
void register_resampling_rules();      // resampling.cpp
void register_normalization_rules();   // normalization.cpp
void register_attention_rules();       // attention.cpp
void register_generated_rules();       // build/generated/generated_rules.cpp (tools/gen_semiring_rules.py)

namespace {
std::vector<std::string>& generic_family_names() {
  static std::vector<std::string> names;
  return names;
}
}  // namespace

const std::vector<std::string>& generic_families() { return generic_family_names(); }

void register_builtin_rules() {
  for (const char* name : kPointwiseNodes) register_rule(name, diagonal_rule, "pointwise");
  register_rule("MulBackward0", mul_rule, "pointwise");  // the diagonal from its saved operands
  register_rule("AddBackward0", add_rule, "pointwise");  // alpha = 1: the identity
  for (const char* name : kBijective) register_rule(name, bijective_rule, "placement");
  for (const char* name : kInjective) register_rule(name, injective_rule, "placement");
  register_rule("ExpandBackward0", broadcast_rule, "broadcast");
  register_rule("BackwardHookFunctionBackward", identity_rule, "identity");
  for (const char* name : {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"})
    register_rule(name, reshape_rule, "placement");
  register_rule("SliceBackward0", slice_rule, "placement");
  register_rule("SelectBackward0", select_rule, "placement");
  register_rule("CatBackward0", cat_rule, "placement");

  register_rule("SumBackward0", reduction_rule(reduced_all), "reduction");
  register_rule("SumBackward1", reduction_rule(reduced_by_fields<SumBackward1>), "reduction");
  register_rule("MeanBackward0", reduction_rule(reduced_all), "reduction");
  register_rule("MeanBackward1", reduction_rule(reduced_by_fields<MeanBackward1>), "reduction");
  register_rule("AmaxBackward0", reduction_rule(reduced_by_fields<AmaxBackward0>), "reduction");
  register_rule("AminBackward0", reduction_rule(reduced_by_fields<AminBackward0>), "reduction");
  register_rule("MaxBackward0", reduction_rule(reduced_by_fields<MaxBackward0>), "reduction");
  register_rule("MaxBackward1", reduction_rule(reduced_all), "reduction");
  register_rule("MinBackward0", reduction_rule(reduced_by_fields<MinBackward0>), "reduction");
  register_rule("MinBackward1", reduction_rule(reduced_all), "reduction");
  register_rule("ProdBackward0", reduction_rule(reduced_all), "reduction");
  register_rule("ProdBackward1", reduction_rule(reduced_by_fields<ProdBackward1>), "reduction");
  register_rule("LogsumexpBackward0", reduction_rule(reduced_by_fields<LogsumexpBackward0>), "reduction");
  register_rule("NormBackward0", reduction_rule(reduced_all), "reduction");
  register_rule("NormBackward1", reduction_rule(reduced_by_fields<NormBackward1>), "reduction");
  register_rule("LinalgVectorNormBackward0", reduction_rule(reduced_by_fields<LinalgVectorNormBackward0>), "reduction");
  register_rule("StdBackward0", reduction_rule(reduced_by_fields<StdBackward0>), "reduction");
  register_rule("VarBackward0", reduction_rule(reduced_by_fields<VarBackward0>), "reduction");
  register_rule("NormBackward2", reduction_rule(reduced_all), "reduction");
  register_rule("NormBackward3", reduction_rule(reduced_by_fields<NormBackward3>), "reduction");
  register_rule("NansumBackward0", reduction_rule(reduced_by_fields<NansumBackward0>), "reduction");
  register_rule("TraceBackward0", reduction_rule(reduced_all), "reduction");  // off-diagonal weights 0: no edge
  register_rule("MedianBackward0", reduction_rule(reduced_all), "reduction");  // ties share 1/count
  register_rule("NanmedianBackward0", reduction_rule(reduced_all), "reduction");

  register_rule("IndexBackward0", selection_rule(index_positions), "selection");
  register_rule("IndexSelectBackward0", selection_rule(index_select_positions), "selection");
  register_rule("GatherBackward0", selection_rule(gather_positions), "selection");
  register_rule("RepeatBackward0", selection_rule(repeat_positions), "selection");
  register_rule("TakeBackward0", selection_rule(take_positions), "selection");
  register_rule("MaskedSelectBackward0", selection_rule(masked_select_positions), "selection");
  register_rule("UnfoldBackward0", selection_rule(unfold_positions<UnfoldBackward0>), "selection");
  register_rule("UnfoldBackward0_copy", selection_rule(unfold_positions<UnfoldBackward0_copy>), "selection");
  register_rule("CummaxBackward0", selection_rule(cummaxmin_positions<CummaxBackward0>), "selection");
  register_rule("CumminBackward0", selection_rule(cummaxmin_positions<CumminBackward0>), "selection");
  register_rule("MaxPool2DWithIndicesBackward0", selection_rule(pool_positions<MaxPool2DWithIndicesBackward0, 2>),
                "selection");
  register_rule("MaxPool3DWithIndicesBackward0", selection_rule(pool_positions<MaxPool3DWithIndicesBackward0, 3>),
                "selection");
  register_rule("AdaptiveMaxPool2DBackward0", selection_rule(pool_positions<AdaptiveMaxPool2DBackward0, 2>), "selection");
  register_rule("AdaptiveMaxPool3DBackward0", selection_rule(pool_positions<AdaptiveMaxPool3DBackward0, 3>), "selection");
  register_rule("FractionalMaxPool2DBackward0", selection_rule(pool_positions<FractionalMaxPool2DBackward0, 2>),
                "selection");
  register_rule("FractionalMaxPool3DBackward0", selection_rule(pool_positions<FractionalMaxPool3DBackward0, 3>),
                "selection");

  register_rule("UpsampleNearest1DBackward0", selection_rule(upsample_nearest1d_positions), "selection");
  register_rule("UpsampleNearest2DBackward0", selection_rule(upsample_nearest2d_positions), "selection");
  register_rule("UpsampleNearest3DBackward0", selection_rule(upsample_nearest3d_positions), "selection");
  register_rule("UpsampleNearestExact1DBackward0", selection_rule(upsample_nearest_exact1d_positions), "selection");
  register_rule("UpsampleNearestExact2DBackward0", selection_rule(upsample_nearest_exact2d_positions), "selection");
  register_rule("UpsampleNearestExact3DBackward0", selection_rule(upsample_nearest_exact3d_positions), "selection");
  register_rule("ReflectionPad1DBackward0", selection_rule(reflection_pad1d_positions), "selection");
  register_rule("ReflectionPad2DBackward0", selection_rule(reflection_pad2d_positions), "selection");
  register_rule("ReflectionPad3DBackward0", selection_rule(reflection_pad3d_positions), "selection");
  register_rule("ReplicationPad1DBackward0", selection_rule(replication_pad1d_positions), "selection");
  register_rule("ReplicationPad2DBackward0", selection_rule(replication_pad2d_positions), "selection");
  register_rule("ReplicationPad3DBackward0", selection_rule(replication_pad3d_positions), "selection");
  register_rule("CumsumBackward0", cumsum_rule, "scan");
  register_rule("CtcLossBackward0", reduction_rule(reduced_by_ctc_loss), "reduction");
  register_rule("CtcLossBackward1", reduction_rule(reduced_by_ctc_loss), "reduction");

  register_rule("NllLossBackward0", reduction_rule(reduced_by_nll_loss<NllLossBackward0>), "reduction");
  register_rule("NllLoss2DBackward0", reduction_rule(reduced_by_nll_loss<NllLoss2DBackward0>), "reduction");
  register_rule("MultiMarginLossBackward0", reduction_rule(reduced_by_nll_loss<MultiMarginLossBackward0>), "reduction");
  register_rule("MultilabelMarginLossBackward0", reduction_rule(reduced_by_nll_loss<MultilabelMarginLossBackward0>),
                "reduction");
  register_rule("EmbeddingBackward0", selection_rule(embedding_positions, embedding_weights), "selection");
  // Everything registered so far is a family of this file.
  auto& generic = generic_family_names();
  generic.clear();
  for (const auto& [node, family] : registered_rules())
    if (std::find(generic.begin(), generic.end(), family) == generic.end()) generic.push_back(family);
  std::sort(generic.begin(), generic.end());

  register_linear_algebra_rules();
  register_softmax_rules();
  register_in_place_rules();
  register_convolution_rules();
  register_resampling_rules();
  register_normalization_rules();
  register_attention_rules();
  // Last, and only for names still without a rule: generic and hand-written rules win.
  register_generated_rules();
}

}  // namespace torch_semiring
