#include "core/scheduler/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <latch>
#include <mutex>
#include <thread>

#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/session/snapshot.h"
#include "tests/attention/test_util.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

// A status as plain data, for results that cross from the compute worker to
// the test thread: an absl::Status shares a reference-counted payload, and
// Debian's Abseil is not built for ThreadSanitizer, which then cannot see
// the ordering of the count (a payload freed on the worker after the test
// read it looks like a race). Converted on the worker, in set_value.
class Plain {
 public:
  Plain() = default;
  Plain(const absl::Status& s)  // NOLINT: converts where the status is made
      : code_(s.code()), message_(s.message()) {}
  bool ok() const { return code_ == absl::StatusCode::kOk; }
  absl::StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  absl::StatusCode code_ = absl::StatusCode::kUnknown;
  std::string message_;
};

// Steps of many sessions submitted from many threads at once: each session's
// outputs equal stepping it alone, in order, bit for bit, and sessions are
// batched together.
// `stats` (optional) receives the scheduler's stats after the run.
void ExpectConcurrentStepsKeepOrderAndBatch(
    SchedulerOptions options, const AttentionSpec& spec,
    SchedulerStats* stats_out = nullptr) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler(std::move(options));
  constexpr int kSessions = 16, kTokens = 40;
  const uint64_t row = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t out_row = uint64_t{spec.num_heads} * spec.value_dim;
  std::vector<std::shared_ptr<AttentionSession>> sessions;
  std::vector<testing::Tokens> data;
  for (int s = 0; s < kSessions; ++s) {
    sessions.push_back(*manager->CreateSession(spec, 0.0f, ""));
    data.push_back(testing::RandomTokens(spec, kTokens, s));
  }
  std::vector<testing::Outputs> got(kSessions, testing::Outputs(spec, kTokens));
  // The worker is held (a request on another session that waits) until
  // every thread has queued all its steps, so that batching does not depend
  // on how threads happen to be scheduled: the first round after the
  // release finds a step of every session.
  auto gate = *manager->CreateSession(spec, 0.0f, "gate");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<Plain> gate_done;
  scheduler.Run(
      gate,
      [released](Session&) {
        released.wait();
        return absl::OkStatus();
      },
      [&gate_done](absl::Status st) { gate_done.set_value(std::move(st)); });
  std::latch queued(kSessions);
  std::vector<std::thread> threads;
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      // Submit every token without waiting: the scheduler must keep order.
      std::vector<std::future<Plain>> done;
      for (uint64_t t = 0; t < kTokens; ++t) {
        auto promise = std::make_shared<std::promise<Plain>>();
        done.push_back(promise->get_future());
        const uint64_t qk = t * row;
        scheduler.Step(
            sessions[s],
            {data[s].q.data() + qk, data[s].k.data() + qk,
             data[s].v.data() + t * out_row, 1},
            got[s].view(t, spec.num_heads, spec.value_dim),
            [promise](absl::Status st) { promise->set_value(std::move(st)); });
      }
      queued.count_down();
      for (auto& f : done) EXPECT_TRUE(f.get().ok());
    });
  }
  queued.wait();
  release.set_value();
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(gate_done.get_future().get().ok());
  Attention attention = *Attention::Create(spec);
  for (int s = 0; s < kSessions; ++s) {
    AttentionState state = attention.NewState();
    testing::Outputs alone(spec, kTokens);
    ASSERT_TRUE(
        StepSequence(attention, state, data[s].input(), alone.view()).ok());
    EXPECT_EQ(0, std::memcmp(alone.output.data(), got[s].output.data(),
                             alone.output.size() * sizeof(float)))
        << "session " << s;
    EXPECT_EQ(sessions[s]->position(), uint64_t(kTokens));
  }
  const SchedulerStats stats = scheduler.stats();
  EXPECT_EQ(stats.steps, uint64_t(kSessions * kTokens));
  EXPECT_GT(stats.largest_step_batch, 1u)
      << "no two sessions were ever batched, although all were queued";
  if (stats_out != nullptr) *stats_out = stats;
}

TEST(Scheduler, ConcurrentStepsKeepPerSessionOrderAndBatch) {
  ExpectConcurrentStepsKeepOrderAndBatch(
      {}, {.num_heads = 4, .key_dim = 8, .value_dim = 8, .epsilon = 0.0f});
}

