// UseShortOpenMpSpin: the programs' OpenMP workers share the cores with
// other threads (the server's gRPC threads; a load generator's server on
// the same machine). libgomp's default is to spin for a long while after
// every parallel region, which takes those cores from the others
// (docs/benchmarks.md, "Measured figures behind constants in the code").
// A short spin keeps a single
// stream's latency low and lets the threads sleep between batches. libgomp
// reads its environment when it is loaded, so the setting is applied by
// re-executing once; an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
#ifndef LINATTN_CORE_UTIL_OPENMP_SPIN_H_
#define LINATTN_CORE_UTIL_OPENMP_SPIN_H_

#include <unistd.h>

#include <cstdlib>

namespace linattn {

// Call first in main(); returns only when no re-execution was needed or it
// failed (then the program carries on as it is).
inline void UseShortOpenMpSpin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr ||
      std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("GOMP_SPINCOUNT", "20000", 1);
  // The binary's own path (not /proc/self/exe itself, which would rename
  // the process "exe" in ps and top).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);  // returns only on failure
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_OPENMP_SPIN_H_
