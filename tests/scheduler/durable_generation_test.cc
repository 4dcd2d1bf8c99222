// Model sessions with a durable store: what the engine answered is what a
// table rebuilt from the store's directory holds. A model session's context
// is replayed through the forward pass (prefill order, not the decode order
// it first ran in), so the check is the one its users make: the recovered
// session continues exactly as a twin restored from a snapshot taken before
// the crash does (greedy, so a difference in the context would show).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <map>

#include "core/scheduler/generation.h"
#include "core/session/durable_store.h"
#include "server/redis/redis_shared_store.h"
#include "server/replica/shared_record_log.h"
#include "tests/model/test_model.h"
#include "tests/scheduler/builtin_model.h"
#include "tests/util/redis_server.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

using testing::Builtin;

std::vector<int32_t> Bytes(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());
}

// The tokens of one Generate, and how it ended (plain data across threads).
struct Generated {
  std::vector<int32_t> ids;
  absl::StatusCode code = absl::StatusCode::kOk;
};

Generated Generate(GenerationEngine& engine, const std::string& id,
                   const std::string& prompt, SamplingParams params) {
  std::promise<Generated> done;
  auto out = std::make_shared<Generated>();
  engine.Generate(id, Bytes(prompt), params, [&, out](const GenerateEvent& e) {
    if (e.token_id >= 0) out->ids.push_back(e.token_id);
    if (e.finished) {
      out->code = e.status.code();
      done.set_value(*out);
    }
  });
  return done.get_future().get();
}

absl::StatusCode Append(GenerationEngine& engine, const std::string& id,
                        const std::string& text) {
  std::promise<absl::StatusCode> p;
  engine.Append(id, Bytes(text), [&](absl::StatusOr<ModelSessionInfo> r) {
    p.set_value(r.status().code());
  });
  return p.get_future().get();
}

absl::StatusCode Fork(GenerationEngine& engine, const std::string& id,
                      const std::string& new_id) {
  std::promise<absl::StatusCode> p;
  engine.Fork(id, new_id, [&](absl::StatusOr<ModelSessionInfo> r) {
    p.set_value(r.status().code());
  });
  return p.get_future().get();
}

std::string Snapshot(GenerationEngine& engine, const std::string& id) {
  std::promise<std::string> p;
  engine.Snapshot(id, [&](absl::StatusOr<std::string> r) {
    p.set_value(r.ok() ? *r : "");
  });
  return p.get_future().get();
}

absl::StatusCode Delete(GenerationEngine& engine, const std::string& id) {
  std::promise<absl::StatusCode> p;
  engine.Delete(id, [&](absl::Status s) { p.set_value(s.code()); });
  return p.get_future().get();
}

// A store, its table and an engine on them, recovered from `dir`.
struct DurableEngine {
  std::unique_ptr<DurableStore> store;
  std::unique_ptr<SessionManager> table;
  std::unique_ptr<GenerationEngine> engine;
  RecoveryReport report;
};

absl::StatusOr<std::unique_ptr<DurableEngine>> Open(
    const std::string& dir,
    std::vector<std::shared_ptr<const Model>> models = {Builtin()}) {
  auto d = std::make_unique<DurableEngine>();
  auto store = DurableStore::Open({.dir = dir});
  if (!store.ok()) return store.status();
  d->store = *std::move(store);
  d->table = SessionManager::Create({.observer = d->store.get()}).value();
  auto report = d->store->Recover(*d->table, models);
  if (!report.ok()) return report.status();
  d->report = *report;
  d->engine = std::make_unique<GenerationEngine>(
      models,
      GenerationOptions{.sessions = d->table.get(), .store = d->store.get()});
  return d;
}

const SamplingParams kGreedy{.max_tokens = 12};

