// The engine, in four steps (micrograd's loop with the stock engine's
// bookkeeping):
//   1. discover the graph reachable from the roots;
//   2. prune: a node matters only if it lies on a path to a target; it runs
//      only if one of its next edges leads to a target (as the stock engine's
//      exec_info does);
//   3. count, per node, the incoming edges from nodes that run (dependencies);
//   4. process nodes whose dependencies are all delivered: capture targets,
//      call the rule, ⊕ each result into the next node's input buffer after
//      ⊕-reducing broadcast dims to that input's shape (the stock
//      InputMetadata::reduce_grad step), free the buffer, release saved
//      tensors unless the graph is kept.
#include "engine.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <deque>
#include <sstream>
#include <unordered_map>

#include "../rules/rule.h"
#include "node_hooks.h"

namespace torch_semiring {

using torch::autograd::AccumulateGrad;
using torch::autograd::InputMetadata;
using torch::autograd::Node;

namespace {

std::function<void(const std::string&)>& log_sink() {
  static std::function<void(const std::string&)> sink;
  return sink;
}

std::vector<int64_t> shape_of(const InputMetadata& meta) {
  std::vector<int64_t> shape;
  for (const auto& s : meta.shape_as_dim_vector()) shape.push_back(s.expect_int());
  return shape;
}

// The semiring version of validate_outputs: ⊕-reduce broadcast dims down to
// the shape of the tensor the edge points at, and match its dtype (bf16/fp16
// tensors: float32 values outside real, Semiring::value_dtype).
at::Tensor conform(const Semiring& sr, at::Tensor value, const InputMetadata& meta,
                   const Node& producer, size_t edge) {
  value = oplus_sum_to(sr, value, shape_of(meta), "the rule of " + producer.name() + " (input " +
                                                      std::to_string(edge) + ")");
  const auto dtype = sr.value_dtype(c10::typeMetaToScalarType(meta.dtype()));
  if (value.scalar_type() != dtype) value = value.to(dtype);
  return value;
}

struct GraphInfo {
  std::vector<Node*> nodes;                // discovery order
  std::unordered_map<Node*, size_t> index;
  std::vector<bool> leads;                 // on a path to a target
  std::vector<bool> runs;                  // has a next edge that leads
  std::vector<int> dependencies;
};

GraphInfo discover(const std::vector<Edge>& roots, const std::vector<Edge>& targets, bool collect_leaves) {
  GraphInfo g;
  std::vector<Node*> stack;
  auto visit = [&](Node* n) {
    if (n && g.index.emplace(n, g.nodes.size()).second) {
      g.nodes.push_back(n);
      stack.push_back(n);
    }
  };
  for (const auto& r : roots) visit(r.function.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) visit(e.function.get());
  }
  const size_t N = g.nodes.size();
  std::vector<bool> is_target(N, false);
  for (const auto& t : targets) {
    auto it = g.index.find(t.function.get());
    if (it != g.index.end()) is_target[it->second] = true;
  }
  if (collect_leaves)
    for (size_t i = 0; i < N; ++i)
      if (dynamic_cast<AccumulateGrad*>(g.nodes[i])) is_target[i] = true;

  // leads[n] = target(n) or any child leads: iterative post-order.
  g.leads.assign(N, false);
  std::vector<char> state(N, 0);  // 0 new, 1 open, 2 done
  for (size_t root = 0; root < N; ++root) {
    if (state[root]) continue;
    std::vector<size_t> work{root};
    while (!work.empty()) {
      size_t i = work.back();
      if (state[i] == 0) {
        state[i] = 1;
        for (const auto& e : g.nodes[i]->next_edges())
          if (e.is_valid()) {
            size_t c = g.index.at(e.function.get());
            if (state[c] == 0) work.push_back(c);
          }
      } else {
        work.pop_back();
        if (state[i] == 2) continue;
        state[i] = 2;
        bool leads = is_target[i];
        for (const auto& e : g.nodes[i]->next_edges())
          if (e.is_valid() && g.leads[g.index.at(e.function.get())]) leads = true;
        g.leads[i] = leads;
      }
    }
  }
  g.runs.assign(N, false);
  g.dependencies.assign(N, 0);
  for (size_t i = 0; i < N; ++i)
    for (const auto& e : g.nodes[i]->next_edges())
      if (e.is_valid() && g.leads[g.index.at(e.function.get())]) g.runs[i] = true;
  for (size_t i = 0; i < N; ++i)
    if (g.runs[i])
      for (const auto& e : g.nodes[i]->next_edges())
        if (e.is_valid()) {
          size_t c = g.index.at(e.function.get());
          if (g.leads[c]) g.dependencies[c]++;
        }
  return g;
}

std::string describe(const Node& n, const std::vector<at::Tensor>& grads, const RuleEntry* entry) {
  std::ostringstream s;
  s << "[torch_semiring] " << n.name() << " (rule: " << (entry ? entry->family : "-") << ") values:";
  for (const auto& g : grads) {
    if (g.defined()) s << " " << g.sizes();
    else s << " zero";
  }
  return s.str();
}

// Path provenance bookkeeping (record_provenance): numbers every element that
// can carry a path — each node's outputs, the roots — and remembers who
// delivered what into each buffer. Needs a semiring that tracks_origin().
struct Provenance {
  const Semiring& sr;
  const GraphInfo& g;
  bool enabled;
  std::vector<ProvenanceRecord> records;
  std::vector<int64_t> root_offsets;
  std::unordered_map<const Node*, std::vector<std::vector<std::pair<c10::intrusive_ptr<Node>, uint32_t>>>> from;
  std::unordered_map<const Node*, std::vector<int64_t>> incoming;  // expected contributions per slot

