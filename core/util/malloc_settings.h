// UseServingMallocSettings: glibc's allocator tuned for a process that
// allocates and frees many short-lived buffers per message on many threads
// (gRPC's and ours).
//
// By default glibc's free() hands the free memory at the top of a thread's
// arena back to the kernel (madvise) as soon as more than M_TRIM_THRESHOLD
// (128 KiB to start with) is free there, and the next allocation faults the
// pages back in; on a VM each such madvise also flushes the other cores'
// TLBs. Profiling the server at 64 sessions (bench/serving_profile.py) put
// the madvise calls and the page faults after them at ~10% of its CPU.
// With 1 MiB for both the trim and the mmap thresholds, a buffer of up to a
// megabyte is reused from the arena, and an arena keeps at most 1 MiB free
// at its top (glibc's own moving thresholds can keep up to 64 MiB).
// An explicit GLIBC_TUNABLES setting wins.
#ifndef LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_
#define LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_

#include <malloc.h>

#include <cstdlib>

namespace linattn {

// Call early in main().
inline void UseServingMallocSettings() {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return;
  constexpr int kThreshold = 1 << 20;
  mallopt(M_TRIM_THRESHOLD, kThreshold);
  mallopt(M_MMAP_THRESHOLD, kThreshold);
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_