// Batches large enough for StepBatch to spread heads over threads, run by
// the whole team (no single-thread limit) and by the compute worker alone
// (the default limit): both give each session what it gets alone, and
// every batch took the path its limit names.
TEST(Scheduler, LargeStepBatchesAreExactOnOneThreadAndOnTheTeam) {
  const AttentionSpec spec{
      .num_heads = 8, .key_dim = 64, .value_dim = 64, .epsilon = 0.0f};
  SchedulerStats team, alone;
  ExpectConcurrentStepsKeepOrderAndBatch({.single_thread_step_bytes = 0}, spec,
                                         &team);
  EXPECT_EQ(team.single_thread_step_batches, 0u);
  ExpectConcurrentStepsKeepOrderAndBatch({}, spec, &alone);
  EXPECT_EQ(alone.single_thread_step_batches, alone.step_batches);
}

// Step groups and single steps of the same sessions, all queued while the
// worker is held: a group deferred behind session A's earlier step must also
// hold back B's later step, so every session still sees its tokens in
// submission order (outputs equal stepping each session alone).
TEST(Scheduler, StepGroupsKeepEachSessionsOrder) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler;
  const AttentionSpec spec{
      .num_heads = 2, .key_dim = 4, .value_dim = 4, .epsilon = 0.0f};
  constexpr uint64_t kTokens = 4;
  auto a = *manager->CreateSession(spec, 0.0f, "a");
  auto b = *manager->CreateSession(spec, 0.0f, "b");
  auto gate = *manager->CreateSession(spec, 0.0f, "gate");
  const testing::Tokens da = testing::RandomTokens(spec, kTokens, 1);
  const testing::Tokens db = testing::RandomTokens(spec, kTokens, 2);
  testing::Outputs ga(spec, kTokens), gb(spec, kTokens);
  auto in = [](const testing::Tokens& d, uint64_t t) {
    return SequenceInput{d.q.data() + t * 8, d.k.data() + t * 8,
                         d.v.data() + t * 8, 1};
  };
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<std::future<Plain>> done;
  auto track = [&done] {
    auto promise = std::make_shared<std::promise<Plain>>();
    done.push_back(promise->get_future());
    return [promise](absl::Status st) { promise->set_value(std::move(st)); };
  };
  scheduler.Run(
      gate,
      [released](Session&) {
        released.wait();
        return absl::OkStatus();
      },
      track());
  // Queue: A0 | {A1, B0} | B1 | {B2, A2} | A3 | B3.
  scheduler.Step(a, in(da, 0), ga.view(0, 2, 4), track());
  scheduler.StepGroup(
      {{a, in(da, 1), ga.view(1, 2, 4)}, {b, in(db, 0), gb.view(0, 2, 4)}},
      track());
  scheduler.Step(b, in(db, 1), gb.view(1, 2, 4), track());
  scheduler.StepGroup(
      {{b, in(db, 2), gb.view(2, 2, 4)}, {a, in(da, 2), ga.view(2, 2, 4)}},
      track());
  scheduler.Step(a, in(da, 3), ga.view(3, 2, 4), track());
  scheduler.Step(b, in(db, 3), gb.view(3, 2, 4), track());
  release.set_value();
  for (auto& f : done) EXPECT_TRUE(f.get().ok());

  Attention attention = *Attention::Create(spec);
  for (const auto& [data, got] : {std::pair{&da, &ga}, std::pair{&db, &gb}}) {
    AttentionState state = attention.NewState();
    testing::Outputs alone(spec, kTokens);
    ASSERT_TRUE(
        StepSequence(attention, state, data->input(), alone.view()).ok());
    EXPECT_EQ(0, std::memcmp(alone.output.data(), got->output.data(),
                             alone.output.size() * sizeof(float)));
  }
  EXPECT_EQ(a->position(), kTokens);
  EXPECT_EQ(b->position(), kTokens);
  EXPECT_EQ(scheduler.stats().steps, 2 * kTokens);
}

