#include "core/session/snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/attention/recurrent.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

std::string WarmSnapshot(AttentionSpec spec, AttentionState* out = nullptr) {
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  testing::Tokens data = testing::RandomTokens(spec, 7, 1);
  testing::Outputs o(spec, 7);
  EXPECT_TRUE(StepSequence(attention, state, data.input(), o.view()).ok());
  std::string blob = SerializeSnapshot(spec, state);
  if (out != nullptr) *out = std::move(state);
  return blob;
}

TEST(Snapshot, RoundTripsSpecPositionAndStateExactly) {
  AttentionSpec spec{.num_heads = 3,
                     .key_dim = 4,
                     .value_dim = 5,
                     .feature_map = FeatureMapKind::kFavor,
                     .epsilon = 1e-6f,
                     .decay = {0.5f, 1.0f, 0.25f},
                     .feature_dim = 6,
                     .seed = 42};
  AttentionState state(spec);
  const std::string blob = WarmSnapshot(spec, &state);
  auto parsed = ParseSnapshot(blob);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec, spec);
  EXPECT_EQ(parsed->state.position(), 7u);
  ASSERT_EQ(parsed->state.size(), state.size());
  EXPECT_EQ(0, std::memcmp(parsed->state.data(), state.data(), state.bytes()));
  EXPECT_EQ(Crc32("123456789"), 0xcbf43926u);  // the CRC-32 check value
}

TEST(Snapshot, EveryTruncationAndEveryFlippedByteIsRefused) {
  const std::string blob =
      WarmSnapshot({.num_heads = 1, .key_dim = 2, .value_dim = 2});
  for (size_t n = 0; n < blob.size(); ++n) {
    EXPECT_FALSE(ParseSnapshot(blob.substr(0, n)).ok()) << "truncated to " << n;
  }
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string altered = blob;
    altered[i] ^= 0x01;
    auto parsed = ParseSnapshot(altered);
    EXPECT_FALSE(parsed.ok()) << "byte " << i;
    if (!parsed.ok()) {
      EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("state:"));
    }
  }
}

}  // namespace
}  // namespace linattn
