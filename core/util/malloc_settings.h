// UseServingMallocSettings: glibc's allocator tuned for a process that
// allocates and frees many short-lived buffers per message on many threads
// (gRPC's and ours).
//
// By default glibc's free() hands the free memory at the top of a thread's
// arena back to the kernel (madvise) as soon as more than M_TRIM_THRESHOLD
// (128 KiB to start with) is free there, and the next allocation faults the
// pages back in; on a VM each such madvise also flushes the other cores'
// TLBs, a visible share of the server's CPU in bench/serving_profile.py at
// 64 sessions. glibc raises both thresholds by itself only once a block larger
// than the current mmap threshold is freed, which a server busy with
// messages of tens of kilobytes may not do for a long time, if ever.
//
// Here they are set where glibc's moving thresholds end (its rule after a
// 32 MiB block): blocks up to 32 MiB come from the arenas (larger ones are
// mapped and unmapped whole), and an arena gives memory back once more
// than 64 MiB is free at its top. A large Prefill's tensors (8 MiB each at
// 4096 tokens, 8 heads, d = 64) and its message buffers are then reused
// from call to call instead of being mapped afresh and faulted in page by
// page, which makes large Prefills faster through the server with no change
// to decode (docs/benchmarks.md, "Measured figures behind constants in the
// code"). The price is that each
// arena may keep up to 64 MiB free. An explicit glibc.malloc tunable in
// GLIBC_TUNABLES wins.
#ifndef LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_
#define LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace linattn {

// Call early in main().
inline void UseServingMallocSettings() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr &&
      std::strstr(tunables, "glibc.malloc.") != nullptr) {
    return;
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_MALLOC_SETTINGS_H_
