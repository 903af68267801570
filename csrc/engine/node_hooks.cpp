// Calling tensor and node hooks inside the out-of-tree engine (see node_hooks.h
// for what each semiring shows a hook and what it may return).
#include "node_hooks.h"

#include <sstream>

namespace torch_semiring {

using torch::autograd::FunctionPostHook;
using torch::autograd::FunctionPreHook;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {
HookNamer& hook_namer() {
  static HookNamer namer;
  return namer;
}

std::string hook_name(const FunctionPreHook* pre, const FunctionPostHook* post) {
  std::string name = hook_namer() ? hook_namer()(pre, post) : std::string();
  return name.empty() ? std::string("a C++ hook") : name;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl());
}
}  // namespace

void set_hook_namer(HookNamer namer) { hook_namer() = std::move(namer); }

NodeHooks::NodeHooks(const Semiring& semiring)
    : sr_(semiring), gradients_(semiring.stock_backward_is_exact()), product_(!product_parts(semiring).empty()) {}

bool NodeHooks::any(Node& node) {
  return !node.tensor_pre_hooks().empty() || !node.retains_grad_hooks().empty() || !node.pre_hooks().empty() ||
         !node.post_hooks().empty();
}

variable_list NodeHooks::shown(const std::vector<at::Tensor>& values) const {
  variable_list out(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].defined()) out[i] = gradients_ ? values[i].select(0, 0) : sr_.readout(values[i]);
  return out;
}

void NodeHooks::take(Node& node, Kind kind, const void* hook, std::vector<at::Tensor>& values,
                     const variable_list& shown, const variable_list& returned) const {
  const char* what = kind == Kind::Tensor ? "a tensor hook (Tensor.register_hook)"
                     : kind == Kind::Pre  ? "a node pre-hook (Node.register_prehook)"
                                          : "a node post-hook (Node.register_hook)";
  const auto* pre = kind == Kind::Post ? nullptr : static_cast<const FunctionPreHook*>(hook);
  const auto* post = kind == Kind::Post ? static_cast<const FunctionPostHook*>(hook) : nullptr;
  TORCH_CHECK(returned.size() == shown.size(), "torch_semiring: ", what, " of ", node.name(), " returned ",
              returned.size(), " values for ", shown.size());
  for (size_t i = 0; i < shown.size(); ++i) {
    if (same(shown[i], returned[i])) continue;
    if (gradients_) {  // real: the hook's gradient replaces the value, as in stock
      values[i] = returned[i].defined() ? returned[i].unsqueeze(0) : at::Tensor();
      continue;
    }
    std::ostringstream where;
    where << (kind == Kind::Post ? "input " : "output ") << i << " of " << node.name();
    TORCH_CHECK(false, "torch_semiring: ", what, " on ", where.str(), " (", hook_name(pre, post),
                ") returned a new gradient while semiring '", sr_.name(), "' runs. Hooks see the readout of "
                "a semiring value (what .grad would hold) and may observe it, but a replaced gradient has no "
                "semiring meaning. Return None from the hook (or remove it) for this pass, or run it with "
                "semiring='real', which honours hooks exactly as torch.autograd.grad does.");
  }
}

void NodeHooks::arriving(Node& node, std::vector<at::Tensor>& values) const {
  auto& tensor_hooks = node.tensor_pre_hooks();
  auto& retain_hooks = node.retains_grad_hooks();
  if (tensor_hooks.empty() && (retain_hooks.empty() || !gradients_)) return;
  TORCH_CHECK(!product_ || tensor_hooks.empty(), "torch_semiring: a tensor hook (Tensor.register_hook) on ",
              node.name(), " (", hook_name(tensor_hooks.front().get(), nullptr), ") would see a value of several "
              "semirings at once (", sr_.name(), "), which has no single readout. Run one semiring per pass "
              "(torch_semiring.grad(..., semiring=name)) or remove the hook.");
  for (const auto& hook : tensor_hooks) {
    auto show = shown(values);
    take(node, Kind::Tensor, hook.get(), values, show, (*hook)(show));
  }
  if (gradients_)  // retain_grad stores the gradient itself; other semirings: engine.py ⊕-accumulates
    for (const auto& entry : retain_hooks) {
      auto show = shown(values);
      take(node, Kind::Tensor, entry.second.get(), values, show, (*entry.second)(show));
    }
}

void NodeHooks::before(Node& node, std::vector<at::Tensor>& values) const {
  const auto& hooks = node.pre_hooks();
  if (hooks.empty()) return;
  TORCH_CHECK(!product_, "torch_semiring: a node pre-hook (Node.register_prehook) on ", node.name(), " (",
              hook_name(hooks.front().get(), nullptr), ") would see a value of several semirings at once (",
              sr_.name(), "), which has no single readout. Run one semiring per pass or remove the hook.");
  for (const auto& hook : hooks) {
    auto show = shown(values);
    take(node, Kind::Pre, hook.get(), values, show, (*hook)(show));
  }
}

void NodeHooks::after(Node& node, std::vector<at::Tensor>& results, const std::vector<at::Tensor>& values) const {
  const auto& hooks = node.post_hooks();
  if (hooks.empty()) return;
  TORCH_CHECK(!product_, "torch_semiring: a node post-hook (Node.register_hook) on ", node.name(), " (",
              hook_name(nullptr, hooks.front().get()), ") would see a value of several semirings at once (",
              sr_.name(), "), which has no single readout. Run one semiring per pass or remove the hook.");
  results.resize(node.next_edges().size());
  const auto received = shown(values);
  for (const auto& hook : hooks) {
    // A result that is a received value (a pass-through rule) is shown as the
    // same tensor: module backward hooks return grad_output as grad_input on
    // BackwardHookFunction's identity node, which must read as "unchanged".
    auto show = shown(results);
    for (size_t i = 0; i < results.size(); ++i)
      for (size_t k = 0; k < values.size(); ++k)
        if (results[i].defined() && same(results[i], values[k])) show[i] = received[k];
    take(node, Kind::Post, hook.get(), results, show, (*hook)(show, received));
  }
}

}  // namespace torch_semiring
