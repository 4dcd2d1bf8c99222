// The two services' shared parts: one session table for attention and model
// sessions, and one compute worker for the Scheduler and the
// GenerationEngine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "core/scheduler/generation.h"
#include "core/scheduler/scheduler.h"
#include "core/session/snapshot.h"
#include "tests/scheduler/builtin_model.h"

namespace linattn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::Builtin;

const AttentionSpec kSpec{.num_heads = 2, .key_dim = 4, .value_dim = 4};

// Plain data across threads (see generation_test.cc: Debian's Abseil is not
// built for ThreadSanitizer).
struct Outcome {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
};

Outcome Wait(std::future<Outcome> f) { return f.get(); }

Outcome AppendTokens(GenerationEngine& engine, const std::string& id,
                     std::vector<int32_t> tokens) {
  std::promise<Outcome> p;
  engine.Append(id, std::move(tokens), [&](absl::StatusOr<ModelSessionInfo> r) {
    p.set_value({r.status().code(), std::string(r.status().message())});
  });
  return Wait(p.get_future());
}

// A step of zeros: valid input for any spec.
Outcome StepZeros(Scheduler& scheduler,
                  const std::shared_ptr<AttentionSession>& session) {
  const AttentionSpec& spec = session->spec();
  std::vector<float> qk(spec.num_heads * spec.key_dim, 0.5f);
  std::vector<float> v(spec.num_heads * spec.value_dim, 1.0f);
  std::vector<float> out(spec.num_heads * spec.value_dim);
  std::vector<float> den(spec.num_heads);
  std::vector<uint8_t> avail(spec.num_heads);
  std::promise<Outcome> p;
  scheduler.Step(session, {qk.data(), qk.data(), v.data(), 1},
                 {out.data(), den.data(), avail.data()}, [&](absl::Status s) {
                   p.set_value({s.code(), std::string(s.message())});
                 });
  return Wait(p.get_future());
}

TEST(SharedTable, BothKindsShareIdsTheSessionLimitAndTheBudget) {
  const uint64_t model_bytes = Builtin()->state_bytes();
  const uint64_t attention_bytes = SessionChargeBytes(kSpec);
  auto table = *SessionManager::Create(
      {.max_sessions = 3,
       .max_state_bytes = 2 * model_bytes + attention_bytes});
  GenerationEngine engine({Builtin()}, {.sessions = table.get()});
  ASSERT_TRUE(table->CreateSession(kSpec, std::nullopt, "a").ok());
  ASSERT_TRUE(engine.CreateSession("", "m").ok());

  // One id space: either kind's id is taken for the other.
  EXPECT_EQ(engine.CreateSession("", "a").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table->CreateSession(kSpec, std::nullopt, "m").status().code(),
            absl::StatusCode::kAlreadyExists);
  // Each service finds only its kind, and says where the other lives.
  auto wrong = table->FindAttention("m");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("GenerationService"));
  auto other = engine.GetSession("a");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("AttentionService"));
  EXPECT_EQ(table->Delete("m", SessionKind::kAttention).code(),
            absl::StatusCode::kNotFound);
  ASSERT_EQ(table->List(SessionKind::kAttention).size(), 1u);
  ASSERT_EQ(engine.ListSessions().size(), 1u);
  EXPECT_EQ(table->state_bytes_in_use(), model_bytes + attention_bytes);

  // One memory budget: a second model session fits exactly; then the
  // budget is full for either kind, and a third needs a slot too.
  ASSERT_TRUE(engine.CreateSession("", "m2").ok());
  auto full = table->CreateSession(kSpec, std::nullopt, "b");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(table->Delete("a", SessionKind::kAttention).ok());
  ASSERT_TRUE(table->CreateSession(kSpec, std::nullopt, "b").ok());
  // One session limit: three sessions of two kinds are the maximum.
  EXPECT_EQ(table->session_count(), 3u);
  ASSERT_TRUE(table->Delete("b", SessionKind::kAttention).ok());
  auto limit = table->CreateSession(
      {.num_heads = 1, .key_dim = 1, .value_dim = 1}, std::nullopt, "c");
  ASSERT_TRUE(limit.ok()) << limit.status();
  auto over = engine.CreateSession("", "m3");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("sessions"));
}

// Records what a durable store would hear.
class Recorder : public SessionObserver {
 public:
  void OnCreated(const std::shared_ptr<Session>& session) override {
    const Session& s = *session;
    Add("created " + s.id() + " " + std::string(SessionKindName(s.kind())));
  }
  void OnStepped(const Session& s) override {
    Add("stepped " + s.id() + " @" + std::to_string(s.position()));
  }
  void OnRemoved(const Session& s, Removal why) override {
    Add("removed " + s.id() +
        (why == Removal::kDeleted ? " deleted" : " evicted"));
  }
  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(events_);
  }

 private:
  void Add(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
};

