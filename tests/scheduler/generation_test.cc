// GenerationEngine: sessions, continuous batching, sampling and the rules a
// request must keep (order, atomicity, limits), on the built-in model and on
// small models written here.
#include "core/scheduler/generation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "core/session/snapshot.h"
#include "tests/model/test_model.h"
#include "tests/scheduler/builtin_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

using testing::Builtin;

// Results cross from the engine's worker to the test thread as plain data:
// an absl::Status shares a reference-counted payload, and Debian's Abseil is
// not built for ThreadSanitizer, so a payload freed on one thread after
// being read on another would be reported although the count is atomic.
struct PlainStatus {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  explicit PlainStatus(const absl::Status& s)
      : code(s.code()), message(s.message()) {}
  absl::Status ToStatus() const { return absl::Status(code, message); }
};

template <typename T>
struct PlainResult {
  PlainStatus status;
  std::optional<T> value;
  explicit PlainResult(const absl::StatusOr<T>& r)
      : status(r.status()),
        value(r.ok() ? std::optional<T>(*r) : std::nullopt) {}
  absl::StatusOr<T> ToStatusOr() const {
    if (value) return *value;
    return status.ToStatus();
  }
};

std::vector<int32_t> Bytes(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());
}

struct Generated {
  std::vector<int32_t> ids;
  std::string text;
  std::string reason;
  absl::Status status;
  uint64_t position = 0;
  uint64_t completion = 0;
};

// Collects one Generate's events; Wait() blocks until the last one.
class Collector {
 public:
  GenerationEngine::EventCallback Callback() {
    return [this](const GenerateEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e.token_id >= 0) result_.ids.push_back(e.token_id);
      result_.text += e.text;
      if (e.finished) {
        result_.reason = e.finish_reason;
        status_.emplace(e.status);
        result_.position = e.position;
        result_.completion = e.completion_tokens;
        done_ = true;
        cv_.notify_all();
      }
      if (on_event_) on_event_(e);
    };
  }
  void OnEvent(std::function<void(const GenerateEvent&)> f) { on_event_ = f; }
  Generated Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    Generated out = result_;
    out.status = status_->ToStatus();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Generated result_;
  std::optional<PlainStatus> status_;
  std::function<void(const GenerateEvent&)> on_event_;
};

// Holds the engine's worker inside an event callback (callbacks run on the
// worker) until Release(), so that requests submitted meanwhile are all
// queued when the next iteration is planned: batching then does not depend
// on thread timing.
class WorkerHold {
 public:
  explicit WorkerHold(GenerationEngine& engine) {
    auto s = engine.CreateSession("", "").value();
    std::promise<void> holding;
    std::future<void> held = holding.get_future();
    // The callback keeps its own handle on the release: the hold may be
    // destroyed (released) before the worker wakes up.
    engine.Generate(s.session_id, {65}, SamplingParams{.max_tokens = 1},
                    [released = released_,
                     holding = std::make_shared<std::promise<void>>(
                         std::move(holding))](const GenerateEvent& e) {
                      if (!e.finished) return;
                      holding->set_value();
                      released.wait();
                    });
    held.wait();  // the worker is inside the callback now
  }
  ~WorkerHold() { Release(); }
  void Release() {
    if (!done_) release_.set_value();
    done_ = true;
  }

 private:
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
  bool done_ = false;
};

Generated Generate(GenerationEngine& engine, const std::string& id,
                   const std::string& prompt, SamplingParams params) {
  Collector c;
  engine.Generate(id, Bytes(prompt), params, c.Callback());
  return c.Wait();
}

absl::StatusOr<ModelSessionInfo> Append(GenerationEngine& engine,
                                        const std::string& id,
                                        std::vector<int32_t> tokens) {
  std::promise<PlainResult<ModelSessionInfo>> p;
  engine.Append(id, std::move(tokens), [&](absl::StatusOr<ModelSessionInfo> r) {
    p.set_value(PlainResult<ModelSessionInfo>(r));
  });
  return p.get_future().get().ToStatusOr();
}

absl::StatusOr<ModelSessionInfo> Fork(GenerationEngine& engine,
                                      const std::string& id,
                                      const std::string& new_id = "") {
  std::promise<PlainResult<ModelSessionInfo>> p;
  engine.Fork(id, new_id, [&](absl::StatusOr<ModelSessionInfo> r) {
    p.set_value(PlainResult<ModelSessionInfo>(r));
  });
  return p.get_future().get().ToStatusOr();
}

absl::StatusOr<std::string> Snapshot(GenerationEngine& engine,
                                     const std::string& id) {
  std::promise<PlainResult<std::string>> p;
  engine.Snapshot(id, [&](absl::StatusOr<std::string> r) {
    p.set_value(PlainResult<std::string>(r));
  });
  return p.get_future().get().ToStatusOr();
}

const SamplingParams kGreedy48{.max_tokens = 48};

