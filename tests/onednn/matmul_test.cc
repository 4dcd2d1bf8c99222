#include "core/onednn/matmul.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

namespace linattn {
namespace {

// C[b] (+)= op(A[b])·op(B[b]) against the triple loop in double, for every
// transpose combination; error ≤ (k + 2)·u·Σ|a||b| (any summation order).
TEST(Matmul, MatchesTripleLoop) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool acc : {false, true}) {
        MatmulShape shape{.batch = 3,
                          .m = 7,
                          .k = 13,
                          .n = 5,
                          .transpose_a = ta,
                          .transpose_b = tb,
                          .accumulate = acc};
        std::vector<float> a(3 * 7 * 13), b(3 * 13 * 5), c(3 * 7 * 5);
        for (float& x : a) x = dist(rng);
        for (float& x : b) x = dist(rng);
        for (float& x : c) x = dist(rng);
        const std::vector<float> c0 = c;
        ASSERT_TRUE(BatchedMatmul(shape, a.data(), b.data(), c.data()).ok());
        for (int bi = 0; bi < 3; ++bi) {
          for (int i = 0; i < 7; ++i) {
            for (int j = 0; j < 5; ++j) {
              double sum = acc ? c0[(bi * 7 + i) * 5 + j] : 0.0,
                     abs_sum = std::abs(sum);
              for (int p = 0; p < 13; ++p) {
                const float av =
                    ta ? a[(bi * 13 + p) * 7 + i] : a[(bi * 7 + i) * 13 + p];
                const float bv =
                    tb ? b[(bi * 5 + j) * 13 + p] : b[(bi * 13 + p) * 5 + j];
                sum += double(av) * bv;
                abs_sum += std::abs(double(av) * bv);
              }
              EXPECT_NEAR(c[(bi * 7 + i) * 5 + j], sum,
                          15 * 0x1.0p-24 * abs_sum)
                  << "ta=" << ta << " tb=" << tb << " acc=" << acc;
            }
          }
        }
      }
    }
  }
}

// Each thread binds a shape's oneDNN memory objects once and points them
// at every call's buffers: one shape over different buffers in turn, and
// from several threads at once, gives every call its own product.
TEST(Matmul, OneShapeOverManyBuffersAndThreads) {
  const MatmulShape shape{.batch = 2, .m = 5, .k = 6, .n = 3};
  auto matches = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> a(2 * 5 * 6), b(2 * 6 * 3), c(2 * 5 * 3, NAN);
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    if (!BatchedMatmul(shape, a.data(), b.data(), c.data()).ok()) return false;
    for (int bi = 0; bi < 2; ++bi) {
      for (int i = 0; i < 5; ++i) {
        for (int j = 0; j < 3; ++j) {
          double sum = 0, abs_sum = 0;
          for (int p = 0; p < 6; ++p) {
            const double t =
                double(a[(bi * 5 + i) * 6 + p]) * b[(bi * 6 + p) * 3 + j];
            sum += t;
            abs_sum += std::abs(t);
          }
          if (!(std::abs(c[(bi * 5 + i) * 3 + j] - sum) <=
                8 * 0x1.0p-24 * abs_sum)) {
            return false;
          }
        }
      }
    }
    return true;
  };
  for (uint64_t seed = 0; seed < 10; ++seed) EXPECT_TRUE(matches(seed)) << seed;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 50; ++i) {
        if (!matches(100 * (t + 1) + i)) ++mismatches;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Matmul, PrimitivesAreCreatedOncePerShape) {
  MatmulShape shape{.batch = 2, .m = 4, .k = 4, .n = 4};
  std::vector<float> a(32, 1.0f), b(32, 1.0f), c(32);
  ASSERT_TRUE(BatchedMatmul(shape, a.data(), b.data(), c.data()).ok());
  const size_t cached = MatmulCache::Global().size();
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(BatchedMatmul(shape, a.data(), b.data(), c.data()).ok());
  EXPECT_EQ(MatmulCache::Global().size(), cached);
  EXPECT_EQ(c[0], 4.0f);
}

}  // namespace
}  // namespace linattn
