#include "core/session/session_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
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
  ASSERT_TRUE(manager->Delete("b", SessionKind::kAttention).ok());
  EXPECT_EQ(manager->state_bytes_in_use(), bytes);
  EXPECT_TRUE(manager->CreateSession(spec, std::nullopt, "").ok());
}

TEST(SessionManager, TenantsSeeTheirOwnAndAreHeldToTheirQuotas) {
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  const uint64_t bytes = SessionChargeBytes(spec);
  auto manager = *SessionManager::Create({.max_sessions = 100});
  const Tenant alpha = Tenant::Named("alpha", false, {.max_sessions = 2});
  const Tenant beta =
      Tenant::Named("beta", false, {.max_state_bytes = 3 * bytes});
  const Tenant admin = Tenant::Named("ops", /*admin=*/true);
  ASSERT_TRUE(manager->CreateSession(spec, std::nullopt, "a1", alpha).ok());
  ASSERT_TRUE(manager->CreateSession(spec, std::nullopt, "a2", alpha).ok());
  auto third = manager->CreateSession(spec, std::nullopt, "", alpha);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), ::testing::HasSubstr("'alpha'"));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(manager->CreateSession(spec, std::nullopt, "", beta).ok());
  }
  auto over = manager->CreateSession(spec, std::nullopt, "", beta);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), ::testing::HasSubstr("'beta'"));
  // Refused admissions hold nothing.
  EXPECT_EQ(manager->UsageOf("alpha").sessions, 2u);
  EXPECT_EQ(manager->UsageOf("alpha").reserved_sessions, 0u);
  EXPECT_EQ(manager->UsageOf("beta").bytes, 3 * bytes);
  EXPECT_EQ(manager->tenant_count(), 2u);

  // Another tenant's session is NOT_FOUND, as an id no one holds; the
  // anonymous tenant sees only sessions of "".
  EXPECT_TRUE(manager->FindAttention("a1", alpha).ok());
  auto hidden = manager->FindAttention("a1", beta);
  EXPECT_EQ(hidden.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(hidden.status().message(), "session_id: no session 'a1'");
  EXPECT_FALSE(manager->FindAttention("a1").ok());
  EXPECT_EQ(manager->Delete("a1", SessionKind::kAttention, beta).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager->List(SessionKind::kAttention, alpha).size(), 2u);
  EXPECT_EQ(manager->List(SessionKind::kAttention, beta).size(), 3u);
  EXPECT_EQ(manager->List(SessionKind::kAttention, admin).size(), 5u);
  EXPECT_TRUE(manager->FindAttention("a1", admin).ok());
  EXPECT_TRUE(manager->FindAttention("a1", Tenant::Server()).ok());

  // A fork belongs to whoever forks; a deletion gives the quota back.
  auto parent = *manager->FindAttention("a1", alpha);
  auto fork = manager->ForkSession(*parent, "copy", "new_session_id", admin);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ((*fork)->owner(), "ops");
  EXPECT_EQ(manager->ForkSession(*parent, "", "new_session_id", alpha)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(manager->Delete("a2", SessionKind::kAttention, alpha).ok());
  EXPECT_EQ(manager->UsageOf("alpha").sessions, 1u);
  EXPECT_TRUE(manager->CreateSession(spec, std::nullopt, "", alpha).ok());
  manager->EvictIdle(std::chrono::seconds(0));
  EXPECT_EQ(manager->tenant_count(), 0u);
  EXPECT_EQ(manager->UsageOf("beta").bytes, 0u);
}

// A session whose state grows (a hybrid model's keys and values) is
// recharged: growth is taken from its owner's quota and the budget or
// refused with nothing changed; shrinking gives back; a deleted session
// gives back what it holds then, and cannot grow.
TEST(SessionManager, RechargeGrowsAndShrinksASessionsCharge) {
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  const uint64_t bytes = SessionChargeBytes(spec);
  auto manager = *SessionManager::Create(
      {.max_sessions = 10, .max_state_bytes = 10 * bytes});
  const Tenant alpha =
      Tenant::Named("alpha", false, {.max_state_bytes = 4 * bytes});
  auto s = *manager->CreateSession(spec, std::nullopt, "s", alpha);
  auto other = *manager->CreateSession(spec, std::nullopt, "o");
  const auto what = [] { return std::string("memory: growing s"); };

  ASSERT_TRUE(manager->Recharge(*s, 3 * bytes, alpha, what).ok());
  EXPECT_EQ(s->charged_bytes(), 3 * bytes);
  EXPECT_EQ(manager->state_bytes_in_use(), 4 * bytes);
  EXPECT_EQ(manager->budget().in_use(), 4 * bytes);
  EXPECT_EQ(manager->UsageOf("alpha").bytes, 3 * bytes);

  // Past the owner's quota: refused, naming it; nothing moved.
  absl::Status over = manager->Recharge(*s, 5 * bytes, alpha, what);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("memory: growing s"));
  EXPECT_THAT(over.message(), HasSubstr("'alpha'"));
  // An admin acting on it is held to the budget alone: past the server's
  // limit is refused too.
  over = manager->Recharge(*s, 10 * bytes, Tenant::Server(), what);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("memory: growing s"));
  EXPECT_EQ(s->charged_bytes(), 3 * bytes);
  EXPECT_EQ(manager->state_bytes_in_use(), 4 * bytes);
  EXPECT_EQ(manager->budget().in_use(), 4 * bytes);
  EXPECT_EQ(manager->UsageOf("alpha").bytes, 3 * bytes);
  ASSERT_TRUE(manager->Recharge(*s, 9 * bytes, Tenant::Server(), what).ok());
  EXPECT_EQ(manager->budget().in_use(), 10 * bytes);

  // Shrinking gives back, and a new session fits again.
  ASSERT_TRUE(manager->Recharge(*s, 2 * bytes, alpha, what).ok());
  EXPECT_EQ(manager->state_bytes_in_use(), 3 * bytes);
  EXPECT_EQ(manager->budget().in_use(), 3 * bytes);
  EXPECT_EQ(manager->UsageOf("alpha").bytes, 2 * bytes);
  EXPECT_TRUE(manager->CreateSession(spec, std::nullopt, "n").ok());

  ASSERT_TRUE(manager->Delete("s", SessionKind::kAttention, alpha).ok());
  EXPECT_EQ(manager->budget().in_use(), 2 * bytes);
  EXPECT_EQ(manager->UsageOf("alpha").bytes, 0u);
  EXPECT_EQ(manager->Recharge(*s, 3 * bytes, alpha, what).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager->Recharge(*s, bytes, alpha, what).ok());
  EXPECT_EQ(manager->budget().in_use(), 2 * bytes);
  (void)other;
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
  EXPECT_EQ(manager->FindAttention("missing").status().code(),
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
  EXPECT_EQ(manager->EvictIdle(std::chrono::milliseconds(10)).attention, 1u);
  EXPECT_FALSE(manager->FindAttention("idle").ok());
  EXPECT_TRUE(manager->FindAttention("busy").ok());
  EXPECT_EQ(manager->state_bytes_in_use(), busy->state_bytes());
}

