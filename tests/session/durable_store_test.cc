// The durable store against the one thing that counts: a table rebuilt from
// its directory holds, bit for bit, what the table that wrote it held —
// whatever the mix of creates, steps, step groups, sliced prefills, forks,
// restores, deletes and id reuse, with or without snapshot files, and
// whatever a crash cut short.
#include "core/session/durable_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <random>

#include "core/attention/recurrent.h"
#include "core/scheduler/scheduler.h"
#include "core/session/snapshot.h"
#include "core/util/crc.h"
#include "core/util/status_macros.h"
#include "tests/util/files.h"
#include "tests/util/full_disk.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

// A store and the table it observes, recovered from `dir`.
struct Durable {
  std::unique_ptr<DurableStore> store;
  std::unique_ptr<SessionManager> table;
  RecoveryReport report;

  static absl::StatusOr<Durable> Open(const std::string& dir,
                                      DurableStoreOptions options = {}) {
    options.dir = dir;
    Durable d;
    LINATTN_ASSIGN_OR_RETURN(d.store, DurableStore::Open(options));
    LINATTN_ASSIGN_OR_RETURN(
        d.table, SessionManager::Create({.observer = d.store.get()}));
    LINATTN_ASSIGN_OR_RETURN(d.report, d.store->Recover(*d.table, {}));
    return d;
  }
};

// Every attention session of `table`, as its snapshot bytes, by id.
std::map<std::string, std::string> Contents(SessionManager& table) {
  std::map<std::string, std::string> out;
  for (const auto& s : table.List(SessionKind::kAttention)) {
    const auto& a = static_cast<const AttentionSession&>(*s);
    out[a.id()] = SerializeSnapshot(a.spec(), a.state());
  }
  return out;
}

// One token's inputs for a spec, from `rng`.
struct Token {
  std::vector<float> q, k, v, y, den;
  std::vector<uint8_t> avail;
  Token(const AttentionSpec& spec, std::mt19937& rng, uint64_t tokens = 1) {
    std::uniform_real_distribution<float> u(-1, 1);
    const uint64_t qk = tokens * spec.num_heads * spec.key_dim;
    const uint64_t vv = tokens * spec.num_heads * spec.value_dim;
    for (uint64_t i = 0; i < qk; ++i) q.push_back(u(rng)), k.push_back(u(rng));
    for (uint64_t i = 0; i < vv; ++i) v.push_back(u(rng));
    y.resize(vv);
    den.resize(tokens * spec.num_heads);
    avail.resize(tokens * spec.num_heads);
  }
  SequenceInput in(uint64_t tokens = 1) const {
    return {q.data(), k.data(), v.data(), tokens};
  }
  SequenceOutput out() { return {y.data(), den.data(), avail.data()}; }
};

absl::Status Wait(const std::function<void(Scheduler::Done)>& submit) {
  std::promise<std::string> done;
  submit([&](absl::Status s) { done.set_value(s.ok() ? "" : s.ToString()); });
  const std::string error = done.get_future().get();
  return error.empty() ? absl::OkStatus() : absl::InternalError(error);
}

const AttentionSpec kElu{.num_heads = 2, .key_dim = 8, .value_dim = 8};
const AttentionSpec kFavor{.num_heads = 2,
                           .key_dim = 8,
                           .value_dim = 4,
                           .feature_map = FeatureMapKind::kFavor,
                           .feature_dim = 16,
                           .seed = 7};

