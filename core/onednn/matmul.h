// oneDNN (v2.6 API) matmul primitives, created once per shape and reused.
//
// linattn's GEMMs are all batched products of packed, row-major buffers:
// C[b] (+)= op(A[b])·op(B[b]), C fp32, A and B fp32 or (bf16_inputs) both
// bfloat16 with fp32 accumulation. MatmulCache keys the primitive on the
// shape; BatchedMatmul() wraps the user pointers, supplies a per-thread
// scratchpad and stream, executes, and turns oneDNN's exceptions into a
// status, so nothing thrown by oneDNN crosses this file.
//
//   MatmulShape shape{.batch = 64, .m = 64, .k = 64, .n = 64};
//   LINATTN_RETURN_IF_ERROR(BatchedMatmul(shape, a, b, c));
#ifndef LINATTN_CORE_ONEDNN_MATMUL_H_
#define LINATTN_CORE_ONEDNN_MATMUL_H_

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace linattn {

// C[b] (m×n) = op(A[b]) (m×k) · op(B[b]) (k×n) [+ C[b] when accumulate].
// A is stored (batch, m, k), or (batch, k, m) when transpose_a; B is stored
// (batch, k, n), or (batch, n, k) when transpose_b; C is (batch, m, n).
struct MatmulShape {
  int64_t batch = 1;
  int64_t m = 1;
  int64_t k = 1;
  int64_t n = 1;
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;
  bool bf16_inputs = false;  // A and B bfloat16 (uint16_t bits), C fp32
  auto operator<=>(const MatmulShape&) const = default;

  double Flops() const { return 2.0 * batch * m * k * n; }
};

// The process-wide CPU engine.
const dnnl::engine& CpuEngine();
// This thread's in-order stream on CpuEngine().
dnnl::stream& ThreadStream();

class MatmulCache {
 public:
  // The process-wide cache. Thread-safe.
  static MatmulCache& Global();

  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, c;
    uint64_t scratchpad_bytes = 0;
  };
  // The primitive for `shape`, created on first use (may throw dnnl::error).
  // The reference stays valid for the cache's lifetime.
  const Entry& Get(const MatmulShape& shape);
  // Number of distinct primitives created so far.
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<MatmulShape, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

// Executes `shape` on caller-owned buffers through the global cache.
// Thread-safe; INTERNAL on a oneDNN error, RESOURCE_EXHAUSTED when memory
// runs out.
absl::Status BatchedMatmul(const MatmulShape& shape, const float* a,
                           const float* b, float* c);
// The same with bfloat16 inputs (shape.bf16_inputs must be set).
absl::Status BatchedMatmul(const MatmulShape& shape, const uint16_t* a,
                           const uint16_t* b, float* c);

// True when oneDNN runs bf16 products natively here (AVX512_BF16 or AMX),
// not by emulation.
bool NativeBf16Products();

}  // namespace linattn

#endif  // LINATTN_CORE_ONEDNN_MATMUL_H_
