// within_node_oplus="sum": the max semantics of Du et al.'s implementation
// (brunoflow), a compatibility mode — not a semiring. ⊕ is the max semiring's
// own ⊕ between the consumers of a tensor (the engine's input buffers, .grad),
// but + inside one node: across a matmul's contraction, over a broadcast's
// reduced dims, over any fused node's Jacobian. See summed_within_nodes.cpp.
#pragma once

#include "rule.h"

namespace torch_semiring {

// The semiring handle that runs `base` with + inside nodes: a wrapper for
// max_prod, max_abs and viterbi; `base` itself for the semirings whose ⊕ is
// already a sum (real, abs, count, log, entropy: the option changes nothing);
// an error naming the semiring for everything else (kmax, products, Python
// semirings), whose within-node sum has no defined meaning here.
SemiringPtr summed_within_nodes(SemiringPtr base);

// Whether `semiring` came from summed_within_nodes (a wrapper). apply_rule
// then runs a node through apply_summed_within_node instead of its own rule.
bool sums_within_nodes(const Semiring& semiring);
std::vector<at::Tensor> apply_summed_within_node(Node& node, const Semiring& semiring, std::vector<bool> needed,
                                                 const std::vector<at::Tensor>& values, bool create_graph);

}  // namespace torch_semiring
