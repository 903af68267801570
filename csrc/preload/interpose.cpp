// The LD_PRELOAD interposer: the upstream patch's hook points on the stock
// wheel. It defines the wheel's exported engine symbols that the patch series
// touches —
//   InputBuffer::add                 ⊕ of values meeting at a node input
//   InputMetadata::reduce_grad       ⊕ over broadcast dims (bias gradients)
//   AccumulateGrad::apply            ⊕ into .grad
//   Engine::execute                  seeds lifted, captured values read out
//   XxxBackward::apply               ⊗: the node's semiring rule (711 generated
//                                    nodes, CopySlices, CopyBackwards)
// — so that the dynamic linker binds the wheel's own calls (PLT entries and
// vtable relocations; libtorch is not linked -Bsymbolic) to these definitions.
// While no semiring is active on the calling thread each one jumps to the
// wheel's definition; otherwise it hands over to the library's hooks
// (hook_table.h). The symbol list is generated from the installed wheel by
// tools/gen_preload_symbols.py.
//
// Why per-node applys and not one engine hook: the engine's node call
// (call_function) is a file-local function of engine.cpp, not an exported
// symbol; the patch series (patch 3) uses that single site instead.
#include "hook_table.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "preload_symbols.h"  // generated: TS_PRELOAD_* symbol names

// Same size as std::vector<at::Tensor> / at::Tensor, and — through the
// user-provided destructor — "non-trivial for the purposes of calls", so they
// are returned through a hidden pointer exactly like the real types. (Outside
// the anonymous namespace: the interposed functions must keep external linkage.)
namespace ts_preload {
struct OpaqueTensorList {
  void* words[3];
  ~OpaqueTensorList() {}
};
struct OpaqueTensor {
  void* impl;
  ~OpaqueTensor() {}
};
}  // namespace ts_preload
using ts_preload::OpaqueTensor;
using ts_preload::OpaqueTensorList;

namespace {

enum : int { kInputBufferAdd, kReduceGrad, kAccumulateGrad, kEngineExecute, kFirstNodeApply };
#define TS_NAME(I, SYMBOL) SYMBOL,
const char* const kSymbols[] = {TS_PRELOAD_INPUT_BUFFER_ADD, TS_PRELOAD_REDUCE_GRAD, TS_PRELOAD_ACCUMULATE_GRAD,
                                TS_PRELOAD_ENGINE_EXECUTE, TS_PRELOAD_NODE_APPLY(TS_NAME)};
#undef TS_NAME
constexpr int kSymbolCount = sizeof(kSymbols) / sizeof(kSymbols[0]);

std::atomic<void*> originals[kSymbolCount];
std::atomic<const ts_preload_hooks*> installed_hooks{nullptr};
// initial-exec: this library is loaded at start-up (LD_PRELOAD), so its TLS is
// static and the off-mode check is a single thread-pointer-relative load.
__attribute__((tls_model("initial-exec"))) thread_local const void* active_semiring = nullptr;

// The wheel's definition: the next one after ours in the global scope, or —
// torch's libraries are usually loaded RTLD_LOCAL by Python, outside the
// global scope that RTLD_NEXT searches — the one inside libtorch_cpu itself.
void* lookup_original(int i) {
  void* fn = dlsym(RTLD_NEXT, kSymbols[i]);
  if (!fn) {
    if (void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) {
      fn = dlsym(lib, kSymbols[i]);
      dlclose(lib);
    }
  }
  return fn;
}

void* original(int i) {
  void* fn = originals[i].load(std::memory_order_acquire);
  if (__builtin_expect(fn != nullptr, 1)) return fn;
  fn = lookup_original(i);
  if (!fn) {
    // Only libtorch calls these symbols, so libtorch is loaded: a missing
    // definition means the wheel differs from the one this was built against.
    std::fprintf(stderr,
                 "torch_semiring preload: the loaded torch does not define %s; rebuild torch_semiring "
                 "against the installed torch (make build)\n",
                 kSymbols[i]);
    std::abort();
  }
  originals[i].store(fn, std::memory_order_release);
  return fn;
}

inline const ts_preload_hooks* hooks_if_active() {
  if (__builtin_expect(active_semiring == nullptr, 1)) return nullptr;
  return installed_hooks.load(std::memory_order_acquire);
}

// Node::apply(variable_list&&) of symbol i: the wheel's, or `hook` of the
// installed table (node_apply for nodes, accumulate_grad for AccumulateGrad).
using ApplyFn = OpaqueTensorList (*)(void*, void*);
using ApplyHook = void (*ts_preload_hooks::*)(void*, void*, void*, void*);

inline OpaqueTensorList apply_site(int i, ApplyHook hook, void* self, void* grads) {
  void* fn = original(i);
  const ts_preload_hooks* h = hooks_if_active();
  if (!h) return reinterpret_cast<ApplyFn>(fn)(self, grads);
  OpaqueTensorList out;
  (h->*hook)(self, grads, &out, fn);
  return out;
}

}  // namespace

