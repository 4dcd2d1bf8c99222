#include "core/session/snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <tuple>

#include "core/attention/recurrent.h"
#include "tests/attention/rule_bounds.h"
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

// Sessions of the gated and delta rules carry their rule in a RULE
// section (required: a reader that does not know it refuses the blob); the
// linear rule's blobs have none, byte for byte as before.
TEST(Snapshot, TheGatedAndDeltaRulesRoundTripWithTheirRuleSection) {
  for (auto [rule, gate] : {std::pair{UpdateRule::kGated, GateShape::kKey},
                            {UpdateRule::kGated, GateShape::kHead},
                            {UpdateRule::kDelta, GateShape::kHead},
                            {UpdateRule::kGatedDelta, GateShape::kHead},
                            {UpdateRule::kRwkv7, GateShape::kKey},
                            {UpdateRule::kRwkv6, GateShape::kKey}}) {
    AttentionSpec spec{.rule = rule,
                       .num_heads = 2,
                       .key_dim = 4,
                       .value_dim = 3,
                       .feature_map = FeatureMapKind::kIdentity,
                       .unnormalized = true};
    spec.gate = gate;
    spec.qk_l2norm = rule != UpdateRule::kGated;
    spec.scale = 0.5f;
    if (rule == UpdateRule::kRwkv6) spec.bonus = testing::RandomBonus(spec, 4);
    Attention attention = *Attention::Create(spec);
    AttentionState state = attention.NewState();
    const testing::RuleTokens data =
        testing::RandomRuleTokens(spec, 5, 2, {.k_scale = 0.5f});
    testing::Outputs o(spec, 5);
    ASSERT_TRUE(StepSequence(attention, state, data.input(), o.view()).ok());
    const std::string blob = SerializeSnapshot(spec, state);
    EXPECT_EQ(blob.size(), SnapshotBytes(spec));
    EXPECT_NE(blob.find("RULE"), std::string::npos);
    auto parsed = ParseSnapshot(blob);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->spec, spec);
    EXPECT_EQ(parsed->state.bytes(), state.bytes());
    EXPECT_EQ(0,
              std::memcmp(parsed->state.data(), state.data(), state.bytes()));
    auto spec_only = ParseSpec(SerializeSpec(spec));
    ASSERT_TRUE(spec_only.ok()) << spec_only.status();
    EXPECT_EQ(*spec_only, spec);
    // A rule no session has, under a valid checksum, is refused. RULE is
    // the last section: rule u8, gate u8, qk_l2norm u8, scale f32 (rwkv6:
    // then its bonus), then the CRC.
    std::string bad = SerializeSpec(spec);
    bad[bad.size() - 4 - 7 - 4 * spec.bonus.size()] = 9;
    const uint32_t crc =
        Crc32(absl::string_view(bad).substr(0, bad.size() - 4));
    std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
    auto refused = ParseSpec(bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("rule section"));
  }
  const std::string linear =
      WarmSnapshot({.num_heads = 1, .key_dim = 2, .value_dim = 2});
  EXPECT_EQ(linear.find("RULE"), std::string::npos);
}

TEST(Snapshot, TheEightTableCrcMatchesTheBitwiseDefinition) {
  auto bitwise = [](absl::string_view data) {
    uint32_t c = 0xffffffffu;
    for (unsigned char b : data) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
  };
  std::string data(777, '\0');
  uint32_t x = 1;
  for (char& ch : data)
    ch = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 100, 777}) {
    EXPECT_EQ(Crc32(absl::string_view(data).substr(0, n)),
              bitwise(absl::string_view(data).substr(0, n)))
        << n;
  }
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

namespace linattn {
namespace {

// A container packed by hand from the layout snapshot.h documents, with
// sections (tag, flags, bytes) and an optional lie about one offset.
std::string Pack(
    uint32_t kind,
    const std::vector<std::tuple<std::string, uint32_t, std::string>>& sections,
    int64_t offset_skew = 0) {
  auto put = [](std::string& out, auto v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  };
  std::string out = "LNATSNAP";
  put(out, uint32_t{2});
  put(out, kind);
  put(out, static_cast<uint32_t>(sections.size()));
  put(out, uint32_t{0});
  uint64_t offset = 24 + 24 * sections.size();
  for (const auto& [tag, flags, bytes] : sections) {
    out += tag;
    put(out, flags);
    put(out, offset + offset_skew);
    put(out, static_cast<uint64_t>(bytes.size()));
    offset += bytes.size();
  }
  for (const auto& [tag, flags, bytes] : sections) out += bytes;
  put(out, Crc32(out));
  return out;
}

TEST(SnapshotContainer, OneStatusPerFailure) {
  const std::string blob =
      WarmSnapshot({.num_heads = 1, .key_dim = 2, .value_dim = 2});
  for (size_t n = 0; n < blob.size(); ++n) {
    const absl::StatusCode code =
        ParseSnapshot(blob.substr(0, n)).status().code();
    // Too short for the magic: not a snapshot; past it: damaged.
    EXPECT_EQ(code, n < 8 ? absl::StatusCode::kInvalidArgument
                          : absl::StatusCode::kDataLoss)
        << "truncated to " << n;
  }
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string altered = blob;
    altered[i] ^= 0x01;
    const absl::Status s = ParseSnapshot(altered).status();
    if (i < 8) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << i;
      EXPECT_THAT(std::string(s.message()), HasSubstr("not a linattn"));
    } else if (i < 12) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << i;
      EXPECT_THAT(std::string(s.message()), HasSubstr("version"));
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << i;
    }
  }
}