TEST(DurableStore, ATableRebuiltFromItsDirectoryIsTheSameBitForBit) {
  testing::TempDir tmp;
  std::mt19937 rng(3);
  std::map<std::string, std::string> expected;
  {
    auto d = Durable::Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->report.attention_sessions, 0u);
    // Prefills in slices of 5 tokens: each slice a round, the result one
    // state record.
    Scheduler scheduler({.prefill_tokens_per_round = 5,
                         .budget = d->table->shared_budget(),
                         .store = d->store.get()});
    auto a = d->table->CreateSession(kElu, std::nullopt, "a").value();
    auto b = d->table->CreateSession(kFavor, std::nullopt, "b").value();
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, *a).ok());
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, *b).ok());
    for (int t = 0; t < 3; ++t) {
      Token x(kElu, rng);
      ASSERT_TRUE(Wait([&](auto done) {
                    scheduler.Step(a, x.in(), x.out(), std::move(done));
                  }).ok());
    }
    Token p(kFavor, rng, 23), pa(kElu, rng, 11);
    ASSERT_TRUE(Wait([&](auto done) {
                  scheduler.Prefill(b, p.in(23), p.out(), std::move(done));
                }).ok());
    ASSERT_TRUE(Wait([&](auto done) {
                  scheduler.Prefill(a, pa.in(11), pa.out(), std::move(done));
                }).ok());
    Token ga(kElu, rng), gb(kFavor, rng);
    ASSERT_TRUE(Wait([&](auto done) {
                  std::vector<Scheduler::GroupStep> g;
                  g.push_back({a, ga.in(), ga.out()});
                  g.push_back({b, gb.in(), gb.out()});
                  scheduler.StepGroup(std::move(g), std::move(done));
                }).ok());
    // A step the kernels refuse is recorded and refused again on replay.
    Token bad(kElu, rng);
    bad.k[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(Wait([&](auto done) {
                   scheduler.Step(a, bad.in(), bad.out(), std::move(done));
                 }).ok());
    // A fork, a restore, a delete and an id taken again.
    ASSERT_TRUE(Wait([&](auto done) {
                  scheduler.Run(
                      a,
                      [&](AttentionSession& parent) -> absl::Status {
                        auto c = d->table->ForkSession(parent, "c");
                        if (!c.ok()) return c.status();
                        return d->store->AwaitCreate(*d->table, **c);
                      },
                      std::move(done));
                }).ok());
    auto parsed = ParseSnapshot(SerializeSnapshot(a->spec(), a->state()));
    auto r =
        d->table->AdoptSession(parsed->spec, std::move(parsed->state), "r");
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, **r).ok());
    ASSERT_TRUE(d->store->Delete(*d->table, "b", SessionKind::kAttention).ok());
    auto b2 = d->table->CreateSession(kElu, std::nullopt, "b").value();
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, *b2).ok());
    Token x(kElu, rng);
    ASSERT_TRUE(Wait([&](auto done) {
                  scheduler.Step(b2, x.in(), x.out(), std::move(done));
                }).ok());
    expected = Contents(*d->table);
    // Gone without a word (as after kill -9): no snapshot files.
  }
  EXPECT_EQ(expected.size(), 4u);  // a, b (again), c, r
  auto d = Durable::Open(tmp.Path("state"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->report.attention_sessions, 4u);
  EXPECT_EQ(d->report.snapshot_files, 0u);
  EXPECT_EQ(Contents(*d->table), expected);
  EXPECT_EQ(d->table->FindAttention("a").value()->position(), 15u);
  EXPECT_EQ(d->table->FindAttention("b").value()->position(), 1u);
  // Recovered sessions keep being recorded: a third life.
  auto a = d->table->FindAttention("a").value();
  DurableStore::Group g;
  Token x(kElu, rng);
  g.AddStep(*a, x.in(), 1);
  ASSERT_TRUE(d->store->Commit(std::move(g)).ok());
  ASSERT_TRUE(StepBatch(std::vector<StepItem>{
                            {&a->attention(), &a->state(), x.in(), x.out()}})
                  .ok());
  expected = Contents(*d->table);
  d->store.reset();
  d->table.reset();
  auto again = Durable::Open(tmp.Path("state"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Contents(*again->table), expected);
}

// Steps applied the way the scheduler applies them: recorded, then run.
void RecordAndStep(DurableStore& store, AttentionSession& s, std::mt19937& rng,
                   int steps) {
  for (int t = 0; t < steps; ++t) {
    Token x(s.spec(), rng);
    DurableStore::Group g;
    g.AddStep(s, x.in(), 1);
    ASSERT_TRUE(store.Commit(std::move(g)).ok());
    ASSERT_TRUE(StepBatch(std::vector<StepItem>{
                              {&s.attention(), &s.state(), x.in(), x.out()}})
                    .ok());
  }
}

TEST(DurableStore, SnapshotsFoldTheJournalAndOldSegmentsGo) {
  testing::TempDir tmp;
  std::mt19937 rng(5);
  const DurableStoreOptions options{.segment_bytes = 8 << 10,
                                    .snapshot_tail_factor = 1,
                                    .min_snapshot_tail_bytes = 1};
  std::map<std::string, std::string> expected;
  uint64_t journal_before = 0;
  {
    auto d = Durable::Open(tmp.Path("state"), options);
    ASSERT_TRUE(d.ok()) << d.status();
    auto a = d->table->CreateSession(kElu, std::nullopt, "a").value();
    auto b = d->table->CreateSession(kElu, std::nullopt, "b").value();
    ASSERT_TRUE(d->store->SyncThrough(1, d->store->last_ticket()).ok());
    RecordAndStep(*d->store, *a, rng, 60);
    RecordAndStep(*d->store, *b, rng, 3);
    // a's records outgrew its state; b pins the oldest segment.
    auto due = d->store->DueForSnapshot(10);
    ASSERT_EQ(due.size(), 2u);
    EXPECT_TRUE(d->store->DueForSnapshot(10).empty()) << "listed once";
    journal_before = d->store->journal_disk_bytes();
    for (const auto& item : due) {
      auto s = d->table->FindAttention(item.id).value();
      ASSERT_TRUE(d->store
                      ->WriteSnapshot(item, d->store->committed_seq(),
                                      SerializeSnapshot(s->spec(), s->state()))
                      .ok());
    }
    ASSERT_TRUE(d->store->Maintain().ok());
    EXPECT_LT(d->store->journal_disk_bytes(), journal_before / 2);
    EXPECT_GE(d->store->stats().segments_removed, 1u);
    // More steps after the snapshot: replayed from the journal.
    RecordAndStep(*d->store, *a, rng, 2);
    // A deleted session's file goes once its deletion is committed.
    ASSERT_TRUE(d->store->Delete(*d->table, "b", SessionKind::kAttention).ok());
    ASSERT_TRUE(d->store->Maintain().ok());
    EXPECT_EQ(d->store->stats().files_removed, 1u);
    EXPECT_FALSE(
        std::filesystem::exists(tmp.Path("state/sessions/session-b.snap")));
    expected = Contents(*d->table);
  }
  auto d = Durable::Open(tmp.Path("state"), options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->report.snapshot_files, 1u);
  EXPECT_EQ(Contents(*d->table), expected);
  EXPECT_EQ(d->table->FindAttention("a").value()->position(), 62u);
}

TEST(DurableStore, AnEvictedSessionIsRecordedAsGoneAndItsFileRemoved) {
  testing::TempDir tmp;
  std::mt19937 rng(7);
  {
    auto d = Durable::Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    auto a = d->table->CreateSession(kElu, std::nullopt, "a").value();
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, *a).ok());
    RecordAndStep(*d->store, *a, rng, 3);
    const DurableStore::Due due{"a", a->incarnation(), SessionKind::kAttention};
    ASSERT_TRUE(d->store
                    ->WriteSnapshot(due, d->store->committed_seq(),
                                    SerializeSnapshot(a->spec(), a->state()))
                    .ok());
    const std::string file = tmp.Path("state/sessions/session-a.snap");
    ASSERT_TRUE(std::filesystem::exists(file));
    EXPECT_EQ(d->table->EvictIdle(std::chrono::nanoseconds(0)).attention, 1u);
    // The maintenance thread's turn: the eviction's record, then the file.
    ASSERT_TRUE(d->store->Tick().ok());
    ASSERT_TRUE(d->store->Maintain().ok());
    EXPECT_FALSE(std::filesystem::exists(file));
  }
  auto d = Durable::Open(tmp.Path("state"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->report.attention_sessions, 0u);
}

