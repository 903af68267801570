// Path tracking's bookkeeping, watching a walk of the engine
// (BackwardObserver): numbers every element that can carry a path — each
// running node's outputs, the roots — so that a provenance semiring's ids
// (semiring/provenance.h) say where each selected entry came from, and keeps
// what arrived at every input buffer and who delivered each contribution.
// Following the ids back through these records walks the best paths
// (python/torch_semiring/paths.py). Memory: every buffer's value is kept until
// the recorder dies, so it is opt-in (top_paths, component_flow).
#pragma once

#include <unordered_map>
#include <utility>
#include <vector>

#include "../engine/engine.h"
#include "../engine/node_compat.h"

namespace torch_semiring {

// What arrived at one input buffer slot (= one tensor of the forward): the
// ⊕-combined value with origin ids, and who delivered each contribution
// (producer node, its next-edge index; a null producer is the virtual root,
// the edge index then the output's index).
struct PathRecord {
  NodePtr node;
  uint32_t slot;
  at::Tensor value;
  std::vector<std::pair<NodePtr, uint32_t>> contributors;
  int64_t expected_contributors;  // the n of tag_contributor
};

class PathRecorder final : public BackwardObserver {
 public:
  // semiring: the provenance semiring the walk runs (Semiring::tracks_origin).
  explicit PathRecorder(const Semiring& semiring);

  void planned(const std::vector<Edge>& roots, const std::vector<at::Tensor>& seeds,
               const std::vector<Node*>& running, const std::function<bool(const Edge&)>& delivers) override;
  at::Tensor seeded(size_t root, at::Tensor seed) override;
  at::Tensor delivered(Node& consumer, uint32_t slot, at::Tensor value, Node* producer, uint32_t edge) override;
  std::vector<at::Tensor> ready(Node& node, std::vector<at::Tensor> values, bool runs) override;

  std::vector<PathRecord> take_records() { return std::move(records_); }

 private:
  using Contributors = std::vector<std::pair<NodePtr, uint32_t>>;
  std::vector<int64_t>& expected(const Node* n);  // contributions expected per input slot

  const Semiring& sr_;
  std::vector<int64_t> root_offsets_;
  std::unordered_map<const Node*, std::vector<int64_t>> expected_;
  std::unordered_map<const Node*, std::vector<Contributors>> from_;
  std::vector<PathRecord> records_;
};

}  // namespace torch_semiring