TEST(DurableGeneration, RecoveredSessionsContinueAsTheirTwins) {
  testing::TempDir tmp;
  std::map<std::string, std::string> blobs;  // before the "crash"
  {
    auto d = Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    GenerationEngine& e = *(*d)->engine;
    ASSERT_TRUE(e.CreateSession("", "m").ok());
    ASSERT_EQ(Append(e, "m", "In the beginning God"), absl::StatusCode::kOk);
    ASSERT_EQ(Generate(e, "m", " created", kGreedy).ids.size(), 12u);
    ASSERT_EQ(Fork(e, "m", "f"), absl::StatusCode::kOk);
    // Sampled tokens are recorded as they are, whatever the sampler.
    ASSERT_EQ(Generate(e, "f", " and",
                       {.temperature = 0.9f, .seed = 5, .max_tokens = 9})
                  .ids.size(),
              9u);
    ASSERT_EQ(Append(e, "m", "."), absl::StatusCode::kOk);
    ASSERT_TRUE(e.CreateSession("", "empty").ok());
    ASSERT_TRUE(e.Restore(Snapshot(e, "f"), "r").ok());
    ASSERT_TRUE(e.CreateSession("", "gone").ok());
    ASSERT_EQ(Append(e, "gone", "x"), absl::StatusCode::kOk);
    ASSERT_EQ(Delete(e, "gone"), absl::StatusCode::kOk);
    // A Generate whose prompt starts an empty session's context.
    ASSERT_TRUE(e.CreateSession("", "fresh").ok());
    ASSERT_EQ(Generate(e, "fresh", "Jesus", kGreedy).ids.size(), 12u);
    for (const std::string id : {"m", "f", "empty", "r", "fresh"}) {
      blobs[id] = Snapshot(e, id);
      ASSERT_FALSE(blobs[id].empty()) << id;
    }
    // Gone without snapshot files, as after kill -9.
  }
  auto d = Open(tmp.Path("state"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->report.model_sessions, blobs.size());
  EXPECT_EQ((*d)->report.snapshot_files, 0u);
  GenerationEngine twins({Builtin()});
  for (const auto& [id, blob] : blobs) {
    auto twin = twins.Restore(blob, id);
    ASSERT_TRUE(twin.ok()) << twin.status();
    auto recovered = (*d)->engine->GetSession(id);
    ASSERT_TRUE(recovered.ok()) << id;
    EXPECT_EQ(recovered->position, twin->position) << id;
    EXPECT_EQ(Generate(*(*d)->engine, id, "", kGreedy).ids,
              Generate(twins, id, "", kGreedy).ids)
        << id;
  }
  EXPECT_FALSE((*d)->engine->GetSession("gone").ok());
}

// Replay runs the recorded tokens with the store's forward options (the
// server passes its own, --prefill-precision among them): a recovered
// linear_attn session whose context went in with bf16 chunkwise products
// holds the state a bf16 forward of that context gives, not the fp32 one.
TEST(DurableGeneration, ReplayRunsWithTheStoresForwardOptions) {
  if (!PrefillPrecisionSupported(PrefillPrecision::kBf16).ok()) {
    GTEST_SKIP() << "no native bf16 products here";
  }
  testing::TempDir tmp;
  testing::WriteRandomModel(tmp.Path("model"), testing::SmallConfig(), 3);
  const std::shared_ptr<const Model> model =
      Model::Load(tmp.Path("model")).value();
  const std::vector<std::shared_ptr<const Model>> models = {model};
  ForwardOptions bf16;
  bf16.chunkwise.precision = PrefillPrecision::kBf16;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "In the beginning. ";
  const std::vector<int32_t> ids = Bytes(text);
  {
    auto store =
        DurableStore::Open({.dir = tmp.Path("state"), .forward = bf16});
    ASSERT_TRUE(store.ok()) << store.status();
    auto table = SessionManager::Create({.observer = store->get()}).value();
    ASSERT_TRUE((*store)->Recover(*table, models).ok());
    GenerationOptions options{.sessions = table.get(), .store = store->get()};
    options.forward = bf16;
    GenerationEngine engine(models, options);
    ASSERT_TRUE(engine.CreateSession("", "s").ok());
    ASSERT_EQ(Append(engine, "s", text), absl::StatusCode::kOk);
  }
  auto store = DurableStore::Open({.dir = tmp.Path("state"), .forward = bf16});
  ASSERT_TRUE(store.ok()) << store.status();
  auto table = SessionManager::Create({.observer = store->get()}).value();
  ASSERT_TRUE((*store)->Recover(*table, models).ok());
  auto recovered = table->FindModel("s");
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ((*recovered)->pending_token(), ids.back());
  // Replay feeds all but the last token (which stays pending) in one call.
  auto expected = [&](ForwardOptions options) {
    ForwardRunner runner(model, options);
    ModelState state = model->NewState();
    EXPECT_TRUE(runner
                    .Run(state,
                         std::span<const int32_t>(ids).first(ids.size() - 1),
                         nullptr)
                    .ok());
    return state;
  };
  auto same = [](const ModelState& a, const ModelState& b) {
    if (a.position() != b.position()) return false;
    for (size_t l = 0; l < a.layers().size(); ++l) {
      const AttentionState& x = a.layers()[l];
      const AttentionState& y = b.layers()[l];
      if (x.size() != y.size() ||
          std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  };
  const ModelState& got = (*recovered)->state();
  EXPECT_TRUE(same(got, expected(bf16)));
  EXPECT_FALSE(same(got, expected(ForwardOptions{})));
}

// A sampling Generate cut after 8 tokens (here by a "crash"), asked again
// with resume_stream, gives the tokens the uncut one gives after its 8th.
TEST(DurableGeneration, AResumedStreamContinuesWhereTheCutOneStopped) {
  const SamplingParams sampled{
      .temperature = 0.9f, .seed = 77, .max_tokens = 20};
  GenerationEngine uncut({Builtin()});
  ASSERT_TRUE(uncut.CreateSession("", "u").ok());
  ASSERT_EQ(Append(uncut, "u", "And the earth was"), absl::StatusCode::kOk);
  const std::vector<int32_t> expected = Generate(uncut, "u", "", sampled).ids;
  ASSERT_EQ(expected.size(), 20u);

  testing::TempDir tmp;
  std::vector<int32_t> got;
  {
    auto d = Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    GenerationEngine& e = *(*d)->engine;
    ASSERT_TRUE(e.CreateSession("", "c").ok());
    // Nothing to resume yet.
    EXPECT_EQ(Generate(e, "c", "", {.resume_stream = true}).code,
              absl::StatusCode::kFailedPrecondition);
    ASSERT_EQ(Append(e, "c", "And the earth was"), absl::StatusCode::kOk);
    SamplingParams first = sampled;
    first.max_tokens = 8;
    got = Generate(e, "c", "", first).ids;
    ASSERT_EQ(got.size(), 8u);
  }
  auto d = Open(tmp.Path("state"));
  ASSERT_TRUE(d.ok()) << d.status();
  GenerationEngine& e = *(*d)->engine;
  // The stream travels with snapshots (and so with forks and restores).
  GenerationEngine twins({Builtin()});
  ASSERT_TRUE(twins.Restore(Snapshot(e, "c"), "c").ok());
  // Another seed in the request does not matter: the session's stream is
  // resumed.
  const SamplingParams resume{
      .seed = 1, .max_tokens = 12, .resume_stream = true};
  SamplingParams rest = resume;
  rest.temperature = 0.9f;
  const std::vector<int32_t> after = Generate(e, "c", "", rest).ids;
  got.insert(got.end(), after.begin(), after.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(Generate(twins, "c", "", rest).ids, after);
}

TEST(DurableGeneration, ASessionOfAModelNotLoadedStopsRecovery) {
  testing::TempDir tmp;
  {
    auto d = Open(tmp.Path("state"));
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE((*d)->engine->CreateSession("", "m").ok());
  }
  auto d = Open(tmp.Path("state"), {});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr(Builtin()->name()));
}

// Two replicas' engines sharing model sessions through a real Redis: a
// session generated on one continues on the other, after a takeover that
// replays its tokens, exactly as a twin that never moved.
TEST(DurableGeneration,
     AModelSessionTakenOverByAnotherReplicaContinuesAsItsTwin) {
  testing::TempDir tmp;
  testing::RedisServer redis(tmp.Path(""));
  auto open = [&](const std::string& name)
      -> absl::StatusOr<std::unique_ptr<DurableEngine>> {
    auto d = std::make_unique<DurableEngine>();
    auto shared =
        RedisSharedStore::Open({.url = redis.url(),
                                .replica = name,
                                .lease = std::chrono::milliseconds(300),
                                .timeout = std::chrono::milliseconds(2000)});
    if (!shared.ok()) return shared.status();
    DurableStoreOptions options;
    options.log = std::make_shared<SharedRecordLog>(*std::move(shared));
    auto store = DurableStore::Open(options);
    if (!store.ok()) return store.status();
    d->store = *std::move(store);
    d->table = SessionManager::Create({.observer = d->store.get()}).value();
    const std::vector<std::shared_ptr<const Model>> models = {Builtin()};
    auto report = d->store->Recover(*d->table, models);
    if (!report.ok()) return report.status();
    d->engine = std::make_unique<GenerationEngine>(
        models,
        GenerationOptions{.sessions = d->table.get(), .store = d->store.get()});
    return d;
  };
  auto a = open("a");
  auto b = open("b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();

  GenerationEngine twin({Builtin()}, {});
  for (GenerationEngine* e : {(*a)->engine.get(), &twin}) {
    ASSERT_TRUE(e->CreateSession("", "m").ok());
    ASSERT_EQ(Append(*e, "m", "And God said"), absl::StatusCode::kOk);
    ASSERT_EQ(Generate(*e, "m", ", Let", kGreedy).ids.size(), 12u);
  }
  const Generated expected = Generate(twin, "m", " there", kGreedy);
  ASSERT_EQ(expected.ids.size(), 12u);
  // A renews no lease here: B takes the session once it lapses, replaying
  // its prompt and the 12 generated tokens.
  const Generated moved = Generate(*(*b)->engine, "m", " there", kGreedy);
  EXPECT_EQ(moved.code, absl::StatusCode::kOk);
  EXPECT_EQ(moved.ids, expected.ids);
  EXPECT_TRUE((*b)->table->Contains("m"));
}

}  // namespace
}  // namespace linattn
