#include "core/onednn/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace linattn {
namespace {

constexpr double kU = 0x1.0p-24;  // fp32 unit roundoff

// x rounded to the nearest bfloat16 (ties to even), as a float.
float RoundBf16(float x) {
  uint32_t u = __builtin_bit_cast(uint32_t, x);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return __builtin_bit_cast(float, u);
}

struct Case {
  int64_t out, in, rows;
  bool accumulate;
};

// y = x·Wᵀ (+ y) against double loops. f32: (in + 2)·u·Σ|x·w| in any
// summation order. bf16 (8 significant bits, unit roundoff 2^-8) with
// weights that are bfloat16 already: x is rounded (relative 2^-8 each),
// then the same fp32 sums, so (2^-8 + (in + 2)·u)·Σ|x·w|; with arbitrary
// fp32 weights both factors are rounded: (2^-7 + 2^-16 + (in + 2)·u)·Σ|x·w|.
void Check(WeightType type, bool bf16_weights, const Case& c) {
  std::mt19937_64 rng(c.out * 131 + c.in * 7 + c.rows);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> w(c.out * c.in), x(PackedLinear::Bucket(c.rows) * c.in);
  for (float& v : w) v = bf16_weights ? RoundBf16(dist(rng)) : dist(rng);
  for (float& v : x) v = dist(rng);
  std::vector<float> y(PackedLinear::Bucket(c.rows) * c.out);
  for (float& v : y) v = dist(rng);
  const std::vector<float> y0 = y;
  auto linear = PackedLinear::Create(w.data(), c.out, c.in, c.accumulate, type);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ((*linear)->type(), type);
  ASSERT_TRUE((*linear)->Apply(x.data(), c.rows, y.data()).ok());
  const double rel = type == WeightType::kF32
                         ? 0.0
                         : (bf16_weights ? 0x1.0p-8 : 0x1.0p-7 + 0x1.0p-16);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t o = 0; o < c.out; ++o) {
      double sum = c.accumulate ? y0[r * c.out + o] : 0.0;
      double abs_sum = 0;
      for (int64_t i = 0; i < c.in; ++i) {
        const double p = double(x[r * c.in + i]) * w[o * c.in + i];
        sum += p;
        abs_sum += std::abs(p);
      }
      const double bound = (rel + (c.in + 2) * kU) * abs_sum +
                           (c.accumulate ? 2 * kU * std::abs(sum) : 0.0);
      ASSERT_NEAR(y[r * c.out + o], sum, bound)
          << WeightTypeName(type) << " out=" << c.out << " in=" << c.in
          << " rows=" << c.rows << " acc=" << c.accumulate << " at (" << r
          << ", " << o << ")";
    }
  }
}

const Case kCases[] = {{48, 64, 1, false},
                       {33, 1024, 3, true},
                       {256, 96, 17, false},
                       {7, 5, 2, true},
                       {64, 128, 40, true}};

TEST(PackedLinear, F32MatchesDoubleLoops) {
  for (const Case& c : kCases) Check(WeightType::kF32, false, c);
}

TEST(PackedLinear, Bf16StaysWithinItsRoundingBound) {
  if (!Bf16Supported().ok()) GTEST_SKIP() << Bf16Supported().message();
  for (const Case& c : kCases) {
    Check(WeightType::kBf16, true, c);
    Check(WeightType::kBf16, false, c);
  }
}

// The bf16 bound is tight enough to see the rounding: on the same inputs
// the bf16 product differs from the f32 one (it is not f32 in disguise).
TEST(PackedLinear, Bf16RoundsTheActivations) {
  if (!Bf16Supported().ok()) GTEST_SKIP() << Bf16Supported().message();
  std::vector<float> w(16 * 64, 0.0f), x(64);
  for (int i = 0; i < 16; ++i) w[i * 64 + i] = 1.0f;  // y = x[0..16)
  // Eighths of a bf16 ulp (2^-7 at 1): below, at and past half, ties.
  for (int i = 0; i < 64; ++i) x[i] = 1.0f + 0x1.0p-10f * (i + 1);
  std::vector<float> y(16);
  auto linear =
      PackedLinear::Create(w.data(), 16, 64, false, WeightType::kBf16);
  ASSERT_TRUE(linear.ok()) << linear.status();
  ASSERT_TRUE((*linear)->Apply(x.data(), 1, y.data()).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[i], RoundBf16(x[i])) << i;
  EXPECT_EQ(y[3], 1.0f);               // 4/8 ulp: tie, to even
  EXPECT_EQ(y[4], 1.0f + 0x1.0p-7f);   // 5/8 ulp: up
  EXPECT_EQ(y[11], 1.0f + 0x1.0p-6f);  // 12/8 ulp: tie, to even
}

// The bf16 bound is the worst case: single-term products whose x sits just
// below a rounding tie (relative error just under 2^-8) stay within it for
// every seed-independent value tried.
TEST(PackedLinear, Bf16WorstCaseRoundingStaysWithinTheBound) {
  if (!Bf16Supported().ok()) GTEST_SKIP() << Bf16Supported().message();
  std::vector<float> w(16 * 16, 0.0f), x(16);
  for (int i = 0; i < 16; ++i) w[i * 16 + i] = 1.0f;
  for (int i = 0; i < 16; ++i) {
    // 1 + 2^-8 − k·2^-23: a hair below half a bf16 ulp above 1 (rounds down).
    x[i] = 1.0f + 0x1.0p-8f - 0x1.0p-23f * float(i + 1);
  }
  std::vector<float> y(16);
  auto linear =
      PackedLinear::Create(w.data(), 16, 16, false, WeightType::kBf16);
  ASSERT_TRUE(linear.ok()) << linear.status();
  ASSERT_TRUE((*linear)->Apply(x.data(), 1, y.data()).ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i], 1.0f) << i;
    EXPECT_LE(std::abs(double(y[i]) - x[i]), 0x1.0p-8 * x[i]) << i;
    EXPECT_GT(std::abs(double(y[i]) - x[i]), 0x1.0p-9 * x[i]) << i;
  }
}

TEST(PackedLinear, WeightTypeNames) {
  EXPECT_EQ(*ParseWeightType("bf16"), WeightType::kBf16);
  EXPECT_EQ(*ParseWeightType("f32"), WeightType::kF32);
  EXPECT_EQ(ParseWeightType("fp8").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_STREQ(WeightTypeName(WeightType::kBf16), "bf16");
}

}  // namespace
}  // namespace linattn
