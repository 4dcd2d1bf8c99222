// The seed's worked example and its adversarial preset, exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "core/attention/chunkwise.h"
#include "core/attention/quadratic.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"

namespace linattn {
namespace {

AttentionSpec TwoDSpec(FeatureMapKind map) {
  return {.num_heads = 1,
          .key_dim = 2,
          .value_dim = 1,
          .feature_map = map,
          .epsilon = 0.0f};
}

// General preset, elu1, prefix 1: φ(q) = [1.5, 2], z = S = [2, 1],
// numerator = denominator = 5, output = 1 exactly.
TEST(SeedExample, GeneralPresetElu1PrefixOne) {
  auto attention = Attention::Create(TwoDSpec(FeatureMapKind::kElu1));
  ASSERT_TRUE(attention.ok());
  const float q[] = {0.5f, 1.0f}, k[] = {1.0f, 0.0f}, v[] = {1.0f};
  float phi_q[2];
  attention->feature_map().Apply(q, 0, phi_q);
  EXPECT_EQ(phi_q[0], 1.5f);
  EXPECT_EQ(phi_q[1], 2.0f);

  AttentionState state = attention->NewState();
  float y = 0, den = 0;
  uint8_t available = 0;
  ASSERT_TRUE(
      Step(*attention, state, {q, k, v, 1}, {&y, &den, &available}).ok());
  EXPECT_EQ(state.z(0)[0], 2.0f);
  EXPECT_EQ(state.z(0)[1], 1.0f);
  EXPECT_EQ(state.s(0)[0], 2.0f);
  EXPECT_EQ(state.s(0)[1], 1.0f);
  EXPECT_EQ(phi_q[0] * state.s(0)[0] + phi_q[1] * state.s(0)[1],
            5.0f);  // numerator
  EXPECT_EQ(den, 5.0f);
  EXPECT_EQ(available, 1);
  EXPECT_EQ(y, 1.0f);

  // The chunkwise and quadratic orders give the same exact numbers.
  for (int order = 0; order < 2; ++order) {
    float y2 = 0, den2 = 0;
    uint8_t a2 = 0;
    AttentionState s2 = attention->NewState();
    ChunkwiseRunner runner;
    ASSERT_TRUE(
        (order == 0
             ? runner.Run(*attention, s2, {q, k, v, 1}, {&y2, &den2, &a2})
             : QuadraticAttention(*attention, {q, k, v, 1}, {&y2, &den2, &a2}))
            .ok());
    EXPECT_EQ(y2, 1.0f);
    EXPECT_EQ(den2, 5.0f);
  }
}

// A single key gives attention exactly 1, so y = v₀. Where fp32 arithmetic
// is exact (dyadic inputs with few bits: x+1, products and sums are all
// representable) the output must be v₀ bit for bit; any difference would be
// an error in the math, not rounding.
TEST(SeedExample, SingleKeyReturnsItsValueExactly) {
  AttentionSpec spec{.num_heads = 2, .key_dim = 3, .value_dim = 4};
  auto attention = Attention::Create(spec);
  ASSERT_TRUE(attention.ok());
  const float q[6] = {0.5f, 1, 0.25f, 0, 2, 0.75f};
  const float k[6] = {1, 0, 0.5f, 0.125f, 3, 0.25f};
  const float v[8] = {1, -2, 3.5f, 0.125f, 7, 0, -0.375f, 1024};
  float y[8], den[2];
  uint8_t avail[2];
  AttentionState state = attention->NewState();
  ASSERT_TRUE(Step(*attention, state, {q, k, v, 1}, {y, den, avail}).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], v[i]) << "element " << i;
}

// For arbitrary inputs the weight is 1 up to rounding: numerator and
// denominator are the same d_φ non-negative products (times v₀ in the
// numerator), so |y − v₀| ≤ (2·d_φ + 4)·u·|v₀|.
TEST(SeedExample, SingleKeyReturnsItsValueForEveryMap) {
  for (FeatureMapKind map : {FeatureMapKind::kElu1, FeatureMapKind::kRelu,
                             FeatureMapKind::kFavor, FeatureMapKind::kCosine}) {
    AttentionSpec spec{
        .num_heads = 3, .key_dim = 5, .value_dim = 4, .feature_map = map};
    if (map == FeatureMapKind::kCosine) spec.horizon = 8;
    auto attention = Attention::Create(spec);
    ASSERT_TRUE(attention.ok());
    const float q[15] = {0.3f, -1, 2,  0.25f, 0.7f, 1, 1,   1,
                         1,    1,  -2, 2,     0,    3, 0.5f};
    const float k[15] = {1, -0.5f, 0,    2,    0.1f,  3,    0, 0.4f,
                         0, 0,     0.2f, 0.4f, -0.6f, 0.8f, -1};
    const float v[12] = {1,      -2,   3.5f, 0.125f, 7,    0,
                         -1e-3f, 1e3f, 0.1f, 0.2f,   0.3f, 0.4f};
    float y[12], den[3];
    uint8_t avail[3];
    AttentionState state = attention->NewState();
    ASSERT_TRUE(Step(*attention, state, {q, k, v, 1}, {y, den, avail}).ok());
    const double bound = (2.0 * attention->feature_dim() + 4) * 0x1.0p-24;
    for (int i = 0; i < 12; ++i) {
      ASSERT_EQ(avail[i / 4], 1) << FeatureMapName(map);
      EXPECT_LE(std::abs(y[i] - v[i]), bound * std::abs(v[i]))
          << FeatureMapName(map) << " element " << i << ": " << y[i] << " vs "
          << v[i];
    }
  }
}

// Negative preset: with relu every feature is 0, so the denominator is
// exactly 0 and the output unavailable; with elu1 it is finite and equals
// the quadratic reference.
TEST(SeedExample, NegativePreset) {
  const float q[] = {-1, -0.5f, -1, -0.5f, -1, -0.5f};
  const float k[] = {-1, -2, -0.5f, -1, -2, -0.5f};
  const float v[] = {1, -1, 2};
  {
    auto attention = Attention::Create(TwoDSpec(FeatureMapKind::kRelu));
    ASSERT_TRUE(attention.ok());
    AttentionState state = attention->NewState();
    float y[3], den[3];
    uint8_t avail[3];
    ASSERT_TRUE(
        StepSequence(*attention, state, {q, k, v, 3}, {y, den, avail}).ok());
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(avail[t], 0);
      EXPECT_EQ(den[t], 0.0f);
      EXPECT_TRUE(std::isnan(y[t]))
          << "unavailable is reported as NaN with available=0";
    }
  }
  {
    auto attention = Attention::Create(TwoDSpec(FeatureMapKind::kElu1));
    ASSERT_TRUE(attention.ok());
    AttentionState state = attention->NewState();
    float y[3], den[3], ry[3], rden[3];
    uint8_t avail[3], ravail[3];
    ASSERT_TRUE(
        StepSequence(*attention, state, {q, k, v, 3}, {y, den, avail}).ok());
    ASSERT_TRUE(
        QuadraticAttention(*attention, {q, k, v, 3}, {ry, rden, ravail}).ok());
    const ReferenceResult ref = ReferenceAttention(*attention, {q, k, v, 3});
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(avail[t], 1);
      EXPECT_TRUE(std::isfinite(y[t]));
      // Three terms of two features: a few roundings of relative size 2^-24.
      EXPECT_NEAR(y[t], ry[t], 16 * 0x1.0p-24 * 2);
      EXPECT_NEAR(y[t], ref.output[t], 16 * 0x1.0p-24 * 2);
    }
    EXPECT_NEAR(y[2], 0.560868, 1e-6);
  }
}

}  // namespace
}  // namespace linattn