TEST(GenerationTest, GreedyAloneEqualsGreedyInsideABatch) {
  const std::string prompt = "And God said, Let there be light";
  GenerationEngine alone({Builtin()});
  auto a = alone.CreateSession("", "a").value();
  const Generated expected = Generate(alone, a.session_id, prompt, kGreedy48);
  ASSERT_TRUE(expected.status.ok()) << expected.status;
  EXPECT_EQ(expected.ids.size(), 48u);

  GenerationEngine batched({Builtin()});
  WorkerHold hold(batched);
  const std::vector<std::string> prompts = {
      "In the beginning",
      prompt,
      "The LORD is my shepherd; I shall not want.",
      "And",
      "Blessed are the meek: for they shall inherit the earth. And",
      "Jesus wept."};
  std::vector<std::unique_ptr<Collector>> collectors;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = batched.CreateSession("", absl::StrCat("s", i)).value();
    collectors.push_back(std::make_unique<Collector>());
    batched.Generate(s.session_id, Bytes(prompts[i]), kGreedy48,
                     collectors.back()->Callback());
  }
  const uint64_t before = batched.max_rows_seen();
  hold.Release();  // every prompt is queued: the next iteration has them all
  std::vector<Generated> results;
  for (auto& c : collectors) results.push_back(c->Wait());
  EXPECT_EQ(results[1].ids, expected.ids);
  EXPECT_EQ(results[1].text, expected.text);
  uint64_t prompt_rows = 0;
  for (const std::string& p : prompts) prompt_rows += p.size();
  EXPECT_EQ(before, 1u);  // the hold's own row
  EXPECT_EQ(batched.max_rows_seen(), prompt_rows)
      << "the prompts, all queued, did not share one iteration";
}

TEST(GenerationTest, ForkGeneratesWhatItsParentGenerates) {
  GenerationEngine engine({Builtin()});
  auto parent = engine.CreateSession("", "").value();
  ASSERT_TRUE(Append(engine, parent.session_id,
                     Bytes("Thou shalt love thy neighbour as"))
                  .ok());
  auto child = Fork(engine, parent.session_id, "child");
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->position, 32u);
  const Generated a = Generate(engine, parent.session_id, "", kGreedy48);
  const Generated b = Generate(engine, "child", "", kGreedy48);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.position, 32u + 48u);
}

TEST(GenerationTest, AppendInPiecesThenGenerateEqualsOnePrompt) {
  GenerationEngine engine({Builtin()});
  const std::string text = "For God so loved the world, that he gave";
  auto one = engine.CreateSession("", "one").value();
  auto pieces = engine.CreateSession("", "pieces").value();
  ASSERT_TRUE(Append(engine, pieces.session_id, Bytes(text.substr(0, 1))).ok());
  ASSERT_TRUE(
      Append(engine, pieces.session_id, Bytes(text.substr(1, 20))).ok());
  auto info = Append(engine, pieces.session_id, Bytes(text.substr(21)));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->position, text.size());
  const Generated a = Generate(engine, one.session_id, text, kGreedy48);
  const Generated b = Generate(engine, pieces.session_id, "", kGreedy48);
  EXPECT_EQ(a.ids, b.ids);
}

TEST(GenerationTest, SameSeedSameTextOtherSeedOtherText) {
  GenerationEngine engine({Builtin()});
  SamplingParams p{.temperature = 0.9f,
                   .top_k = 40,
                   .top_p = 0.95f,
                   .seed = 5,
                   .max_tokens = 64};
  std::vector<std::string> texts;
  for (uint64_t seed : {5, 5, 6}) {
    p.seed = seed;
    auto s = engine.CreateSession("", "").value();
    texts.push_back(
        Generate(engine, s.session_id, "And it came to pass", p).text);
  }
  EXPECT_EQ(texts[0], texts[1]);
  EXPECT_NE(texts[0], texts[2]);
}

TEST(GenerationTest, StopStringsAndMaxTokensEndTheStream) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  const Generated full = Generate(engine, s.session_id, "And", kGreedy48);
  ASSERT_GE(full.text.size(), 20u);
  const std::string stop = full.text.substr(10, 3);
  const size_t cut = full.text.find(stop);

  auto t = engine.CreateSession("", "").value();
  SamplingParams p = kGreedy48;
  p.stop = {stop, "never appears"};
  const Generated stopped = Generate(engine, t.session_id, "And", p);
  EXPECT_EQ(stopped.reason, "stop");
  EXPECT_EQ(stopped.text, full.text.substr(0, cut));
  EXPECT_EQ(stopped.position, 3 + stopped.completion);

  auto u = engine.CreateSession("", "").value();
  const Generated five =
      Generate(engine, u.session_id, "And", SamplingParams{.max_tokens = 5});
  EXPECT_EQ(five.reason, "length");
  EXPECT_EQ(five.ids.size(), 5u);
  EXPECT_EQ(five.text, full.text.substr(0, five.text.size()));
}

TEST(GenerationTest, EosEndsGeneration) {
  testing::TempDir tmp;
  nlohmann::json config = testing::SmallConfig();
  config["eos_token_id"] = 0;
  testing::WriteRandomModel(tmp.Path("eos"), config, 4, /*zero_lm_head=*/true);
  GenerationEngine engine({Model::Load(tmp.Path("eos")).value()});
  auto s = engine.CreateSession("", "").value();
  // Every logit is 0, so greedy picks id 0: the eos token.
  const Generated g = Generate(engine, s.session_id, "hi", kGreedy48);
  EXPECT_EQ(g.reason, "eos");
  EXPECT_EQ(g.ids, std::vector<int32_t>{0});
  EXPECT_EQ(g.text, "");
}

