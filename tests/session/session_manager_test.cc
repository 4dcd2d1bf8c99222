#include "core/session/session_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace linattn {
namespace {

using ::testing::HasSubstr;

TEST(SessionManager, AdmissionByCountAndExactStateBytes) {
  const AttentionSpec spec{.num_heads = 2, .key_dim = 8, .value_dim = 8};
  const uint64_t bytes = StateBytes(spec);
  auto manager = *SessionManager::Create(
      {.max_sessions = 3, .max_state_bytes = 2 * bytes});
  ASSERT_TRUE(manager->CreateSession(spec, std::nullopt, "").ok());
  auto second = manager->CreateSession(spec, 0.0f, "b");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)->spec().epsilon, 0.0f);
  EXPECT_EQ(manager->state_bytes_in_use(), 2 * bytes);
  auto third = manager->CreateSession(spec, std::nullopt, "");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(manager->Delete("b").ok());
  EXPECT_EQ(manager->state_bytes_in_use(), bytes);
  EXPECT_TRUE(manager->CreateSession(spec, std::nullopt, "").ok());
}

TEST(SessionManager, IdsAndDefaults) {
  auto manager = *SessionManager::Create({});
  auto a = manager->CreateSession({}, std::nullopt, "");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->id().size(), 32u);
  EXPECT_EQ((*a)->spec().epsilon, 1e-6f);
  EXPECT_EQ(manager->CreateSession({}, std::nullopt, "x y").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager->CreateSession({}, std::nullopt, std::string(129, 'a'))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(manager->CreateSession({}, std::nullopt, "k").ok());
  EXPECT_EQ(manager->CreateSession({}, std::nullopt, "k").status().code(),
            absl::StatusCode::kAlreadyExists);
  auto bad = manager->CreateSession({.num_heads = 0}, std::nullopt, "");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("spec.num_heads"));
  EXPECT_EQ(manager->Find("missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SessionManager, SessionsOfOneSpecShareTheirAttention) {
  auto manager = *SessionManager::Create({});
  const AttentionSpec spec{
      .key_dim = 8, .feature_map = FeatureMapKind::kFavor, .seed = 3};
  auto a = *manager->CreateSession(spec, std::nullopt, "");
  auto b = *manager->CreateSession(spec, std::nullopt, "");
  EXPECT_EQ(&a->attention(), &b->attention());
  AttentionSpec other = spec;
  other.seed = 4;
  auto c = *manager->CreateSession(other, std::nullopt, "");
  EXPECT_NE(&a->attention(), &c->attention());
}

TEST(SessionManager, EvictsOnlyIdleSessionsWithoutPendingWork) {
  auto manager = *SessionManager::Create({});
  auto idle = *manager->CreateSession({}, std::nullopt, "idle");
  auto busy = *manager->CreateSession({}, std::nullopt, "busy");
  busy->pending().fetch_add(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(manager->EvictIdle(std::chrono::milliseconds(10)), 1u);
  EXPECT_FALSE(manager->Find("idle").ok());
  EXPECT_TRUE(manager->Find("busy").ok());
  EXPECT_EQ(manager->state_bytes_in_use(), busy->state_bytes());
}

}  // namespace
}  // namespace linattn
