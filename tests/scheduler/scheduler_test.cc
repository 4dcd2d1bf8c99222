#include "core/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
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
      for (auto& f : done) EXPECT_TRUE(f.get().ok());
    });
  }
  for (std::thread& t : threads) t.join();
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
      << "no two sessions were ever batched";
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
