#include "core/attention/feature_map.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/attention/chunkwise.h"
#include "core/attention/quadratic.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

FeatureMap Make(const AttentionSpec& spec) {
  auto fm = FeatureMap::Create(spec);
  EXPECT_TRUE(fm.ok()) << fm.status();
  return *std::move(fm);
}

TEST(FeatureMap, ElementwiseMapsFollowTheirDefinitions) {
  const float x[] = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f};
  float out[10];
  FeatureMap elu1 = Make({.key_dim = 5});
  EXPECT_EQ(elu1.Apply(x, 0, out), 0.0f);
  EXPECT_NEAR(out[0], std::exp(-2.0), 4 * 0x1.0p-24 * std::exp(-2.0));  // 2 ulp
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 1.5f);
  EXPECT_EQ(out[4], 4.0f);
  FeatureMap relu = Make({.key_dim = 5, .feature_map = FeatureMapKind::kRelu});
  relu.Apply(x, 0, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[3], 0.5f);
  EXPECT_EQ(out[4], 3.0f);
  FeatureMap id = Make({.key_dim = 5,
                        .feature_map = FeatureMapKind::kIdentity,
                        .unnormalized = true});
  id.Apply(x, 0, out);
  EXPECT_EQ(out[0], -2.0f);
  FeatureMap cosine = Make(
      {.key_dim = 5, .feature_map = FeatureMapKind::kCosine, .horizon = 10});
  ASSERT_EQ(cosine.dim(), 10u);
  cosine.Apply(x, 5, out);  // angle π·5/20 = π/4
  EXPECT_FLOAT_EQ(out[4], 3.0f * std::cos(std::numbers::pi / 4));
  EXPECT_FLOAT_EQ(out[9], 3.0f * std::sin(std::numbers::pi / 4));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[5], 0.0f);
}

// Apply reports whether its input is finite, for every map (ELU+1 from its
// own pass over x).
TEST(FeatureMap, ApplyReportsWhetherTheInputIsFinite) {
  for (FeatureMapKind kind :
       {FeatureMapKind::kElu1, FeatureMapKind::kRelu, FeatureMapKind::kIdentity,
        FeatureMapKind::kCosine, FeatureMapKind::kFavor}) {
    FeatureMap fm =
        Make({.key_dim = 8,
              .feature_map = kind,
              .unnormalized = kind == FeatureMapKind::kIdentity,
              .feature_dim = kind == FeatureMapKind::kFavor ? 16u : 0u,
              .horizon = kind == FeatureMapKind::kCosine ? 10u : 0u});
    float x[8] = {-1.0f, 0.5f, 2.0f, -3.0f, 0.0f, 1.0f, -0.25f, 4.0f};
    std::vector<float> out(fm.dim());
    bool finite = false;
    fm.Apply(x, 3, out.data(), &finite);
    EXPECT_TRUE(finite) << static_cast<int>(kind);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      x[5] = bad;
      finite = true;
      fm.Apply(x, 3, out.data(), &finite);
      EXPECT_FALSE(finite) << static_cast<int>(kind) << " " << bad;
    }
  }
}

TEST(FeatureMap, FavorIsDeterministicInItsSeed) {
  AttentionSpec spec{.key_dim = 16,
                     .feature_map = FeatureMapKind::kFavor,
                     .feature_dim = 40,
                     .seed = 7};
  FeatureMap a = Make(spec), b = Make(spec);
  EXPECT_EQ(a.projection(), b.projection());
  spec.seed = 8;
  EXPECT_NE(Make(spec).projection(), a.projection());
  const float x[16] = {0.1f, -0.2f, 0.3f,  0.4f, -0.5f, 0.6f, 0.7f, -0.8f,
                       0.9f, 1.0f,  -1.1f, 1.2f, 0.0f,  0.1f, 0.2f, -0.3f};
  float fa[40], fb[40];
  EXPECT_EQ(a.Apply(x, 0, fa), b.Apply(x, 0, fb));
  for (int i = 0; i < 40; ++i) EXPECT_EQ(fa[i], fb[i]);
}

TEST(FeatureMap, FavorRowsAreOrthogonalWithinABlock) {
  const uint32_t d = 12, m = 30;
  std::vector<float> omega = OrthogonalGaussianRows(m, d, 3);
  for (uint32_t block = 0; block < m; block += d) {
    for (uint32_t i = block; i < std::min(m, block + d); ++i) {
      for (uint32_t j = block; j < i; ++j) {
        double dot = 0, ni = 0, nj = 0;
        for (uint32_t c = 0; c < d; ++c) {
          dot += double(omega[i * d + c]) * omega[j * d + c];
          ni += double(omega[i * d + c]) * omega[i * d + c];
          nj += double(omega[j * d + c]) * omega[j * d + c];
        }
        // Orthogonal in double, then rounded to fp32 once per entry.
        EXPECT_LT(std::abs(dot) / std::sqrt(ni * nj), 4 * d * 0x1.0p-24)
            << i << "," << j;
      }
    }
  }
}