// ---- the interposed definitions ---------------------------------------------

void ts_input_buffer_add(void* self, size_t pos, void* var, const void* producer_stream, const void* consumer_stream,
                         void* fn) __asm__(TS_PRELOAD_INPUT_BUFFER_ADD);
void ts_input_buffer_add(void* self, size_t pos, void* var, const void* producer_stream, const void* consumer_stream,
                         void* fn) {
  void* orig = original(kInputBufferAdd);
  if (const ts_preload_hooks* h = hooks_if_active())
    return h->input_buffer_add(self, pos, var, producer_stream, consumer_stream, fn, orig);
  using Fn = void (*)(void*, size_t, void*, const void*, const void*, void*);
  reinterpret_cast<Fn>(orig)(self, pos, var, producer_stream, consumer_stream, fn);
}

OpaqueTensor ts_reduce_grad(const void* self, void* grad) __asm__(TS_PRELOAD_REDUCE_GRAD);
OpaqueTensor ts_reduce_grad(const void* self, void* grad) {
  void* orig = original(kReduceGrad);
  const ts_preload_hooks* h = hooks_if_active();
  if (!h) return reinterpret_cast<OpaqueTensor (*)(const void*, void*)>(orig)(self, grad);
  OpaqueTensor out;
  h->reduce_grad(self, grad, &out, orig);
  return out;
}

OpaqueTensorList ts_accumulate_grad(void* self, void* grads) __asm__(TS_PRELOAD_ACCUMULATE_GRAD);
OpaqueTensorList ts_accumulate_grad(void* self, void* grads) {
  return apply_site(kAccumulateGrad, &ts_preload_hooks::accumulate_grad, self, grads);
}

OpaqueTensorList ts_engine_execute(void* self, const void* roots, const void* inputs, bool keep_graph,
                                   bool create_graph, bool accumulate_grad, const void* outputs)
    __asm__(TS_PRELOAD_ENGINE_EXECUTE);
OpaqueTensorList ts_engine_execute(void* self, const void* roots, const void* inputs, bool keep_graph,
                                   bool create_graph, bool accumulate_grad, const void* outputs) {
  void* orig = original(kEngineExecute);
  const ts_preload_hooks* h = hooks_if_active();
  if (!h) {
    using Fn = OpaqueTensorList (*)(void*, const void*, const void*, bool, bool, bool, const void*);
    return reinterpret_cast<Fn>(orig)(self, roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }
  OpaqueTensorList out;
  h->engine_execute(self, roots, inputs, keep_graph, create_graph, accumulate_grad, outputs, &out, orig);
  return out;
}

#define TS_NODE_APPLY(I, SYMBOL)                                                           \
  OpaqueTensorList ts_node_apply_##I(void* self, void* grads) __asm__(SYMBOL);            \
  OpaqueTensorList ts_node_apply_##I(void* self, void* grads) {                           \
    return apply_site(kFirstNodeApply + I, &ts_preload_hooks::node_apply, self, grads);   \
  }
TS_PRELOAD_NODE_APPLY(TS_NODE_APPLY)
#undef TS_NODE_APPLY

// ---- control, called by the library -----------------------------------------

extern "C" {

void ts_preload_install(const ts_preload_hooks* hooks) {
  if (hooks && hooks->abi_version != TS_PRELOAD_ABI_VERSION) {
    std::fprintf(stderr, "torch_semiring preload: hook table ABI %d, expected %d; rebuild (make build)\n",
                 hooks->abi_version, TS_PRELOAD_ABI_VERSION);
    std::abort();
  }
  installed_hooks.store(hooks, std::memory_order_release);
}

void ts_preload_set_active(const void* semiring) { active_semiring = semiring; }
const void* ts_preload_active(void) { return active_semiring; }
int ts_preload_symbol_count(void) { return kSymbolCount; }
const char* ts_preload_symbol_name(int i) { return i >= 0 && i < kSymbolCount ? kSymbols[i] : nullptr; }
void* ts_preload_original(int i) { return i >= 0 && i < kSymbolCount ? lookup_original(i) : nullptr; }

}  // extern "C"