TEST(GenerationTest, BytesThatAreNotUtf8StreamAsReplacementCharacters) {
  // A byte model that only ever says 0xFF (never valid UTF-8), and one that
  // says 0xC3 (a lead byte that the next 0xC3 breaks off): the text of every
  // event is valid UTF-8 (U+FFFD where the bytes are not), and the raw bytes
  // stay available as token ids.
  testing::TempDir tmp;
  const nlohmann::json config = testing::SmallConfig();
  for (int32_t byte : {0xFF, 0xC3}) {
    const std::string dir = tmp.Path(absl::StrCat("byte", byte));
    testing::WriteModel(dir, config,
                        testing::OneTokenModelTensors(config, byte));
    GenerationEngine engine({Model::Load(dir).value()});
    auto s = engine.CreateSession("", "").value();
    Collector c;
    std::vector<std::string> pieces;
    c.OnEvent([&](const GenerateEvent& e) { pieces.push_back(e.text); });
    engine.Generate(s.session_id, Bytes("hi"), SamplingParams{.max_tokens = 4},
                    c.Callback());
    const Generated g = c.Wait();
    ASSERT_TRUE(g.status.ok()) << g.status;
    EXPECT_EQ(g.ids, std::vector<int32_t>(4, byte));
    for (const std::string& piece : pieces) EXPECT_TRUE(IsValidUtf8(piece));
    const std::string fffd = "\xEF\xBF\xBD";
    EXPECT_EQ(g.text, fffd + fffd + fffd + fffd) << byte;
  }
}

TEST(GenerationTest, FailedRequestsLeaveTheSessionAsItWas) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "s").value();
  ASSERT_TRUE(Append(engine, "s", Bytes("0123456789")).ok());
  auto snapshot = Snapshot(engine, "s").value();

  Collector bad;
  const int32_t past_vocabulary = Builtin()->config().vocab_size;
  engine.Generate("s", {65, past_vocabulary}, kGreedy48, bad.Callback());
  Generated g = bad.Wait();
  EXPECT_EQ(g.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status.message(), HasSubstr("prompt_token_ids[1]"));
  Collector zero;
  engine.Generate("s", {}, SamplingParams{.max_tokens = 0}, zero.Callback());
  EXPECT_THAT(zero.Wait().status.message(), HasSubstr("sampling.max_tokens"));
  EXPECT_EQ(Append(engine, "s", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Append(engine, "s", {-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fork(engine, "s", "s").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Fork(engine, "s", "bad id!").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.GetSession("s")->position, 10u);
  EXPECT_EQ(Snapshot(engine, "s").value(), snapshot);  // bit for bit

  EXPECT_EQ(Append(engine, "nope", {1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine.CreateSession("no-such-model", "").status().code(),
            absl::StatusCode::kNotFound);
  // A fresh session of a model without bos needs a prompt.
  auto empty = engine.CreateSession("", "").value();
  Collector none;
  engine.Generate(empty.session_id, {}, kGreedy48, none.Callback());
  EXPECT_THAT(none.Wait().status.message(), HasSubstr("prompt"));
  EXPECT_EQ(engine.GetSession(empty.session_id)->position, 0u);
}

TEST(GenerationTest, SnapshotRestoresAndRefusesAnotherModel) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  ASSERT_TRUE(
      Generate(engine, s.session_id, "Hear, O Israel", kGreedy48).status.ok());
  auto bytes = Snapshot(engine, s.session_id);
  ASSERT_TRUE(bytes.ok());
  auto restored = engine.Restore(*bytes, "restored");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->position, 14u + 48u);
  EXPECT_EQ(Generate(engine, s.session_id, "", kGreedy48).ids,
            Generate(engine, "restored", "", kGreedy48).ids);

  std::string corrupt = *bytes;
  corrupt[corrupt.size() / 2] ^= 0x40;
  absl::Status c = engine.Restore(corrupt, "").status();
  EXPECT_EQ(c.code(), absl::StatusCode::kDataLoss);  // as attention's
  EXPECT_THAT(c.message(), HasSubstr("checksum"));
  EXPECT_EQ(engine.Restore("garbage", "").status().code(),
            absl::StatusCode::kInvalidArgument);

  // Another model under the same name: refused by fingerprint.
  testing::TempDir tmp;
  nlohmann::json config = testing::SmallConfig();
  testing::WriteRandomModel(tmp.Path("tiny"), config, 5);
  GenerationEngine other({Model::Load(tmp.Path("tiny")).value()});
  absl::Status r = other.Restore(*bytes, "").status();
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.message(), HasSubstr("fingerprint"));
}

// Model snapshots whose checksum was recomputed after an edit: contents no
// session can have are refused all the same.
TEST(GenerationTest, ForgedModelSnapshotsAreRefusedDespiteAValidChecksum) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  ASSERT_TRUE(Append(engine, s.session_id, Bytes("Amen")).ok());
  const std::string good = Snapshot(engine, s.session_id).value();
  // Where the fields are, from the layout table: MODL holds fingerprint
  // u64, name length u32, the name, the pending token i32; STAT the state
  // count u32, then per layer position u64, float count u64, floats; SMPL
  // (optional) the random stream's seed u64, draws u64, set u8; CONV the
  // short convolutions' windows.
  const auto sections = OpenSnapshot(good, SnapshotKind::kModelSession).value();
  ASSERT_EQ(sections.size(), 4u);
  EXPECT_EQ(sections[2].tag, SnapshotTag("SMPL"));
  EXPECT_EQ(sections[3].tag, SnapshotTag("CONV"));
  EXPECT_EQ(sections[2].flags, 0u) << "optional: older readers skip it";
  const size_t pending_at =
      sections[0].offset + 8 + 4 + Builtin()->name().size();
  const size_t first_float = sections[1].offset + 4 + 8 + 8;
  auto reseal = [](std::string blob) {
    const uint32_t crc =
        Crc32(absl::string_view(blob).substr(0, blob.size() - 4));
    std::memcpy(blob.data() + blob.size() - 4, &crc, 4);
    return blob;
  };
  ASSERT_TRUE(engine.Restore(reseal(good), "").ok());
  std::string no_pending = good;
  const int32_t none = -1;
  std::memcpy(no_pending.data() + pending_at, &none, 4);
  absl::Status a = engine.Restore(reseal(no_pending), "").status();
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.message()), HasSubstr("no pending token"));
  std::string nan = good;
  const float bad = NAN;
  std::memcpy(nan.data() + first_float + 4 * 7, &bad, 4);
  absl::Status b = engine.Restore(reseal(nan), "").status();
  EXPECT_EQ(b.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.message()), HasSubstr("NaN or Inf"));
  std::string stream = good;
  stream[sections[2].offset + 16] = 2;  // `set` is 0 or 1
  absl::Status c = engine.Restore(reseal(stream), "").status();
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.message()), HasSubstr("sampler position"));
}