TEST(SharedTable, TheObserverHearsCreatesStepsAndRemovalsOfBothKinds) {
  Recorder recorder;
  auto table = *SessionManager::Create({.observer = &recorder});
  auto executor = std::make_shared<ComputeExecutor>();
  Scheduler scheduler({.executor = executor});
  GenerationEngine engine({Builtin()},
                          {.sessions = table.get(), .executor = executor});

  auto a = *table->CreateSession(kSpec, std::nullopt, "a");
  ASSERT_EQ(StepZeros(scheduler, a).code, absl::StatusCode::kOk);
  // Work that only reads (an inspect) is not a step.
  std::promise<void> read;
  scheduler.Run(
      a, [](AttentionSession&) { return absl::OkStatus(); },
      [&](absl::Status) { read.set_value(); });
  read.get_future().wait();
  EXPECT_THAT(recorder.Take(),
              ElementsAre("created a attention", "stepped a @1"));

  ASSERT_TRUE(engine.CreateSession("", "m").ok());
  ASSERT_EQ(AppendTokens(engine, "m", {72, 105}).code, absl::StatusCode::kOk);
  std::promise<std::string> snap;
  engine.Snapshot("m", [&](absl::StatusOr<std::string> r) {
    snap.set_value(r.ok() ? *r : "");
  });
  const std::string blob = snap.get_future().get();
  ASSERT_FALSE(blob.empty());
  ASSERT_TRUE(engine.Restore(blob, "r").ok());
  std::promise<void> forked;
  engine.Fork("m", "f",
              [&](absl::StatusOr<ModelSessionInfo>) { forked.set_value(); });
  forked.get_future().wait();
  std::promise<void> deleted;
  engine.Delete("m", [&](absl::Status) { deleted.set_value(); });
  deleted.get_future().wait();
  EXPECT_THAT(recorder.Take(),
              ElementsAre("created m model", "stepped m @2", "created r model",
                          "created f model", "removed m deleted"));

  ASSERT_TRUE(table->Delete("a", SessionKind::kAttention).ok());
  const SessionManager::Evicted evicted =
      table->EvictIdle(std::chrono::milliseconds(0));
  EXPECT_EQ(evicted.attention, 0u);
  EXPECT_EQ(evicted.model, 2u);
  auto events = recorder.Take();
  std::sort(events.begin(), events.end());
  EXPECT_THAT(events, ElementsAre("removed a deleted", "removed f evicted",
                                  "removed r evicted"));
}

