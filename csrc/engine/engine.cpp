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
#include <stdexcept>
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

// The semiring version of validate_outputs: ⊕-reduce broadcast dims down to
// the shape of the tensor the edge points at, and match its dtype (bf16/fp16
// tensors: float32 values outside real, Semiring::value_dtype).
at::Tensor conform(const Semiring& sr, at::Tensor value, const InputMetadata& meta,
                   const Node& producer, size_t edge) {
  value = oplus_sum_to(sr, value, metadata_shape(meta), "the rule of " + producer.name() + " (input " +
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

}  // namespace

void set_log_sink(std::function<void(const std::string&)> sink) { log_sink() = std::move(sink); }

BackwardResult run_backward(const Semiring& sr, const std::vector<Edge>& roots,
                            const std::vector<at::Tensor>& seeds, const std::vector<Edge>& targets,
                            const BackwardOptions& opt, BackwardObserver* observer) {
  TORCH_CHECK(roots.size() == seeds.size(), "torch_semiring: ", roots.size(), " roots but ", seeds.size(), " seeds");
  GraphInfo g = discover(roots, targets, opt.collect_leaves);
  const size_t N = g.nodes.size();
  std::vector<std::vector<at::Tensor>> buffers(N);
  auto buffer = [&](size_t i) -> std::vector<at::Tensor>& {
    if (buffers[i].empty()) buffers[i].resize(g.nodes[i]->num_inputs());
    return buffers[i];
  };
  std::deque<size_t> ready;
  auto leads = [&](const Edge& e) { return e.is_valid() && g.leads[g.index.at(e.function.get())]; };
  if (observer) {
    std::vector<Node*> running;
    for (size_t i = 0; i < N; ++i)
      if (g.runs[i]) running.push_back(g.nodes[i]);
    observer->planned(roots, seeds, running, leads);
  }
  auto deliver = [&](size_t i, uint32_t slot, at::Tensor v, Node* producer, uint32_t edge) {
    if (v.defined()) {
      auto& b = buffer(i);
      TORCH_CHECK(slot < b.size(), "torch_semiring: ", g.nodes[i]->name(), " has no input ", slot);
      if (observer) v = observer->delivered(*g.nodes[i], slot, std::move(v), producer, edge);
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
    deliver(i, e.input_nr, observer ? observer->seeded(r, seeds[r]) : seeds[r], nullptr, (uint32_t)r);
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
    if (observer) grads = observer->ready(node, std::move(grads), g.runs[i]);
    if (hooked && !g.runs[i] && opt.collect_leaves && dynamic_cast<AccumulateGrad*>(&node)) {
      hooks.before(node, grads);  // the stock engine runs a leaf's AccumulateGrad, hooks and all
      std::vector<at::Tensor> none;
      hooks.after(node, none, grads);
    }
    if (!g.runs[i]) continue;
    if (hooked) hooks.before(node, grads);

    const auto& edges = node.next_edges();
    if (log_sink() && any_value(grads)) log_sink()(describe(node, grads, &rule_for(node, sr)));
    auto outputs = apply_rule(node, sr, [&](size_t j) { return leads(edges[j]); }, grads, opt.create_graph);
    if (hooked) hooks.after(node, outputs, grads);
    for (size_t j = 0; j < edges.size(); ++j) {
      const auto& e = edges[j];
      if (!leads(e)) continue;
      size_t c = g.index.at(e.function.get());
      if (outputs[j].defined())
        deliver(c, e.input_nr, conform(sr, outputs[j], e.function->input_metadata(e.input_nr), node, j), &node,
                (uint32_t)j);
      if (--g.dependencies[c] == 0 && !queued[c]) {
        ready.push_back(c);
        queued[c] = true;
      }
    }
    if (!opt.keep_graph) node.release_variables();
  }
  return result;
}

std::vector<at::Tensor> run_node_rule(const Semiring& sr, Node& node, const std::vector<at::Tensor>& values,
                                      const std::vector<bool>& wanted) {
  if (NodeHooks::any(node))
    throw std::invalid_argument("torch_semiring: " + node.name() + " has hooks, which only a walk runs");
  at::AutoGradMode grad_mode(false);
  const auto& edges = node.next_edges();
  auto want = [&](size_t j) { return j < wanted.size() && wanted[j] && edges[j].is_valid(); };
  auto outputs = apply_rule(node, sr, want, values, false);
  for (size_t j = 0; j < edges.size(); ++j) {
    if (!want(j) || !outputs[j].defined()) {
      outputs[j] = at::Tensor();
      continue;
    }
    outputs[j] = conform(sr, outputs[j], edges[j].function->input_metadata(edges[j].input_nr), node, j);
  }
  return outputs;
}

}  // namespace torch_semiring
