// RoundCommit: each request of a round is committed, or fails with the
// commit, and nothing is written for nothing; without a store every request
// is committed at once. (Requests handed over to another replica:
// tests/session/shared_store_test.cc.)
#include "core/session/round_commit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/util/full_disk.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

const AttentionSpec kSpec{.num_heads = 2, .key_dim = 4, .value_dim = 4};

struct Stored {
  std::unique_ptr<DurableStore> store;
  std::unique_ptr<SessionManager> table;
  std::shared_ptr<AttentionSession> a, b;

  explicit Stored(const std::string& dir) {
    store = DurableStore::Open({.dir = dir}).value();
    table = SessionManager::Create({.observer = store.get()}).value();
    EXPECT_TRUE(store->Recover(*table, {}).ok());
    a = table->CreateSession(kSpec, std::nullopt, "a").value();
    b = table->CreateSession(kSpec, std::nullopt, "b").value();
  }
};

const std::vector<float> kToken(16, 0.25f);
const SequenceInput kIn{kToken.data(), kToken.data(), kToken.data(), 1};

TEST(RoundCommit, WithoutAStoreEveryRequestIsCommitted) {
  RoundCommit commit;
  EXPECT_FALSE(commit.durable());
  EXPECT_EQ(commit.Begin(), 0u);
  EXPECT_EQ(commit.Begin(), 1u);
  EXPECT_FALSE(commit.HasWork());
  commit.Commit();
  EXPECT_TRUE(commit.Outcome(0).ok());
  EXPECT_TRUE(commit.Outcome(1).ok());
}

TEST(RoundCommit, OneWriteCarriesTheStagedCreatesAndEveryRequest) {
  testing::TempDir dir;
  Stored s(dir.Path("state"));
  RoundCommit commit(s.store.get());
  ASSERT_TRUE(commit.durable());
  // The table staged two creates: there is work before any record.
  EXPECT_TRUE(commit.HasWork());
  const uint32_t first = commit.Begin();
  commit.records().AddStep(*s.a, kIn, 1);
  const uint32_t second = commit.Begin();
  commit.records().AddStep(*s.b, kIn, 1);
  const uint64_t commits = s.store->stats().commits;
  commit.Commit();
  EXPECT_TRUE(commit.status().ok()) << commit.status();
  EXPECT_TRUE(commit.Outcome(first).ok());
  EXPECT_TRUE(commit.Outcome(second).ok());
  EXPECT_EQ(s.store->stats().commits, commits + 1);
  // Two creates and two steps.
  EXPECT_EQ(s.store->stats().records, 4u);
  EXPECT_FALSE(RoundCommit(s.store.get()).HasWork());
}

TEST(RoundCommit, AFailedCommitFailsEveryRequestOfTheRound) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("state");
  const int code = testing::ExitCodeWithFullDisk(32 << 10, [&] {
    Stored s(dir);
    for (int round = 0; round < 1000; ++round) {
      RoundCommit commit(s.store.get());
      const uint32_t first = commit.Begin();
      commit.records().AddStep(*s.a, kIn, 1);
      const uint32_t second = commit.Begin();
      commit.records().AddStep(*s.b, kIn, 1);
      commit.Commit();
      const absl::Status a = commit.Outcome(first);
      const absl::Status b = commit.Outcome(second);
      if (commit.status().ok()) {
        if (!a.ok() || !b.ok()) return 10;
        continue;
      }
      // Both requests carry the commit's error, which names the full disk.
      if (a != commit.status() || b != commit.status()) return 11;
      return absl::IsResourceExhausted(a) && round > 0 ? 100 : 12;
    }
    return 13;
  });
  EXPECT_EQ(code, 100);
}

TEST(RoundCommit, AHandedOverRequestIsAbortedWithTheReason) {
  const absl::Status s = HandedOverError();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("handed over to another replica"));
}

}  // namespace
}  // namespace linattn
