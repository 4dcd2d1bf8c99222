// Engine: both kinds of session behind its two APIs, without a process or a
// transport — answers against the kernels run directly, durability inside
// (a new engine on the same directory holds, bit for bit, what the last one
// held), failures that change nothing, and what the operator hears.
#include "core/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <random>

#include "core/attention/recurrent.h"
#include "core/session/snapshot.h"
#include "tests/scheduler/builtin_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

AttentionSpec SmallSpec() {
  AttentionSpec spec;
  spec.num_heads = 2;
  spec.key_dim = 4;
  spec.value_dim = 3;
  return spec;
}

// `tokens` tokens of q, k, v for `spec`, and room for their outputs.
struct Tokens {
  std::vector<float> q, k, v, y, den;
  std::vector<uint8_t> available;
  uint64_t tokens;
  Tokens(const AttentionSpec& spec, uint64_t n, uint32_t seed) : tokens(n) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (uint64_t i = 0; i < n * spec.num_heads * spec.key_dim; ++i) {
      q.push_back(u(rng));
      k.push_back(u(rng));
    }
    for (uint64_t i = 0; i < n * spec.num_heads * spec.value_dim; ++i) {
      v.push_back(u(rng));
    }
    y.resize(n * spec.num_heads * spec.value_dim);
    den.resize(n * spec.num_heads);
    available.resize(n * spec.num_heads);
  }
  SequenceInput in() const { return {q.data(), k.data(), v.data(), tokens}; }
  SequenceOutput out() { return {y.data(), den.data(), available.data()}; }
};

// A compute call's status, waited for. It crosses threads as its code and
// message: Debian's Abseil is not built for ThreadSanitizer, which would
// take a status's shared payload, freed on the other thread, for a race.
absl::Status Wait(const std::function<void(AttentionSessions::Done)>& call) {
  std::promise<std::pair<absl::StatusCode, std::string>> done;
  call([&done](absl::Status s) {
    done.set_value({s.code(), std::string(s.message())});
  });
  const auto [code, message] = done.get_future().get();
  return absl::Status(code, message);
}

std::string SnapshotOf(AttentionSessions& sessions, const std::string& id) {
  auto found = sessions.Find(id, Tenant());
  EXPECT_TRUE(found.ok()) << found.status();
  std::promise<absl::StatusOr<std::string>> blob;
  sessions.Snapshot(*found, [&blob](absl::StatusOr<std::string> b) {
    blob.set_value(std::move(b));
  });
  absl::StatusOr<std::string> got = blob.get_future().get();
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : "";
}

// What the operator hears, counted.
class Heard final : public EngineEvents {
 public:
  void SchedulerRound(size_t, double) override { rounds++; }
  void Evicted(size_t attention, size_t model,
               std::chrono::milliseconds) override {
    evicted_attention += attention;
    evicted_model += model;
  }
  void DrainSnapshots(size_t written, size_t, double,
                      const absl::Status& status) override {
    drain_written = written;
    drain_ok = status.ok();
  }
  std::atomic<uint64_t> rounds{0}, evicted_attention{0}, evicted_model{0};
  std::atomic<size_t> drain_written{0};
  std::atomic<bool> drain_ok{false};
};

