#include "engine_hooks.h"

#include <dlfcn.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/input_buffer.h>
#include <torch/csrc/autograd/input_metadata.h>

#include <new>

#include "../preload/hook_table.h"
#include "../rules/rule.h"
#include "semiring_value.h"

namespace torch_semiring {

using torch::autograd::AccumulateGrad;
using torch::autograd::edge_list;
using torch::autograd::Engine;
using torch::autograd::InputBuffer;
using torch::autograd::InputMetadata;
using torch::autograd::Node;
using torch::autograd::variable_list;

static_assert(sizeof(variable_list) == 3 * sizeof(void*) && sizeof(at::Tensor) == sizeof(void*),
              "hook_table.h's opaque return storage must match std::vector<at::Tensor> and at::Tensor");

namespace {

// The interposer's exported controls (found in the process at install time).
struct Interposer {
  void (*install)(const ts_preload_hooks*) = nullptr;
  void (*set_active)(const void*) = nullptr;
  const void* (*active)() = nullptr;
  int (*symbol_count)() = nullptr;
  const char* (*symbol_name)(int) = nullptr;
  void* (*original)(int) = nullptr;
} interposer;

// The mode: the semiring is kept alive here; the interposer sees its address.
thread_local SemiringPtr thread_semiring;

const Semiring& active_semiring() {
  const void* p = interposer.active ? interposer.active() : nullptr;
  TORCH_INTERNAL_ASSERT(p, "torch_semiring: a preload hook ran with no semiring active");
  return *static_cast<const Semiring*>(p);
}

LeafAccumulator& leaf_accumulator() {
  static LeafAccumulator accumulator;
  return accumulator;
}

// .backward()'s leaf values, collected by AccumulateGrad and applied by the
// Engine::execute hook once the whole pass succeeded (so a failing pass
// leaves every .grad untouched, as in the out-of-tree engine).
struct LeafValues {
  std::vector<at::Tensor> variables, values;
};
thread_local LeafValues* pending_leaves = nullptr;

const char* const kNotIntercepted =
    "it came from a node the LD_PRELOAD harness cannot intercept (a Python autograd.Function, a C++ custom "
    "function, or a hook that returned a new gradient). Run this model with torch_semiring.grad or "
    "ts.semiring() without the preload: the out-of-tree engine runs Python Functions through "
    "torch_semiring.register_rule.";

// ---- the interposer's hooks: which semiring is active, the wheel's own code
// for plain tensors, and the stock engine kept out of the way while rules run;
// the semantics themselves are the shared functions at the end of this file.

// ⊗: grads arrive wrapped; the node's rule maps them to its inputs' values.
void node_apply(void* self, void* grads_ptr, void* result, void* /*original*/) {
  Node& node = *static_cast<Node*>(self);  // Node is the primary base of every interposed node type
  const Semiring& sr = active_semiring();
  PreloadSuspended stock;  // the rule may call the node's own backward
  new (result) variable_list(node_values(node, sr, *static_cast<variable_list*>(grads_ptr), kNotIntercepted));
}

// ⊕ where two values meet in one input buffer slot. The first value is stored
// by the wheel's own add (it only moves it; no arithmetic).
void input_buffer_add(void* buffer_ptr, size_t pos, void* var_ptr, const void* producer_stream,
                      const void* consumer_stream, void* fn, void* original) {
  auto& buffer = *static_cast<InputBuffer*>(buffer_ptr);
  auto& var = *static_cast<at::Tensor*>(var_ptr);
  if (!var.defined()) return;
  TORCH_INTERNAL_ASSERT(pos < buffer.buffer.size());
  auto& old = buffer.buffer[pos];
  if (!old.defined() || !(is_wrapped_value(var) || is_wrapped_value(old))) {
    using Add = void (*)(InputBuffer*, size_t, at::Tensor*, const void*, const void*, void*);
    return reinterpret_cast<Add>(original)(&buffer, pos, &var, producer_stream, consumer_stream, fn);
  }
  const Semiring& sr = active_semiring();
  TORCH_CHECK(var.device().is_cpu(), "torch_semiring: the LD_PRELOAD harness runs CPU graphs only (device ",
              var.device(), "); CUDA streams need the patched engine (patches/pytorch/)");
  PreloadSuspended stock;
  old = oplus_values(sr, old, var, fn ? static_cast<Node*>(fn)->name() : "a node", kNotIntercepted);
  var = at::Tensor();  // consumed, as the stock add consumes it
}

// The semiring sum_to: ⊕ over the dims a forward op broadcast.
void reduce_grad(const void* meta_ptr, void* grad_ptr, void* result, void* original) {
  const auto& meta = *static_cast<const InputMetadata*>(meta_ptr);
  auto& grad = *static_cast<at::Tensor*>(grad_ptr);
  if (!is_wrapped_value(grad)) {
    using Reduce = at::Tensor (*)(const InputMetadata*, at::Tensor&);
    new (result) at::Tensor(reinterpret_cast<Reduce>(original)(&meta, grad));
    return;
  }
  const Semiring& sr = active_semiring();
  PreloadSuspended stock;
  new (result) at::Tensor(reduce_value(sr, grad, meta));
}

// A leaf's total value: kept until the pass has succeeded.
void accumulate_grad(void* self, void* grads_ptr, void* result, void* original) {
  auto& node = *static_cast<AccumulateGrad*>(self);
  auto& grads = *static_cast<variable_list*>(grads_ptr);
  if (grads.size() == 1 && grads[0].defined() && !is_wrapped_value(grads[0])) {
    TORCH_CHECK(false, "torch_semiring: the .grad of a leaf of shape ", node.variable.sizes(), " received a plain "
                "gradient while semiring '", active_semiring().name(), "' is active; ", kNotIntercepted);
  }
  if (grads.size() == 1 && grads[0].defined()) {
    TORCH_INTERNAL_ASSERT(pending_leaves, "torch_semiring: AccumulateGrad ran outside Engine::execute");
    pending_leaves->variables.push_back(node.variable);
    pending_leaves->values.push_back(unwrap_value(grads[0]));
    new (result) variable_list();
    return;
  }
  using Apply = variable_list (*)(Node*, variable_list&&);
  new (result) variable_list(reinterpret_cast<Apply>(original)(&node, std::move(grads)));
}

// The boundary of a semiring pass: seeds in, read-outs and .grad updates out.
void engine_execute(void* self, const void* roots_ptr, const void* inputs_ptr, int keep_graph, int create_graph,
                    int accumulate, const void* outputs_ptr, void* result, void* original) {
  const auto& inputs = *static_cast<const variable_list*>(inputs_ptr);
  const Semiring& sr = active_semiring();
  TORCH_CHECK(!create_graph, "torch_semiring: create_graph=True is not supported by the LD_PRELOAD harness (its "
              "values cannot carry autograd history); use torch_semiring.grad(..., create_graph=True)");
  variable_list seeds(inputs.size());
  {
    PreloadSuspended stock;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) seeds[i] = lift_seed_value(sr, inputs[i]);
  }
  LeafValues leaves;
  struct Pending {
    LeafValues* previous;
    explicit Pending(LeafValues* now) : previous(pending_leaves) { pending_leaves = now; }
    ~Pending() { pending_leaves = previous; }
  } pending(&leaves);
  using Execute = variable_list (*)(Engine*, const edge_list&, const variable_list&, bool, bool, bool,
                                    const edge_list&);
  variable_list captured = reinterpret_cast<Execute>(original)(
      static_cast<Engine*>(self), *static_cast<const edge_list*>(roots_ptr), seeds, keep_graph != 0,
      create_graph != 0, accumulate != 0, *static_cast<const edge_list*>(outputs_ptr));
  PreloadSuspended stock;
  for (auto& t : captured)
    if (t.defined() && is_wrapped_value(t)) t = readout_value(sr, t);
  if (!leaves.variables.empty()) {
    TORCH_CHECK(leaf_accumulator(), "torch_semiring: no .grad accumulator installed (import torch_semiring)");
    leaf_accumulator()(leaves.variables, leaves.values);
  }
  new (result) variable_list(std::move(captured));
}

const ts_preload_hooks kHooks{TS_PRELOAD_ABI_VERSION, node_apply, input_buffer_add, reduce_grad, accumulate_grad,
                              engine_execute};

template <class F>
bool find(F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return fn != nullptr;
}

}  // namespace