TEST(DurableStore, ARequestWhoseStepsWereNotAllWrittenIsDroppedWhole) {
  testing::TempDir tmp;
  std::mt19937 rng(13);
  const std::string dir = tmp.Path("state");
  {
    auto d = Durable::Open(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    auto x = d->table->CreateSession(kElu, std::nullopt, "x").value();
    auto y = d->table->CreateSession(kElu, std::nullopt, "y").value();
    ASSERT_TRUE(d->store->SyncThrough(1, d->store->last_ticket()).ok());
    RecordAndStep(*d->store, *x, rng, 2);
    DurableStore::Group group;  // a DecodeBatch of x and y
    Token tx(kElu, rng), ty(kElu, rng);
    group.AddStep(*x, tx.in(), 2);
    group.AddStep(*y, ty.in(), 0);
    ASSERT_TRUE(d->store->Commit(std::move(group)).ok());
  }
  // The write stopped between the two records (at a record boundary: no
  // torn record, but the request is incomplete).
  auto scan = ReadJournal(dir + "/journal");
  ASSERT_TRUE(scan.ok()) << scan.status();
  const JournalRecord& last = scan->records.back();
  std::filesystem::resize_file(last.file, last.offset);
  for (int restart = 0; restart < 2; ++restart) {
    auto d = Durable::Open(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->table->FindAttention("x").value()->position(), 2u);
    EXPECT_EQ(d->table->FindAttention("y").value()->position(),
              static_cast<uint64_t>(restart));
    if (restart == 0) {
      EXPECT_GT(d->report.dropped_tail_bytes, 0u);
      // The journal goes on after the cut.
      auto y = d->table->FindAttention("y").value();
      RecordAndStep(*d->store, *y, rng, 1);
    } else {
      EXPECT_EQ(d->report.dropped_tail_bytes, 0u);
    }
  }
}

TEST(DurableStore, RecordsOfADeletedSessionNeverReachItsSuccessor) {
  testing::TempDir tmp;
  std::mt19937 rng(9);
  std::map<std::string, std::string> expected;
  {
    auto d = Durable::Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    auto x = d->table->CreateSession(kElu, std::nullopt, "x").value();
    auto y = d->table->CreateSession(kElu, std::nullopt, "y").value();
    ASSERT_TRUE(d->store->SyncThrough(1, d->store->last_ticket()).ok());
    // A round took x and y, then x was deleted and created again before
    // the round committed: the round's records name the old x.
    DurableStore::Group round;
    Token tx(kElu, rng), ty(kElu, rng);
    round.AddStep(*x, tx.in(), 2);
    round.AddStep(*y, ty.in(), 0);
    ASSERT_TRUE(d->store->Delete(*d->table, "x", SessionKind::kAttention).ok());
    auto x2 = d->table->CreateSession(kElu, std::nullopt, "x").value();
    EXPECT_NE(x2->incarnation(), x->incarnation());
    ASSERT_TRUE(d->store->Commit(std::move(round)).ok());
    ASSERT_TRUE(
        StepBatch(std::vector<StepItem>{
                      {&x->attention(), &x->state(), tx.in(), tx.out()},
                      {&y->attention(), &y->state(), ty.in(), ty.out()}})
            .ok());
    // A group whose deleted member's input was not finite was refused
    // whole: its live member did not step.
    DurableStore::Group refused;
    Token bad(kElu, rng), ok(kElu, rng);
    bad.v[0] = std::numeric_limits<float>::infinity();
    refused.AddStep(*x, bad.in(), 2);
    refused.AddStep(*y, ok.in(), 0);
    ASSERT_TRUE(d->store->Commit(std::move(refused)).ok());
    expected = Contents(*d->table);
  }
  auto d = Durable::Open(tmp.Path("state"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Contents(*d->table), expected);
  EXPECT_EQ(d->table->FindAttention("x").value()->position(), 0u);
  EXPECT_EQ(d->table->FindAttention("y").value()->position(), 1u);
}

TEST(DurableStore, DamageIsRefusedNamingTheFileAndATornTailIsDropped) {
  testing::TempDir tmp;
  std::mt19937 rng(11);
  const std::string dir = tmp.Path("state");
  {
    auto d = Durable::Open(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    auto a = d->table->CreateSession(kElu, std::nullopt, "a").value();
    ASSERT_TRUE(d->store->AwaitCreate(*d->table, *a).ok());
    RecordAndStep(*d->store, *a, rng, 4);
    const DurableStore::Due due{"a", a->incarnation(), SessionKind::kAttention};
    ASSERT_TRUE(d->store
                    ->WriteSnapshot(due, d->store->committed_seq(),
                                    SerializeSnapshot(a->spec(), a->state()))
                    .ok());
    RecordAndStep(*d->store, *a, rng, 2);
  }
  std::string segment;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/journal")) {
    segment = e.path().string();
  }
  const std::string journal = testing::ReadFile(segment);

  // A write cut short at the end: dropped, the rest recovered.
  testing::WriteFile(segment, journal.substr(0, journal.size() - 5));
  {
    auto d = Durable::Open(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_GT(d->report.dropped_tail_bytes, 0u);
    EXPECT_EQ(d->report.dropped_tail_file, segment);
    EXPECT_EQ(d->table->FindAttention("a").value()->position(), 5u);
  }
  // A damaged record with records after it: refused, file and offset named.
  std::string damaged = journal;
  damaged[40] ^= 0x10;
  testing::WriteFile(segment, damaged);
  {
    auto d = Durable::Open(dir);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(segment));
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("byte"));
  }
  // A damaged snapshot file: refused by name.
  for (const auto& e : std::filesystem::directory_iterator(dir + "/journal")) {
    std::filesystem::remove(e.path());
  }
  const std::string file = dir + "/sessions/session-a.snap";
  std::string snap = testing::ReadFile(file);
  snap[snap.size() / 2] ^= 1;
  testing::WriteFile(file, snap);
  auto d = Durable::Open(dir);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr(file));
}

