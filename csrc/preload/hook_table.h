// The C ABI between the preloaded interposer (interpose.cpp, built as
// torch_semiring/_preload*.so, loaded with LD_PRELOAD) and the semiring library
// (torch_semiring._C, loaded later by `import torch_semiring`).
//
// The interposer defines the stock wheel's exported engine symbols — the hook
// points of the upstream patch series (patches/pytorch/) — and, while no
// semiring is active on the calling thread, jumps straight to the wheel's own
// definition. While one is active it calls the library through this table.
// It knows no torch type: every object crosses as an opaque pointer, and the
// library casts them back (it is compiled against the same headers as the
// wheel). The interposer therefore links against nothing but libc/libdl, so
// preloading it costs nothing in processes that never import torch.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PRELOAD_ABI_VERSION 1

// `original` is always the wheel's definition of the interposed symbol; a
// hook calls it for values that are not semiring values (and to reuse its
// bookkeeping). `result` is uninitialised storage for the return value
// (std::vector<at::Tensor> or at::Tensor), which the hook constructs.
struct ts_preload_hooks {
  int abi_version;
  // XxxBackward::apply (generated nodes, CopySlices, CopyBackwards): ⊗.
  void (*node_apply)(void* node, void* grads, void* result, void* original);
  // InputBuffer::add(pos, var, producer_stream, consumer_stream, fn): ⊕.
  void (*input_buffer_add)(void* buffer, size_t pos, void* var, const void* producer_stream,
                           const void* consumer_stream, void* fn, void* original);
  // InputMetadata::reduce_grad(grad) const: the broadcast ⊕-reduction.
  void (*reduce_grad)(const void* metadata, void* grad, void* result, void* original);
  // AccumulateGrad::apply(grads): .grad accumulation.
  void (*accumulate_grad)(void* node, void* grads, void* result, void* original);
  // Engine::execute(roots, inputs, keep_graph, create_graph, accumulate_grad,
  // outputs): seeds are lifted before, captured values read out after.
  void (*engine_execute)(void* engine, const void* roots, const void* inputs, int keep_graph, int create_graph,
                         int accumulate_grad, const void* outputs, void* result, void* original);
};

// ---- exported by the interposer --------------------------------------------
// Installs the library's hooks (once, at import).
void ts_preload_install(const struct ts_preload_hooks* hooks);
// The semiring active on the calling thread (an opaque library pointer), or
// NULL: every interposed symbol is then the wheel's own.
void ts_preload_set_active(const void* semiring);
const void* ts_preload_active(void);
// How many symbols this build interposes, and the wheel's definition of
// symbol number i (NULL when the loaded torch does not define it): for tests
// and diagnostics.
int ts_preload_symbol_count(void);
const char* ts_preload_symbol_name(int i);
void* ts_preload_original(int i);

#ifdef __cplusplus
}
#endif