TEST(Engine, AttentionSessionsGiveTheKernelsAnswers) {
  auto engine = Engine::Create({});
  ASSERT_TRUE(engine.ok()) << engine.status();
  AttentionSessions& sessions = (*engine)->attention();
  const AttentionSpec spec = SmallSpec();
  auto info = sessions.Create(spec, std::nullopt, "a", Tenant());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id, "a");
  EXPECT_EQ(info->spec.epsilon, 1e-6f);  // the table's default

  // The same tokens through the engine and through the kernels directly.
  auto attention = Attention::Create(info->spec).value();
  AttentionState local = attention.NewState();
  Tokens prompt(spec, 5, 1), expected_prompt(spec, 5, 1);
  auto session = sessions.Find("a", Tenant()).value();
  ASSERT_TRUE(Wait([&](AttentionSessions::Done done) {
                sessions.Prefill(session, prompt.in(), prompt.out(),
                                 std::move(done));
              }).ok());
  ASSERT_TRUE(StepSequence(attention, local, expected_prompt.in(),
                           expected_prompt.out())
                  .ok());
  // Chunkwise against the recurrence: fp32 rounding of sums of 5 terms.
  for (size_t i = 0; i < prompt.y.size(); ++i) {
    EXPECT_NEAR(prompt.y[i], expected_prompt.y[i], 1e-5) << i;
  }
  Tokens step(spec, 1, 2), expected_step(spec, 1, 2);
  ASSERT_TRUE(Wait([&](AttentionSessions::Done done) {
                sessions.Step(session, step.in(), step.out(), std::move(done),
                              {}, /*expected_position=*/5);
              }).ok());
  ASSERT_TRUE(
      Step(attention, local, expected_step.in(), expected_step.out()).ok());
  for (size_t i = 0; i < step.y.size(); ++i) {
    EXPECT_NEAR(step.y[i], expected_step.y[i], 1e-5) << i;
  }
  EXPECT_EQ(sessions.Get("a", Tenant())->position, 6u);

  // A step at the wrong position changes nothing.
  const std::string before = SnapshotOf(sessions, "a");
  const absl::Status refused = Wait([&](AttentionSessions::Done done) {
    sessions.Step(session, step.in(), step.out(), std::move(done), {}, 2);
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("expected_position"));
  EXPECT_EQ(SnapshotOf(sessions, "a"), before);

  // Fork and Restore give sessions with the same bytes.
  std::promise<absl::StatusOr<SessionInfo>> forked;
  sessions.Fork(session, "b", Tenant(),
                [&forked](absl::StatusOr<SessionInfo> child) {
                  forked.set_value(std::move(child));
                });
  ASSERT_TRUE(forked.get_future().get().ok());
  EXPECT_EQ(SnapshotOf(sessions, "b"), before);
  ASSERT_TRUE(sessions.Restore(before, "c", Tenant()).ok());
  EXPECT_EQ(SnapshotOf(sessions, "c"), before);
  EXPECT_EQ(sessions.List(Tenant()).size(), 3u);

  // Another tenant sees none of them.
  EXPECT_TRUE(sessions.List(Tenant::Named("other")).empty());
  EXPECT_EQ(sessions.Get("a", Tenant::Named("other")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions.Delete("a", Tenant::Named("other")).code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(sessions.Delete("b", Tenant()).ok());
  EXPECT_EQ(sessions.Get("b", Tenant()).status().code(),
            absl::StatusCode::kNotFound);
  const Engine::Readings readings = (*engine)->Read();
  EXPECT_EQ(readings.attention_sessions, 2u);
  EXPECT_EQ(readings.attention.steps, 1u);
  EXPECT_EQ(readings.attention.prefill_tokens, 5u);
  EXPECT_FALSE(readings.durable);
}

TEST(Engine, ADirectoryBringsBackEverySessionBitForBit) {
  testing::TempDir dir;
  const AttentionSpec spec = SmallSpec();
  std::map<std::string, std::string> attention;
  std::string model_snapshot;
  Heard heard;
  {
    EngineOptions options;
    options.durable.dir = dir.Path("state");
    options.models = {testing::Builtin()};
    options.events = &heard;
    auto engine = Engine::Create(std::move(options));
    ASSERT_TRUE(engine.ok()) << engine.status();
    AttentionSessions& sessions = (*engine)->attention();
    for (const std::string id : {"x", "y"}) {
      ASSERT_TRUE(sessions.Create(spec, std::nullopt, id, Tenant()).ok());
      auto session = sessions.Find(id, Tenant()).value();
      Tokens t(spec, id == "x" ? 3 : 1, id[0]);
      ASSERT_TRUE(Wait([&](AttentionSessions::Done done) {
                    if (id == "x") {
                      sessions.Prefill(session, t.in(), t.out(),
                                       std::move(done));
                    } else {
                      sessions.Step(session, t.in(), t.out(), std::move(done));
                    }
                  }).ok());
      attention[id] = SnapshotOf(sessions, id);
    }
    GenerationEngine& generation = (*engine)->generation();
    ASSERT_TRUE(generation.CreateSession("", "m", Tenant()).ok());
    std::promise<absl::StatusOr<ModelSessionInfo>> appended;
    generation.Append("m", {104, 105, 33},
                      [&appended](absl::StatusOr<ModelSessionInfo> info) {
                        appended.set_value(std::move(info));
                      });
    ASSERT_TRUE(appended.get_future().get().ok());
    std::promise<absl::StatusOr<std::string>> blob;
    generation.Snapshot("m", [&blob](absl::StatusOr<std::string> b) {
      blob.set_value(std::move(b));
    });
    model_snapshot = blob.get_future().get().value();
    EXPECT_TRUE((*engine)->Read().durable);
  }
  // The drain wrote every session's snapshot.
  EXPECT_EQ(heard.drain_written.load(), 3u);
  EXPECT_TRUE(heard.drain_ok.load());
  EXPECT_GT(heard.rounds.load(), 0u);

  EngineOptions options;
  options.durable.dir = dir.Path("state");
  options.models = {testing::Builtin()};
  auto engine = Engine::Create(std::move(options));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->recovery().attention_sessions, 2u);
  EXPECT_EQ((*engine)->recovery().model_sessions, 1u);
  for (const auto& [id, bytes] : attention) {
    EXPECT_EQ(SnapshotOf((*engine)->attention(), id), bytes) << id;
  }
  std::promise<absl::StatusOr<std::string>> blob;
  (*engine)->generation().Snapshot("m", [&blob](absl::StatusOr<std::string> b) {
    blob.set_value(std::move(b));
  });
  EXPECT_EQ(blob.get_future().get().value(), model_snapshot);
}

TEST(Engine, ADirectoryInUseIsRefusedWithItsHolder) {
  testing::TempDir dir;
  EngineOptions options;
  options.durable.dir = dir.Path("state");
  auto first = Engine::Create(options);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Engine::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Engine, IdleSessionsAreEvictedAndTheOperatorHears) {
  Heard heard;
  EngineOptions options;
  options.idle_ttl = std::chrono::milliseconds(20);
  options.models = {testing::Builtin()};
  options.events = &heard;
  auto engine = Engine::Create(std::move(options));
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)
                  ->attention()
                  .Create(SmallSpec(), std::nullopt, "idle", Tenant())
                  .ok());
  ASSERT_TRUE((*engine)->generation().CreateSession("", "m", Tenant()).ok());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (
      (heard.evicted_attention.load() < 1 || heard.evicted_model.load() < 1) &&
      std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(heard.evicted_attention.load(), 1u);
  EXPECT_EQ(heard.evicted_model.load(), 1u);
  EXPECT_EQ((*engine)->attention().Get("idle", Tenant()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Engine, ADrainedEngineRefusesNewCompute) {
  auto engine = Engine::Create({});
  ASSERT_TRUE(engine.ok());
  AttentionSessions& sessions = (*engine)->attention();
  ASSERT_TRUE(sessions.Create(SmallSpec(), std::nullopt, "a", Tenant()).ok());
  (*engine)->Drain();
  (*engine)->Drain();  // idempotent
  Tokens t(SmallSpec(), 1, 3);
  const absl::Status s = Wait([&](AttentionSessions::Done done) {
    sessions.Step(sessions.Find("a", Tenant()).value(), t.in(), t.out(),
                  std::move(done));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sessions.Get("a", Tenant())->position, 0u);
}

}  // namespace
}  // namespace linattn
