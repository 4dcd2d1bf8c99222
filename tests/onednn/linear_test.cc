#include "core/onednn/linear.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/attention/kernels.h"

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
void Check(WeightType type, bool bf16_weights, const Case& c,
           LinearKernel kernel = LinearKernel::kAuto) {
  std::mt19937_64 rng(c.out * 131 + c.in * 7 + c.rows);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> w(c.out * c.in), x(PackedLinear::Bucket(c.rows) * c.in);
  for (float& v : w) v = bf16_weights ? RoundBf16(dist(rng)) : dist(rng);
  for (float& v : x) v = dist(rng);
  std::vector<float> y(PackedLinear::Bucket(c.rows) * c.out);
  for (float& v : y) v = dist(rng);
  const std::vector<float> y0 = y;
  auto linear =
      PackedLinear::Create(w.data(), c.out, c.in, c.accumulate, type, kernel);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ((*linear)->type(), type);
  if (kernel != LinearKernel::kAuto) {
    EXPECT_EQ((*linear)->kernel(), kernel);
  }
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
          << WeightTypeName(type) << " kernels " << int(kernel) << " isa "
          << ActiveKernels().name << " out=" << c.out << " in=" << c.in
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
  for (const Case& c : kCases) {
    Check(WeightType::kF32, false, c, LinearKernel::kOneDnn);
  }
}

// The panel kernels of every ISA this CPU runs: every height of row tile
// and of the last tile (up to AVX-512's 12 rows), partial last panels,
// several k blocks (in > 256, not a multiple of it), one thread and the
// whole team (from 2^16 multiply-adds).
TEST(PackedLinear, F32PanelsMatchDoubleLoopsOnEveryIsa) {
  for (const VectorKernels* kernels : SupportedKernels()) {
    ScopedKernelsOverride use(kernels);
    for (int64_t rows : {1, 2, 3, 5, 6, 7, 11, 12, 13, 25, 32, 64}) {
      Check(WeightType::kF32, false, {48, 64, rows, false},
            LinearKernel::kPanels);
      Check(WeightType::kF32, false, {33, 600, rows, true},
            LinearKernel::kPanels);
      Check(WeightType::kF32, false, {7, 5, rows, rows % 2 == 0},
            LinearKernel::kPanels);
    }
    Check(WeightType::kF32, false, {200, 300, 512, true},
          LinearKernel::kPanels);
    Check(WeightType::kF32, false, {1032, 256, 32, false},
          LinearKernel::kPanels);
  }
}

// On every ISA's panel kernel a row's outputs do not depend on the rows
// beside it: each row alone, and the first 13 (tiles of other heights on
// every ISA), give the bits it gets among 19.
TEST(PackedLinear, PanelsGiveEachRowTheSameBitsInAnyBatch) {
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> dist(-1, 1);
  const int64_t out = 75, in = 300, rows = 19;
  std::vector<float> w(out * in), x(PackedLinear::Bucket(rows) * in);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  for (const VectorKernels* kernels : SupportedKernels()) {
    ScopedKernelsOverride use(kernels);
    auto linear = PackedLinear::Create(w.data(), out, in, false,
                                       WeightType::kF32, LinearKernel::kPanels);
    ASSERT_TRUE(linear.ok()) << linear.status();
    std::vector<float> all(PackedLinear::Bucket(rows) * out);
    ASSERT_TRUE((*linear)->Apply(x.data(), rows, all.data()).ok());
    std::vector<float> part(PackedLinear::Bucket(13) * out);
    ASSERT_TRUE((*linear)->Apply(x.data(), 13, part.data()).ok());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> alone(out);
      ASSERT_TRUE((*linear)->Apply(x.data() + r * in, 1, alone.data()).ok());
      EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * out,
                               out * sizeof(float)))
          << kernels->name << " row " << r << " alone";
      if (r < 13) {
        EXPECT_EQ(0, std::memcmp(part.data() + r * out, all.data() + r * out,
                                 out * sizeof(float)))
            << kernels->name << " row " << r << " among 13";
      }
    }
  }
}

