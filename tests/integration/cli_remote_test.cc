// The `linattn` client commands against a real server: attend --server in
// both modes, explain --server, health.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "clients/cli/attend.h"
#include "clients/cli/explain.h"
#include "clients/cli/npy.h"
#include "clients/cli/remote.h"
#include "clients/load/generation_load.h"
#include "clients/load/load.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/attention/rule_bounds.h"
#include "tests/attention/test_util.h"
#include "tests/integration/server_process.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CliRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::ServerProcess::Start();
    ASSERT_NE(server_, nullptr);
  }
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  // `o` through the server in both modes: decode.npy, then prefill.npy.
  void AttendDecodeAndPrefill(AttendOptions o) const {
    o.server = server_->address();
    o.mode = "decode";
    o.out_path = Path("decode.npy");
    const absl::Status decoded = Attend(o);
    ASSERT_TRUE(decoded.ok()) << decoded;
    o.mode = "prefill";
    o.out_path = Path("prefill.npy");
    const absl::Status prefilled = Attend(o);
    ASSERT_TRUE(prefilled.ok()) << prefilled;
  }

  std::unique_ptr<testing::ServerProcess> server_;
  testing::TempDir dir_;
};

TEST_F(CliRemoteTest, AttendThroughServerSessions) {
  const AttentionSpec spec{
      .num_heads = 3, .key_dim = 8, .value_dim = 5, .epsilon = 0.0f};
  const uint64_t T = 150;
  const testing::Tokens data = testing::RandomTokens(spec, T, 21);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), {int64_t(T), 3, 8}, data.q.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("k.npy"), {int64_t(T), 3, 8}, data.k.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("v.npy"), {int64_t(T), 3, 5}, data.v.data()).ok());
  AttendOptions o;
  o.q_path = Path("q.npy");
  o.k_path = Path("k.npy");
  o.v_path = Path("v.npy");
  o.epsilon = 0.0f;
  AttendDecodeAndPrefill(o);

  // Decode equals the local recurrent step bit for bit; prefill matches the
  // reference within the fp32 bound.
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  testing::Outputs local(spec, T);
  ASSERT_TRUE(StepSequence(attention, state, data.input(), local.view()).ok());
  auto decoded = ReadNpy(Path("decode.npy"));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(0, std::memcmp(decoded->data.data(), local.output.data(),
                           local.output.size() * 4));
  auto prefilled = ReadNpy(Path("prefill.npy"));
  ASSERT_TRUE(prefilled.ok());
  const ReferenceResult ref = ReferenceAttention(attention, data.input());
  testing::Outputs via_prefill(spec, T);
  via_prefill.output = prefilled->data;
  via_prefill.available = local.available;
  for (size_t i = 0; i < via_prefill.denominator.size(); ++i) {
    via_prefill.denominator[i] = float(ref.denominator[i]);
  }
  testing::ExpectMatchesReference(attention, ref, via_prefill,
                                  "attend --mode prefill");

  o.mode = "prefill";
  o.out_path = Path("prefill.npy");
  o.server.clear();
  EXPECT_THAT(std::string(Attend(o).message()), HasSubstr("give --server"));
  o.server = server_->address();
  o.mode = "recurrent";
  EXPECT_THAT(std::string(Attend(o).message()), HasSubstr("computes locally"));
}