TEST(GenerationTest, ALongPromptDoesNotStallRunningStreams) {
  GenerationOptions options;
  options.token_budget = 64;
  GenerationEngine engine({Builtin()}, options);
  auto streaming = engine.CreateSession("", "").value();
  auto long_prompt = engine.CreateSession("", "").value();
  WorkerHold hold(engine);  // both requests start in the same iteration
  std::mutex mu;
  int tokens_before_prefill_done = -1;
  int tokens = 0;
  Collector c;
  c.OnEvent([&](const GenerateEvent&) {
    std::lock_guard<std::mutex> lock(mu);
    ++tokens;
  });
  engine.Generate(streaming.session_id, Bytes("And"),
                  SamplingParams{.max_tokens = 200}, c.Callback());
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "And the earth was without form, and void. ";
  std::promise<PlainResult<ModelSessionInfo>> done;
  engine.Append(long_prompt.session_id, Bytes(text),
                [&](absl::StatusOr<ModelSessionInfo> r) {
                  {
                    std::lock_guard<std::mutex> lock(mu);
                    tokens_before_prefill_done = tokens;
                  }
                  done.set_value(PlainResult<ModelSessionInfo>(r));
                });
  hold.Release();
  auto info = done.get_future().get().ToStatusOr();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->position, text.size());
  c.Wait();
  // 2580 prompt tokens at most 63 per iteration (one row goes to the
  // stream) take ≥ 41 iterations, each of which also decoded a token (the
  // first iteration prefilled the stream's own prompt).
  EXPECT_GE(tokens_before_prefill_done, 40);
  EXPECT_LE(engine.max_rows_seen(), 64u);
}

TEST(GenerationTest, CancelStopsAndKeepsWhatWasDelivered) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  auto control = std::make_shared<GenerateControl>();
  Collector c;
  std::atomic<int> seen{0};
  c.OnEvent([&](const GenerateEvent&) {
    if (++seen == 5) engine.Cancel(*control);
  });
  engine.Generate(s.session_id, Bytes("Amen"),
                  SamplingParams{.max_tokens = 100000}, c.Callback(), control);
  const Generated g = c.Wait();
  EXPECT_EQ(g.reason, "cancelled");
  EXPECT_GE(g.completion, 5u);
  EXPECT_LT(g.completion, 100u);
  EXPECT_EQ(engine.GetSession(s.session_id)->position, 4 + g.completion);
}