// Each element's sum runs in the same order however the panels are split
// over threads, so one thread and two give the same bits; the panel
// kernels take bf16 and int8 weights as an error, not as f32.
TEST(PackedLinear, PanelsGiveTheSameBitsOnAnyNumberOfThreads) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  const int64_t out = 515, in = 700, rows = 19;
  std::vector<float> w(out * in), x(PackedLinear::Bucket(rows) * in);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  auto linear = PackedLinear::Create(w.data(), out, in, false, WeightType::kF32,
                                     LinearKernel::kPanels);
  ASSERT_TRUE(linear.ok()) << linear.status();
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  std::vector<float> one(PackedLinear::Bucket(rows) * out), team(one.size());
  omp_set_num_threads(1);
  ASSERT_TRUE((*linear)->Apply(x.data(), rows, one.data()).ok());
  omp_set_num_threads(std::max(2, restore.threads));
  int team_size = 0;
#pragma omp parallel
  {
#pragma omp single
    team_size = omp_get_num_threads();
  }
  ASSERT_GE(team_size, 2) << "OpenMP gives no second thread here";
  ASSERT_TRUE((*linear)->Apply(x.data(), rows, team.data()).ok());
  for (uint64_t i = 0; i < uint64_t(rows * out); ++i) {
    ASSERT_EQ(__builtin_bit_cast(uint32_t, one[i]),
              __builtin_bit_cast(uint32_t, team[i]))
        << i;
  }
  for (WeightType type : {WeightType::kBf16, WeightType::kInt8}) {
    auto refused = PackedLinear::Create(w.data(), out, in, false, type,
                                        LinearKernel::kPanels);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A product with no elements is refused on either kernel.
  for (LinearKernel kernel : {LinearKernel::kPanels, LinearKernel::kOneDnn}) {
    EXPECT_EQ(
        PackedLinear::Create(w.data(), out, 0, false, WeightType::kF32, kernel)
            .status()
            .code(),
        absl::StatusCode::kInvalidArgument);
  }
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

// int8 against double loops, with the steps computed here from the inputs:
// t = max|x_r|/127 per row, s_o = max|w_o|/127 per output channel. Rounding
// to the nearest step moves each x_i by ≤ t/2 and each w_oi by ≤ s_o/2, so
//   |y − x·w| ≤ (t/2)·Σ|w_oi| + (s_o/2)·Σ|x_i| + in·t·s_o/4,
// each step's float arithmetic (127/amax, x·that, amax/127: three roundings
// on values ≤ 127 steps) adding at most 762u < 2^-14 of a half step, hence
// the factor 1 + 2^-13 on all three terms. The int32 sums are exact; the
// result t·s·sum takes three fp32 roundings (3u of its size, which is
// within Σ|x·w| + the quantisation bound), and the accumulate one more.
void CheckInt8(const Case& c) {
  std::mt19937_64 rng(c.out * 17 + c.in * 3 + c.rows);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> w(c.out * c.in), x(PackedLinear::Bucket(c.rows) * c.in);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  // One channel of tiny weights, one row of x scaled up: the steps are per
  // channel and per row, not shared.
  for (int64_t i = 0; i < c.in; ++i) w[i] *= 1e-3f;
  for (int64_t i = 0; i < c.in; ++i) x[i] *= 300.0f;
  std::vector<float> y(PackedLinear::Bucket(c.rows) * c.out);
  for (float& v : y) v = dist(rng);
  const std::vector<float> y0 = y;
  auto linear = PackedLinear::Create(w.data(), c.out, c.in, c.accumulate,
                                     WeightType::kInt8);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ((*linear)->type(), WeightType::kInt8);
  ASSERT_TRUE((*linear)->Apply(x.data(), c.rows, y.data()).ok());
  const double f = 1 + 0x1.0p-13;
  double worst_used = 0;  // the largest error as a fraction of its bound
  for (int64_t r = 0; r < c.rows; ++r) {
    double t = 0, x_abs = 0;
    for (int64_t i = 0; i < c.in; ++i) {
      t = std::max(t, std::abs(double(x[r * c.in + i])) / 127);
      x_abs += std::abs(double(x[r * c.in + i]));
    }
    for (int64_t o = 0; o < c.out; ++o) {
      double s = 0, w_abs = 0, sum = 0, abs_sum = 0;
      for (int64_t i = 0; i < c.in; ++i) {
        s = std::max(s, std::abs(double(w[o * c.in + i])) / 127);
        w_abs += std::abs(double(w[o * c.in + i]));
        const double p = double(x[r * c.in + i]) * w[o * c.in + i];
        sum += p;
        abs_sum += std::abs(p);
      }
      const double q = f * (t / 2 * w_abs + s / 2 * x_abs + c.in * t * s / 4);
      const double y_ref = (c.accumulate ? y0[r * c.out + o] : 0.0) + sum;
      const double bound = q + 3 * kU * (abs_sum + q) +
                           (c.accumulate ? 2 * kU * std::abs(y_ref) : 0.0);
      const double err = std::abs(double(y[r * c.out + o]) - y_ref);
      ASSERT_LE(err, bound)
          << "int8 out=" << c.out << " in=" << c.in << " rows=" << c.rows
          << " acc=" << c.accumulate << " at (" << r << ", " << o << ")";
      worst_used = std::max(worst_used, err / bound);
    }
  }
  // Not fp32 in disguise: the quantisation shows.
  EXPECT_GT(worst_used, 1e-3) << "out=" << c.out << " in=" << c.in;
}

TEST(PackedLinear, Int8StaysWithinItsQuantisationBound) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  for (const Case& c : kCases) CheckInt8(c);
}