// A Decode stream the server ends early: the client ends its call too and
// reports the server's own status (not CANCELLED, not a silent success).
TEST_F(CliRemoteTest, DecodeStreamEndedByTheServerReportsItsStatus) {
  RemoteAttention remote(server_->address());
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  const testing::Tokens data = testing::RandomTokens(spec, 4, 3);
  std::vector<float> y(4 * 2), den(4);
  std::vector<uint8_t> available(4);
  const absl::Status s = remote.Decode(
      "no-such-session", spec, {data.q.data(), data.k.data(), data.v.data(), 4},
      {y.data(), den.data(), available.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("session_id"));
}

TEST_F(CliRemoteTest, ExplainThroughInspectMatchesLocal) {
  auto local = Explain({.prefix = 1});
  auto remote = ExplainOnServer({.prefix = 1}, server_->address());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->z, local->z);
  EXPECT_EQ(remote->s, local->s);
  EXPECT_EQ(remote->numerator, 5.0f);
  EXPECT_EQ(remote->denominator, 5.0f);
  EXPECT_EQ(remote->output, 1.0f);
  auto negative = ExplainOnServer({.preset = "negative", .feature_map = "relu"},
                                  server_->address());
  ASSERT_TRUE(negative.ok());
  EXPECT_FALSE(negative->available);
  // The maps whose state is more than 2-D (cosine) or kept with a log-scale
  // (FAVOR+): the server's state, read through Inspect, is the local one.
  for (const char* map : {"elu1", "relu", "cosine", "favor"}) {
    for (const char* preset : {"general", "negative"}) {
      auto here = Explain({.preset = preset, .feature_map = map});
      auto there = ExplainOnServer({.preset = preset, .feature_map = map},
                                   server_->address());
      ASSERT_TRUE(there.ok()) << map << " " << there.status();
      EXPECT_EQ(there->z, here->z) << map << " " << preset;
      EXPECT_EQ(there->s, here->s) << map << " " << preset;
      EXPECT_EQ(there->denominator, here->denominator) << map << " " << preset;
    }
  }
  // Identity runs premapped, which client sessions do not take.
  EXPECT_THAT(std::string(ExplainOnServer({.feature_map = "identity"},
                                          server_->address())
                              .status()
                              .message()),
              HasSubstr("feature_map"));
}

TEST_F(CliRemoteTest, HealthCommandExitCodes) {
  const std::string bin = LINATTN_BINARY;
  EXPECT_EQ(0, std::system((bin + " health --server " + server_->address() +
                            " > /dev/null")
                               .c_str()));
  EXPECT_NE(
      0, std::system(
             (bin + " health --server 127.0.0.1:1 --timeout 0.5 2> /dev/null")
                 .c_str()));
}

// Load runs of the gated, delta and RWKV rules, decode-only (bit for bit
// against the same steps locally) and after a prefill (within the rule's
// bound of the float64 recurrence), on Decode and DecodeBatch streams,
// through message fields and shared memory: every sampled session checked.
TEST_F(CliRemoteTest, LoadRunsOfEveryRuleVerify) {
  for (const std::string rule :
       {"gated", "delta", "gated_delta", "rwkv7", "rwkv6"}) {
    for (uint32_t prefill : {0u, 150u}) {
      LoadOptions o;
      o.server = server_->address();
      o.rule = rule;
      o.sessions = 8;
      o.steps = 40;
      o.prefill = prefill;
      o.batch = prefill == 0 ? 0 : 4;
      // Prefills' tensors as repeated fields, steps' as bytes.
      o.tensors_as_bytes = prefill == 0;
      o.duration_s = 120;
      o.progress = false;
      auto summary = RunLoad(o);
      ASSERT_TRUE(summary.ok()) << summary.status();
      EXPECT_TRUE(summary->ok()) << rule << "\n" << SummaryText(*summary, o);
      EXPECT_EQ(summary->verified_sessions, 8u) << rule;
      EXPECT_EQ(summary->mismatched_sessions, 0u) << rule;
      EXPECT_EQ(SummaryJson(*summary, o)["rule"], rule);
    }
  }
}