// A full disk (the file size limit of a child process) fails the commit
// with RESOURCE_EXHAUSTED and keeps every commit before it.
TEST(DurableStore, AFullDiskFailsTheCommitAndKeepsWhatWasCommitted) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("state");
  const int code = testing::ExitCodeWithFullDisk(64 << 10, [&] {
    auto d = Durable::Open(dir);
    if (!d.ok()) return 10;
    auto a = d->table->CreateSession(kElu, std::nullopt, "a").value();
    if (!d->store->AwaitCreate(*d->table, *a).ok()) return 11;
    std::mt19937 rng(1);
    for (int t = 0; t < 1000; ++t) {
      Token x(kElu, rng);
      DurableStore::Group g;
      g.AddStep(*a, x.in(), 1);
      const absl::Status s = d->store->Commit(std::move(g));
      if (absl::IsResourceExhausted(s)) return t >= 10 ? 100 : 12;
      if (!s.ok()) return 13;
      // The test's record of what was acknowledged: the step count.
      testing::WriteFile(tmp.Path("acknowledged"), std::to_string(t + 1));
    }
    return 14;
  });
  ASSERT_EQ(code, 100) << "the commit did not fail as a full disk";
  const uint64_t acknowledged =
      std::stoull(testing::ReadFile(tmp.Path("acknowledged")));
  auto d = Durable::Open(dir);
  ASSERT_TRUE(d.ok()) << d.status();
  // The steps were recorded, not run (the child never stepped): replay runs
  // exactly the acknowledged ones.
  EXPECT_EQ(d->table->FindAttention("a").value()->position(), acknowledged);
}

