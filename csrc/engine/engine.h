// The out-of-tree semiring engine: walks a stock grad_fn graph once, in
// topological order, ⊕-combining the values that reach each node and calling
// the node's semiring rule. It contains no op-specific code.
#pragma once

#include <torch/csrc/autograd/edge.h>

#include <functional>
#include <string>
#include <vector>

#include "../semiring/semiring.h"

namespace torch_semiring {

using torch::autograd::Edge;

using torch::autograd::Node;

// Watches a walk and may rewrite the values it moves (path tracking,
// paths/path_recorder.h, is one); the engine itself keeps no record. Calls, in
// order: planned once, seeded per root, then delivered per value as it enters
// an input buffer and ready per node as its buffer is complete.
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  // The walk as planned: the nodes that will run, in discovery order, and
  // whether an edge delivers (leads to a target).
  virtual void planned(const std::vector<Edge>& roots, const std::vector<at::Tensor>& seeds,
                       const std::vector<Node*>& running, const std::function<bool(const Edge&)>& delivers) {}
  // Root r's seed, before it is delivered.
  virtual at::Tensor seeded(size_t root, at::Tensor seed) { return seed; }
  // A value entering input `slot` of `consumer` from next edge `edge` of
  // `producer` (null: the virtual root, `edge` then the root's index).
  virtual at::Tensor delivered(Node& consumer, uint32_t slot, at::Tensor value, Node* producer, uint32_t edge) {
    return value;
  }
  // A node's complete input buffer (after targets were captured), before its
  // rule runs (`runs`) or it is passed by.
  virtual std::vector<at::Tensor> ready(Node& node, std::vector<at::Tensor> values, bool runs) { return values; }
};

struct BackwardResult {
  // Per target edge: its ⊕-combined value (undefined = zero) and whether the
  // target is part of the graph at all (stock's "appears to not have been used").
  std::vector<at::Tensor> captured;
  std::vector<bool> in_graph;
  // With collect_leaves: every reached AccumulateGrad's variable and value;
  // the caller ⊕-accumulates them into .grad once the whole pass succeeded.
  std::vector<at::Tensor> leaf_variables;
  std::vector<at::Tensor> leaf_values;
};

struct BackwardOptions {
  bool keep_graph = false;    // retain_graph: keep saved tensors alive
  bool create_graph = false;  // run rules with grad mode on
  bool collect_leaves = false;  // .backward() without inputs=: every leaf is a target
};

// roots/seeds: output edges and their seed values (shape (C, *output shape)).
// targets: edges whose arriving values are wanted (leaves: their AccumulateGrad).
// observer: optional (see BackwardObserver).
BackwardResult run_backward(const Semiring& semiring, const std::vector<Edge>& roots,
                            const std::vector<at::Tensor>& seeds, const std::vector<Edge>& targets,
                            const BackwardOptions& options, BackwardObserver* observer = nullptr);

// One node's rule outside a walk (the lazy k-best paths, paths/k_best.py):
// `values` arrive at the node's outputs (undefined = zero); returns the value
// along each next edge j with wanted[j] (else undefined), ⊕-reduced and cast
// to the input it points at exactly as a walk delivers it. Grad mode off. A
// node with hooks is refused (std::invalid_argument): a walk runs its hooks
// around the rule, and calling them outside one would change what they see.
std::vector<at::Tensor> run_node_rule(const Semiring& semiring, Node& node, const std::vector<at::Tensor>& values,
                                      const std::vector<bool>& wanted);

// Debug log of executed nodes (off by default; TORCH_SEMIRING_LOGS=1 or
// torch_semiring.set_logging(True)).
void set_log_sink(std::function<void(const std::string&)> sink);

}  // namespace torch_semiring
