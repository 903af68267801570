// The hooks users attach to tensors and autograd nodes, called by the
// out-of-tree engine where the stock engine calls them:
//   tensor hooks (Tensor.register_hook — on a leaf they live on its
//     AccumulateGrad) and retain_grad, on the values arriving at a node,
//     before they are captured or the node runs;
//   node pre-hooks (Node.register_prehook), before the node runs;
//   node post-hooks (Node.register_hook), after it ran, with its results and
//     the values it received (module full backward hooks are such node hooks
//     on BackwardHookFunctionBackward nodes).
// What a hook sees, per semiring:
//   real: the gradient, and what it returns replaces it, as in the stock engine
//     (the Python API runs `real` on the stock engine itself; this is the same
//     behaviour for direct callers of the engine);
//   any other semiring: the readout of the value (a plain tensor: what .grad
//     would hold), to observe; a hook that returns a different tensor is
//     refused with an error naming it, since a replaced gradient has no
//     semiring meaning; retain_grad is left to the Python API, which
//     ⊕-accumulates into the retained .grad (engine.py);
//   several semirings in one walk: no single readout exists, so any hook is
//     refused with an error naming it.
// Cost: a check of four hook lists per node; readouts only for nodes with hooks.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <functional>
#include <string>
#include <vector>

#include "../semiring/semiring.h"

namespace torch_semiring {

// Names a hook for error messages (the Python bindings look inside Python
// hooks: the functions' qualified names); empty when it cannot.
using HookNamer = std::function<std::string(const torch::autograd::FunctionPreHook*,
                                            const torch::autograd::FunctionPostHook*)>;
void set_hook_namer(HookNamer namer);

class NodeHooks {
 public:
  explicit NodeHooks(const Semiring& semiring);
  // True when `node` has a hook of any kind (then call the three below).
  static bool any(torch::autograd::Node& node);
  // Tensor hooks and retain_grad, on the values arriving at node's outputs.
  void arriving(torch::autograd::Node& node, std::vector<at::Tensor>& values) const;
  // Node pre-hooks, before the node runs.
  void before(torch::autograd::Node& node, std::vector<at::Tensor>& values) const;
  // Node post-hooks, on what the node's rule returned (`results`, one per
  // next edge) and what it received (`values`).
  void after(torch::autograd::Node& node, std::vector<at::Tensor>& results,
             const std::vector<at::Tensor>& values) const;

 private:
  enum class Kind { Tensor, Pre, Post };
  torch::autograd::variable_list shown(const std::vector<at::Tensor>& values) const;
  void take(torch::autograd::Node& node, Kind kind, const void* hook, std::vector<at::Tensor>& values,
            const torch::autograd::variable_list& shown, const torch::autograd::variable_list& returned) const;
  const Semiring& sr_;
  bool gradients_;  // real: values are gradients
  bool product_;    // several semirings: no readout
};

}  // namespace torch_semiring
