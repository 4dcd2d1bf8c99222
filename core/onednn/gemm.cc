#include "core/onednn/gemm.h"

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.h"

namespace linattn {

absl::Status LinearGemm(const float* a, int64_t m, int64_t k, const float* w,
                        int64_t n, float* c, bool accumulate) {
  if (m == 0 || n == 0) return absl::OkStatus();
  dnnl_status_t status = dnnl_sgemm('N', 'T', m, n, k, 1.0f, a, k, w, k,
                                    accumulate ? 1.0f : 0.0f, c, n);
  if (status != dnnl_success) {
    return absl::InternalError(absl::StrCat("oneDNN sgemm (", m, "×", k, ")·(",
                                            k, "×", n, ") failed with status ",
                                            static_cast<int>(status)));
  }
  return absl::OkStatus();
}

}  // namespace linattn