// One worker for both: a long Generate and a stream of Decode steps run
// together, every callback comes from the one worker thread, and each makes
// progress while the other runs (the worker alternates a generation
// iteration and an attention round).
TEST(ComputeExecutor, AGenerateAndDecodeStepsBothProgressOnOneWorker) {
  auto table = *SessionManager::Create({});
  auto executor = std::make_shared<ComputeExecutor>();
  Scheduler scheduler({.executor = executor});
  GenerationEngine engine({Builtin()},
                          {.sessions = table.get(), .executor = executor});
  auto decoding = *table->CreateSession(kSpec, std::nullopt, "decoding");
  ASSERT_TRUE(engine.CreateSession("", "generating").ok());

  constexpr uint32_t kTokens = 600;
  std::atomic<uint64_t> tokens{0};
  std::atomic<uint64_t> steps{0};
  std::atomic<bool> off_worker{false};
  std::promise<void> finished;
  // Steps the decoder had done when the first and the last token arrived.
  std::atomic<uint64_t> steps_at_first{0}, steps_at_last{0};
  engine.Generate("generating", {72, 105}, {.max_tokens = kTokens},
                  [&](const GenerateEvent& e) {
                    if (!executor->OnWorker()) off_worker = true;
                    if (e.token_id >= 0 && tokens++ == 0) {
                      steps_at_first = steps.load();
                    }
                    if (e.finished) {
                      steps_at_last = steps.load();
                      finished.set_value();
                    }
                  });
  auto done = finished.get_future();
  // Tokens the generator had sent when the decoder's 50th step was done.
  uint64_t tokens_at_step50 = 0;
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    std::promise<void> step;
    std::vector<float> qk(8, 0.5f), v(8, 1.0f), out(8), den(2);
    std::vector<uint8_t> avail(2);
    scheduler.Step(decoding, {qk.data(), qk.data(), v.data(), 1},
                   {out.data(), den.data(), avail.data()}, [&](absl::Status s) {
                     if (!executor->OnWorker()) off_worker = true;
                     EXPECT_TRUE(s.ok()) << s;
                     step.set_value();
                   });
    step.get_future().wait();
    if (++steps == 50) tokens_at_step50 = tokens.load();
  }
  EXPECT_FALSE(off_worker) << "a callback came from another thread";
  EXPECT_EQ(tokens.load(), kTokens);
  // The decoder stepped all through the generation, and the generator kept
  // producing tokens while the decoder stepped.
  EXPECT_GE(steps_at_last - steps_at_first, 50u);
  EXPECT_GT(tokens_at_step50, 0u);
  EXPECT_LT(tokens_at_step50, kTokens);
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// One snapshot format family: the same statuses for the same failures on
// both kinds, and a blob of one kind refused by the other's restore.
TEST(SharedTable, SnapshotsOfBothKindsFailAlike) {
  GenerationEngine engine({Builtin()});
  ASSERT_TRUE(engine.CreateSession("", "m").ok());
  ASSERT_EQ(AppendTokens(engine, "m", {72, 105, 33}).code,
            absl::StatusCode::kOk);
  std::promise<std::string> snap;
  engine.Snapshot("m", [&](absl::StatusOr<std::string> r) {
    snap.set_value(r.ok() ? *r : "");
  });
  const std::string model_blob = snap.get_future().get();
  ASSERT_EQ(model_blob.size(), ModelSnapshotBytes(*Builtin()));
  const std::string attention_blob =
      SerializeSnapshot(kSpec, AttentionState(kSpec));

  // Damaged (a byte flipped past the version, or cut short): DATA_LOSS.
  for (size_t i :
       {size_t{12}, size_t{30}, model_blob.size() / 2, model_blob.size() - 1}) {
    std::string altered = model_blob;
    altered[i] ^= 0x10;
    EXPECT_EQ(engine.Restore(altered, "").status().code(),
              absl::StatusCode::kDataLoss)
        << i;
  }
  EXPECT_EQ(engine.Restore(model_blob.substr(0, 100), "").status().code(),
            absl::StatusCode::kDataLoss);
  // The other kind: INVALID_ARGUMENT, naming where it belongs.
  const absl::Status a = engine.Restore(attention_blob, "").status();
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.message()), HasSubstr("AttentionService.Restore"));
  const absl::Status m = ParseSnapshot(model_blob).status();
  EXPECT_EQ(m.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.message()), HasSubstr("GenerationService.Restore"));
  // Another model: FAILED_PRECONDITION (tested with another fingerprint in
  // generation_test.cc); nothing was created by any of these.
  EXPECT_EQ(engine.ListSessions().size(), 1u);
  auto restored = engine.Restore(model_blob, "again");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->position, 3u);
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// The observer hears nothing of a session after its removal: steps queued
// before an attention session is deleted still run, but are not reported.
TEST(SharedTable, NothingIsHeardOfASessionAfterItsRemoval) {
  Recorder recorder;
  auto table = *SessionManager::Create({.observer = &recorder});
  auto executor = std::make_shared<ComputeExecutor>();
  Scheduler scheduler({.executor = executor});
  auto a = *table->CreateSession(kSpec, std::nullopt, "a");
  auto gate = *table->CreateSession(kSpec, std::nullopt, "gate");
  std::promise<void> release, holding;
  std::shared_future<void> released = release.get_future().share();
  scheduler.Run(
      gate,
      [&](AttentionSession&) {
        holding.set_value();
        released.wait();
        return absl::OkStatus();
      },
      [](absl::Status) {});
  holding.get_future().wait();
  // Queued behind the hold, then the session is deleted.
  std::vector<float> qk(8, 0.5f), v(8, 1.0f), out(8), den(2);
  std::vector<uint8_t> avail(2);
  std::promise<void> stepped;
  scheduler.Step(a, {qk.data(), qk.data(), v.data(), 1},
                 {out.data(), den.data(), avail.data()},
                 [&](absl::Status) { stepped.set_value(); });
  ASSERT_TRUE(table->Delete("a", SessionKind::kAttention).ok());
  release.set_value();
  stepped.get_future().wait();
  EXPECT_THAT(recorder.Take(),
              ElementsAre("created a attention", "created gate attention",
                          "removed a deleted"));
}

// An engine destroyed while a request is under way puts the session back
// first: the table outlives it, and the session is as it was.
TEST(SharedTable, AnEngineGoingAwayPutsItsSessionsBack) {
  auto table = *SessionManager::Create({});
  ASSERT_TRUE(table->CreateModelSession(Builtin(), "m").ok());
  std::promise<Outcome> answered;
  {
    GenerationEngine engine({Builtin()},
                            {.token_budget = 8, .sessions = table.get()});
    ASSERT_EQ(AppendTokens(engine, "m", {72, 105}).code, absl::StatusCode::kOk);
    std::vector<int32_t> prompt(4000, 97);
    engine.Append("m", prompt, [&](absl::StatusOr<ModelSessionInfo> r) {
      answered.set_value(
          {r.status().code(), std::string(r.status().message())});
    });
    // Under way: some of the prompt is in the state.
    while ((*table->FindModel("m"))->position() <= 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  EXPECT_EQ(answered.get_future().get().code, absl::StatusCode::kUnavailable);
  auto m = *table->FindModel("m");
  EXPECT_EQ(m->position(), 2u);
  EXPECT_EQ(m->state().position(), 1u);
  EXPECT_EQ(m->pending_token(), 105);
  EXPECT_EQ(m->pending_count(), 0);
}

}  // namespace
}  // namespace linattn
