// The records of durable sessions: each type is written and read back to
// what it was made of, a store's own numbers (incarnation, a step's count)
// are set where the body is built rather than patched into bytes, and what
// does not parse is refused naming why.
#include "core/session/records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/session/snapshot.h"
#include "core/util/little_endian.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SessionManager> Table() {
  return SessionManager::Create({}).value();
}

TEST(Records, AStepCarriesItsInputsAndTheStoresNumbers) {
  auto table = Table();
  AttentionSpec spec{.num_heads = 2, .key_dim = 3, .value_dim = 2};
  spec.rule = UpdateRule::kGatedDelta;
  spec.feature_map = FeatureMapKind::kIdentity;
  spec.unnormalized = true;
  auto session = table->CreateSession(spec, std::nullopt, "s").value();
  session->set_incarnation(7);
  std::vector<float> q(6), k(6), v(4), g{-0.5f, -0.25f}, beta{1.5f, 0.5f};
  for (int i = 0; i < 6; ++i) q[i] = i, k[i] = 10 + i;
  for (int i = 0; i < 4; ++i) v[i] = 20 + i;
  SequenceInput in{q.data(), k.data(), v.data(), 1, g.data(), beta.data()};
  RecordGroup group;
  group.BeginRequest();
  group.AddStep(*session, in, 2);
  ASSERT_EQ(group.size(), 1u);
  const Record& r = group.records()[0];
  EXPECT_EQ(r.type, DurableRecord::kStep);
  EXPECT_EQ(r.id, "s");
  EXPECT_EQ(r.request, 0u);
  EXPECT_EQ(StepFloats(spec), 6u + 6 + 4 + 2 + 2);

  // The journal's body: its own incarnation and count.
  const std::string body = r.Body();
  EXPECT_EQ(body.size(), r.BodySize());
  auto split = SplitBody(body).value();
  EXPECT_EQ(split.incarnation, 7u);
  auto step = ParseStepPayload(split.rest).value();
  EXPECT_EQ(step.steps, 2u);
  ASSERT_EQ(step.floats.size(), StepFloats(spec) * sizeof(float));
  const SequenceInput back = StepInput(spec, step.floats);
  EXPECT_EQ(0, std::memcmp(back.q, q.data(), 6 * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(back.k, k.data(), 6 * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(back.v, v.data(), 4 * sizeof(float)));
  EXPECT_EQ(back.g[1], -0.25f);
  EXPECT_EQ(back.beta[0], 1.5f);

  // The shared store's: incarnation 0, a count of 1, the same inputs.
  const std::string shared = r.Body(0, 1);
  EXPECT_EQ(SplitBody(shared)->incarnation, 0u);
  EXPECT_EQ(ParseStepPayload(SplitBody(shared)->rest)->steps, 1u);
  EXPECT_EQ(shared.substr(12), body.substr(12));
}

// The rwkv7 rule's step carries its gates per key channel, then a and b.
TEST(Records, AnRwkv7StepCarriesItsLowRankVectors) {
  auto table = Table();
  AttentionSpec spec{.rule = UpdateRule::kRwkv7,
                     .num_heads = 2,
                     .key_dim = 3,
                     .value_dim = 2,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  spec.gate = GateShape::kKey;
  auto session = table->CreateSession(spec, std::nullopt, "r").value();
  std::vector<float> q(6), k(6), v(4), g(6), a(6), b(6);
  for (int i = 0; i < 6; ++i) {
    q[i] = i, k[i] = 10 + i, g[i] = -0.1f * i, a[i] = 30 + i, b[i] = 40 + i;
  }
  for (int i = 0; i < 4; ++i) v[i] = 20 + i;
  SequenceInput in{q.data(), k.data(), v.data(), 1, g.data()};
  in.a = a.data();
  in.b = b.data();
  RecordGroup group;
  group.BeginRequest();
  group.AddStep(*session, in, 1);
  ASSERT_EQ(group.size(), 1u);
  EXPECT_EQ(StepFloats(spec), 6u + 6 + 4 + 6 + 6 + 6);
  const std::string body = group.records()[0].Body();  // the views' bytes
  auto split = SplitBody(body).value();
  auto step = ParseStepPayload(split.rest).value();
  ASSERT_EQ(step.floats.size(), StepFloats(spec) * sizeof(float));
  const SequenceInput back = StepInput(spec, step.floats);
  EXPECT_EQ(0, std::memcmp(back.g, g.data(), 6 * sizeof(float)));
  EXPECT_EQ(back.beta, nullptr);
  ASSERT_NE(back.a, nullptr);
  ASSERT_NE(back.b, nullptr);
  EXPECT_EQ(0, std::memcmp(back.a, a.data(), 6 * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(back.b, b.data(), 6 * sizeof(float)));
}

TEST(Records, CreatesCarryTheSessionAndItsOwner) {
  auto table = Table();
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  auto plain = table->CreateSession(spec, 0.0f, "a").value();
  std::vector<Record> records = CreateRecords(*plain, 3);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].type, DurableRecord::kCreate);
  EXPECT_EQ(ParseSpec(SplitBody(records[0].Body())->rest).value(),
            plain->spec());

  auto owned =
      table->CreateSession(spec, 0.0f, "b", Tenant::Named("t1")).value();
  AttentionState state = owned->attention().NewState();
  state.set_position(5);
  auto restored = table
                      ->AdoptSession(owned->spec(), std::move(state), "c",
                                     "session_id", Tenant::Named("t1"))
                      .value();
  records = CreateRecords(*restored, 4);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].type, DurableRecord::kCreateWithState);
  EXPECT_EQ(ParseSnapshot(SplitBody(records[0].Body())->rest)->state.position(),
            5u);
  EXPECT_EQ(records[1].type, DurableRecord::kOwner);
  EXPECT_EQ(ParseOwner(SplitBody(records[1].Body())->rest).value(), "t1");
  EXPECT_EQ(DeleteRecord("c", 4).Body(), IncarnationBytes(4));
}

