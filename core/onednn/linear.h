// PackedLinear: y = x·Wᵀ (+ y) for one weight matrix, with the weights
// packed once: for oneDNN's matmul, reordered into the layout its kernels
// read, or (f32 on AVX2, LinearKernel) in panels for linattn's own kernel.
//
// W comes as nn.Linear stores it, (out × in) row-major. Primitives exist
// per row bucket (1, 2, 4, 8, 16, then multiples of 16 up to kMaxRows) and
// are shared by every matrix of the same shape; all of them are created up
// front, so Apply() never creates one. The caller's x and y must have room
// for Bucket(m) rows; rows past m are computed from whatever they hold and
// ignored. Thread-safe: execution uses a per-thread stream and scratchpad.
//
// With WeightType::kBf16 the packed weights are bfloat16 (half the bytes a
// memory-bound decode step reads) and x is rounded to bfloat16 (nearest
// even) before the product; products and sums stay fp32, and so does y.
// bfloat16 keeps 8 significant bits (unit roundoff 2^-8), so each output is
// within (2^-7 + 2^-16)·Σ|x_i·w_i| (+ fp32 summation) of the fp32 product;
// for weights that were bfloat16 to begin with (most checkpoints), only x's
// rounding remains: 2^-8·Σ|x_i·w_i|.
//
// With WeightType::kInt8 each output channel j (a row of W) is stored as
// int8 with its own scale s_j = max_i |w_ji| / 127 (w ≈ s_j·q_j, |q| ≤ 127),
// each row of x is quantised to int8 with its own scale t = max_i |x_i| / 127
// at the call, oneDNN multiplies int8 by int8 into exact int32 sums (VNNI
// or AMX), and y = t·s_j·sum. Rounding to the nearest step moves x_i by at
// most t/2 and w_ji by at most s_j/2, so each output is within
//   (t/2)·Σ_i|w_ji| + (s_j/2)·Σ_i|x_i| + in·t·s_j/4
// (times 1 + 2^-13 for the float arithmetic of the steps, plus a few fp32
// roundings of y) of the fp32 product. A row of x holding Inf or NaN gives
// NaN in every output of its row, as the fp32 product would give Inf/NaN.
// A row or channel whose largest magnitude is below 2^-100 is taken as zero
// (its outputs are then off by at most 2^-100·Σ|w| or 2^-100·Σ|x|).
#ifndef LINATTN_CORE_ONEDNN_LINEAR_H_
#define LINATTN_CORE_ONEDNN_LINEAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/util/aligned_buffer.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace linattn {

enum class WeightType { kF32, kBf16, kInt8 };

// Which kernels run f32 products. kPanels: the weights packed in panels of
// 16 output columns and multiplied by linattn's own register-tiled kernel
// (VectorKernels::panel_gemm, each ISA's); kOneDnn: oneDNN's matmul.
// kAuto takes kPanels where the AVX2 kernels are the active ones, where
// they beat oneDNN 2.6 on the model's products (BM_PackedLinear;
// docs/benchmarks.md, "Measured figures behind constants in the code"),
// and oneDNN's matmul elsewhere (its brgemm kernels on AVX-512). bf16 and
// int8 weights always run on oneDNN.
enum class LinearKernel { kAuto, kOneDnn, kPanels };

// "f32" / "bf16" / "int8".
const char* WeightTypeName(WeightType type);
absl::StatusOr<WeightType> ParseWeightType(const std::string& name);
// OK when this CPU runs bf16 products natively (AVX512_BF16 or AMX, as
// oneDNN sees it); FAILED_PRECONDITION saying what is missing otherwise.
absl::Status Bf16Supported();
// OK when oneDNN runs int8 products with AVX512_VNNI or AMX here;
// FAILED_PRECONDITION saying what is missing otherwise.
absl::Status Int8Supported();
// The check for `type` (OK for f32).
absl::Status WeightTypeSupported(WeightType type);

class PackedLinear {
 public:
  static constexpr int64_t kMaxRows = 512;

  // `weight` is (out × in) row-major, in, out ≥ 1; `accumulate` adds into
  // y. kPanels with bf16 or int8 weights is INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<PackedLinear>> Create(
      const float* weight, int64_t out, int64_t in, bool accumulate,
      WeightType type = WeightType::kF32,
      LinearKernel kernel = LinearKernel::kAuto);

  // Rows a call with m (1 ≤ m ≤ kMaxRows) rows touches in x and y.
  static int64_t Bucket(int64_t m);

  // y (m × out) = x (m × in) · Wᵀ [+ y], 1 ≤ m ≤ kMaxRows. INTERNAL from
  // oneDNN only.
  absl::Status Apply(const float* x, int64_t m, float* y) const;

  // The kernels this product runs on (kPanels or kOneDnn, never kAuto).
  LinearKernel kernel() const {
    return panel_gemm_ != nullptr ? LinearKernel::kPanels
                                  : LinearKernel::kOneDnn;
  }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  WeightType type() const { return type_; }
  // Bytes of the weights a product reads (in × out of the packed type;
  // int8's per-channel scales aside).
  uint64_t weight_bytes() const {
    const uint64_t each = type_ == WeightType::kF32    ? 4
                          : type_ == WeightType::kBf16 ? 2
                                                       : 1;
    return static_cast<uint64_t>(in_) * static_cast<uint64_t>(out_) * each;
  }

  struct Shape;

 private:
  PackedLinear() = default;
  int64_t in_ = 0, out_ = 0;
  WeightType type_ = WeightType::kF32;
  absl::Status ApplyPanels(const float* x, int64_t m, float* y) const;

  const Shape* shape_ = nullptr;  // the shared primitives of (in, out, acc)
  dnnl::memory packed_;
  // kPanels: the weights in panels, and the kernel that reads them.
  AlignedBuffer panels_;
  void (*panel_gemm_)(const float*, uint64_t, uint64_t, const float*, uint64_t,
                      uint64_t, uint64_t, float*, bool) = nullptr;
  std::vector<float> scales_;  // kInt8: s_j per output channel
  bool accumulate_ = false;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ONEDNN_LINEAR_H_