// A short verified load run, as CI runs it: 32 sessions × 200 steps, plus a
// run with a prefill first; every sampled session recomputed locally.
TEST_F(CliRemoteTest, LoadRunVerifiesSessions) {
  LoadOptions o;
  o.server = server_->address();
  o.sessions = 32;
  o.steps = 200;
  o.duration_s = 120;
  o.progress = false;
  auto summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 32u * 200);
  EXPECT_EQ(summary->verified_sessions, 8u);
  EXPECT_EQ(summary->mismatched_sessions, 0u);
  EXPECT_GT(summary->p99_us, 0);

  o.sessions = 6;
  o.steps = 50;
  o.prefill = 130;
  o.feature_map = "favor";
  o.concurrency = 3;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->prefill_tokens, 6u * 130);
  EXPECT_EQ(SummaryJson(*summary, o)["ok"], true);

  // Groups of sessions on DecodeBatch streams (the last group short), with
  // a prefill first and a verified sample spanning two groups.
  o.sessions = 10;
  o.batch = 4;
  o.concurrency = 2;
  o.feature_map = "elu1";
  o.steps = 40;
  o.prefill = 70;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 10u * 40);
  EXPECT_EQ(summary->prefill_tokens, 10u * 70);
  EXPECT_EQ(summary->verified_sessions, 8u);
  EXPECT_EQ(summary->mismatched_sessions, 0u);
  EXPECT_EQ(SummaryJson(*summary, o)["concurrency"], 2);
  o.concurrency = 0;  // one stream per group: 3
  EXPECT_EQ(Streams(o), 3u);
  o.prefill = 0;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 10u * 40);

  o.server = "192.168.1.1:50051";
  EXPECT_EQ(RunLoad(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.server = server_->address();
  // Every run deleted the sessions it created.
  RemoteAttention remote(server_->address());
  grpc::ClientContext ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(remote.stub().ListSessions(&ctx, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.2:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:1"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/run/linattn.sock"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3:1"));
}

// Every feature map linattn-load lists runs and verifies: cosine gets a
// horizon that covers the run, identity is unnormalised, and unnormalised
// outputs after a prefill are checked within their derived bound.
TEST_F(CliRemoteTest, LoadRunsEveryFeatureMapItLists) {
  for (const char* map : {"elu1", "relu", "favor", "cosine", "identity"}) {
    for (uint32_t prefill : {0u, 40u}) {
      LoadOptions o;
      o.server = server_->address();
      o.sessions = 4;
      o.steps = 20;
      o.prefill = prefill;
      o.heads = 2;
      o.dim = 16;
      o.feature_map = map;
      o.unnormalized = std::string(map) == "relu";
      o.progress = false;
      auto summary = RunLoad(o);
      ASSERT_TRUE(summary.ok()) << map << ": " << summary.status();
      EXPECT_TRUE(summary->ok()) << map << "\n" << SummaryText(*summary, o);
      EXPECT_EQ(summary->verified_sessions, 4u) << map;
      EXPECT_EQ(summary->mismatched_sessions, 0u) << map;
    }
  }
}

// --duration ends a timed run, which is not a failure; an open loop that
// cannot reach --rate says so.
TEST_F(CliRemoteTest, LoadDurationIsATimedRunAndAMissedRateIsReported) {
  LoadOptions o;
  o.server = server_->address();
  o.sessions = 4;
  o.steps = 1000000;
  o.heads = 2;
  o.dim = 16;
  o.duration_s = 1.0;
  o.progress = false;
  auto timed = RunLoad(o);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE(timed->ok()) << SummaryText(*timed, o);
  EXPECT_TRUE(timed->duration_reached);
  EXPECT_THAT(SummaryText(*timed, o), HasSubstr("a timed run"));

  o.steps = 2000;
  o.sessions = 2;
  o.rate = 1e9;  // far beyond what any machine sends through one stream
  auto missed = RunLoad(o);
  ASSERT_TRUE(missed.ok()) << missed.status();
  EXPECT_TRUE(missed->rate_missed);
  EXPECT_EQ(SummaryJson(*missed, o)["rate_missed"], true);
  EXPECT_THAT(SummaryText(*missed, o), HasSubstr("target rate was missed"));
}

// A load run that fails halfway through creating its sessions deletes the
// ones it made.
TEST(CliLoadCleanupTest, ARunThatFailsPartwayLeavesNoSessions) {
  auto server =
      testing::ServerProcess::Start({"--max-sessions", "3", "--model", "none"});
  ASSERT_NE(server, nullptr);
  LoadOptions o;
  o.server = server->address();
  o.sessions = 5;
  o.steps = 10;
  o.progress = false;
  const absl::StatusOr<LoadSummary> run = RunLoad(o);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted);
  RemoteAttention remote(server->address());
  grpc::ClientContext ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(remote.stub().ListSessions(&ctx, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);
}

// linattn-load --service generation: multi-turn model sessions, every
// reply of every session counted, greedy sessions replayed in process. The
// replay passes against the served model and finds the sessions of another
// model of the same shape; open loop and sampling run too.
TEST(GenerationLoadTest, ConversationsRunAndVerifyAgainstTheServedModel) {
  testing::TempDir dir;
  const nlohmann::json config = testing::SmallConfig();
  const std::string served = dir.Path("served"), other = dir.Path("other");
  testing::WriteRandomModel(served, config, 11);
  testing::WriteRandomModel(other, config, 12);
  auto server = testing::ServerProcess::Start({"--model", served});
  ASSERT_NE(server, nullptr);

  GenerationLoadOptions o;
  o.server = server->address();
  o.sessions = 6;
  o.turns = 3;
  o.turn_tokens = 5;
  o.reply_tokens = 12;
  o.verify = 6;
  o.verify_model_dir = served;
  auto summary = RunGenerationLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << summary->first_mismatch;
  EXPECT_EQ(summary->turns, 6u * 3u);
  // The small model has no EOS: every reply runs to max_tokens.
  EXPECT_EQ(summary->generated_tokens, 6u * 3u * 12u);
  EXPECT_EQ(summary->verified_sessions, 6u);
  EXPECT_GT(summary->tokens_per_second, 0.0);
  EXPECT_GT(summary->ttft_p50_ms, 0.0);
  EXPECT_GE(summary->ttft_p99_ms, summary->ttft_p50_ms);
  EXPECT_GE(summary->tbt_p99_ms, summary->tbt_p50_ms);

  o.verify_model_dir = other;
  summary = RunGenerationLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->verified_sessions, 6u);
  EXPECT_GT(summary->mismatched_sessions, 0u);
  EXPECT_THAT(summary->first_mismatch, HasSubstr("the server chose"));

  GenerationLoadOptions open = o;
  open.verify = 0;
  open.temperature = 0.8f;
  open.rate = 100;  // turns/s over all sessions
  summary = RunGenerationLoad(open);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok());
  EXPECT_EQ(summary->turns, 6u * 3u);
  EXPECT_EQ(GenerationSummaryJson(*summary, open)["mode"].get<std::string>(),
            "open");

  // Sampled sessions cannot be verified; the sessions of every run are gone.
  open.verify = 2;
  EXPECT_EQ(RunGenerationLoad(open).status().code(),
            absl::StatusCode::kInvalidArgument);
  GenerationLoadOptions many = o;
  many.sessions = kMaxGenerationSessions + 1;
  EXPECT_THAT(std::string(RunGenerationLoad(many).status().message()),
              HasSubstr("--sessions"));
  auto generation = v1::GenerationService::NewStub(server->Channel());
  grpc::ClientContext ctx;
  v1::ListModelSessionsResponse list;
  ASSERT_TRUE(generation->ListSessions(&ctx, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);
}

// A server running the model with bf16 weights and bf16 chunkwise products
// is verified by a replay told to run it alike (--verify-weights,
// --verify-prefill-precision).
TEST(GenerationLoadTest, VerifiesAServerRunningBf16) {
  if (!PrefillPrecisionSupported(PrefillPrecision::kBf16).ok()) {
    GTEST_SKIP() << "no native bf16 products here";
  }
  testing::TempDir dir;
  const std::string served = dir.Path("served");
  testing::WriteRandomModel(served, testing::SmallConfig(), 11);
  auto server = testing::ServerProcess::Start(
      {"--model", served, "--weights", "bf16", "--prefill-precision", "bf16"});
  ASSERT_NE(server, nullptr);
  GenerationLoadOptions o;
  o.server = server->address();
  o.sessions = 4;
  o.turns = 2;
  o.turn_tokens = 70;  // past one chunk of the chunkwise prefill
  o.reply_tokens = 8;
  o.verify = 4;
  o.verify_model_dir = served;
  o.verify_weights = WeightType::kBf16;
  o.verify_prefill_precision = PrefillPrecision::kBf16;
  auto summary = RunGenerationLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << summary->first_mismatch;
  EXPECT_EQ(summary->verified_sessions, 4u);
}

// `linattn sessions` lists both services' sessions and deletes them by id
// (the way to remove what `generate --keep` kept); unknown commands and
// attend --server without --mode behave.
TEST(CliSessionsTest, ListAndDeleteSessionsOfBothServices) {
  auto server =
      testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR});
  ASSERT_NE(server, nullptr);
  testing::TempDir dir;
  const std::string bin = LINATTN_BINARY;
  const std::string kept = dir.Path("kept.txt");
  ASSERT_EQ(0, std::system((bin + " generate --server " + server->address() +
                            " --keep --max-tokens 3 hi > /dev/null 2> " + kept)
                               .c_str()));
  std::ifstream in(kept);
  std::string word, model_session;
  in >> word >> model_session;
  ASSERT_EQ(word, "session");
  RemoteAttention remote(server->address());
  auto attention_session = remote.CreateSession(
      AttentionSpec{.num_heads = 1, .key_dim = 2, .value_dim = 2},
      std::nullopt);
  ASSERT_TRUE(attention_session.ok());

  const std::string listed = dir.Path("list.json");
  ASSERT_EQ(0, std::system((bin + " sessions list --json --server " +
                            server->address() + " > " + listed)
                               .c_str()));
  std::ifstream list_in(listed);
  const nlohmann::json list = nlohmann::json::parse(list_in);
  ASSERT_EQ(list.size(), 2u);
  std::set<std::string> ids;
  for (const auto& entry : list) ids.insert(entry["session_id"]);
  EXPECT_TRUE(ids.count(model_session));
  EXPECT_TRUE(ids.count(attention_session->session_id()));

  EXPECT_EQ(0, std::system((bin + " sessions delete --server " +
                            server->address() + " " + model_session + " " +
                            attention_session->session_id() + " > /dev/null")
                               .c_str()));
  const int again =
      std::system((bin + " sessions delete --server " + server->address() +
                   " " + model_session + " > /dev/null 2>&1")
                      .c_str());
  EXPECT_EQ(WEXITSTATUS(again), 1);
  ASSERT_EQ(0, std::system((bin + " sessions list --json --server " +
                            server->address() + " > " + listed)
                               .c_str()));
  std::ifstream empty_in(listed);
  EXPECT_EQ(nlohmann::json::parse(empty_in).size(), 0u);

  const int unknown =
      std::system((bin + " bogus > /dev/null 2> " + kept).c_str());
  EXPECT_EQ(WEXITSTATUS(unknown), 2);
  std::ifstream unknown_in(kept);
  std::string said((std::istreambuf_iterator<char>(unknown_in)), {});
  EXPECT_THAT(said, HasSubstr("unknown command 'bogus'"));
}

