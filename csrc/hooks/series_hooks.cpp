// SemiringHooks (patches/pytorch/0001, torch/csrc/autograd/semiring.h) for
// this library's semirings. The series' functions are referenced weakly: on a
// stock wheel they are absent (null), this file registers nothing and _C still
// loads; in a PyTorch built with the series, or a process with the series'
// engine preloaded (make patch-check), they resolve at load time.
//
// The interface header comes from the installed torch when it has one (a
// custom wheel) and otherwise from build/series/include, where setup.py
// extracts it from patch 0001 (tools/series_files.py): the patch is the one
// copy of the interface.
#include "series_hooks.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/semiring.h>

#include "engine_hooks.h"
#include "semiring_value.h"

namespace torch::autograd {
// Weak redeclarations: null where the running torch lacks the series.
[[gnu::weak]] void register_semiring(std::string name, SemiringFactory factory);
[[gnu::weak]] void set_semiring(std::shared_ptr<SemiringHooks> semiring);
[[gnu::weak]] std::shared_ptr<SemiringHooks> current_semiring();
}  // namespace torch::autograd

namespace torch_semiring {

namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::GraphRoot;
using torch::autograd::InputMetadata;
using torch::autograd::Node;
using torch::autograd::SemiringGuard;
using torch::autograd::variable_list;

const char* const kPlainNote =
    "a tensor hook (register_hook, retain_grad) returned a new gradient, or a node produced one outside the "
    "semiring's rules. Remove the hook, or run this model with torch_semiring.grad (the out-of-tree engine).";

SeriesAccumulator& accumulator() {
  static SeriesAccumulator accumulate;
  return accumulate;
}

class LibraryHooks final : public torch::autograd::SemiringHooks {
 public:
  explicit LibraryHooks(SemiringPtr semiring) : sr_(std::move(semiring)) {}

  std::string name() const override { return sr_->name(); }

  // Each hook runs with the mode off: rules call nodes' own backward and
  // stock ops, which must not see the semiring.
  at::Tensor lift_seed(const at::Tensor& grad_output) override {
    SemiringGuard off(nullptr);
    return lift_seed_value(*sr_, grad_output);
  }

  at::Tensor oplus(at::Tensor a, at::Tensor b) override {
    SemiringGuard off(nullptr);
    return oplus_values(*sr_, a, b, "a node", kPlainNote);
  }

  at::Tensor reduce_to(const at::Tensor& value, const InputMetadata& metadata) override {
    SemiringGuard off(nullptr);
    return reduce_value(*sr_, value, metadata);
  }

  variable_list apply(Node& node, variable_list&& grads) override {
    // The engine runs nodes with grad mode on exactly when create_graph=True.
    TORCH_CHECK(!at::GradMode::is_enabled(), "torch_semiring: create_graph=True is not supported in a semiring "
                "mode of PyTorch's engine (semiring values carry no autograd history); use "
                "torch_semiring.grad(..., create_graph=True)");
    // The engine's own nodes pass values on: GraphRoot (several roots) holds the
    // seeds lift_seed made; AccumulateGrad::apply hands a leaf's value to
    // accumulate_grad below.
    if (dynamic_cast<GraphRoot*>(&node) || dynamic_cast<AccumulateGrad*>(&node)) return node(std::move(grads));
    SemiringGuard off(nullptr);
    return node_values(node, *sr_, grads, kPlainNote);
  }

  void accumulate_grad(const torch::autograd::Variable& leaf, at::Tensor&& value) override {
    TORCH_CHECK(accumulator(), "torch_semiring: no .grad accumulator registered (import torch_semiring)");
    SemiringGuard off(nullptr);
    accumulator()(leaf, unwrap_value(value), sr_->name(), sr_->components());
  }

  at::Tensor readout(at::Tensor value) override {
    SemiringGuard off(nullptr);
    return readout_value(*sr_, value);
  }

  bool is_value(const at::Tensor& t) const override { return is_wrapped_value(t); }

 private:
  SemiringPtr sr_;  // outlives every value it wraps: the mode holds the hooks
};

std::shared_ptr<torch::autograd::SemiringHooks> make_hooks(const std::string& name,
                                                           const torch::autograd::SemiringParams& params) {
  int64_t k = 1;
  for (const auto& [key, value] : params) {
    TORCH_CHECK_VALUE(name == "kmax" && key == "k", "torch_semiring: semiring '", name,
                      "' takes no parameter '", key, "'", name == "kmax" ? " (kmax takes k)" : "");
    TORCH_CHECK_VALUE(value.isInt(), "torch_semiring: kmax needs an integer k >= 1, got ", value);
    k = value.toInt();
  }
  return std::make_shared<LibraryHooks>(make_semiring(name, k));
}

}  // namespace

bool register_series_semirings(SeriesAccumulator accumulate) {
  if (&torch::autograd::register_semiring == nullptr) return false;
  accumulator() = std::move(accumulate);
  for (const auto& name : semiring_names())
    torch::autograd::register_semiring(
        name, [name](const torch::autograd::SemiringParams& params) { return make_hooks(name, params); });
  return true;
}

}  // namespace torch_semiring
