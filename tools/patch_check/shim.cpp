// Definitions the preloaded patched engine of `make patch-check` needs besides
// the series' engine sources, written for this harness from the declarations
// in the wheel's headers (a full PyTorch build has its own in function.cpp,
// utils/warnings.cpp and functions/tensor.cpp):
// - the four that engine.cpp uses and the torch wheel does not export
//   (measured: ../shared/pytorch-preimage/README.md);
// - CopySlices::update_exec_info, whose wheel definition calls the wheel's own
//   add_node_to_current_graph_task_exec_info — not exported, so bound inside
//   libtorch_cpu to the wheel's engine.cpp, whose graph-task thread-local is
//   never set once the preloaded engine runs the pass (it crashed).
//
// NodeGuard keeps the node being evaluated in a thread-local of this library,
// so get_current_node() (exported by the wheel and reached through the PLT)
// is defined here too: the preloaded engine and the wheel's callers of it
// (torch._C._current_autograd_node, anomaly mode) then read the same slot.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/tensor.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/warnings.h>

#include <utility>

namespace torch::autograd {

namespace {
thread_local c10::intrusive_ptr<Node> evaluating_node;
}  // namespace

NodeGuard::NodeGuard(c10::intrusive_ptr<Node> node) : last_evaluating_node_(std::move(evaluating_node)) {
  evaluating_node = std::move(node);
}

NodeGuard::~NodeGuard() { evaluating_node = std::move(last_evaluating_node_); }

c10::intrusive_ptr<Node> get_current_node() { return evaluating_node; }

// Under torch.autograd.grad (a non-empty exec_info) only the nodes listed in
// the graph task's exec_info run. CopySlices runs `fn`, whose edge 0 leads into
// the view's history instead of CopySlices' own edge 0: when that node is not
// listed and CopySlices' output 0 is needed, it is listed too.
void CopySlices::update_exec_info() {
  const auto* exec_info = get_current_graph_task_exec_info();
  if (!fn || !exec_info || exec_info->empty()) return;
  Node* fn_base = fn->next_edge(0).function.get();
  if (fn_base && exec_info->count(fn_base) == 0 && task_should_compute_output(0))
    add_node_to_current_graph_task_exec_info(fn_base);
}

namespace utils {

// Warnings raised on the engine's threads are queued and re-raised on the
// thread that called backward, once the pass is over.
void DelayWarningHandler::process(const c10::Warning& warning) {
  std::lock_guard<std::mutex> lock(mutex_);
  warnings_.push_back(warning);
}

void DelayWarningHandler::replay_warnings() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_INTERNAL_ASSERT(c10::WarningUtils::get_warning_handler() != this,
                        "DelayWarningHandler cannot replay warnings into itself");
  for (const auto& warning : warnings_) c10::warn(warning);
  warnings_.clear();
}

}  // namespace utils
}  // namespace torch::autograd
