// Plain GEMMs on oneDNN's sgemm, for the model's projections:
//   C (m×n) = A (m×k) · Wᵀ  [+ C when accumulate]
// with W stored (n×k) row-major, as nn.Linear keeps its weight. oneDNN picks
// its AVX-512 / AVX2 kernels at run time and threads with OpenMP.
#ifndef LINATTN_CORE_ONEDNN_GEMM_H_
#define LINATTN_CORE_ONEDNN_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace linattn {

// INTERNAL if oneDNN refuses the arguments (never for valid sizes).
absl::Status LinearGemm(const float* a, int64_t m, int64_t k, const float* w,
                        int64_t n, float* c, bool accumulate);

}  // namespace linattn

#endif  // LINATTN_CORE_ONEDNN_GEMM_H_