// Groups that could not run as one batch are refused before they queue, so
// they cannot fail other clients' steps in the same round.
TEST(Scheduler, MalformedStepGroupsAreRefusedAlone) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler;
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  auto a = *manager->CreateSession(spec, std::nullopt, "a");
  const float in[2] = {0.5f, 0.25f};
  float y[2][2], d[2];
  uint8_t av[2];
  auto step = [&](std::shared_ptr<AttentionSession> s, int i) {
    return Scheduler::GroupStep{
        std::move(s), {in, in, in, 1}, {y[i], &d[i], &av[i]}};
  };
  struct Case {
    std::vector<Scheduler::GroupStep> group;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({{}, "steps: at least one step"});
  cases.push_back({{step(a, 0), step(a, 1)},
                   "steps[1].session_id: 'a' already has a step"});
  cases.push_back({{step(a, 0), step(nullptr, 1)}, "steps[1]: no session"});
  for (Case& c : cases) {
    absl::Status result;
    scheduler.StepGroup(std::move(c.group),
                        [&](absl::Status s) { result = std::move(s); });
    EXPECT_EQ(result.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(result.message().find(c.message), std::string::npos)
        << result.message();
  }
  EXPECT_EQ(a->position(), 0u);
  EXPECT_EQ(scheduler.stats().steps, 0u);
}

TEST(Scheduler, ABadRequestFailsAloneAndChangesNothing) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler;
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  auto good = *manager->CreateSession(spec, std::nullopt, "good");
  auto bad = *manager->CreateSession(spec, std::nullopt, "bad");
  const float ok_in[2] = {0.5f, 0.25f}, nan_in[2] = {NAN, 1.0f};
  float y1[2], y2[2], d1, d2;
  uint8_t a1, a2;
  std::promise<Plain> p1, p2;
  scheduler.Prefill(good, {ok_in, ok_in, ok_in, 1}, {y1, &d1, &a1},
                    [&](absl::Status s) { p1.set_value(s); });
  scheduler.Prefill(bad, {ok_in, nan_in, ok_in, 1}, {y2, &d2, &a2},
                    [&](absl::Status s) { p2.set_value(s); });
  EXPECT_TRUE(p1.get_future().get().ok());
  const Plain s = p2.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(good->position(), 1u);
  EXPECT_EQ(bad->position(), 0u);
}

TEST(Scheduler, RefusesWorkAfterShutdown) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler;
  auto session = *manager->CreateSession({}, std::nullopt, "");
  scheduler.Shutdown();
  absl::Status result;
  scheduler.Run(
      session, [](Session&) { return absl::OkStatus(); },
      [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable);
}

// Holds the scheduler's worker inside a Run on a session of its own until
// Release(), so that requests submitted meanwhile share the next rounds.
class WorkerHold {
 public:
  WorkerHold(SessionManager& manager, Scheduler& scheduler) {
    auto gate = *manager.CreateSession({}, std::nullopt, "");
    std::shared_future<void> released = release_.get_future().share();
    auto holding = std::make_shared<std::promise<void>>();
    std::future<void> held = holding->get_future();
    scheduler.Run(
        gate,
        [released, holding](Session&) {
          holding->set_value();
          released.wait();
          return absl::OkStatus();
        },
        [](absl::Status) {});
    held.wait();
  }
  ~WorkerHold() { Release(); }
  void Release() {
    if (!done_) release_.set_value();
    done_ = true;
  }

 private:
  std::promise<void> release_;
  bool done_ = false;
};