  Provenance(const Semiring& s, const GraphInfo& graph, const std::vector<Edge>& roots,
             const std::vector<at::Tensor>& seeds, bool on)
      : sr(s), g(graph), enabled(on) {
    if (!enabled) return;
    TORCH_CHECK(sr.tracks_origin(), "torch_semiring: recording paths needs a provenance semiring, got ", sr.name());
    int64_t offset = 0, largest = 0;
    for (size_t r = 0; r < roots.size(); ++r) {
      root_offsets.push_back(offset);
      offset += seeds[r].numel() / std::max<int64_t>(seeds[r].size(0), 1);
      if (roots[r].is_valid()) slots(roots[r].function.get())[roots[r].input_nr]++;
    }
    largest = offset;
    int64_t most_contributions = 1;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (!g.runs[i]) continue;
      largest = std::max(largest, outputs_numel(*g.nodes[i]));
      for (const auto& e : g.nodes[i]->next_edges())
        if (e.is_valid() && g.leads[g.index.at(e.function.get())]) slots(e.function.get())[e.input_nr]++;
    }
    for (auto& kv : incoming)
      for (auto n : kv.second) most_contributions = std::max(most_contributions, n);
    // ids must stay exact integers in the value dtype
    const double bound = double(largest + 1) * double(sr.origin_entries()) * double(most_contributions);
    const auto dtype = seeds.empty() ? at::kDouble : seeds[0].scalar_type();
    const int digits = dtype == at::kDouble ? 53 : dtype == at::kFloat ? 24 : 8;
    TORCH_CHECK(bound < std::ldexp(1.0, digits), "torch_semiring: path ids up to ", bound, " do not fit exactly "
                "in ", dtype, " values; run the model in float64 (model.double()) to extract paths");
  }
  std::vector<int64_t>& slots(const Node* n) {
    auto& v = incoming[n];
    if (v.size() < n->num_inputs()) v.resize(n->num_inputs(), 0);
    return v;
  }
  static int64_t outputs_numel(const Node& n) {
    int64_t total = 0;
    for (uint32_t s = 0; s < n.num_inputs(); ++s) {
      int64_t k = 1;
      for (const auto& d : n.input_metadata(s).shape_as_dim_vector()) k *= d.expect_int();
      total += k;
    }
    return total;
  }
  at::Tensor seed(size_t r, const at::Tensor& v) { return sr.with_origin(v, root_offsets[r]); }
  at::Tensor arrived(size_t i, uint32_t slot, const at::Tensor& v, Node* producer, uint32_t edge) {
    const Node* n = g.nodes[i];
    auto& list = from[n];
    if (list.size() < n->num_inputs()) list.resize(n->num_inputs());
    const int64_t e = (int64_t)list[slot].size();
    list[slot].emplace_back(producer ? c10::intrusive_ptr<Node>::unsafe_reclaim_from_nonowning(producer)
                                     : c10::intrusive_ptr<Node>(), edge);
    return sr.tag_contributor(v, e, std::max<int64_t>(slots(n)[slot], 1));
  }
  // Records what arrived at each slot; for a node that runs, re-numbers the
  // ids as "element o of this node's outputs" before its rule.
  std::vector<at::Tensor> ready(Node& node, std::vector<at::Tensor> grads, bool runs) {
    int64_t offset = 0;
    auto& list = from[&node];
    for (uint32_t s = 0; s < grads.size(); ++s) {
      int64_t k = 1;
      for (const auto& d : node.input_metadata(s).shape_as_dim_vector()) k *= d.expect_int();
      if (grads[s].defined()) {
        ProvenanceRecord rec;
        rec.node = c10::intrusive_ptr<Node>::unsafe_reclaim_from_nonowning(&node);
        rec.slot = s;
        rec.value = grads[s];
        if (s < list.size()) rec.contributors = list[s];
        rec.expected_contributors = std::max<int64_t>(slots(&node)[s], 1);
        records.push_back(std::move(rec));
        if (runs) grads[s] = sr.with_origin(grads[s], offset);
      }
      offset += k;
    }
    return grads;
  }
};

}  // namespace

void set_log_sink(std::function<void(const std::string&)> sink) { log_sink() = std::move(sink); }

