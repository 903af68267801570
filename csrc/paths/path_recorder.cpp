#include "path_recorder.h"

#include <cmath>

#include "../rules/rule.h"

namespace torch_semiring {

namespace {
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t k = 1;
  for (auto d : shape) k *= d;
  return k;
}
int64_t outputs_numel(const Node& n) {
  int64_t total = 0;
  for (uint32_t s = 0; s < n.num_inputs(); ++s) total += numel_of(metadata_shape(n.input_metadata(s)));
  return total;
}
NodePtr hold(Node* n) {
  return hold_node(n);
}
}  // namespace

PathRecorder::PathRecorder(const Semiring& semiring) : sr_(semiring) {
  TORCH_CHECK(sr_.tracks_origin(), "torch_semiring: recording paths needs a provenance semiring, got ", sr_.name());
}

std::vector<int64_t>& PathRecorder::expected(const Node* n) {
  auto& v = expected_[n];
  if (v.size() < n->num_inputs()) v.resize(n->num_inputs(), 0);
  return v;
}

void PathRecorder::planned(const std::vector<Edge>& roots, const std::vector<at::Tensor>& seeds,
                           const std::vector<Node*>& running, const std::function<bool(const Edge&)>& delivers) {
  int64_t offset = 0;
  for (size_t r = 0; r < roots.size(); ++r) {
    root_offsets_.push_back(offset);
    offset += seeds[r].numel() / std::max<int64_t>(seeds[r].size(0), 1);
    if (roots[r].is_valid()) expected(roots[r].function.get())[roots[r].input_nr]++;
  }
  int64_t largest = offset, most_contributions = 1;
  for (Node* n : running) {
    largest = std::max(largest, outputs_numel(*n));
    for (const auto& e : n->next_edges())
      if (delivers(e)) expected(e.function.get())[e.input_nr]++;
  }
  for (auto& kv : expected_)
    for (auto n : kv.second) most_contributions = std::max(most_contributions, n);
  // ids must stay exact integers in the value dtype
  const double bound = double(largest + 1) * double(sr_.origin_entries()) * double(most_contributions);
  const auto dtype = seeds.empty() ? at::kDouble : seeds[0].scalar_type();
  const int digits = dtype == at::kDouble ? 53 : dtype == at::kFloat ? 24 : 8;
  TORCH_CHECK(bound < std::ldexp(1.0, digits), "torch_semiring: path ids up to ", bound, " do not fit exactly "
              "in ", dtype, " values; run the model in float64 (model.double()) to extract paths");
}

at::Tensor PathRecorder::seeded(size_t root, at::Tensor seed) { return sr_.with_origin(seed, root_offsets_[root]); }

at::Tensor PathRecorder::delivered(Node& consumer, uint32_t slot, at::Tensor value, Node* producer, uint32_t edge) {
  auto& list = from_[&consumer];
  if (list.size() < consumer.num_inputs()) list.resize(consumer.num_inputs());
  const int64_t e = (int64_t)list[slot].size();
  list[slot].emplace_back(hold(producer), edge);
  return sr_.tag_contributor(value, e, std::max<int64_t>(expected(&consumer)[slot], 1));
}

// Records what arrived at each slot; for a node that runs, re-numbers the ids
// as "element o of this node's outputs" before its rule.
std::vector<at::Tensor> PathRecorder::ready(Node& node, std::vector<at::Tensor> values, bool runs) {
  int64_t offset = 0;
  auto& list = from_[&node];
  for (uint32_t s = 0; s < values.size(); ++s) {
    if (values[s].defined()) {
      PathRecord rec{hold(&node), s, values[s], s < list.size() ? list[s] : Contributors{},
                     std::max<int64_t>(expected(&node)[s], 1)};
      records_.push_back(std::move(rec));
      if (runs) values[s] = sr_.with_origin(values[s], offset);
    }
    offset += numel_of(metadata_shape(node.input_metadata(s)));
  }
  return values;
}

}  // namespace torch_semiring