// Performer's estimate: φ(q)·φ(k) → exp(qᵀk/√d_k) as m grows, so FAVOR+
// linear attention approaches softmax attention; the error falls ~ m^{-½}.
TEST(FeatureMap, FavorApproachesSoftmaxAsFeaturesGrow) {
  const uint32_t d = 8, T = 24;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> dist(-0.8f, 0.8f);
  std::vector<double> errors;
  for (uint32_t m : {8u, 128u, 2048u}) {
    double err = 0;
    int count = 0;
    for (uint64_t seed = 0; seed < 6; ++seed) {
      AttentionSpec spec{.num_heads = 1,
                         .key_dim = d,
                         .value_dim = 1,
                         .feature_map = FeatureMapKind::kFavor,
                         .feature_dim = m,
                         .seed = seed};
      auto attention = Attention::Create(spec);
      ASSERT_TRUE(attention.ok());
      std::vector<float> q(T * d), k(T * d), v(T);
      for (float& x : q) x = dist(rng);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      ReferenceResult ref =
          ReferenceAttention(*attention, {q.data(), k.data(), v.data(), T});
      for (uint32_t i = 0; i < T; ++i) {
        double num = 0, den = 0;
        for (uint32_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (uint32_t c = 0; c < d; ++c)
            dot += double(q[i * d + c]) * k[j * d + c];
          const double w = std::exp(dot / std::sqrt(double(d)));
          num += w * v[j];
          den += w;
        }
        err += std::abs(ref.output[i] - num / den);
        ++count;
      }
    }
    errors.push_back(err / count);
  }
  // 16× the features: the error should fall ~4×; demand at least 2×.
  EXPECT_LT(errors[1], errors[0] / 2) << errors[0] << " → " << errors[1];
  EXPECT_LT(errors[2], errors[1] / 2) << errors[1] << " → " << errors[2];
}

// Keys and queries aligned with a projection row have exponents near d_k/2:
// at d_k = 256 that is ≈ 128, beyond fp32's exp range (≈ 88.7). The running
// max keeps every evaluation order finite and equal to the double reference.
// (Tokens alternate between two rows of one orthogonal block, each query's
// row among the keys before it, so the attention is carried by terms that
// fp32 can hold once rescaled; the rest are e^{-250} smaller.)
TEST(FeatureMap, FavorRunningMaxKeepsOverflowingInputsFinite) {
  const uint32_t d = 256, m = 64, T = 40;
  AttentionSpec spec{.num_heads = 1,
                     .key_dim = d,
                     .value_dim = 3,
                     .feature_map = FeatureMapKind::kFavor,
                     .feature_dim = m,
                     .seed = 5};
  auto attention = Attention::Create(spec);
  ASSERT_TRUE(attention.ok());
  const std::vector<float>& omega = attention->feature_map().projection();
  const float to_x = std::pow(float(d), 0.25f);  // x̂ = x·d^{-¼} = ω_i
  std::vector<float> q(T * d), k(T * d), v(T * 3);
  std::mt19937_64 rng(1);
  for (uint32_t t = 0; t < T; ++t) {
    const uint32_t rq = t % 2, rk = t % 2;
    const float sk =
        0.8f + 0.4f * (rng() % 100) / 100.0f;  // exponent ≈ 128·sk·(2 − sk)
    for (uint32_t c = 0; c < d; ++c) {
      q[t * d + c] = omega[rq * d + c] * to_x;
      k[t * d + c] = omega[rk * d + c] * to_x * sk;
    }
    for (int c = 0; c < 3; ++c) v[t * 3 + c] = float(rng() % 7) - 3.0f;
  }
  std::vector<float> a(m);
  const float max_exponent =
      attention->feature_map().Exponents(q.data(), a.data());
  ASSERT_GT(max_exponent, 100.0f);
  ASSERT_TRUE(std::isinf(std::exp(max_exponent)))
      << "premise: plain exp overflows fp32";

  const SequenceInput in{q.data(), k.data(), v.data(), T};
  const ReferenceResult ref = ReferenceAttention(*attention, in);
  testing::Outputs rec(spec, T), chunk(spec, T), quad(spec, T);
  AttentionState s1 = attention->NewState(), s2 = attention->NewState();
  ASSERT_TRUE(StepSequence(*attention, s1, in, rec.view()).ok());
  ChunkwiseRunner runner({.chunk_size = 16});
  ASSERT_TRUE(runner.Run(*attention, s2, in, chunk.view()).ok());
  ASSERT_TRUE(QuadraticAttention(*attention, in, quad.view()).ok());
  for (uint32_t i = 0; i < T * 3; ++i) {
    ASSERT_TRUE(std::isfinite(rec.output[i])) << i;
    ASSERT_TRUE(std::isfinite(chunk.output[i])) << i;
    ASSERT_TRUE(std::isfinite(quad.output[i])) << i;
  }
  testing::ExpectMatchesReference(*attention, ref, rec, "recurrent");
  testing::ExpectMatchesReference(*attention, ref, chunk, "chunkwise");
  testing::ExpectMatchesReference(*attention, ref, quad, "quadratic");
  // The state stays finite too: S and z are kept at the keys' running scale.
  for (uint64_t i = 0; i < s1.size(); ++i)
    ASSERT_TRUE(std::isfinite(s1.data()[i]));
}

}  // namespace
}  // namespace linattn
