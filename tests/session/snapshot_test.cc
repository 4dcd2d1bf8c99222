#include "core/session/snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

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

// A blob whose checksum was recomputed after an edit passes the CRC; its
// contents must still be a session's. `edit` changes the parsed state, and
// the blob is rebuilt around it with a valid checksum.
std::string Forged(const AttentionSpec& spec,
                   const std::function<void(AttentionState&)>& edit) {
  AttentionState state(spec);
  WarmSnapshot(spec, &state);
  edit(state);
  return SerializeSnapshot(spec, state);  // a fresh, valid CRC
}

TEST(Snapshot, ContentsNoSessionCanHaveAreRefusedDespiteAValidChecksum) {
  const AttentionSpec elu{.num_heads = 2, .key_dim = 3, .value_dim = 2};
  AttentionSpec cosine = elu;
  cosine.feature_map = FeatureMapKind::kCosine;
  cosine.horizon = 10;
  AttentionSpec favor = elu;
  favor.feature_map = FeatureMapKind::kFavor;
  struct Case {
    const char* name;
    AttentionSpec spec;
    std::function<void(AttentionState&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"past the cosine horizon", cosine,
       [](AttentionState& s) { s.set_position(11); }, "horizon"},
      {"a position that would wrap", elu,
       [](AttentionState& s) { s.set_position(~uint64_t{0}); },
       "no session reaches"},
      {"sums at position 0", elu, [](AttentionState& s) { s.set_position(0); },
       "position 0"},
      {"a negative sum of non-negative features", elu,
       [](AttentionState& s) { s.z(1)[2] = -1.0f; }, "z[2]"},
      {"infinite sums", elu, [](AttentionState& s) { s.s(0)[1] = INFINITY; },
       "NaN or Inf"},
      {"keys without a key scale", favor,
       [](AttentionState& s) { s.key_shift(0) = -INFINITY; }, "key scale"},
  };
  for (const Case& c : cases) {
    const std::string blob = Forged(c.spec, c.edit);
    auto parsed = ParseSnapshot(blob);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.expect))
        << c.name;
  }
  // The unedited ones are fine, and so is a cosine session exactly at its
  // horizon.
  EXPECT_TRUE(ParseSnapshot(Forged(elu, [](AttentionState&) {})).ok());
  EXPECT_TRUE(ParseSnapshot(Forged(cosine, [](AttentionState& s) {
                s.set_position(10);
              })).ok());
}

// Positions never wrap: at the last position a step is refused, not taken.
TEST(Snapshot, AStateAtTheLastPositionTakesNoMoreTokens) {
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  state.set_position(kMaxPosition);
  testing::Tokens data = testing::RandomTokens(spec, 1, 2);
  testing::Outputs o(spec, 1);
  const absl::Status s = StepSequence(attention, state, data.input(), o.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(state.position(), kMaxPosition);
}

}  // namespace
}  // namespace linattn
