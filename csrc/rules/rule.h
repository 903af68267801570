// A semiring rule: the semiring analogue of a node's backward. Given the
// semiring values arriving at a node's outputs, it returns the value for each
// of the node's inputs (one per next edge):
//     v_in[e] = ⊕_o  g[o] ⊗ lift(J[o, e])
// over the node's true local Jacobian J, computed with the op's structure.
// Rules are found by autograd node name (JAX-style registry); the engine knows
// no op.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <functional>
#include <string>
#include <vector>

#include "../engine/node_compat.h"
#include "../semiring/semiring.h"

namespace torch_semiring {

using torch::autograd::Node;

struct RuleContext {
  Node& node;
  const Semiring& semiring;
  bool create_graph;
  // needed[i]: next edge i leads to a requested input, so its value is wanted.
  std::vector<bool> needed;

  bool needs(size_t i) const { return i < needed.size() && needed[i]; }
  bool needs_any() const;
  // Shape / options of the tensor behind next edge i (the node's forward input).
  std::vector<int64_t> input_shape(size_t i) const;
  at::TensorOptions input_options(size_t i) const;
  // Shape / options of the node's forward output j (where grads arrive).
  std::vector<int64_t> output_shape(size_t j) const;
  at::TensorOptions output_options(size_t j) const;
  // A saved tensor of the node (saved outputs such as result_ need the node).
  at::Tensor unpack(const torch::autograd::SavedVariable& saved) const;
  // Calls the node's own (stock) backward on plain tensors.
  std::vector<at::Tensor> call_backward(std::vector<at::Tensor> grads) const;
};

// grads: one value per node output, undefined = zero. Returns one value per
// next edge (undefined = zero; unneeded entries may be left undefined). A
// returned value may have the broadcast shape of the forward op: the engine
// ⊕-reduces it to the input's shape, as the stock engine does with sum_to.
using Rule = std::function<std::vector<at::Tensor>(const RuleContext&, const std::vector<at::Tensor>& grads)>;

struct RuleEntry {
  Rule rule;
  std::string family;  // for logs and the coverage listing: "pointwise", "matmul", …
  // Placement, broadcast and identity rules only move values and ⊕-sum them (no ⊗ with a
  // weight), so a +∞ value (an overflowed count or abs sum) passes through
  // them exactly: apply_rule skips the +∞ split for them (set from the family).
  bool moves_values = false;
  // Rows (layer and RMS norm): the node's output 0 and input 0 (next edge 0)
  // are rows of row_length(node) elements, and the value along edge 0 of a row
  // depends on that row's output values alone. Unset: no such structure.
  // Lazy k-best path enumeration (k_best.py) runs such a rule on the values of
  // the one row it asks about, the other rows holding the zero.
  std::function<int64_t(const Node&)> row_length;
};

void register_rule(const std::string& node_name, Rule rule, const std::string& family,
                   std::function<int64_t(const Node&)> row_length = {});
void unregister_rule(const std::string& node_name);
const RuleEntry* find_rule(const std::string& node_name);
std::vector<std::pair<std::string, std::string>> registered_rules();  // (node name, family)

// The rule that runs `node` in `semiring`: the stock backward for semirings
// whose values are plain gradients, else the registered rule; a node without
// one is a clear NotImplementedError naming it and how to register a rule.
const RuleEntry& rule_for(const Node& node, const Semiring& semiring);

// Applies `node`'s rule in `semiring` to the values arriving at its outputs —
// the one place both routes (the out-of-tree engine and the stock-engine
// hooks) run a rule, so their behaviour and errors cannot drift apart.
// wanted(j): the route wants a value along next edge j (it leads to a
// requested input); an invalid edge never gets one. Each call runs inside a
// profiler range "ts::<family>::<node name>" (torch.profiler shows where a
// semiring backward spends its time; free when no profiler is active).
// Returns exactly one value per next edge (undefined = zero); all zero,
// without running the rule, when no value arrived.
std::vector<at::Tensor> apply_rule(Node& node, const Semiring& semiring, const std::function<bool(size_t)>& wanted,
                                   const std::vector<at::Tensor>& values, bool create_graph);
// Whether any value is defined (not the implicit semiring zero).
bool any_value(const std::vector<at::Tensor>& values);
// The shape of the tensor an InputMetadata describes (concrete sizes).
std::vector<int64_t> metadata_shape(const torch::autograd::InputMetadata& meta);

// The node's own backward, for semirings whose values are plain gradients.
const RuleEntry& stock_backward_rule();

// Registers the built-in rule families (called once at import).
void register_builtin_rules();
// The families register_builtin_rules defines by a Jacobian's structure
// (pointwise, placement, …), for the coverage listing.
const std::vector<std::string>& generic_families();

// Rules and helpers shared by the families and the generated rules
// (families.cpp):
// - diagonal_rule: a node whose Jacobian is diagonal at the broadcast shape
//   (the pointwise family; generated nodes whose formulas are element-wise
//   kernels of grad): its own backward applied to ones IS every edge weight;
//   for a node with one output element the same call gives the one row of J.
//   Anything else (weights of another shape, values at a second output)
//   raises instead of guessing.
// - zero_where_unreached: a moved value whose unreached positions (where
//   moving ones gave a numeric 0: no edge) hold the semiring zero.
std::vector<at::Tensor> diagonal_rule(const RuleContext& ctx, const std::vector<at::Tensor>& grads);
// - declared_diagonal_rule: diagonal_rule for a node whose Jacobian the user
//   declared diagonal (ts.register_pointwise on an autograd.Function), with the
//   declaration checked at run time: besides diagonal_rule's shape check, the
//   node's backward of a fixed non-constant probe r must equal r times its
//   backward of ones (true for every diagonal Jacobian; a mixing one — a
//   cumsum, a matmul — fails it), else it raises. Costs two more backward calls.
std::vector<at::Tensor> declared_diagonal_rule(const RuleContext& ctx, const std::vector<at::Tensor>& grads);
at::Tensor zero_where_unreached(const Semiring& semiring, const at::Tensor& moved, const at::Tensor& reached);

}  // namespace torch_semiring
