// Why the engine touches malloc's settings at all.
//
// A semiring backward allocates and frees many blocks of 0.1–10 MiB a node
// (values with several components, packed operands, row buffers). glibc serves
// a block above M_MMAP_THRESHOLD by mmap (unmapped again on free) and gives the
// free memory at the top of its heap back to the kernel once more than
// M_TRIM_THRESHOLD of it is free. Both start at 128 KiB and glibc raises them
// only as it frees mmapped blocks, to the largest such block (M_TRIM_THRESHOLD
// twice that). In a process running semiring backwards they settled too low
// for the next backward's blocks: each backward gave its pages back and then
// faulted them in again, every page zero-filled by the kernel. Measured on the
// real MiniLM at 128 tokens (one thread, a process that had run ten of them):
// 2 000–6 600 page faults and 5–20 ms of system time per max_prod backward
// (~130–190 ms), 2 300–6 200 and 7–16 ms per kmax(4) one; viterbi, abs and
// entropy 0–240. With both thresholds set as below: none, and the backward's
// CPU time 4–8 % lower (best of 8, before and after in one process).
//
// So the first rule to run sets them to where glibc's own adjustment tends
// (its largest mmap threshold, 32 MiB on 64-bit, and a trim threshold of twice
// that): blocks up to 32 MiB come from the heap, and up to 64 MiB of freed heap
// is kept for reuse rather than returned. The cost is that a process keeps up to
// 64 MiB it no longer uses. The stock backward is unaffected either way
// (10–30 faults a MiniLM backward). A user who configured malloc
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
// MALLOC_MMAP_MAX_ or glibc.malloc.* in GLIBC_TUNABLES — benchmarks/run.py does,
// to measure peak memory by RSS) keeps that configuration;
// TORCH_SEMIRING_TUNE_HEAP=0 leaves malloc alone too. Another allocator
// (jemalloc, tcmalloc by LD_PRELOAD) does not read these settings.
#include "engine/process_heap.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace torch_semiring {

namespace {

bool malloc_configured_by_user() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    if (std::getenv(name)) return true;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables && std::strstr(tunables, "glibc.malloc.");
}

bool tune() {
#if defined(__GLIBC__)
  const char* opt = std::getenv("TORCH_SEMIRING_TUNE_HEAP");
  if ((opt && std::strcmp(opt, "0") == 0) || malloc_configured_by_user()) return false;
  constexpr int kMmapThreshold = 32 << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, 2 * kMmapThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace

bool keep_freed_heap_for_reuse() {
  static const bool tuned = tune();
  return tuned;
}

}  // namespace torch_semiring