// FAVOR+ is the one map whose setup is heavy (its projection is drawn by
// orthogonalising d_k×d_k blocks): it runs outside the table lock, so the
// table answers while a large one is being set up.
TEST(SessionManager, FavorSetupDoesNotHoldTheTable) {
  auto manager = *SessionManager::Create({});
  ASSERT_TRUE(manager->CreateSession({}, std::nullopt, "small").ok());
  const AttentionSpec big{.num_heads = 1,
                          .key_dim = 512,
                          .value_dim = 1,
                          .feature_map = FeatureMapKind::kFavor,
                          .feature_dim = 2048,
                          .seed = 7};
  const uint64_t setup = FeatureMapSetupBytes(big);
  std::atomic<bool> created{false};
  std::thread creator([&] {
    EXPECT_TRUE(manager->CreateSession(big, std::nullopt, "big").ok());
    created = true;
  });
  // The reservation (with the setup's working memory) is taken before the
  // setup starts; wait for it.
  while (manager->budget().in_use() < setup && !created) {
    std::this_thread::yield();
  }
  // Every call on the table completes while the setup (four 512×512 blocks,
  // a few tenths of a second) is still running.
  EXPECT_TRUE(manager->FindAttention("small").ok());
  EXPECT_EQ(manager->List(SessionKind::kAttention).size(), 1u);
  EXPECT_TRUE(manager->CreateSession({}, std::nullopt, "other").ok());
  EXPECT_TRUE(manager->Delete("other", SessionKind::kAttention).ok());
  EXPECT_FALSE(created) << "the table waited for the FAVOR+ setup";
  creator.join();
  EXPECT_TRUE(manager->FindAttention("big").ok());
  // The session is charged its state and its projection.
  EXPECT_EQ((*manager->FindAttention("big"))->charged_bytes(),
            StateBytes(big) + uint64_t{2048} * 512 * 4);
  EXPECT_EQ(manager->budget().in_use(), manager->state_bytes_in_use());
}