// All or nothing (a non-streamed HTTP answer): cancelled after tokens were
// sampled, or ended by the server's abort, the session is back where it
// was before the request, prompt included, bit for bit.
TEST(GenerationTest, AnAtomicGenerateThatEndsEarlyLeavesNothing) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  {
    std::promise<absl::StatusOr<ModelSessionInfo>> done;
    engine.Append(
        s.session_id, Bytes("In the beginning"),
        [&](absl::StatusOr<ModelSessionInfo> i) { done.set_value(i); });
    ASSERT_TRUE(done.get_future().get().ok());
  }
  const std::string before = Snapshot(engine, s.session_id).value();
  auto control = std::make_shared<GenerateControl>(/*paced=*/false,
                                                   /*atomic=*/true);
  Collector c;
  std::atomic<int> seen{0};
  c.OnEvent([&](const GenerateEvent&) {
    if (++seen == 5) engine.Cancel(*control);
  });
  engine.Generate(s.session_id, Bytes(" and"),
                  SamplingParams{.max_tokens = 100000}, c.Callback(), control);
  const Generated g = c.Wait();
  EXPECT_EQ(g.reason, "cancelled");
  EXPECT_EQ(Snapshot(engine, s.session_id).value(), before);
  // The same when the server ends it.
  auto aborted = std::make_shared<GenerateControl>(false, true);
  Collector c2;
  std::atomic<int> seen2{0};
  c2.OnEvent([&](const GenerateEvent&) {
    if (++seen2 == 3) {
      engine.AbortGenerations(absl::UnavailableError("shutting down"));
    }
  });
  engine.Generate(s.session_id, Bytes(" and"),
                  SamplingParams{.max_tokens = 100000}, c2.Callback(), aborted);
  c2.Wait();
  EXPECT_EQ(Snapshot(engine, s.session_id).value(), before);
}

// Paced delivery (what the gRPC stream uses): the engine runs at most one
// message ahead of delivery, and a cancel leaves exactly the delivered
// tokens in the context, bit for bit as if generation had stopped there.
TEST(GenerationTest, PacedCancelKeepsExactlyTheDeliveredTokens) {
  GenerationEngine engine({Builtin()});
  const std::string prompt = "And God said";
  // What the context must be: the prompt and the first k greedy tokens.
  auto reference = [&](uint32_t k) {
    auto r = engine.CreateSession("", "").value();
    EXPECT_EQ(
        Generate(engine, r.session_id, prompt, SamplingParams{.max_tokens = k})
            .completion,
        k);
    return Snapshot(engine, r.session_id).value();
  };
  struct Case {
    const char* name;
    int deliver;         // messages delivered before the cancel
    bool cancel_at_end;  // the cancel comes with the last delivery (else
                         // with the next message, never delivered)
    uint32_t max_tokens;
  };
  for (const Case& c : {Case{"next one undelivered", 5, false, 100000},
                        Case{"right after a delivery", 5, true, 100000},
                        Case{"final message undelivered", 4, false, 5},
                        Case{"first message undelivered", 0, false, 100000}}) {
    SCOPED_TRACE(c.name);
    auto s = engine.CreateSession("", "").value();
    const std::string before = Snapshot(engine, s.session_id).value();
    auto control = std::make_shared<GenerateControl>(/*paced=*/true);
    Collector collector;
    int tokens = 0;
    int ahead = 0;  // most messages emitted beyond the delivered ones
    collector.OnEvent([&](const GenerateEvent& e) {
      if (e.token_id < 0) return;
      ++tokens;
      ahead = std::max<int>(ahead, tokens - int(control->delivered()));
      if (tokens <= c.deliver) engine.Delivered(*control);
      if (tokens == c.deliver + (c.cancel_at_end ? 0 : 1)) {
        engine.Cancel(*control);
      }
    });
    engine.Generate(s.session_id, Bytes(prompt),
                    SamplingParams{.max_tokens = c.max_tokens},
                    collector.Callback(), control);
    const Generated g = collector.Wait();
    ASSERT_TRUE(g.status.ok()) << g.status;
    EXPECT_EQ(ahead, 1);
    const std::string after = Snapshot(engine, s.session_id).value();
    if (c.deliver == 0) {
      EXPECT_EQ(after, before);  // nothing reached the client
      EXPECT_EQ(engine.GetSession(s.session_id)->position, 0u);
      continue;
    }
    EXPECT_EQ(g.reason, c.max_tokens == 5 ? "length" : "cancelled");
    EXPECT_EQ(engine.GetSession(s.session_id)->position,
              prompt.size() + c.deliver);
    EXPECT_EQ(after, reference(c.deliver));
  }
}

