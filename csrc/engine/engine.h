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

// What arrived at one input buffer slot (= one tensor of the forward) when
// path provenance is recorded: the ⊕-combined value with origin ids, and who
// delivered each contribution (producer node, its next-edge index; a null
// producer is the virtual root, the edge index then the output's index).
struct ProvenanceRecord {
  c10::intrusive_ptr<torch::autograd::Node> node;
  uint32_t slot;
  at::Tensor value;
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uint32_t>> contributors;
  int64_t expected_contributors;  // the n of tag_contributor
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
  std::vector<ProvenanceRecord> provenance;  // with record_provenance
};

struct BackwardOptions {
  bool keep_graph = false;    // retain_graph: keep saved tensors alive
  bool create_graph = false;  // run rules with grad mode on
  bool collect_leaves = false;  // .backward() without inputs=: every leaf is a target
  bool record_provenance = false;  // keep every buffer's value + contributors (a provenance semiring)
};

// roots/seeds: output edges and their seed values (shape (C, *output shape)).
// targets: edges whose arriving values are wanted (leaves: their AccumulateGrad).
BackwardResult run_backward(const Semiring& semiring, const std::vector<Edge>& roots,
                            const std::vector<at::Tensor>& seeds, const std::vector<Edge>& targets,
                            const BackwardOptions& options);

// Debug log of executed nodes (off by default; TORCH_SEMIRING_LOGS=1 or
// torch_semiring.set_logging(True)).
void set_log_sink(std::function<void(const std::string&)> sink);

}  // namespace torch_semiring