bool install_preload_hooks() {
  if (preload_loaded()) return true;
  Interposer found;
  if (!(find(found.install, "ts_preload_install") && find(found.set_active, "ts_preload_set_active") &&
        find(found.active, "ts_preload_active") && find(found.symbol_count, "ts_preload_symbol_count") &&
        find(found.symbol_name, "ts_preload_symbol_name") && find(found.original, "ts_preload_original")))
    return false;
  interposer = found;
  interposer.install(&kHooks);
  return true;
}

bool preload_loaded() { return interposer.install != nullptr; }

void set_preload_semiring(SemiringPtr semiring) {
  if (semiring && semiring->stock_backward_is_exact()) semiring = nullptr;
  TORCH_CHECK(!semiring || preload_loaded(), "torch_semiring: the LD_PRELOAD interposer is not loaded");
  thread_semiring = std::move(semiring);
  if (interposer.set_active) interposer.set_active(thread_semiring.get());
}

void set_preload_accumulator(LeafAccumulator accumulator) { leaf_accumulator() = std::move(accumulator); }

std::vector<std::pair<std::string, bool>> preload_symbols() {
  std::vector<std::pair<std::string, bool>> out;
  if (!preload_loaded()) return out;
  for (int i = 0; i < interposer.symbol_count(); ++i)
    out.emplace_back(interposer.symbol_name(i), interposer.original(i) != nullptr);
  return out;
}