// A Fork or Snapshot of a session whose paced Generate is under way (and
// whose client stopped reading) is answered at the next token boundary,
// not after the Generate: from the tokens delivered so far, with the random
// stream where they left it. The fork, and a restore of the snapshot, then
// continue exactly as the original does from that token, greedy or seeded.
TEST(GenerationTest, ForkAndSnapshotOfAGeneratingSessionContinueAsItDoes) {
  GenerationEngine engine({Builtin()});
  const std::string prompt = "And God said";
  constexpr uint32_t kTokens = 24;
  // Waits for a request a Generate under way must not hold up; a request
  // that waited for the Generate's end would never be answered.
  auto await = [](auto& future) {
    return future.wait_for(std::chrono::seconds(30)) ==
           std::future_status::ready;
  };
  struct Case {
    const char* name;
    SamplingParams params;
    int deliver;  // messages delivered before the fork and snapshot
  };
  const SamplingParams greedy{.max_tokens = kTokens};
  const SamplingParams seeded{.temperature = 0.9f,
                              .top_k = 40,
                              .top_p = 0.95f,
                              .seed = 11,
                              .max_tokens = kTokens};
  for (const Case& c : {Case{"greedy", greedy, 5}, Case{"seeded", seeded, 5},
                        Case{"greedy, nothing delivered", greedy, 0},
                        Case{"seeded, nothing delivered", seeded, 0}}) {
    SCOPED_TRACE(c.name);
    auto s = engine.CreateSession("", "").value();
    auto control = std::make_shared<GenerateControl>(/*paced=*/true);
    Collector original;
    std::promise<void> stalled;  // the first undelivered message came
    std::atomic<bool> reading{false};
    int tokens = 0;
    original.OnEvent([&](const GenerateEvent& e) {
      if (e.token_id < 0) return;
      if (++tokens <= c.deliver || reading.load()) {
        engine.Delivered(*control);
      } else if (tokens == c.deliver + 1) {
        stalled.set_value();
      }
    });
    engine.Generate(s.session_id, Bytes(prompt), c.params, original.Callback(),
                    control);
    stalled.get_future().wait();

    std::promise<PlainResult<ModelSessionInfo>> forked;
    engine.Fork(s.session_id, "", [&](absl::StatusOr<ModelSessionInfo> r) {
      forked.set_value(PlainResult<ModelSessionInfo>(r));
    });
    std::promise<PlainResult<std::string>> snapshotted;
    engine.Snapshot(s.session_id, [&](absl::StatusOr<std::string> r) {
      snapshotted.set_value(PlainResult<std::string>(r));
    });
    auto fork_future = forked.get_future();
    auto snapshot_future = snapshotted.get_future();
    ASSERT_TRUE(await(fork_future)) << "the fork waited for the Generate";
    ASSERT_TRUE(await(snapshot_future))
        << "the snapshot waited for the Generate";
    auto fork = fork_future.get().ToStatusOr();
    auto blob = snapshot_future.get().ToStatusOr();
    ASSERT_TRUE(fork.ok()) << fork.status();
    ASSERT_TRUE(blob.ok()) << blob.status();
    const uint64_t kept = c.deliver == 0 ? 0 : prompt.size() + c.deliver;
    EXPECT_EQ(fork->position, kept);
    auto restored = engine.Restore(*blob, "");
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->position, kept);

    // The original goes on to its end.
    reading.store(true);
    engine.Delivered(*control);  // the message it stalled on
    const Generated whole = original.Wait();
    ASSERT_TRUE(whole.status.ok()) << whole.status;
    ASSERT_EQ(whole.ids.size(), kTokens);
    const std::vector<int32_t> rest(whole.ids.begin() + c.deliver,
                                    whole.ids.end());

    // The fork and the restored session continue it: the rest of the
    // tokens (nothing delivered: the prompt again, from the start).
    SamplingParams more = c.params;
    more.max_tokens = kTokens - c.deliver;
    more.resume_stream = c.params.temperature > 0.0f && c.deliver > 0;
    const std::string again = c.deliver == 0 ? prompt : "";
    EXPECT_EQ(Generate(engine, fork->session_id, again, more).ids, rest);
    EXPECT_EQ(Generate(engine, restored->session_id, again, more).ids, rest);
  }
}

// An all-or-nothing Generate (a non-streamed completion) has given its
// caller nothing until it ends: a snapshot meanwhile is the session as it
// was before it, and the snapshot does not wait for it.
TEST(GenerationTest, SnapshotBesideAnAtomicGenerateIsTheContextBeforeIt) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  ASSERT_TRUE(Append(engine, s.session_id, Bytes("Hear, O Israel")).ok());
  const std::string before = Snapshot(engine, s.session_id).value();
  auto control = std::make_shared<GenerateControl>(/*paced=*/true,
                                                   /*atomic=*/true);
  Collector generating;
  std::promise<void> first;
  int tokens = 0;
  generating.OnEvent([&](const GenerateEvent& e) {
    if (e.token_id >= 0 && ++tokens == 3) first.set_value();
    if (e.token_id >= 0 && tokens < 3) engine.Delivered(*control);
  });
  engine.Generate(s.session_id, Bytes(" the LORD"),
                  SamplingParams{.max_tokens = 100000}, generating.Callback(),
                  control);
  first.get_future().wait();
  EXPECT_EQ(Snapshot(engine, s.session_id).value(), before);
  engine.Cancel(*control);
  EXPECT_EQ(generating.Wait().reason, "cancelled");
  EXPECT_EQ(Snapshot(engine, s.session_id).value(), before);
}

// A Delete does not wait behind a paced Generate whose messages are never
// delivered (a client that stopped reading): it cancels it.
TEST(GenerationTest, DeleteCancelsAGenerateWaitingForDelivery) {
  GenerationEngine engine({Builtin()});
  auto s = engine.CreateSession("", "").value();
  auto control = std::make_shared<GenerateControl>(/*paced=*/true);
  Collector stalled;
  engine.Generate(s.session_id, Bytes("Amen"),
                  SamplingParams{.max_tokens = 100000}, stalled.Callback(),
                  control);
  std::promise<PlainStatus> deleted;
  engine.Delete(s.session_id,
                [&](absl::Status st) { deleted.set_value(PlainStatus(st)); });
  EXPECT_TRUE(deleted.get_future().get().ToStatus().ok());
  const Generated g = stalled.Wait();
  EXPECT_EQ(g.reason, "cancelled");
  EXPECT_EQ(g.completion, 0u);
  EXPECT_EQ(engine.GetSession(s.session_id).status().code(),
            absl::StatusCode::kNotFound);
}