// One round with a step group whose second step is refused, a single step
// and a step at the wrong position: each request is checked once, before
// anything is recorded; the group fails whole naming its step, and only the
// good step is in the journal (a new table from the directory holds it and
// nothing else).
TEST(Scheduler, OnlyStepsThatPassTheirChecksAreRecordedAndRun) {
  testing::TempDir dir;
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  const float ok_in[2] = {0.5f, 0.25f}, nan_in[2] = {NAN, 1.0f};
  float y[4][2], d[4];
  uint8_t av[4];
  std::string good_state;
  {
    auto store = DurableStore::Open({.dir = dir.Path("state")}).value();
    auto manager = *SessionManager::Create({.observer = store.get()});
    ASSERT_TRUE(store->Recover(*manager, {}).ok());
    Scheduler scheduler({.store = store.get()});
    auto a = *manager->CreateSession(spec, std::nullopt, "a");
    auto b = *manager->CreateSession(spec, std::nullopt, "b");
    auto c = *manager->CreateSession(spec, std::nullopt, "c");
    auto e = *manager->CreateSession(spec, std::nullopt, "e");
    std::promise<Plain> group, single, wrong;
    {
      WorkerHold hold(*manager, scheduler);
      std::vector<Scheduler::GroupStep> steps;
      steps.push_back({a, {ok_in, ok_in, ok_in, 1}, {y[0], &d[0], &av[0]}});
      steps.push_back({b, {ok_in, nan_in, ok_in, 1}, {y[1], &d[1], &av[1]}});
      scheduler.StepGroup(std::move(steps),
                          [&](absl::Status s) { group.set_value(s); });
      scheduler.Step(c, {ok_in, ok_in, ok_in, 1}, {y[2], &d[2], &av[2]},
                     [&](absl::Status s) { single.set_value(s); });
      scheduler.Step(
          e, {ok_in, ok_in, ok_in, 1}, {y[3], &d[3], &av[3]},
          [&](absl::Status s) { wrong.set_value(s); }, {},
          /*expected_position=*/3);
    }
    const Plain g = group.get_future().get();
    EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(g.message(), ::testing::HasSubstr("steps[1].k[0]"));
    EXPECT_TRUE(single.get_future().get().ok());
    EXPECT_EQ(wrong.get_future().get().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(a->position(), 0u);
    EXPECT_EQ(b->position(), 0u);
    EXPECT_EQ(c->position(), 1u);
    EXPECT_EQ(e->position(), 0u);
    const SchedulerStats stats = scheduler.stats();
    EXPECT_EQ(stats.steps, 1u);
    good_state = SerializeSnapshot(c->spec(), c->state());
  }
  auto store = DurableStore::Open({.dir = dir.Path("state")}).value();
  auto manager = *SessionManager::Create({.observer = store.get()});
  auto report = store->Recover(*manager, {});
  ASSERT_TRUE(report.ok()) << report.status();
  // Five creates (the hold's session too) and one step.
  EXPECT_EQ(report->records, 6u);
  for (const char* id : {"a", "b", "e"}) {
    EXPECT_EQ(manager->FindAttention(id).value()->position(), 0u) << id;
  }
  auto c = manager->FindAttention("c").value();
  EXPECT_EQ(SerializeSnapshot(c->spec(), c->state()), good_state);
}

// A long prefill runs a slice of the round budget per round on a working
// copy: a step of another session queued behind it is answered first, and
// the prefill's outputs still match the double reference.
TEST(Scheduler, LongPrefillsRunInSlicesWithOtherSessionsBetween) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler({.prefill_tokens_per_round = 48});
  const AttentionSpec spec{.num_heads = 2, .key_dim = 4, .value_dim = 4};
  auto a = *manager->CreateSession(spec, std::nullopt, "a");
  auto b = *manager->CreateSession(spec, std::nullopt, "b");
  const testing::Tokens data = testing::RandomTokens(spec, 1000, 3);
  const testing::Tokens one = testing::RandomTokens(spec, 1, 4);
  testing::Outputs out(spec, 1000), out_b(spec, 1);
  std::mutex mu;
  std::vector<std::string> order;
  std::promise<Plain> prefilled, stepped;
  {
    WorkerHold hold(*manager, scheduler);
    scheduler.Prefill(a, data.input(), out.view(), [&](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back("prefill");
      prefilled.set_value(s);
    });
    scheduler.Step(b, one.input(), out_b.view(), [&](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back("step");
      stepped.set_value(s);
    });
  }
  ASSERT_TRUE(prefilled.get_future().get().ok());
  ASSERT_TRUE(stepped.get_future().get().ok());
  EXPECT_EQ(order, (std::vector<std::string>{"step", "prefill"}));
  EXPECT_EQ(a->position(), 1000u);
  EXPECT_GE(scheduler.stats().rounds, 1000u / 48);
  EXPECT_EQ(scheduler.stats().prefill_tokens, 1000u);
  const ReferenceResult ref = ReferenceAttention(a->attention(), data.input());
  testing::ExpectMatchesReference(a->attention(), ref, out, "sliced prefill");
  EXPECT_EQ(manager->budget().in_use(), manager->state_bytes_in_use())
      << "the working copy was given back";
}

