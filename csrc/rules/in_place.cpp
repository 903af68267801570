// In-place writes into a view of another tensor (`base[idx] op= ...`,
// `x.diagonal().mul_(2)`): the CopySlices node. Its backward runs the in-place
// op's own node (`fn`) on the part of the base's value that the view covers;
// positions outside the view pass through unchanged, positions inside it take
// what `fn` sends to its view input (the old values there are reached only
// through `fn`: the write replaced them), and `fn`'s other inputs (the `src`
// of copy_, the `other` of mul_) get `fn`'s values directly. The semiring rule
// does the same with `fn`'s semiring rule.
#include <torch/csrc/autograd/functions/tensor.h>
#include <torch/csrc/autograd/graph_task.h>

#include "rule.h"

namespace torch_semiring {

namespace {

using torch::autograd::CopySlices;

// For every element of the view, the (row-major) index of the base element it
// aliases — found as the stock backward finds the slice: an index tensor with
// the base's geometry, viewed through view_fn or the view's strides.
// Made on the value's device: `long_options` are the value's options, as int64.
at::Tensor view_positions(const CopySlices& node, const at::TensorOptions& long_options) {
  auto index = at::empty_strided(node.base.sizes(), node.base.strides(), long_options);
  index.copy_(at::arange(index.numel(), index.options()).view(node.base.sizes()));
  auto viewed = node.view_fn ? (*node.view_fn)(index)
                             : index.as_strided(node.view.sizes(), node.view.strides(),
                                                node.view.storage_offset() - node.base.storage_offset());
  return viewed.reshape(-1);
}

std::vector<Tensor> copy_slices_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& node = static_cast<CopySlices&>(ctx.node);
  Node& fn = *node.fn;
  const auto& sr = ctx.semiring;
  const Tensor& g = grads.at(0);  // (C, *base)
  const int64_t C = sr.components();
  const auto positions = view_positions(node, g.options().dtype(at::kLong));
  const auto view_shape = node.view.sizes().vec();
  std::vector<int64_t> slice_shape{C};
  slice_shape.insert(slice_shape.end(), view_shape.begin(), view_shape.end());
  const auto flat = g.reshape({C, -1});
  auto slice = flat.index_select(1, positions).view(slice_shape);

  // fn's inputs: 0 is the view (before the write), i >= 1 are CopySlices' own
  // next edges i. Under the stock engine, fn is outside the graph task's
  // exec_info until the stock backward adds it; do the same.
  if (torch::autograd::get_current_graph_task_exec_info()) node.update_exec_info();
  RuleContext inner{fn, sr, ctx.create_graph, std::vector<bool>(fn.num_outputs(), false)};
  inner.needed[0] = ctx.needs(0);
  for (size_t i = 1; i < inner.needed.size(); ++i) inner.needed[i] = ctx.needs(i);
  auto from_fn = rule_for(fn, sr).rule(inner, {slice});

  std::vector<Tensor> out(ctx.node.num_outputs());
  if (ctx.needs(0)) {
    auto into_view = from_fn.empty() || !from_fn[0].defined()
                         ? sr.zero(view_shape, g.options())
                         : oplus_sum_to(sr, from_fn[0], view_shape, "the rule of " + fn.name());
    out[0] = flat.index_copy(1, positions, into_view.reshape({C, -1}).to(flat.scalar_type())).view(g.sizes());
  }
  for (size_t i = 1; i < out.size() && i < from_fn.size(); ++i)
    if (ctx.needs(i)) out[i] = from_fn[i];
  return out;
}

}  // namespace

void register_in_place_rules() { register_rule("torch::autograd::CopySlices", copy_slices_rule, "in-place"); }

}  // namespace torch_semiring