TEST(SnapshotContainer, VersionOneBlobsAreRefusedNamingTheVersion) {
  std::string v1 = WarmSnapshot({.num_heads = 1, .key_dim = 2, .value_dim = 2});
  v1[8] = 1;
  const absl::Status a = ParseSnapshot(v1).status();
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.message()), HasSubstr("version 1"));
  // Version 1's model-session layout had a magic of its own.
  const absl::Status m =
      OpenSnapshot(std::string("LNATMSNP\x01\0\0\0", 12) + std::string(64, 0),
                   SnapshotKind::kModelSession)
          .status();
  EXPECT_EQ(m.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.message()), HasSubstr("version 1"));
}

TEST(SnapshotContainer, TheLayoutTableNamesSectionsReadersMaySkip) {
  const AttentionSpec spec{.num_heads = 2, .key_dim = 3, .value_dim = 2};
  AttentionState state(spec);
  const std::string blob = WarmSnapshot(spec, &state);
  auto sections = OpenSnapshot(blob, SnapshotKind::kAttentionSession);
  ASSERT_TRUE(sections.ok()) << sections.status();
  ASSERT_EQ(sections->size(), 2u);
  EXPECT_EQ((*sections)[0].tag, SnapshotTag("SPEC"));
  EXPECT_EQ((*sections)[1].tag, SnapshotTag("STAT"));
  EXPECT_EQ((*sections)[0].offset, 24u + 2 * 24);
  const std::string spec_bytes((*sections)[0].bytes);
  const std::string state_bytes((*sections)[1].bytes);
  // The packer agrees with the writer byte for byte.
  EXPECT_EQ(Pack(1, {{"SPEC", 1, spec_bytes}, {"STAT", 1, state_bytes}}), blob);

  // An optional section this reader does not know is skipped, wherever it
  // is; a required one refuses the blob, naming it.
  auto with_note = ParseSnapshot(Pack(1, {{"NOTE", 0, "later"},
                                          {"SPEC", 1, spec_bytes},
                                          {"STAT", 1, state_bytes}}));
  ASSERT_TRUE(with_note.ok()) << with_note.status();
  EXPECT_EQ(0,
            std::memcmp(with_note->state.data(), state.data(), state.bytes()));
  const absl::Status required = ParseSnapshot(Pack(1, {{"SPEC", 1, spec_bytes},
                                                       {"STAT", 1, state_bytes},
                                                       {"NOTE", 1, "x"}}))
                                    .status();
  EXPECT_EQ(required.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(required.message()), HasSubstr("NOTE"));

  // Intact (the checksum matches) but inconsistent: INVALID_ARGUMENT.
  struct Case {
    const char* name;
    std::string blob;
    const char* expect;
  };
  const Case cases[] = {
      {"a missing section", Pack(1, {{"SPEC", 1, spec_bytes}}), "STAT"},
      {"a section twice",
       Pack(1, {{"SPEC", 1, spec_bytes},
                {"SPEC", 1, spec_bytes},
                {"STAT", 1, state_bytes}}),
       "twice"},
      {"an offset that leaves a gap",
       Pack(1, {{"SPEC", 1, spec_bytes}, {"STAT", 1, state_bytes}}, 4),
       "layout table"},
      {"a short state",
       Pack(1, {{"SPEC", 1, spec_bytes},
                {"STAT", 1, state_bytes.substr(0, state_bytes.size() - 4)}}),
       "bytes of state"},
      {"a model session's blob", Pack(2, {{"SPEC", 1, spec_bytes}}),
       "model session"},
      {"no sections", Pack(1, {}), "section count"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ParseSnapshot(c.blob).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect)) << c.name;
  }
}

}  // namespace
}  // namespace linattn