BackwardResult run_backward(const Semiring& sr, const std::vector<Edge>& roots,
                            const std::vector<at::Tensor>& seeds, const std::vector<Edge>& targets,
                            const BackwardOptions& opt) {
  TORCH_CHECK(roots.size() == seeds.size(), "torch_semiring: ", roots.size(), " roots but ", seeds.size(), " seeds");
  GraphInfo g = discover(roots, targets, opt.collect_leaves);
  const size_t N = g.nodes.size();
  std::vector<std::vector<at::Tensor>> buffers(N);
  auto buffer = [&](size_t i) -> std::vector<at::Tensor>& {
    if (buffers[i].empty()) buffers[i].resize(g.nodes[i]->num_inputs());
    return buffers[i];
  };
  std::deque<size_t> ready;
  Provenance prov(sr, g, roots, seeds, opt.record_provenance);
  auto deliver = [&](size_t i, uint32_t slot, at::Tensor v, Node* producer, uint32_t edge) {
    if (v.defined()) {
      auto& b = buffer(i);
      TORCH_CHECK(slot < b.size(), "torch_semiring: ", g.nodes[i]->name(), " has no input ", slot);
      if (prov.enabled) v = prov.arrived(i, slot, v, producer, edge);
      b[slot] = sr.oplus(b[slot], v);  // the InputBuffer::add of the stock engine
    }
  };

  at::AutoGradMode grad_mode(opt.create_graph);

  // Seeds arrive from a virtual root, like the stock GraphRoot.
  for (size_t r = 0; r < roots.size(); ++r) {
    const auto& e = roots[r];
    if (!e.is_valid()) continue;
    size_t i = g.index.at(e.function.get());
    if (!g.leads[i]) continue;
    deliver(i, e.input_nr, prov.enabled ? prov.seed(r, seeds[r]) : seeds[r], nullptr, (uint32_t)r);
  }
  std::vector<bool> queued(N, false);
  for (size_t i = 0; i < N; ++i)
    if (g.leads[i] && g.dependencies[i] == 0) {
      ready.push_back(i);
      queued[i] = true;
    }

  const NodeHooks hooks(sr);
  BackwardResult result;
  result.captured.resize(targets.size());
  result.in_graph.assign(targets.size(), false);
  std::unordered_multimap<Node*, size_t> target_of;
  for (size_t t = 0; t < targets.size(); ++t) {
    if (!targets[t].is_valid()) continue;
    auto it = g.index.find(targets[t].function.get());
    if (it != g.index.end() && g.leads[it->second]) {
      result.in_graph[t] = true;
      target_of.emplace(targets[t].function.get(), t);
    }
  }

  while (!ready.empty()) {
    const size_t i = ready.front();
    ready.pop_front();
    Node& node = *g.nodes[i];
    std::vector<at::Tensor> grads = std::move(buffer(i));
    buffers[i].clear();
    buffers[i].shrink_to_fit();
    // Tensor hooks and retain_grad see what arrived before it is captured;
    // node pre-hooks run before the rule, post-hooks after (node_hooks.h).
    const bool hooked = NodeHooks::any(node);
    if (hooked) hooks.arriving(node, grads);

    auto range = target_of.equal_range(&node);
    for (auto it = range.first; it != range.second; ++it)
      result.captured[it->second] = grads.at(targets[it->second].input_nr);
    if (opt.collect_leaves) {
      if (auto* acc = dynamic_cast<AccumulateGrad*>(&node)) {
        if (grads.at(0).defined()) {
          result.leaf_variables.push_back(acc->variable);
          result.leaf_values.push_back(grads[0]);
        }
      }
    }
    if (prov.enabled) grads = prov.ready(node, grads, g.runs[i]);
    if (hooked && !g.runs[i] && opt.collect_leaves && dynamic_cast<AccumulateGrad*>(&node)) {
      hooks.before(node, grads);  // the stock engine runs a leaf's AccumulateGrad, hooks and all
      std::vector<at::Tensor> none;
      hooks.after(node, none, grads);
    }
    if (!g.runs[i]) continue;
    if (hooked) hooks.before(node, grads);

    const auto& edges = node.next_edges();
    std::vector<at::Tensor> outputs;
    const bool any_value = std::any_of(grads.begin(), grads.end(), [](const at::Tensor& t) { return t.defined(); });
    if (any_value) {
      if (log_sink()) log_sink()(describe(node, grads, &rule_for(node, sr)));
      std::vector<bool> needed(edges.size(), false);
      for (size_t j = 0; j < edges.size(); ++j)
        needed[j] = edges[j].is_valid() && g.leads[g.index.at(edges[j].function.get())];
      outputs = apply_rule(node, sr, std::move(needed), grads, opt.create_graph);
    }
    if (hooked) hooks.after(node, outputs, grads);
    for (size_t j = 0; j < edges.size(); ++j) {
      const auto& e = edges[j];
      if (!e.is_valid()) continue;
      size_t c = g.index.at(e.function.get());
      if (!g.leads[c]) continue;
      if (j < outputs.size() && outputs[j].defined())
        deliver(c, e.input_nr, conform(sr, outputs[j], e.function->input_metadata(e.input_nr), node, j), &node,
                (uint32_t)j);
      if (--g.dependencies[c] == 0 && !queued[c]) {
        ready.push_back(c);
        queued[c] = true;
      }
    }
    if (!opt.keep_graph) node.release_variables();
  }
  result.provenance = std::move(prov.records);
  return result;
}

}  // namespace torch_semiring