// One server per state dir: a second store on a directory in use is refused,
// naming the holder and the flag, and the directory is free again once the
// first store closes. (A crash frees it too, the lock going with the
// process: tests/integration/durable_sessions_test.cc.)
TEST(DurableStore, ADirectoryInUseIsRefusedUntilItsStoreCloses) {
  testing::TempDir tmp;
  auto first = DurableStore::Open({.dir = tmp.Path("state")});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = DurableStore::Open({.dir = tmp.Path("state")});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("(pid ", getpid(), ")")));
  EXPECT_THAT(second.status().message(), HasSubstr("--state-dir"));
  first->reset();
  EXPECT_TRUE(DurableStore::Open({.dir = tmp.Path("state")}).ok());
}

TEST(Crc32c, MatchesTheCheckValueAndTheSoftwareLoop) {
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);  // the CRC-32C check value
  std::mt19937 rng(2);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 999}) {
    const absl::string_view part = absl::string_view(data).substr(0, n);
    EXPECT_EQ(Crc32cExtend(0, part), Crc32cSoftware(0, part)) << n;
    EXPECT_EQ(Crc32cExtend(Crc32c(part.substr(0, n / 3)), part.substr(n / 3)),
              Crc32c(part));
  }
}

}  // namespace
}  // namespace linattn
