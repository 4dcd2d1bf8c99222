#include "bench/machine_limits.h"

#include <algorithm>
#include <chrono>

#include "core/onednn/matmul.h"
#include "core/util/aligned_buffer.h"

namespace linattn::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One pass of x ← a·x + b, compiled for AVX-512, AVX2 and baseline x86-64
// and picked at run time, so the bound uses the same vector width as the
// kernels it bounds.
__attribute__((target_clones("avx512f", "avx2", "default"))) void RmwPass(
    float* x, int64_t n, bool parallel) {
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * 0.999f + 0.001f;
}

}  // namespace

double RmwBandwidth(uint64_t bytes) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  AlignedBuffer buffer(n);
  float* x = buffer.data();
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  // Best of several timed runs of enough passes to take ~50 ms each, on one
  // thread and on all OpenMP threads (at small sizes a fork/join per pass
  // costs more than a second core brings): the better of the two is the
  // bound.
  double best = 0;
  for (const bool parallel : {false, true}) {
    int64_t passes = std::max<int64_t>(1, (64 << 20) / std::max<int64_t>(n, 1));
    for (int rep = 0; rep < 5; ++rep) {
      const auto start = Clock::now();
      for (int64_t p = 0; p < passes; ++p) RmwPass(x, n, parallel);
      const double s = Seconds(start, Clock::now());
      best = std::max(best, 2.0 * bytes * passes / s);
      if (s < 0.05) passes *= 2;
    }
  }
  return best;
}

double LargeGemmGflops() {
  const int64_t n = 2048;
  static AlignedBuffer* a = nullptr;
  static AlignedBuffer* b = nullptr;
  static AlignedBuffer* c = nullptr;
  const MatmulShape shape{.batch = 1, .m = n, .k = n, .n = n};
  if (a == nullptr) {
    a = new AlignedBuffer(n * n);
    b = new AlignedBuffer(n * n);
    c = new AlignedBuffer(n * n);
    for (int64_t i = 0; i < n * n; ++i) a->data()[i] = b->data()[i] = 0.5f;
    (void)BatchedMatmul(shape, a->data(), b->data(), c->data());  // warm-up
  }
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = Clock::now();
    (void)BatchedMatmul(shape, a->data(), b->data(), c->data());
    best = std::max(best, shape.Flops() / Seconds(start, Clock::now()) / 1e9);
  }
  return best;
}

}  // namespace linattn::bench