// A prefill's values are checked once, by the chunkwise gather: a NaN in a
// later slice fails that prefill alone, named by its index in the whole
// request, while a good prefill sharing its rounds completes exactly.
TEST(Scheduler, ANonFiniteValueInALaterSliceFailsThatPrefillAlone) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler({.prefill_tokens_per_round = 32});
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  auto good = *manager->CreateSession(spec, std::nullopt, "good");
  auto bad = *manager->CreateSession(spec, std::nullopt, "bad");
  const testing::Tokens data = testing::RandomTokens(spec, 100, 5);
  testing::Tokens poisoned = testing::RandomTokens(spec, 100, 6);
  poisoned.k[70 * 4 + 1] = NAN;  // token 70: the third slice of 16
  testing::Outputs out_good(spec, 100), out_bad(spec, 100);
  std::promise<Plain> good_done, bad_done;
  {
    WorkerHold hold(*manager, scheduler);
    scheduler.Prefill(bad, poisoned.input(), out_bad.view(),
                      [&](absl::Status s) { bad_done.set_value(s); });
    scheduler.Prefill(good, data.input(), out_good.view(),
                      [&](absl::Status s) { good_done.set_value(s); });
  }
  const Plain refused = bad_done.get_future().get();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::StartsWith("k[281]"));
  EXPECT_EQ(bad->position(), 0u);
  ASSERT_TRUE(good_done.get_future().get().ok());
  EXPECT_EQ(good->position(), 100u);
  const ReferenceResult ref =
      ReferenceAttention(good->attention(), data.input());
  testing::ExpectMatchesReference(good->attention(), ref, out_good,
                                  "prefill beside a refused one");
  EXPECT_EQ(manager->budget().in_use(), manager->state_bytes_in_use());
}

// A scheduler destroyed with a long prefill between its slices finishes it
// first: every request queued is answered.
TEST(Scheduler, DestructionRunsAPrefillBetweenItsSlicesToTheEnd) {
  auto manager = *SessionManager::Create({});
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  auto a = *manager->CreateSession(spec, std::nullopt, "a");
  const testing::Tokens data = testing::RandomTokens(spec, 1000, 8);
  testing::Outputs out(spec, 1000);
  std::promise<Plain> done;
  {
    Scheduler scheduler({.prefill_tokens_per_round = 16});
    scheduler.Prefill(a, data.input(), out.view(),
                      [&](absl::Status s) { done.set_value(s); });
  }
  auto answered = done.get_future();
  ASSERT_EQ(answered.wait_for(std::chrono::seconds(0)),
            std::future_status::ready);
  EXPECT_TRUE(answered.get().ok());
  EXPECT_EQ(a->position(), 1000u);
  EXPECT_EQ(a->pending_count(), 0);
}

