// ParallelFor: a loop over [0, n) spread over the OpenMP team only when the
// caller says the work is worth it.
//
// `#pragma omp parallel for if (cond)` with a false condition still starts
// and ends a one-thread team, and libgomp wakes its waiters with a futex
// system call each time; inside another parallel region it opens a nested
// one. Decode steps run dozens of small per-row passes, so that cost
// showed in every step (docs/benchmarks.md, "Measured figures behind
// constants in the code"). Here a small or nested loop is a plain loop: no
// region, no system call.
#ifndef LINATTN_CORE_UTIL_PARALLEL_FOR_H_
#define LINATTN_CORE_UTIL_PARALLEL_FOR_H_

#include <omp.h>

#include <cstdint>

namespace linattn {

// fn(i) for every i in [0, n), each exactly once.
template <typename Fn>
void ParallelFor(uint64_t n, bool parallel, const Fn& fn) {
  if (parallel && n > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (uint64_t i = 0; i < n; ++i) fn(i);
  } else {
    for (uint64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_PARALLEL_FOR_H_