TEST(SessionManager, FeatureMapParametersCountAgainstTheBudget) {
  const AttentionSpec favor{.num_heads = 1,
                            .key_dim = 256,
                            .value_dim = 1,
                            .feature_map = FeatureMapKind::kFavor,
                            .feature_dim = 1024};
  // Its state is 8 KiB; its projection 1 MiB; setting it up takes 512 KiB.
  const uint64_t state = StateBytes(favor);
  const uint64_t projection = 1024u * 256u * 4u;
  auto tight = *SessionManager::Create(
      {.max_state_bytes =
           state + projection + FeatureMapSetupBytes(favor) - 1});
  auto refused = tight->CreateSession(favor, std::nullopt, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("of feature map"));
  EXPECT_EQ(tight->budget().in_use(), 0u) << "a refusal holds nothing";

  auto manager =
      *SessionManager::Create({.max_state_bytes = 2 * (state + projection) +
                                                  FeatureMapSetupBytes(favor)});
  ASSERT_TRUE(manager->CreateSession(favor, std::nullopt, "a").ok());
  EXPECT_EQ(manager->state_bytes_in_use(), state + projection);
  // A second session of the same spec shares the projection but is charged
  // for it too (no setup this time).
  ASSERT_TRUE(manager->CreateSession(favor, std::nullopt, "b").ok());
  EXPECT_EQ(manager->budget().in_use(), 2 * (state + projection));
  EXPECT_EQ(manager->CreateSession(favor, std::nullopt, "c").status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(manager->Delete("a", SessionKind::kAttention).ok());
  EXPECT_EQ(manager->budget().in_use(), state + projection);
}

TEST(SessionManager, FavorDimensionsAreBounded) {
  AttentionSpec spec{.num_heads = 1,
                     .key_dim = kMaxFavorKeyDim + 1,
                     .value_dim = 1,
                     .feature_map = FeatureMapKind::kFavor,
                     .feature_dim = 16};
  auto manager = *SessionManager::Create({});
  auto s = manager->CreateSession(spec, std::nullopt, "");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("spec.key_dim"));
  spec.key_dim = 16;
  spec.feature_dim = kMaxFavorFeatureDim + 1;
  s = manager->CreateSession(spec, std::nullopt, "");
  EXPECT_THAT(s.status().message(), HasSubstr("spec.feature_dim"));
  // The default m = 2·d_k is held to the same bound.
  spec.key_dim = kMaxFavorKeyDim;
  spec.feature_dim = 0;
  EXPECT_TRUE(ValidateSpec(spec).ok());
}

// Reservations count against the session limit while they are set up, and
// one that is dropped gives everything back.
TEST(SessionManager, ReservationsHoldTheirPlaceUntilCommittedOrDropped) {
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  auto manager = *SessionManager::Create(
      {.max_sessions = 2, .max_state_bytes = 2 * StateBytes(spec)});
  {
    auto held = manager->Reserve(spec, "x");
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(manager->budget().in_use(), StateBytes(spec));
    ASSERT_TRUE(manager->CreateSession(spec, std::nullopt, "y").ok());
    EXPECT_EQ(manager->CreateSession(spec, std::nullopt, "").status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(manager->budget().in_use(), StateBytes(spec));
  auto held = manager->Reserve(spec, "x");
  ASSERT_TRUE(held.ok());
  auto committed = manager->Commit(*std::move(held), AttentionState(spec), "x");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(manager->session_count(), 2u);
  // An id taken meanwhile fails the commit, which gives the room back.
  auto again = manager->Reserve(spec, "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted);
}

// A session whose whole state could not be sent in one message is refused
// when it is created, naming the limit.
TEST(SessionManager, StatesLargerThanAMessageAreRefused) {
  const AttentionSpec fits{.num_heads = 1, .key_dim = 60, .value_dim = 60};
  const uint64_t limit = SessionMessageBytes(fits);
  auto manager = *SessionManager::Create({.max_message_bytes = limit});
  EXPECT_TRUE(manager->CreateSession(fits, std::nullopt, "").ok());
  const AttentionSpec over{.num_heads = 1, .key_dim = 61, .value_dim = 60};
  auto s = manager->CreateSession(over, std::nullopt, "");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("--max-message-bytes"));
}

TEST(MemoryBudget, TakesGivesAndNamesTheLimit) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.Take(60, "a").ok());
  absl::Status s = budget.Take(41, "b: needs 41 bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "b: needs 41 bytes; 40 of the state memory limit 100 bytes remain");
  {
    auto lease = budget.Lease(40, "c");
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(budget.in_use(), 100u);
    MemoryLease moved = *std::move(lease);
    EXPECT_EQ(moved.bytes(), 40u);
  }
  EXPECT_EQ(budget.in_use(), 60u);
  budget.Give(60);
  EXPECT_EQ(budget.in_use(), 0u);
  MemoryBudget unlimited(0);
  EXPECT_TRUE(unlimited.Take(uint64_t{1} << 62, "x").ok());
}

// Reading a session (GetSession, Inspect) is not using it: its idle time
// keeps counting and idle eviction still takes it.
TEST(SessionManager, FindingASessionDoesNotMakeItBusy) {
  auto manager = *SessionManager::Create({});
  ASSERT_TRUE(manager->CreateSession({}, std::nullopt, "s").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto s = *manager->FindAttention("s");
  EXPECT_GE(DescribeSession(*s).idle_ms, 25u);
  EXPECT_EQ(manager->EvictIdle(std::chrono::milliseconds(20)).attention, 1u);
}

}  // namespace
}  // namespace linattn