// A request whose caller has gone before it commits is dropped: an expired
// deadline fails steps, prefills and state work before they run, and a
// prefill cancelled between its slices leaves its session as it was.
TEST(Scheduler, WorkWhoseCallerHasGoneIsNotApplied) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler({.prefill_tokens_per_round = 32});
  const AttentionSpec spec{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  auto a = *manager->CreateSession(spec, std::nullopt, "a");
  auto b = *manager->CreateSession(spec, std::nullopt, "b");
  const testing::Tokens data = testing::RandomTokens(spec, 600, 5);
  testing::Outputs out(spec, 600);
  const CallLiveness expired(
      CallLiveness::Clock::now() - std::chrono::seconds(1), nullptr);
  std::promise<Plain> step, prefill, work;
  bool ran = false;
  scheduler.Step(
      a, {data.q.data(), data.k.data(), data.v.data(), 1}, out.view(),
      [&](absl::Status s) { step.set_value(s); }, expired);
  scheduler.Prefill(
      a, data.input(), out.view(),
      [&](absl::Status s) { prefill.set_value(s); }, expired);
  scheduler.Run(
      a,
      [&](Session&) {
        ran = true;
        return absl::OkStatus();
      },
      [&](absl::Status s) { work.set_value(s); }, expired);
  EXPECT_EQ(step.get_future().get().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(prefill.get_future().get().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(work.get_future().get().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(ran);
  EXPECT_EQ(a->position(), 0u);

  // Cancelled after its first slice (the step of b, in the same round,
  // cancels it from its completion): the prefill is dropped.
  std::atomic<bool> gone{false};
  std::promise<Plain> cancelled, b_step;
  {
    WorkerHold hold(*manager, scheduler);
    scheduler.Prefill(
        a, data.input(), out.view(),
        [&](absl::Status s) { cancelled.set_value(s); },
        CallLiveness(CallLiveness::Clock::time_point::max(),
                     [&] { return gone.load(); }));
    scheduler.Step(b, {data.q.data(), data.k.data(), data.v.data(), 1},
                   out.view(), [&](absl::Status s) {
                     gone = true;
                     b_step.set_value(s);
                   });
  }
  EXPECT_TRUE(b_step.get_future().get().ok());
  EXPECT_EQ(cancelled.get_future().get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a->position(), 0u);
  std::promise<Plain> inspected;
  scheduler.Run(
      a,
      [](AttentionSession& s) {
        for (uint64_t i = 0; i < s.state().size(); ++i) {
          if (s.state().data()[i] != 0.0f) {
            return absl::InternalError("the state changed");
          }
        }
        return absl::OkStatus();
      },
      [&](absl::Status s) { inspected.set_value(s); });
  EXPECT_TRUE(inspected.get_future().get().ok());
  EXPECT_EQ(manager->budget().in_use(), manager->state_bytes_in_use());
}

// A prefill's working copy comes from the memory budget: with no room for
// one, and none under way to give memory back, it fails naming the limit
// and changes nothing; with room for one, two prefills take turns.
TEST(Scheduler, PrefillWorkingCopiesComeFromTheMemoryBudget) {
  const AttentionSpec spec{.num_heads = 1, .key_dim = 8, .value_dim = 8};
  const uint64_t state = StateBytes(spec);
  const testing::Tokens data = testing::RandomTokens(spec, 200, 6);
  testing::Outputs out_a(spec, 200), out_b(spec, 200);
  {
    auto budget = std::make_shared<MemoryBudget>(state);
    auto manager = *SessionManager::Create({.budget = budget});
    Scheduler scheduler({.budget = budget});
    auto a = *manager->CreateSession(spec, std::nullopt, "a");
    std::promise<Plain> done;
    scheduler.Prefill(a, data.input(), out_a.view(),
                      [&](absl::Status s) { done.set_value(s); });
    const Plain s = done.get_future().get();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("working copy"));
    EXPECT_EQ(a->position(), 0u);
  }
  // Room for the two sessions, one working copy and the holding session.
  const uint64_t gate = StateBytes(AttentionSpec{});
  auto budget = std::make_shared<MemoryBudget>(3 * state + gate);
  auto manager = *SessionManager::Create({.budget = budget});
  Scheduler scheduler({.prefill_tokens_per_round = 16, .budget = budget});
  auto a = *manager->CreateSession(spec, std::nullopt, "a");
  auto b = *manager->CreateSession(spec, std::nullopt, "b");
  std::promise<Plain> done_a, done_b;
  {
    WorkerHold hold(*manager, scheduler);
    scheduler.Prefill(a, data.input(), out_a.view(),
                      [&](absl::Status s) { done_a.set_value(s); });
    scheduler.Prefill(b, data.input(), out_b.view(),
                      [&](absl::Status s) { done_b.set_value(s); });
  }
  EXPECT_TRUE(done_a.get_future().get().ok());
  EXPECT_TRUE(done_b.get_future().get().ok());
  EXPECT_EQ(a->position(), 200u);
  EXPECT_EQ(b->position(), 200u);
  // (In slices of different sizes: b's ran alone, after a's.)
  const ReferenceResult ref = ReferenceAttention(a->attention(), data.input());
  testing::ExpectMatchesReference(a->attention(), ref, out_a, "a");
  testing::ExpectMatchesReference(b->attention(), ref, out_b, "b");
  EXPECT_EQ(budget->in_use(), 2 * state + gate);
}

// Many short prefills at once cannot grow the chunkwise workspace past its
// cap: those beyond it wait a round, and every one still completes exactly.
TEST(Scheduler, PrefillsBeyondTheWorkspaceCapWaitARound) {
  const AttentionSpec spec{.num_heads = 4, .key_dim = 32, .value_dim = 32};
  ChunkwiseRunner probe;
  const uint64_t per_session = 4 * probe.WorkspaceBytesPerJob(32, 32);
  Scheduler scheduler({.prefill_workspace_bytes = 4 * per_session});
  auto manager = *SessionManager::Create({});
  constexpr int kSessions = 32;
  std::vector<std::shared_ptr<AttentionSession>> sessions;
  std::vector<testing::Tokens> data;
  std::vector<testing::Outputs> outs;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(*manager->CreateSession(spec, std::nullopt, ""));
    data.push_back(testing::RandomTokens(spec, 10, 100 + i));
    outs.emplace_back(spec, 10);
  }
  std::vector<std::promise<Plain>> done(kSessions);
  {
    WorkerHold hold(*manager, scheduler);
    for (int i = 0; i < kSessions; ++i) {
      scheduler.Prefill(sessions[i], data[i].input(), outs[i].view(),
                        [&done, i](absl::Status s) { done[i].set_value(s); });
    }
  }
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(done[i].get_future().get().ok()) << i;
    const ReferenceResult ref =
        ReferenceAttention(sessions[i]->attention(), data[i].input());
    testing::ExpectMatchesReference(sessions[i]->attention(), ref, outs[i],
                                    "capped prefill");
  }
  const SchedulerStats stats = scheduler.stats();
  EXPECT_LE(stats.prefill_workspace_bytes, 4 * per_session);
  EXPECT_GE(stats.prefill_batches, kSessions / 4u);
}