// Weights and inputs that are whole steps already (integers with 127 the
// largest magnitude of every channel and row, so both steps are 1) give the
// exact integer sums, scaled and accumulated without loss.
TEST(PackedLinear, Int8IsExactOnItsOwnGrid) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  constexpr int64_t kOut = 40, kIn = 96, kRows = 5;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> q(-127, 127);
  std::vector<float> w(kOut * kIn), x(PackedLinear::Bucket(kRows) * kIn);
  for (float& v : w) v = float(q(rng));
  for (float& v : x) v = float(q(rng));
  for (int64_t o = 0; o < kOut; ++o) w[o * kIn + o % kIn] = o % 2 ? 127 : -127;
  for (int64_t r = 0; r < kRows; ++r) x[r * kIn + r] = r % 2 ? -127 : 127;
  for (bool accumulate : {false, true}) {
    auto linear = PackedLinear::Create(w.data(), kOut, kIn, accumulate,
                                       WeightType::kInt8);
    ASSERT_TRUE(linear.ok()) << linear.status();
    std::vector<float> y(PackedLinear::Bucket(kRows) * kOut, 0.5f);
    ASSERT_TRUE((*linear)->Apply(x.data(), kRows, y.data()).ok());
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        int64_t sum = 0;
        for (int64_t i = 0; i < kIn; ++i) {
          sum += int64_t(x[r * kIn + i]) * int64_t(w[o * kIn + i]);
        }
        EXPECT_EQ(y[r * kOut + o], float(sum) + (accumulate ? 0.5f : 0.0f))
            << r << "," << o;
      }
    }
  }
}

