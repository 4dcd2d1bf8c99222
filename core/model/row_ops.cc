#include "core/model/row_ops.h"

#include <cmath>

#include "core/attention/kernels.h"
#include "core/util/parallel_for.h"

namespace linattn {
namespace {

void RmsNormRow(const float* xr, uint32_t d, const float* w, float eps,
                float* yr) {
  const float ss = ActiveKernels().dot(d, xr, xr);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  if (w != nullptr) {
    for (uint32_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
  } else {
    for (uint32_t i = 0; i < d; ++i) yr[i] = xr[i] * inv;
  }
}

}  // namespace

double SumInDouble(const float* x, uint64_t n) {
  double parts[4] = {0, 0, 0, 0};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int p = 0; p < 4; ++p) parts[p] += x[i + p];
  }
  for (; i < n; ++i) parts[0] += x[i];
  return (parts[0] + parts[1]) + (parts[2] + parts[3]);
}

void LayerNormRow(const float* xr, uint32_t d, const float* w, const float* b,
                  float eps, float* yr) {
  // Mean and variance in double (their error far below a float's rounding,
  // whatever d), each summed in four independent parts so that the adds
  // do not wait on one another.
  const double mean = SumInDouble(xr, d) / d;
  double sq[4] = {0, 0, 0, 0};
  uint32_t i = 0;
  for (; i + 4 <= d; i += 4) {
    for (int p = 0; p < 4; ++p) {
      const double dx = xr[i + p] - mean;
      sq[p] += dx * dx;
    }
  }
  for (; i < d; ++i) {
    const double dx = xr[i] - mean;
    sq[0] += dx * dx;
  }
  const double ss = (sq[0] + sq[1]) + (sq[2] + sq[3]);
  const float m = static_cast<float>(mean);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
  for (i = 0; i < d; ++i) {
    const float y = (xr[i] - m) * inv * w[i];
    yr[i] = b != nullptr ? y + b[i] : y;
  }
}

void LayerNorm(const float* x, uint64_t n, uint32_t d, const float* w,
               const float* b, float eps, float* y) {
  ParallelFor(n, n * d >= kParallelFloats, [&](uint64_t r) {
    LayerNormRow(x + r * d, d, w, b, eps, y + r * d);
  });
}

void RmsNorm(const float* x, uint64_t n, uint32_t d, const float* w, float eps,
             float* y) {
  ParallelFor(n, n * d >= kParallelFloats,
              [&](uint64_t r) { RmsNormRow(x + r * d, d, w, eps, y + r * d); });
}

void RmsNormRows(const float* x, uint64_t n, uint32_t d, const float* w,
                 float eps, float* y) {
  for (uint64_t r = 0; r < n; ++r) RmsNormRow(x + r * d, d, w, eps, y + r * d);
}

void RotateHalves(const float* inv_freq, uint32_t half, uint64_t position,
                  float* x) {
  const float t = static_cast<float>(position);
  for (uint32_t i = 0; i < half; ++i) {
    const float theta = t * inv_freq[i];
    const float cs = std::cos(theta), sn = std::sin(theta);
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cs - x2 * sn;
    x[half + i] = x1 * sn + x2 * cs;
  }
}

}  // namespace linattn
