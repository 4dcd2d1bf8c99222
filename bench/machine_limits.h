// The machine's own limits, measured in the same process as the kernels they
// bound, so every ratio in a benchmark run compares like with like.
#ifndef LINATTN_BENCH_MACHINE_LIMITS_H_
#define LINATTN_BENCH_MACHINE_LIMITS_H_

#include <cstdint>

namespace linattn::bench {

// Read-modify-write bandwidth (bytes read + bytes written per second) of
// x ← a·x + b over a buffer of `bytes`: the better of one thread and all
// OpenMP threads. Measured anew at each call (~0.5 s), so that a ratio
// compares with the machine as it was at that moment.
double RmwBandwidth(uint64_t bytes);

// oneDNN fp32 matmul GFLOP/s on a large square GEMM (n = 2048), best of a
// few runs: the compute bound for the chunkwise path. Measured anew at each
// call, so each ratio compares with the machine as it was at that moment
// (a shared VM's speed drifts by tens of percent within a run).
double LargeGemmGflops();

}  // namespace linattn::bench

#endif  // LINATTN_BENCH_MACHINE_LIMITS_H_