// A server at the end of its grace period ends every Generate with its
// reason; the context keeps what was delivered, like a cancel.
TEST(GenerationTest, AbortEndsRunningAndQueuedGenerationsWithTheReason) {
  GenerationEngine engine({Builtin()});
  auto a = engine.CreateSession("", "").value();
  Collector running, queued;
  std::atomic<int> seen{0};
  running.OnEvent([&](const GenerateEvent&) {
    if (++seen == 3) {
      engine.AbortGenerations(absl::UnavailableError("shutting down"));
    }
  });
  engine.Generate(a.session_id, Bytes("Amen"),
                  SamplingParams{.max_tokens = 100000}, running.Callback());
  engine.Generate(a.session_id, Bytes("more"), SamplingParams{.max_tokens = 10},
                  queued.Callback());
  const Generated r = running.Wait();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("shutting down"));
  EXPECT_GE(r.completion, 3u);
  EXPECT_EQ(queued.Wait().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine.GetSession(a.session_id)->position, 4 + r.completion);
}

TEST(GenerationTest, DeleteAndLimits) {
  GenerationOptions options;
  options.max_sessions = 2;
  GenerationEngine engine({Builtin()}, options);
  ASSERT_TRUE(engine.CreateSession("tiny", "a").ok());
  ASSERT_TRUE(engine.CreateSession("", "b").ok());
  EXPECT_EQ(engine.CreateSession("", "c").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Fork(engine, "a").status().code(),
            absl::StatusCode::kResourceExhausted);
  std::promise<PlainStatus> deleted;
  engine.Delete("a",
                [&](absl::Status s) { deleted.set_value(PlainStatus(s)); });
  EXPECT_TRUE(deleted.get_future().get().ToStatus().ok());
  EXPECT_EQ(engine.GetSession("a").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine.CreateSession("", "c").ok());
  EXPECT_EQ(engine.ListSessions().size(), 2u);
}

TEST(GenerationTest, IdleSessionsAreEvictedBusyAndRecentOnesKept) {
  GenerationEngine engine({Builtin()});
  ASSERT_TRUE(engine.CreateSession("", "idle").ok());
  ASSERT_TRUE(engine.CreateSession("", "used").ok());
  // Margins wide enough for a slow machine: "idle" is ≥ 1.5 s old at the
  // eviction, "used" was used well under 1 s before it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(Append(engine, "used", Bytes("Amen")).ok());  // use renews
  EXPECT_EQ(engine.sessions().EvictIdle(std::chrono::milliseconds(1000)).model,
            1u);
  EXPECT_EQ(engine.GetSession("idle").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine.GetSession("used").ok());
  // A session with a request in flight is never evicted, however old.
  Collector c;
  engine.Generate("used", {}, SamplingParams{.max_tokens = 2000}, c.Callback());
  EXPECT_EQ(engine.sessions().EvictIdle(std::chrono::milliseconds(0)).model,
            0u);
  EXPECT_TRUE(c.Wait().status.ok());
  EXPECT_EQ(engine.sessions().EvictIdle(std::chrono::milliseconds(0)).model,
            1u);
  EXPECT_TRUE(engine.ListSessions().empty());
}

// Prompts share an iteration's budget evenly: a short prompt submitted
// after a long one is done first, instead of waiting for all of it.
TEST(GenerationTest, AShortPromptIsNotHeldBehindALongOne) {
  GenerationOptions options;
  options.token_budget = 32;
  GenerationEngine engine({Builtin()}, options);
  auto long_one = engine.CreateSession("", "").value();
  auto short_one = engine.CreateSession("", "").value();
  std::mutex mu;
  std::vector<std::string> order;
  std::promise<void> both;
  int left = 2;
  auto record = [&](const char* what) {
    return [&, what](absl::StatusOr<ModelSessionInfo> r) {
      EXPECT_TRUE(r.ok());
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(what);
      if (--left == 0) both.set_value();
    };
  };
  {
    WorkerHold hold(engine);
    engine.Append(long_one.session_id, std::vector<int32_t>(3000, 'a'),
                  record("long"));
    engine.Append(short_one.session_id, Bytes("In the beginning"),
                  record("short"));
  }
  both.get_future().wait();
  EXPECT_EQ(order, (std::vector<std::string>{"short", "long"}));
  EXPECT_EQ(engine.GetSession(long_one.session_id)->position, 3000u);
}