PreloadSuspended::PreloadSuspended() : previous_(interposer.active ? interposer.active() : nullptr) {
  if (previous_) interposer.set_active(nullptr);
}
PreloadSuspended::~PreloadSuspended() {
  if (previous_) interposer.set_active(previous_);
}

// ---- the hook semantics, shared by both routes ----------------------------------

at::Tensor lift_seed_value(const Semiring& sr, const at::Tensor& grad_output) {
  // grad_output entries are weights of edges to a virtual sink: lifted (the
  // default all-ones grad_outputs become the semiring one).
  const auto dtype = grad_output.scalar_type();
  return wrap_value(sr.lift(grad_output.detach().to(sr.value_dtype(dtype))), sr, dtype);
}

at::Tensor oplus_values(const Semiring& sr, const at::Tensor& a, const at::Tensor& b, const std::string& where,
                        const char* plain_note) {
  TORCH_CHECK(is_wrapped_value(a) && is_wrapped_value(b), "torch_semiring: a plain gradient met a value of "
              "semiring '", sr.name(), "' in an input buffer of ", where, "; ", plain_note);
  return wrap_value(sr.oplus(unwrap_value(a), unwrap_value(b)), sr, a.scalar_type());
}

at::Tensor reduce_value(const Semiring& sr, const at::Tensor& value, const InputMetadata& meta) {
  return wrap_value(oplus_sum_to(sr, unwrap_value(value), metadata_shape(meta), "a node"), sr, value.scalar_type());
}

variable_list node_values(Node& node, const Semiring& sr, const variable_list& grads, const char* plain_note) {
  std::vector<at::Tensor> values(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    TORCH_CHECK(is_wrapped_value(grads[i]), "torch_semiring: ", node.name(), " received a plain gradient at "
                "output ", i, " while semiring '", sr.name(), "' is active; ", plain_note);
    values[i] = unwrap_value(grads[i]);
  }
  auto outputs = apply_rule(node, sr, [&](size_t j) { return node.task_should_compute_output(j); }, values,
                            at::GradMode::is_enabled());
  // Shapes stay as the rule made them (the engine's validate_outputs then
  // calls reduce_grad for broadcast ones); dtypes become the inputs'.
  const auto& edges = node.next_edges();
  for (size_t j = 0; j < outputs.size(); ++j)
    if (outputs[j].defined())
      outputs[j] = wrap_value(std::move(outputs[j]), sr,
                              c10::typeMetaToScalarType(edges[j].function->input_metadata(edges[j].input_nr).dtype()));
  return outputs;
}

at::Tensor readout_value(const Semiring& sr, const at::Tensor& value) { return sr.readout(unwrap_value(value)); }

}  // namespace torch_semiring
