#include "core/attention/state.h"

#include <gtest/gtest.h>

#include <cmath>

namespace linattn {
namespace {

TEST(State, SizeIsExactAndIndependentOfPosition) {
  AttentionSpec spec{.num_heads = 8, .key_dim = 64, .value_dim = 128};
  AttentionState state(spec);
  EXPECT_EQ(state.bytes(), 8u * (64 * 128 + 64) * 4);
  EXPECT_EQ(StateBytes(spec), state.bytes());
  state.set_position(10'000'000);
  EXPECT_EQ(state.bytes(), 8u * (64 * 128 + 64) * 4);

  spec.feature_map = FeatureMapKind::kFavor;
  spec.feature_dim = 96;
  AttentionState favor(spec);
  // S and z per head, plus one key log-scale per head.
  EXPECT_EQ(favor.bytes(), 8u * (96 * 128 + 96) * 4 + 8 * 4);
  EXPECT_EQ(StateBytes(spec), favor.bytes());
  EXPECT_TRUE(std::isinf(favor.key_shift(3)));
}

TEST(State, LayoutIsContiguousPerHead) {
  AttentionSpec spec{.num_heads = 3, .key_dim = 4, .value_dim = 5};
  AttentionState state(spec);
  EXPECT_EQ(state.z(0), state.s(0) + 4 * 5);
  EXPECT_EQ(state.s(1), state.z(0) + 4);
  EXPECT_EQ(state.data() + state.size(), state.z(2) + 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(state.data()) % 64, 0u);
}

TEST(State, CopyIsDeepAndIndependent) {
  AttentionSpec spec{.num_heads = 2, .key_dim = 3, .value_dim = 2};
  AttentionState a(spec);
  a.s(1)[2] = 7.0f;
  a.set_position(42);
  AttentionState b = a.Copy();
  EXPECT_EQ(b.s(1)[2], 7.0f);
  EXPECT_EQ(b.position(), 42u);
  b.s(1)[2] = 1.0f;
  EXPECT_EQ(a.s(1)[2], 7.0f);
  EXPECT_NE(a.data(), b.data());
  a.Reset();
  EXPECT_EQ(a.s(1)[2], 0.0f);
  EXPECT_EQ(a.position(), 0u);
}

}  // namespace
}  // namespace linattn
