// One million tokens through one session: the recurrent and chunkwise orders
// stay finite and agree with a double-precision recurrence within a bound
// that follows each rounding through the decayed sums.
//
// Bound: with x_t = φ(k_t)·v_tᵀ (and φ(k_t) for z), the recurrence
// S_t = γ·S_{t−1} + x_t commits at most two roundings per step, each of size
// u·(γ|S_{t−1}| + |x_t|), and later steps damp them by γ. Summed, the error
// of S_t is at most 3u·(A_t + B_t) with
//   A_t = Σ_j γ^{t−j}|x_j|             (A_t = γ·A_{t−1} + |x_t|)
//   B_t = Σ_j (t−j)·γ^{t−j}|x_j|       (B_t = γ·(B_{t−1} + A_{t−1}))
// (B_t ≤ t·A_t: the usual n·u; with γ < 1, B_t ≲ A_t/(1−γ)). The chunkwise
// order rounds less often along t but adds a C-term product per chunk, and
// the read-out a d_φ-term dot product, so every entry also gets
// (C + d_φ + 16)·u·A_t.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

constexpr double kU = 0x1.0p-24;

struct DoubleHead {
  std::vector<double> s, z, s_abs, s_age, z_abs, z_age;  // S, z, A, B
};

TEST(LongRun, MillionTokensRecurrentEqualsChunkwise) {
  const uint64_t kTokens = 1'000'000, kBlock = 4096;
  const uint32_t kChunk = 64;
  AttentionSpec spec{
      .num_heads = 2, .key_dim = 8, .value_dim = 8, .decay = {1.0f, 0.999f}};
  auto attention = Attention::Create(spec);
  ASSERT_TRUE(attention.ok());
  const uint32_t H = 2, d = 8;
  AttentionState recurrent = attention->NewState(),
                 chunkwise = attention->NewState();
  ChunkwiseRunner runner({.chunk_size = kChunk});

  std::vector<DoubleHead> truth(H);
  for (DoubleHead& t : truth) {
    t.s.assign(d * d, 0);
    t.s_abs = t.s_age = t.s;
    t.z.assign(d, 0);
    t.z_abs = t.z_age = t.z;
  }
  double worst_recurrent = 0, worst_chunkwise = 0;  // error / bound, reported
  for (uint64_t start = 0; start < kTokens; start += kBlock) {
    const uint64_t n = std::min(kBlock, kTokens - start);
    testing::Tokens data = testing::RandomTokens(spec, n, start);
    testing::Outputs out_r(spec, n), out_c(spec, n);
    ASSERT_TRUE(
        StepSequence(*attention, recurrent, data.input(), out_r.view()).ok());
    ASSERT_TRUE(
        runner.Run(*attention, chunkwise, data.input(), out_c.view()).ok());
    for (uint64_t t = 0; t < n; ++t) {
      for (uint32_t h = 0; h < H; ++h) {
        const double g = spec.decay[h];
        DoubleHead& th = truth[h];
        const uint64_t row = t * H + h;
        double phi_q[8], phi_k[8];
        for (uint32_t i = 0; i < d; ++i) {
          const double qi = data.q[row * d + i], ki = data.k[row * d + i];
          phi_q[i] = qi >= 0 ? qi + 1 : std::exp(qi);
          phi_k[i] = ki >= 0 ? ki + 1 : std::exp(ki);
        }
        double den = 0, den_err = 0;
        double num[8] = {}, num_err[8] = {};
        for (uint32_t i = 0; i < d; ++i) {
          for (uint32_t c = 0; c < d; ++c) {
            const uint64_t e = i * d + c;
            const double x = phi_k[i] * data.v[row * d + c];
            th.s_age[e] = g * (th.s_age[e] + th.s_abs[e]);
            th.s_abs[e] = g * th.s_abs[e] + std::abs(x);
            th.s[e] = g * th.s[e] + x;
            num[c] += phi_q[i] * th.s[e];
            num_err[c] += phi_q[i] * kU *
                          (3 * (th.s_abs[e] + th.s_age[e]) +
                           (kChunk + d + 16) * th.s_abs[e]);
          }
          th.z_age[i] = g * (th.z_age[i] + th.z_abs[i]);
          th.z_abs[i] = g * th.z_abs[i] + phi_k[i];
          th.z[i] = g * th.z[i] + phi_k[i];
          den += phi_q[i] * th.z[i];
          den_err += phi_q[i] * kU *
                     (3 * (th.z_abs[i] + th.z_age[i]) +
                      (kChunk + d + 16) * th.z_abs[i]);
        }
        for (uint32_t c = 0; c < d; ++c) {
          const double y = num[c] / den;
          const double bound =
              (num_err[c] + std::abs(y) * den_err) / (den - den_err) +
              2 * kU * std::abs(y);
          const float yr = out_r.output[row * d + c],
                      yc = out_c.output[row * d + c];
          ASSERT_TRUE(std::isfinite(yr) && std::isfinite(yc))
              << "token " << start + t;
          ASSERT_LE(std::abs(yr - y), bound)
              << "recurrent, token " << start + t << " head " << h;
          ASSERT_LE(std::abs(yc - y), bound)
              << "chunkwise, token " << start + t << " head " << h;
          ASSERT_LE(std::abs(yr - yc), 2 * bound)
              << "token " << start + t << " head " << h;
          worst_recurrent = std::max(worst_recurrent, std::abs(yr - y) / bound);
          worst_chunkwise = std::max(worst_chunkwise, std::abs(yc - y) / bound);
        }
      }
    }
  }
  EXPECT_EQ(recurrent.position(), kTokens);
  EXPECT_EQ(chunkwise.position(), kTokens);
  RecordProperty("worst_recurrent_error_over_bound",
                 std::to_string(worst_recurrent));
  RecordProperty("worst_chunkwise_error_over_bound",
                 std::to_string(worst_chunkwise));
  std::printf(
      "worst |error|/bound over 1M tokens: recurrent %.3g, chunkwise %.3g\n",
      worst_recurrent, worst_chunkwise);
}

}  // namespace
}  // namespace linattn