// A row of x holding Inf or NaN gives NaN across its own row (the fp32
// product gives Inf or NaN there); the other rows, a zero row included,
// are unaffected.
TEST(PackedLinear, Int8NonFiniteRowsComeOutNaN) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  constexpr int64_t kOut = 16, kIn = 32;
  std::vector<float> w(kOut * kIn, 0.0f), x(4 * kIn, 0.25f);
  for (int64_t o = 0; o < kOut; ++o) w[o * kIn + o] = 1.0f;  // y = x[0..16)
  x[0 * kIn + 20] = std::numeric_limits<float>::infinity();
  x[1 * kIn + 3] = std::nanf("");
  std::fill(x.begin() + 2 * kIn, x.begin() + 3 * kIn, 0.0f);
  auto linear =
      PackedLinear::Create(w.data(), kOut, kIn, false, WeightType::kInt8);
  ASSERT_TRUE(linear.ok()) << linear.status();
  std::vector<float> y(4 * kOut);
  ASSERT_TRUE((*linear)->Apply(x.data(), 4, y.data()).ok());
  for (int64_t o = 0; o < kOut; ++o) {
    EXPECT_TRUE(std::isnan(y[o])) << o;
    EXPECT_TRUE(std::isnan(y[kOut + o])) << o;
    EXPECT_EQ(y[2 * kOut + o], 0.0f) << o;
    EXPECT_EQ(y[3 * kOut + o], 0.25f) << o;  // 0.25 is 127 steps of 0.25/127
  }
}

// A row of x or a channel of w whose largest magnitude is below 2^-100
// (where 127/max would overflow near 2^-121) is taken as zero: its outputs
// are 0, within 2^-100·Σ|w| (or ·Σ|x|) of the fp32 product; the other rows
// and channels keep their own steps.
TEST(PackedLinear, Int8RowsAndChannelsBelowTheirFloorAreZero) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  constexpr int64_t kOut = 16, kIn = 32;
  std::vector<float> w(kOut * kIn, 0.5f), x(3 * kIn, 0.25f);
  for (int64_t i = 0; i < kIn; ++i) w[3 * kIn + i] = 1e-37f;  // channel 3
  for (int64_t i = 0; i < kIn; ++i) x[kIn + i] = i % 2 ? 4e-37f : 0.0f;
  std::fill(x.begin() + 2 * kIn, x.end(), 0.0f);
  x[2 * kIn + 5] = 0x1.0p-99f;  // above the floor: a row of its own scale
  auto linear =
      PackedLinear::Create(w.data(), kOut, kIn, false, WeightType::kInt8);
  ASSERT_TRUE(linear.ok()) << linear.status();
  std::vector<float> y(3 * kOut, -1.0f);
  ASSERT_TRUE((*linear)->Apply(x.data(), 3, y.data()).ok());
  // Every entry is a whole 127 steps of its row and channel, so only the
  // three fp32 roundings of t·s·sum remain (linear.h).
  const double r = 4 * kU;
  for (int64_t o = 0; o < kOut; ++o) {
    const bool tiny = o == 3;
    EXPECT_NEAR(y[o], tiny ? 0.0 : 0.25 * 0.5 * kIn, r * 0.25 * 0.5 * kIn) << o;
    EXPECT_EQ(y[kOut + o], 0.0f) << o;
    EXPECT_NEAR(y[2 * kOut + o], tiny ? 0.0 : 0x1.0p-99 * 0.5, r * 0x1.0p-100)
        << o;
  }
}

// Weights that cannot be quantised are refused, naming the channel.
TEST(PackedLinear, Int8RefusesNonFiniteWeights) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  std::vector<float> w(8 * 8, 0.5f);
  w[5 * 8 + 2] = std::numeric_limits<float>::infinity();
  auto linear = PackedLinear::Create(w.data(), 8, 8, false, WeightType::kInt8);
  ASSERT_FALSE(linear.ok());
  EXPECT_EQ(linear.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(linear.status().message().find("output channel 5"),
            std::string::npos)
      << linear.status();
}

TEST(PackedLinear, WeightTypeNames) {
  EXPECT_EQ(*ParseWeightType("bf16"), WeightType::kBf16);
  EXPECT_EQ(*ParseWeightType("int8"), WeightType::kInt8);
  EXPECT_STREQ(WeightTypeName(WeightType::kInt8), "int8");
  EXPECT_TRUE(WeightTypeSupported(WeightType::kF32).ok());
  EXPECT_EQ(*ParseWeightType("f32"), WeightType::kF32);
  EXPECT_EQ(ParseWeightType("fp8").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_STREQ(WeightTypeName(WeightType::kBf16), "bf16");
}

}  // namespace
}  // namespace linattn
