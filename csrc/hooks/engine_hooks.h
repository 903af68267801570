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
// code, untouched.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../semiring/semiring.h"

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

}  // namespace torch_semiring
