// PackedLinear: y = x·Wᵀ (+ y) for one weight matrix, on oneDNN's matmul
// with the weights reordered once into the blocked layout its brgemm
// kernels read (a model's prepacked weights).
//
// W comes as nn.Linear stores it, (out × in) row-major. Primitives exist
// per row bucket (1, 2, 4, 8, 16, then multiples of 16 up to kMaxRows) and
// are shared by every matrix of the same shape; all of them are created up
// front, so Apply() never creates one. The caller's x and y must have room
// for Bucket(m) rows; rows past m are computed from whatever they hold and
// ignored. Thread-safe: execution uses a per-thread stream and scratchpad.
#ifndef LINATTN_CORE_ONEDNN_LINEAR_H_
#define LINATTN_CORE_ONEDNN_LINEAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace linattn {

class PackedLinear {
 public:
  static constexpr int64_t kMaxRows = 512;

  // `weight` is (out × in) row-major; `accumulate` adds into y.
  static absl::StatusOr<std::unique_ptr<PackedLinear>> Create(
      const float* weight, int64_t out, int64_t in, bool accumulate);

  // Rows a call with m (1 ≤ m ≤ kMaxRows) rows touches in x and y.
  static int64_t Bucket(int64_t m);

  // y (m × out) = x (m × in) · Wᵀ [+ y], 1 ≤ m ≤ kMaxRows. INTERNAL from
  // oneDNN only.
  absl::Status Apply(const float* x, int64_t m, float* y) const;

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

  struct Shape;

 private:
  PackedLinear() = default;
  int64_t in_ = 0, out_ = 0;
  const Shape* shape_ = nullptr;  // the shared primitives of (in, out, acc)
  dnnl::memory packed_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ONEDNN_LINEAR_H_
