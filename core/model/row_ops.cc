#include "core/model/row_ops.h"

#include <cmath>

namespace linattn {

void RmsNorm(const float* x, uint64_t n, uint32_t d, const float* w, float eps,
             float* y) {
#pragma omp parallel for if (n * d >= kParallelFloats) schedule(static)
  for (uint64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float ss = 0;
    for (uint32_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    if (w != nullptr) {
      for (uint32_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
    } else {
      for (uint32_t i = 0; i < d; ++i) yr[i] = xr[i] * inv;
    }
  }
}

}  // namespace linattn