TEST(Records, WhatDoesNotParseIsRefusedNamingWhy) {
  EXPECT_THAT(std::string(SplitBody("short").status().message()),
              HasSubstr("too short"));
  EXPECT_THAT(std::string(ParseStepPayload("ab").status().message()),
              HasSubstr("too short"));
  std::string tokens;
  PutLittleEndian<int32_t>(tokens, 5);
  PutLittleEndian<int32_t>(tokens, 300);
  EXPECT_EQ(ParseTokens(tokens, 301).value(), (std::vector<int32_t>{5, 300}));
  EXPECT_THAT(std::string(ParseTokens(tokens, 300).status().message()),
              HasSubstr("token 300 is outside"));
  EXPECT_THAT(std::string(ParseTokens("abc", 300).status().message()),
              HasSubstr("whole tokens"));
  EXPECT_THAT(std::string(ParseSampler("x").status().message()),
              HasSubstr("seed and a draw count"));
  EXPECT_FALSE(ParseOwner("").ok());
  EXPECT_FALSE(ParseOwner(std::string(2000, 'x')).ok());
  EXPECT_EQ(RecordName(9), "tokens");
  EXPECT_EQ(RecordName(200), "unknown");
}

TEST(Records, AStoredSnapshotsOwnerSectionReadsBack) {
  const std::string blob = OwnerSection("tenant-a") + "LNATSNAP...";
  absl::string_view rest = blob;
  EXPECT_EQ(TakeOwnerSection(rest).value(), "tenant-a");
  EXPECT_EQ(rest, "LNATSNAP...");
  // A blob written before tenants existed: owned by "".
  absl::string_view old = "LNATSNAP...";
  EXPECT_EQ(TakeOwnerSection(old).value(), "");
  EXPECT_EQ(old, "LNATSNAP...");
  std::string cut = OwnerSection("tenant-a");
  cut.resize(cut.size() - 3);
  absl::string_view torn = cut;
  EXPECT_FALSE(TakeOwnerSection(torn).ok());
  EXPECT_EQ(OwnerSection(""), "");
}

}  // namespace
}  // namespace linattn
