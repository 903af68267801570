// The process heap's reuse of freed blocks (glibc): see process_heap.cpp.
#pragma once

namespace torch_semiring {

// Once per process, before the first rule runs: lets glibc keep the blocks a
// semiring backward frees for its next allocations instead of handing them
// back to the kernel and faulting them in again. True when the thresholds
// were set; false where the C library is not glibc, the user configured its
// malloc (MALLOC_*_ or GLIBC_TUNABLES), or TORCH_SEMIRING_TUNE_HEAP=0.
bool keep_freed_heap_for_reuse();

}  // namespace torch_semiring
