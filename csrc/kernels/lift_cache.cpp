// The weight-preparation cache of the semiring GEMM kernels (policy in
// lift_cache.h): an LRU list of entries plus a hash index on their keys.
// Cost per lookup: one hash of the key and a sweep over the entries for dead
// storages (an atomic load each; a model has tens to hundreds of weights).
#include "kernels/lift_cache.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>

namespace torch_semiring {
namespace kernels {

namespace {

struct Key {
  const void* storage;
  const void* data;
  int64_t offset;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  at::Device device;
  std::string kind;
  bool operator==(const Key& o) const {
    return storage == o.storage && data == o.data && offset == o.offset && sizes == o.sizes &&
           strides == o.strides && dtype == o.dtype && device == o.device && kind == o.kind;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.storage);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<const void*>()(k.data));
    mix(std::hash<int64_t>()(k.offset));
    for (auto s : k.sizes) mix(std::hash<int64_t>()(s));
    for (auto s : k.strides) mix(std::hash<int64_t>()(s));
    mix(std::hash<int>()(int(k.dtype)));
    mix(std::hash<std::string>()(k.kind));
    return h;
  }
};

struct Entry {
  Key key;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // identity only: never keeps the data alive
  int64_t version;
  Prepared prepared;
  int64_t bytes;
};

int64_t limit_from_env() {
  if (const char* s = std::getenv("TORCH_SEMIRING_LIFT_CACHE_BYTES")) {
    char* end = nullptr;
    long long v = std::strtoll(s, &end, 10);
    if (end != s && v >= 0) return v;
  }
  return int64_t(1) << 30;
}

struct Cache {
  std::mutex mutex;
  std::list<Entry> lru;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index;
  int64_t bytes = 0, limit = limit_from_env();
  int64_t hits = 0, misses = 0, uncached = 0;

  void erase(std::list<Entry>::iterator it) {
    bytes -= it->bytes;
    index.erase(it->key);
    lru.erase(it);
  }
  // Entries whose weight's storage died.
  void sweep() {
    for (auto it = lru.begin(); it != lru.end();) {
      auto next = std::next(it);
      if (it->storage.expired()) erase(it);
      it = next;
    }
  }
  void evict_to(int64_t target) {
    while (bytes > target && !lru.empty()) erase(std::prev(lru.end()));
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked on purpose: tensors must not be freed after libtorch at exit
  return *c;
}

Key key_of(const at::Tensor& w, const std::string& kind) {
  return Key{w.storage().unsafeGetStorageImpl(), w.data_ptr(), w.storage_offset(), w.sizes().vec(),
             w.strides().vec(), w.scalar_type(), w.device(), kind};
}

// Bytes held by the prepared tensors (a storage shared by several counts once).
int64_t bytes_of(const Prepared& p) {
  int64_t b = 0;
  std::vector<const void*> seen;
  for (const auto& t : p) {
    if (!t.defined() || !t.has_storage()) continue;
    const void* s = t.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    b += int64_t(t.storage().nbytes());
  }
  return b;
}

// A prepared tensor that shared the weight's storage would keep the weight
// alive through the cache: preparations must always be new tensors.
bool aliases(const Prepared& p, const at::Tensor& w) {
  for (const auto& t : p)
    if (t.defined() && t.has_storage() && t.storage().is_alias_of(w.storage())) return true;
  return false;
}

Prepared make_without_grad(const at::Tensor& w, const std::function<Prepared(const at::Tensor&)>& make) {
  at::NoGradGuard no_grad;
  return make(w);
}

// How many SavedOperandScopes are open on this thread.
thread_local int saved_operand_depth = 0;

}  // namespace

SavedOperandScope::SavedOperandScope() { ++saved_operand_depth; }
SavedOperandScope::~SavedOperandScope() { --saved_operand_depth; }

bool lift_cache_applies(const at::Tensor& w) {
  if (saved_operand_depth == 0 || !lift_cacheable(w)) return false;
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.limit > 0;
}

bool lift_cacheable(const at::Tensor& w) {
  if (!w.defined() || w.is_inference() || w.layout() != at::kStrided || !w.has_storage()) return false;
  at::TensorBase base = w;
  while (base.is_view()) base = base._base();
  return base.is_leaf();
}

void count_uncached_preparation() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  ++c.uncached;
}

Prepared prepared_weight(const at::Tensor& w, const std::string& kind,
                         const std::function<Prepared(const at::Tensor&)>& make) {
  auto& c = cache();
  if (!lift_cache_applies(w)) {
    count_uncached_preparation();
    return make_without_grad(w, make);
  }
  Key key = key_of(w, kind);
  const int64_t version = w._version();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.sweep();
    auto found = c.index.find(key);
    if (found != c.index.end()) {
      auto it = found->second;
      if (it->version == version) {
        ++c.hits;
        c.lru.splice(c.lru.begin(), c.lru, it);
        return it->prepared;
      }
      c.erase(it);  // an older version of the weight
    }
    ++c.misses;
  }
  Prepared prepared = make_without_grad(w, make);
  const int64_t bytes = bytes_of(prepared);
  std::lock_guard<std::mutex> lock(c.mutex);
  if (bytes > c.limit || aliases(prepared, w)) return prepared;
  auto found = c.index.find(key);  // another thread may have prepared it meanwhile
  if (found != c.index.end()) c.erase(found->second);
  c.evict_to(c.limit - bytes);
  c.lru.push_front(Entry{key, w.storage().getWeakStorageImpl(), version, prepared, bytes});
  c.index.emplace(std::move(key), c.lru.begin());
  c.bytes += bytes;
  return prepared;
}

LiftCacheInfo lift_cache_info() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.sweep();
  LiftCacheInfo info;
  info.hits = c.hits, info.misses = c.misses, info.uncached = c.uncached;
  info.entries = int64_t(c.lru.size()), info.bytes = c.bytes, info.limit = c.limit;
  return info;
}

void clear_lift_cache() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.index.clear();
  c.lru.clear();
  c.bytes = 0;
  c.hits = c.misses = c.uncached = 0;
}

void set_lift_cache_limit(int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, "torch_semiring: the lift cache limit must be >= 0 bytes, got ", bytes);
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.limit = bytes;
  c.evict_to(bytes);
}

}  // namespace kernels
}  // namespace torch_semiring