// Every command that talks to a server finds one without --server: the
// address in LINATTN_SERVER, else 127.0.0.1:50051 (the server `make run`
// starts), as redis-cli and psql find theirs.
TEST(CliServerDefaultTest, CommandsTalkToLinattnServerOrTheMakeRunAddress) {
  auto server =
      testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR});
  ASSERT_NE(server, nullptr);
  testing::TempDir dir;
  const std::string bin = LINATTN_BINARY;
  const std::string env = "LINATTN_SERVER=" + server->address() + " ";
  auto run = [&](const std::string& command) {
    const int status =
        std::system((command + " > " + dir.Path("out") + " 2>&1").c_str());
    std::ifstream in(dir.Path("out"));
    return std::make_pair(
        WEXITSTATUS(status),
        std::string((std::istreambuf_iterator<char>(in)), {}));
  };
  auto [health, said] = run(env + bin + " health");
  EXPECT_EQ(health, 0) << said;
  EXPECT_THAT(said, HasSubstr("SERVING"));
  auto [generated, text] =
      run(env + bin + " generate --max-tokens 8 --temperature 0 Amen");
  EXPECT_EQ(generated, 0) << text;
  EXPECT_FALSE(text.empty());
  auto [listed, list] = run(env + bin + " sessions list --json");
  EXPECT_EQ(listed, 0) << list;
  auto [loaded, summary] =
      run(env + LINATTN_LOAD_BINARY + " --sessions 2 --steps 5 --no-progress");
  EXPECT_EQ(loaded, 0) << summary;
  EXPECT_THAT(summary, HasSubstr(server->address()));
  // A flag still wins over the environment.
  auto [flagged, refused] =
      run("LINATTN_SERVER=127.0.0.1:1 " + bin +
          " health --timeout 0.5 --server " + server->address());
  EXPECT_EQ(flagged, 0) << refused;
  // Without either: the make-run address, said in --help and in the error.
  for (const char* command :
       {" health", " generate", " sessions list", " sessions delete"}) {
    auto [code, help] =
        run("env -u LINATTN_SERVER " + bin + command + " --help");
    EXPECT_EQ(code, 0) << command;
    EXPECT_THAT(help, HasSubstr("127.0.0.1:50051")) << command;
    EXPECT_THAT(help, HasSubstr("LINATTN_SERVER")) << command;
  }
  // (Whether something serves there or not, it is not a usage error.)
  auto [unset, message] =
      run("env -u LINATTN_SERVER " + bin + " health --timeout 0.5");
  EXPECT_NE(unset, 2) << message;
  EXPECT_THAT(message, Not(HasSubstr("required")));
}