// Requests whose caller has gone before they commit are dropped: an Append
// whose deadline passed appends nothing; one cancelled part-way through its
// prompt is taken back; a Fork or Delete queued behind a long Append whose
// caller has gone does not run when its turn comes.
TEST(GenerationTest, RequestsWhoseCallerHasGoneAreNotApplied) {
  GenerationOptions options;
  options.token_budget = 16;
  GenerationEngine engine({Builtin()}, options);
  auto a = engine.CreateSession("", "a").value();
  auto b = engine.CreateSession("", "b").value();
  ASSERT_TRUE(Append(engine, "a", Bytes("Let there be")).ok());
  const std::string before = Snapshot(engine, "a").value();
  const CallLiveness expired(
      CallLiveness::Clock::now() - std::chrono::seconds(1), nullptr);
  auto append_with = [&](const std::string& id, std::vector<int32_t> tokens,
                         CallLiveness caller) {
    auto p = std::make_shared<std::promise<PlainResult<ModelSessionInfo>>>();
    engine.Append(
        id, std::move(tokens),
        [p](absl::StatusOr<ModelSessionInfo> r) {
          p->set_value(PlainResult<ModelSessionInfo>(r));
        },
        std::move(caller));
    return p->get_future();
  };
  EXPECT_EQ(append_with("a", Bytes(" light"), expired)
                .get()
                .ToStatusOr()
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Snapshot(engine, "a").value(), before);

  // Cancelled part-way: b's short Append, in the same iterations, cancels
  // it from its completion.
  std::atomic<bool> gone{false};
  std::future<PlainResult<ModelSessionInfo>> long_append, short_append;
  std::promise<PlainStatus> fork_done, delete_done;
  {
    WorkerHold hold(engine);
    long_append =
        append_with("a", std::vector<int32_t>(800, 'x'),
                    CallLiveness(CallLiveness::Clock::time_point::max(),
                                 [&] { return gone.load(); }));
    engine.Fork(
        "a", "a2",
        [&](absl::StatusOr<ModelSessionInfo> r) {
          fork_done.set_value(PlainStatus(r.status()));
        },
        CallLiveness(CallLiveness::Clock::time_point::max(),
                     [&] { return gone.load(); }));
    engine.Delete(
        "a", [&](absl::Status s) { delete_done.set_value(PlainStatus(s)); },
        CallLiveness(CallLiveness::Clock::time_point::max(),
                     [&] { return gone.load(); }));
    auto p = std::make_shared<std::promise<PlainResult<ModelSessionInfo>>>();
    short_append = p->get_future();
    engine.Append("b", Bytes("And"),
                  [p, &gone](absl::StatusOr<ModelSessionInfo> r) {
                    gone = true;
                    p->set_value(PlainResult<ModelSessionInfo>(r));
                  });
  }
  EXPECT_TRUE(short_append.get().ToStatusOr().ok());
  EXPECT_EQ(long_append.get().ToStatusOr().status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(fork_done.get_future().get().code, absl::StatusCode::kCancelled);
  EXPECT_EQ(delete_done.get_future().get().code, absl::StatusCode::kCancelled);
  EXPECT_EQ(engine.GetSession("a2").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.GetSession("a").ok());
  EXPECT_EQ(Snapshot(engine, "a").value(), before);
}

// The working copies a request keeps (a backup, and for a paced Generate
// two more) come from the memory budget: with no room and nothing under
// way, the request fails naming the limit and the session is unchanged.
TEST(GenerationTest, WorkingCopiesComeFromTheMemoryBudget) {
  const uint64_t state = Builtin()->state_bytes();
  GenerationOptions options;
  options.memory_budget_bytes = state;  // the session, and nothing more
  GenerationEngine engine({Builtin()}, options);
  auto a = engine.CreateSession("", "a").value();
  const auto r = Append(engine, "a", Bytes("In the beginning"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("working copies"));
  EXPECT_EQ(engine.GetSession("a")->position, 0u);

  options.memory_budget_bytes = 2 * state;  // one backup fits
  GenerationEngine roomy({Builtin()}, options);
  ASSERT_TRUE(roomy.CreateSession("", "a").ok());
  EXPECT_TRUE(Append(roomy, "a", Bytes("In the beginning")).ok());
  // A paced Generate keeps three copies: it does not fit.
  Collector c;
  roomy.Generate("a", Bytes(" God"), SamplingParams{.max_tokens = 2},
                 c.Callback(), std::make_shared<GenerateControl>(true));
  EXPECT_EQ(c.Wait().status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(roomy.GetSession("a")->position, 16u);
}

// An engine with a budget of its own destroyed while a paced Generate holds
// working copies (its client never took a message): the copies go back to
// the budget before the budget goes (AddressSanitizer checks it).
TEST(GenerationTest, DestroyedWithARequestUnderWay) {
  GenerationOptions options;
  options.memory_budget_bytes = 16 * Builtin()->state_bytes();
  auto engine = std::make_unique<GenerationEngine>(
      std::vector<std::shared_ptr<const Model>>{Builtin()}, options);
  auto a = engine->CreateSession("", "a").value();
  std::promise<void> first;
  auto seen = std::make_shared<std::atomic<bool>>(false);
  engine->Generate(
      "a", Bytes("In the beginning"), SamplingParams{.max_tokens = 100},
      [&first, seen](const GenerateEvent& e) {
        if (!e.finished && !seen->exchange(true)) first.set_value();
      },
      std::make_shared<GenerateControl>(true));
  first.get_future().wait();  // one message out, never delivered
  engine.reset();
}

}  // namespace
}  // namespace linattn
