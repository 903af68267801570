// The semiring semantics of the stock autograd engine's hook points — what the
// upstream patch series (patches/pytorch/) adds to the engine — implemented
// with this library, and installed into the LD_PRELOAD interposer
// (csrc/preload/) when that is loaded. The five hooks:
//   Engine::execute              seeds: lift(grad_output); captured values read out;
//                                .grad updates applied once the pass succeeded
//   node apply                   ⊗: the node's semiring rule (registry, rule_for)
//   InputBuffer::add             ⊕ of values meeting at one node input
//   InputMetadata::reduce_grad   ⊕ over broadcast dims (oplus_sum_to)
//   AccumulateGrad::apply        the leaf's value, ⊕-accumulated into .grad
// Values travel as wrapped tensors (semiring_value.h). Off (no semiring, or
// `real`, whose values are the stock gradients) every hook is the wheel's own
// code, untouched. The semantics of each hook are shared with series_hooks.cpp
// (declared at the end of this file).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../semiring/semiring.h"

namespace torch::autograd {
struct InputMetadata;
struct Node;
}  // namespace torch::autograd

namespace torch_semiring {

// Finds the interposer in the process and installs the hooks; false when the
// interposer is not loaded (the process was not started with LD_PRELOAD).
bool install_preload_hooks();
bool preload_loaded();

// This thread's semiring for the stock engine (nullptr: off). `real` is off:
// its values are exactly the stock gradients.
void set_preload_semiring(SemiringPtr semiring);

// Receives the leaves' values of a successful .backward() (leaf tensors and
// their raw (C, *S) values); it ⊕-accumulates their readouts into .grad —
// the Python API's one implementation (engine.py), shared by both front ends.
using LeafAccumulator = std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)>;
void set_preload_accumulator(LeafAccumulator accumulator);

// The interposed symbols and whether the loaded torch defines each.
std::vector<std::pair<std::string, bool>> preload_symbols();

// Stock-engine calls inside this scope run the wheel's own code, whatever the
// thread's mode: used around rules (which call the node's own backward) and by
// the out-of-tree engine.
class PreloadSuspended {
 public:
  PreloadSuspended();
  ~PreloadSuspended();
  PreloadSuspended(const PreloadSuspended&) = delete;
  PreloadSuspended& operator=(const PreloadSuspended&) = delete;

 private:
  const void* previous_;
};

// ---- The hook semantics, shared by both routes: the interposer's hooks (this
// file) and series_hooks.cpp, this library's SemiringHooks for a PyTorch built
// with patches/pytorch/. Values are wrapped tensors (semiring_value.h); the
// caller keeps the engine's own semiring handling off while these run (rules
// call nodes' own backward). `plain_note` ends the error raised when a plain
// gradient shows up where a value was expected: it says how that can happen
// on the caller's route.

// A root grad (grad_outputs entry or the ones() of a scalar output) → lift(w).
at::Tensor lift_seed_value(const Semiring& sr, const at::Tensor& grad_output);
// a ⊕ b where two values meet in an input buffer of `where`.
at::Tensor oplus_values(const Semiring& sr, const at::Tensor& a, const at::Tensor& b, const std::string& where,
                        const char* plain_note);
// The ⊕-reduction over the dims a forward op broadcast (the semiring sum_to).
at::Tensor reduce_value(const Semiring& sr, const at::Tensor& value, const torch::autograd::InputMetadata& meta);
// ⊗: `node`'s rule applied to the values at its outputs; one value (or an
// undefined tensor) per next edge.
std::vector<at::Tensor> node_values(torch::autograd::Node& node, const Semiring& sr,
                                    const std::vector<at::Tensor>& grads, const char* plain_note);
// What torch.autograd.grad returns for a captured value.
at::Tensor readout_value(const Semiring& sr, const at::Tensor& value);

}  // namespace torch_semiring