// `linattn attend --rule … --server`: Decode through the server equals the
// local recurrent order bit for bit, Prefill the reference within its bound.
TEST_F(CliRemoteTest, AttendWithARuleThroughTheServer) {
  AttentionSpec spec{.rule = UpdateRule::kGatedDelta,
                     .num_heads = 2,
                     .key_dim = 8,
                     .value_dim = 8,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  spec.qk_l2norm = true;
  const int64_t T = 40;
  const testing::RuleTokens data = testing::RandomRuleTokens(spec, T, 12, {});
  ASSERT_TRUE(WriteNpy(Path("q.npy"), {T, 2, 8}, data.q.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("k.npy"), {T, 2, 8}, data.k.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("v.npy"), {T, 2, 8}, data.v.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("g.npy"), {T, 2}, data.g.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("beta.npy"), {T, 2}, data.beta.data()).ok());
  AttendOptions o;
  o.q_path = Path("q.npy");
  o.k_path = Path("k.npy");
  o.v_path = Path("v.npy");
  o.g_path = Path("g.npy");
  o.beta_path = Path("beta.npy");
  o.rule = "gated_delta";
  o.qk_l2norm = true;
  AttendDecodeAndPrefill(o);
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  testing::Outputs local(spec, T);
  ASSERT_TRUE(StepSequence(attention, state, data.input(), local.view()).ok());
  auto decoded = ReadNpy(Path("decode.npy"));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->data, local.output);
  auto prefilled = ReadNpy(Path("prefill.npy"));
  ASSERT_TRUE(prefilled.ok());
  testing::Outputs got(spec, T);
  got.output = prefilled->data;
  std::fill(got.available.begin(), got.available.end(), 1);
  testing::ExpectRuleMatchesReference(spec, data,
                                      ReferenceRule(spec, data.input()), got,
                                      64, "attend --rule gated_delta, prefill");
}

TEST_F(CliRemoteTest, AttendWithAServerAndNoModePrefills) {
  const AttentionSpec spec{.num_heads = 2, .key_dim = 4, .value_dim = 3};
  const testing::Tokens data = testing::RandomTokens(spec, 20, 5);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), {20, 2, 4}, data.q.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("k.npy"), {20, 2, 4}, data.k.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("v.npy"), {20, 2, 3}, data.v.data()).ok());
  AttendOptions o;
  o.q_path = Path("q.npy");
  o.k_path = Path("k.npy");
  o.v_path = Path("v.npy");
  o.out_path = Path("y.npy");
  o.server = server_->address();
  const absl::Status s = Attend(o);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace linattn
