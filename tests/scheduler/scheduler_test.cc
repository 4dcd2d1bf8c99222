#include "core/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <latch>
#include <thread>

#include "core/attention/recurrent.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

// Steps of many sessions submitted from many threads at once: each session's
// outputs equal stepping it alone, in order, bit for bit, and sessions are
// batched together.
TEST(Scheduler, ConcurrentStepsKeepPerSessionOrderAndBatch) {
  auto manager = *SessionManager::Create({});
  Scheduler scheduler;
  const AttentionSpec spec{
      .num_heads = 4, .key_dim = 8, .value_dim = 8, .epsilon = 0.0f};
  constexpr int kSessions = 16, kTokens = 40;
  std::vector<std::shared_ptr<Session>> sessions;
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
  std::promise<absl::Status> gate_done;
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
      std::vector<std::future<absl::Status>> done;
      for (uint64_t t = 0; t < kTokens; ++t) {
        auto promise = std::make_shared<std::promise<absl::Status>>();
        done.push_back(promise->get_future());
        const uint64_t qk = t * 32;
        scheduler.Step(sessions[s],
                       {data[s].q.data() + qk, data[s].k.data() + qk,
                        data[s].v.data() + qk, 1},
                       got[s].view(t, 4, 8), [promise](absl::Status st) {
                         promise->set_value(std::move(st));
                       });
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
  std::vector<std::future<absl::Status>> done;
  auto track = [&done] {
    auto promise = std::make_shared<std::promise<absl::Status>>();
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
  auto step = [&](std::shared_ptr<Session> s, int i) {
    return Scheduler::GroupStep{
        std::move(s), {in, in, in, 1}, {y[i], &d[i], &av[i]}};
  };
  struct Case {
    std::vector<Scheduler::GroupStep> group;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({{}, "steps: at least one step"});
  cases.push_back({{step(a, 0), step(a, 1)}, "steps[1]: the same session"});
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
  std::promise<absl::Status> p1, p2;
  scheduler.Prefill(good, {ok_in, ok_in, ok_in, 1}, {y1, &d1, &a1},
                    [&](absl::Status s) { p1.set_value(s); });
  scheduler.Prefill(bad, {ok_in, nan_in, ok_in, 1}, {y2, &d2, &a2},
                    [&](absl::Status s) { p2.set_value(s); });
  EXPECT_TRUE(p1.get_future().get().ok());
  const absl::Status s = p2.get_future().get();
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

}  // namespace
}  // namespace linattn