// Tenants share rounds: with tenant A's twelve requests queued before
// tenant B's one and rounds of four, B's runs in the first round after the
// queue forms (A gets two places, B its one), not after all of A's.
TEST(Scheduler, ATenantWithManyRequestsQueuedCannotKeepAnotherOut) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler({.max_round = 4});
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  const Tenant a = Tenant::Named("a"), b = Tenant::Named("b");
  WorkerHold hold(*manager, scheduler);
  std::mutex mu;
  std::vector<std::string> ran;  // owners, in the order their work ran
  std::atomic<int> left{13};
  std::promise<void> all_done;
  auto submit = [&](const Tenant& t) {
    auto s = *manager->CreateSession(spec, std::nullopt, "", t);
    scheduler.Run(
        s,
        [&mu, &ran, owner = t.name()](Session&) {
          std::lock_guard<std::mutex> lock(mu);
          ran.push_back(owner);
          return absl::OkStatus();
        },
        [&left, &all_done](absl::Status) {
          if (--left == 0) all_done.set_value();
        });
  };
  for (int i = 0; i < 12; ++i) submit(a);
  submit(b);
  hold.Release();
  all_done.get_future().wait();
  ASSERT_EQ(ran.size(), 13u);
  const size_t b_at = std::find(ran.begin(), ran.end(), "b") - ran.begin();
  EXPECT_LT(b_at, 3u) << "b's request ran after " << b_at << " of a's";
}

// Prefill tokens are shared among tenants first: b's one prefill gets half
// a round's tokens beside a's eight, so it finishes in three rounds of 900
// tokens, not in ten (a ninth each).
TEST(Scheduler, PrefillTokensAreSharedAmongTenantsFirst) {
  auto manager = *SessionManager::Create({});
  std::atomic<int> rounds{0};
  Scheduler scheduler(
      {.max_round = 64,
       .prefill_tokens_per_round = 900,
       .on_round = [&rounds](size_t, double) { rounds.fetch_add(1); }});
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  const testing::Tokens data = testing::RandomTokens(spec, 1000, 11);
  WorkerHold hold(*manager, scheduler);
  std::vector<testing::Outputs> outs(9, testing::Outputs(spec, 1000));
  std::vector<std::promise<int>> finished(9);  // the round each ended in
  for (int i = 0; i < 9; ++i) {
    auto s = *manager->CreateSession(spec, std::nullopt, "",
                                     Tenant::Named(i < 8 ? "a" : "b"));
    scheduler.Prefill(s, data.input(), outs[i].view(),
                      [&rounds, &finished, i](absl::Status) {
                        finished[i].set_value(rounds.load());
                      });
  }
  hold.Release();
  const int b_round = finished[8].get_future().get();
  for (int i = 0; i < 8; ++i) finished[i].get_future().wait();
  // Rounds counted before the one that finished it; the gate's came first.
  EXPECT_LE(b_round, 1 + 3) << "b's prefill took " << b_round << " rounds";
}

}  // namespace
}  // namespace linattn
