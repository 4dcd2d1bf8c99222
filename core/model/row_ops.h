// Row-wise passes the forward blocks share (forward.cc, forward_mixers.cc).
#ifndef LINATTN_CORE_MODEL_ROW_OPS_H_
#define LINATTN_CORE_MODEL_ROW_OPS_H_

#include <cstdint>

namespace linattn {

// Elementwise passes go parallel only above this many floats: below it a
// parallel region (wake-up and barrier) costs more than the pass itself.
inline constexpr uint64_t kParallelFloats = 1 << 16;

// y = x / sqrt(mean(x²) + eps) · w (w may be null), n vectors of d; y may
// be x. RmsNorm spreads large passes over the OpenMP team; RmsNormRows is
// the same arithmetic on the calling thread (inside a parallel loop).
void RmsNorm(const float* x, uint64_t n, uint32_t d, const float* w, float eps,
             float* y);
void RmsNormRows(const float* x, uint64_t n, uint32_t d, const float* w,
                 float eps, float* y);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_ROW_OPS_H_
