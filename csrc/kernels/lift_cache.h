// A cache of what the semiring GEMM kernels prepare from a weight matrix —
// its lift (log|w|, |w|, NaN-marked w) packed in the micro-kernel's layout, or
// the exp-shift factors of the log/entropy products (column shifts t, Q =
// |w|e^{−t}, Q∘log|w|) — so that a weight that does not change is prepared
// once, not on every backward call.
//
// Why: in a backward through frozen layers (the interpretability case) every
// linear layer's semiring product used to lift and range-check the same W on
// every call: a few element-wise passes over K·N elements, as costly as a
// third to a half of the GEMM itself when M (tokens) is small.
//
// Policy:
// - Caching is opt-in per call site: a rule marks, with a SavedOperandScope,
//   the products whose weight operand is a tensor the node saved in the
//   forward pass (the linear-algebra rules do). Tensors made while rules run
//   are leaves too (the engine runs with grad mode off) but serve one call:
//   they are always prepared per call, one batch entry at a time.
// - Of the saved operands only those that cannot be an activation are cached:
//   leaves (no grad_fn: parameters, frozen or not, and inputs) and views of
//   leaves (addmm saves W.t()). Inference tensors (no version counter) and
//   non-strided layouts are never cached.
// - An entry belongs to one (storage, data pointer, storage offset, sizes,
//   strides, dtype, device, preparation kind) and is valid only for the
//   tensor's version counter value it was made at: an in-place change
//   (W.add_(), W.copy_(), an optimizer step) bumps the version and the next
//   call recomputes. As with autograd's own saved-tensor check, a change that
//   bypasses the version counter (through `.data`, or a `set_` of another
//   tensor's storage into it) is not seen: call clear_lift_cache() after one.
// - No strong reference to the weight is held: an entry keeps only a weak
//   reference to the storage (so its identity cannot be reused), and an entry
//   whose storage died is dropped at the next access to the cache (any
//   lookup, lift_cache_info(), clear_lift_cache()).
// - The prepared tensors are bounded by a byte limit (default 1 GiB, or the
//   environment variable TORCH_SEMIRING_LIFT_CACHE_BYTES at first use; set 0
//   to disable); past it the least recently used entries are evicted.
// Thread-safe; the preparation itself runs outside the lock.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torch_semiring {
namespace kernels {

// What a kernel prepared from a weight. Empty = the weight is outside the
// range the kernel is exact on (e.g. not finite): the kernel declines, and the
// cache remembers that too.
using Prepared = std::vector<at::Tensor>;

// The preparation `kind` of w (a name that says what, and anything else it
// depends on: ISA, tile width) — from the cache when lift_cache_applies(w)
// and an entry of its current version exists, else make(w) (run under
// no-grad), stored when lift_cache_applies(w) and the result fits the limit.
Prepared prepared_weight(const at::Tensor& w, const std::string& kind,
                         const std::function<Prepared(const at::Tensor&)>& make);

// Marks the products run inside it as having a saved forward tensor of the
// node as their weight operand (see the policy). Thread-local, nests.
class SavedOperandScope {
 public:
  SavedOperandScope();
  ~SavedOperandScope();
  SavedOperandScope(const SavedOperandScope&) = delete;
  SavedOperandScope& operator=(const SavedOperandScope&) = delete;
};

// Whether w is a tensor the cache may keep, if passed as a saved operand: a
// leaf or a view of one (see the policy above).
bool lift_cacheable(const at::Tensor& w);
// Whether prepared_weight(w, …) here would look w up in the cache (inside a
// SavedOperandScope, lift_cacheable, and the cache not disabled): a kernel
// that would otherwise prepare w lazily, entry by entry, prepares it whole.
bool lift_cache_applies(const at::Tensor& w);
// For a kernel that prepares a non-cacheable w itself (without
// prepared_weight): counts it in LiftCacheInfo::uncached.
void count_uncached_preparation();

struct LiftCacheInfo {
  int64_t hits = 0, misses = 0;  // lookups of cacheable weights since the last clear
  int64_t uncached = 0;          // preparations of weights that may not be cached
  int64_t entries = 0, bytes = 0, limit = 0;
};
LiftCacheInfo lift_cache_info();
// Drops every entry and zeroes the counters.
void clear_lift_cache();
// Byte limit of the prepared tensors (0 disables the cache); evicts down to it.
void set_lift_cache_limit(int64_t bytes);

}  // namespace kernels
}  // namespace torch_semiring
