// Durable sessions with real server processes on 127.0.0.1: kill -9 at a
// random moment under load, restart, and every session is at least at its
// last acknowledged step with exactly the state a local recomputation gives
// (attention sessions) or continues exactly as an uncrashed twin (model
// sessions); a full disk fails the step with RESOURCE_EXHAUSTED and loses
// nothing acknowledged; a damaged snapshot file stops the start naming it.
// (tools/crash_check.sh runs the attention rounds as one command; ctest runs
// it too.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "clients/load/load.h"
#include "core/scheduler/generation.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadLog(const std::string& path) { return testing::ReadFile(path); }

LoadOptions CrashLoad(const testing::ServerProcess& server,
                      const std::string& ledger) {
  LoadOptions o;
  o.server = server.address();
  o.sessions = 8;
  o.steps = 1'000'000;  // until the server goes
  o.duration_s = 20;
  o.verify = 2;
  o.progress = false;
  o.session_prefix = "crash";
  o.ledger = ledger;
  return o;
}

TEST(DurableSessions, AttentionSessionsSurviveKillNineAtRandomMoments) {
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  const std::string ledger = tmp.Path("ledger.json");
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3; ++round) {
    auto server = testing::ServerProcess::Start(
        {"--state-dir", state, "--model", "none"}, tmp.Path("server.log"));
    ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
    LoadOptions o = CrashLoad(*server, ledger);
    if (round > 0) {
      auto check = CheckLedger(o);
      ASSERT_TRUE(check.ok()) << check.status();
      EXPECT_TRUE(check->ok()) << LedgerCheckText(*check);
      EXPECT_EQ(check->sessions, 8u);
    }
    o.batch = round == 1 ? 4 : 0;  // DecodeBatch groups in one round
    const int kill_after_ms =
        std::uniform_int_distribution<int>(200, 1200)(rng);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
      server->Kill();
    });
    auto summary = RunLoad(o);
    killer.join();
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_GT(summary->steps, 0u) << "killed after " << kill_after_ms << " ms";
    EXPECT_EQ(summary->mismatched_sessions, 0u);
  }
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", "none"}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  auto check = CheckLedger(CrashLoad(*server, ledger));
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE(check->ok()) << LedgerCheckText(*check);
  EXPECT_GE(check->recovered, check->acknowledged);
}

std::vector<int32_t> Bytes(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());
}

// Greedy tokens from an in-process engine (the uncrashed twin).
std::vector<int32_t> TwinGreedy(GenerationEngine& engine, const std::string& id,
                                uint32_t max_tokens) {
  std::promise<std::vector<int32_t>> done;
  auto ids = std::make_shared<std::vector<int32_t>>();
  engine.Generate(id, {}, SamplingParams{.max_tokens = max_tokens},
                  [&, ids](const GenerateEvent& e) {
                    if (e.token_id >= 0) ids->push_back(e.token_id);
                    if (e.finished) done.set_value(*ids);
                  });
  return done.get_future().get();
}

// Greedy tokens streamed by the server; stops at the end of the stream.
std::vector<int32_t> ServerGreedy(v1::GenerationService::Stub& generation,
                                  const std::string& id,
                                  const std::vector<int32_t>& prompt,
                                  uint32_t max_tokens, grpc::Status* status) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id(id);
  req.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(max_tokens);
  auto reader = generation.Generate(&ctx, req);
  std::vector<int32_t> ids;
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    if (r.token_id() >= 0) ids.push_back(r.token_id());
  }
  *status = reader->Finish();
  return ids;
}

TEST(DurableSessions, ModelSessionsContinueAsAnUncrashedTwinAfterKillNine) {
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  const std::vector<std::string> prompts = {"In the beginning", "And God said",
                                            "The LORD is my shepherd",
                                            "Blessed are the meek"};
  std::vector<std::vector<int32_t>> received(prompts.size());
  {
    auto server = testing::ServerProcess::Start(
        {"--state-dir", state, "--model", LINATTN_BUILTIN_MODEL_DIR},
        tmp.Path("server.log"));
    ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
    auto generation = v1::GenerationService::NewStub(server->Channel());
    for (size_t i = 0; i < prompts.size(); ++i) {
      grpc::ClientContext ctx;
      v1::CreateModelSessionRequest req;
      req.set_session_id("m" + std::to_string(i));
      v1::ModelSession s;
      ASSERT_TRUE(generation->CreateSession(&ctx, req, &s).ok());
    }
    std::vector<std::thread> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      streams.emplace_back([&, i] {
        grpc::Status status;
        received[i] = ServerGreedy(*generation, "m" + std::to_string(i),
                                   Bytes(prompts[i]), 100'000, &status);
      });
    }
    std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::uniform_int_distribution<int>(300, 1200)(rng)));
    server->Kill();
    for (auto& t : streams) t.join();
  }
  size_t tokens = 0;
  for (const auto& r : received) tokens += r.size();
  ASSERT_GT(tokens, 0u) << "the server was killed before any token came";
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", LINATTN_BUILTIN_MODEL_DIR},
      tmp.Path("server2.log"));
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server2.log"));
  auto generation = v1::GenerationService::NewStub(server->Channel());
  GenerationEngine twins({Model::Load(LINATTN_BUILTIN_MODEL_DIR).value()});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "m" + std::to_string(i);
    grpc::ClientContext ctx;
    v1::GetModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession recovered;
    ASSERT_TRUE(generation->GetSession(&ctx, req, &recovered).ok()) << id;
    // What the client was told: the prompt and every token it received.
    std::vector<int32_t> context = Bytes(prompts[i]);
    if (received[i].empty()) {
      // Nothing came back: the prompt may or may not have joined.
      EXPECT_TRUE(recovered.position() == 0 ||
                  recovered.position() > context.size())
          << id << " at " << recovered.position();
      if (recovered.position() == 0) continue;
    }
    context.insert(context.end(), received[i].begin(), received[i].end());
    ASSERT_GE(recovered.position(), context.size())
        << id << ": an acknowledged token is lost";
    // The twin: the same context, uncrashed; tokens the server recorded but
    // did not deliver were its greedy continuation.
    ASSERT_TRUE(twins.CreateSession("", id).ok());
    std::promise<absl::StatusCode> appended;
    twins.Append(id, context, [&](absl::StatusOr<ModelSessionInfo> r) {
      appended.set_value(r.status().code());
    });
    ASSERT_EQ(appended.get_future().get(), absl::StatusCode::kOk);
    const uint64_t extra = recovered.position() - context.size();
    if (extra > 0) TwinGreedy(twins, id, static_cast<uint32_t>(extra));
    grpc::Status status;
    const std::vector<int32_t> next =
        ServerGreedy(*generation, id, {}, 16, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(next, TwinGreedy(twins, id, 16))
        << id << " (" << received[i].size() << " tokens received, " << extra
        << " recorded beyond them)";
    std::cout << id << ": " << received[i].size() << " tokens received, "
              << extra << " recorded beyond them\n";
  }
}

// `make run` (scripts/run-server.sh) keeps sessions in the user's state
// directory: attention sessions with their acknowledged steps and model
// sessions with their contexts are all there after kill -9; a second server
// on the same directory is refused naming the flag; --state-dir none keeps
// sessions in memory only.
TEST(DurableSessions, MakeRunKeepsSessionsInTheUsersStateDirAcrossKillNine) {
  testing::TempDir tmp;
  const std::string xdg = tmp.Path("xdg");
  auto start = [&](std::vector<std::string> flags, const std::string& log) {
    flags.insert(flags.end(), {"--model", LINATTN_BUILTIN_MODEL_DIR});
    return testing::ServerProcess::Start(
        flags, log,
        {"/usr/bin/env", "-u", "LINATTN_STATE_DIR", "XDG_STATE_HOME=" + xdg,
         "/bin/bash", LINATTN_SOURCE_DIR "/scripts/run-server.sh"});
  };
  const std::string ledger = tmp.Path("ledger.json");
  auto server = start({}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
  LoadOptions o = CrashLoad(*server, ledger);
  o.sessions = 20;
  o.steps = 50;
  auto summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->steps, 1000u);
  const std::string text = "Honour thy father and thy mother";
  std::map<std::string, uint64_t> positions;
  {
    auto generation = v1::GenerationService::NewStub(server->Channel());
    for (int i = 0; i < 5; ++i) {
      const std::string id = "m" + std::to_string(i);
      grpc::ClientContext create_ctx;
      v1::CreateModelSessionRequest create;
      create.set_session_id(id);
      v1::ModelSession s;
      ASSERT_TRUE(generation->CreateSession(&create_ctx, create, &s).ok());
      grpc::ClientContext ctx;
      v1::AppendRequest req;
      req.set_session_id(id);
      req.set_text(text.substr(0, 10 + 4 * i));
      ASSERT_TRUE(generation->Append(&ctx, req, &s).ok());
      positions[id] = s.position();
    }
  }
  EXPECT_TRUE(std::filesystem::exists(xdg + "/linattn/lock"));
  EXPECT_THAT(ReadLog(tmp.Path("server.log")),
              Not(HasSubstr("sessions live in memory only")));

  // One server per directory: the second is refused, saying what to give.
  auto second = start({}, tmp.Path("second.log"));
  EXPECT_EQ(second, nullptr);
  EXPECT_THAT(ReadLog(tmp.Path("second.log")),
              HasSubstr("is in use by another linattn-server"));
  EXPECT_THAT(ReadLog(tmp.Path("second.log")), HasSubstr("--state-dir"));

  server->Kill();
  server = start({}, tmp.Path("server2.log"));
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server2.log"));
  auto check = CheckLedger(CrashLoad(*server, ledger));
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE(check->ok()) << LedgerCheckText(*check);
  EXPECT_EQ(check->sessions, 20u);
  auto generation = v1::GenerationService::NewStub(server->Channel());
  for (const auto& [id, position] : positions) {
    grpc::ClientContext ctx;
    v1::GetModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession recovered;
    ASSERT_TRUE(generation->GetSession(&ctx, req, &recovered).ok()) << id;
    EXPECT_EQ(recovered.position(), position) << id;
  }
  server.reset();

  // --state-dir none: memory only, nothing of the directory is read.
  server = start({"--state-dir", "none"}, tmp.Path("server3.log"));
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server3.log"));
  generation = v1::GenerationService::NewStub(server->Channel());
  grpc::ClientContext ctx;
  v1::GetModelSessionRequest req;
  req.set_session_id("m0");
  v1::ModelSession gone;
  EXPECT_EQ(generation->GetSession(&ctx, req, &gone).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(ReadLog(tmp.Path("server3.log")),
              HasSubstr("sessions live in memory only"));
}

TEST(DurableSessions, AFullDiskFailsStepsAndLosesNothingAcknowledged) {
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  const std::string ledger = tmp.Path("ledger.json");
  {
    // Files of the state dir may not grow past 1 MiB: the journal segment
    // fills after some 150 steps.
    auto server = testing::ServerProcess::Start(
        {"--state-dir", state, "--model", "none"}, tmp.Path("server.log"),
        {"/usr/bin/prlimit", "--fsize=1048576"});
    ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
    LoadOptions o = CrashLoad(*server, ledger);
    o.sessions = 4;
    o.steps = 1000;
    auto summary = RunLoad(o);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_GT(summary->errors["RESOURCE_EXHAUSTED"], 0u)
        << SummaryText(*summary, o);
    EXPECT_GT(summary->steps, 10u);
    EXPECT_LT(summary->steps, 4000u);
    EXPECT_EQ(summary->mismatched_sessions, 0u);
    // Still serving, with exactly what was acknowledged.
    auto check = CheckLedger(o);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_TRUE(check->ok()) << LedgerCheckText(*check);
    EXPECT_EQ(check->recovered, check->acknowledged);
    server->Kill();
  }
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", "none"}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
  auto check = CheckLedger(CrashLoad(*server, ledger));
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE(check->ok()) << LedgerCheckText(*check);
  EXPECT_EQ(check->recovered, check->acknowledged);
}

// A Generate stream whose token cannot be recorded (the disk is full) ends
// with RESOURCE_EXHAUSTED, and the session's next request is served: the
// stream's last message carries no token, so nothing waits for its
// delivery.
TEST(DurableSessions, AGenerateEndedByAFullDiskLeavesItsSessionServed) {
  testing::TempDir tmp;
  auto server = testing::ServerProcess::Start(
      {"--state-dir", tmp.Path("state")}, tmp.Path("server.log"),
      {"/usr/bin/prlimit", "--fsize=400000"});
  ASSERT_NE(server, nullptr) << ReadLog(tmp.Path("server.log"));
  auto stub = v1::GenerationService::NewStub(server->Channel());
  {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest create;
    create.set_session_id("full");
    v1::ModelSession session;
    ASSERT_TRUE(stub->CreateSession(&ctx, create, &session).ok());
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(120));
  v1::GenerateRequest req;
  req.set_session_id("full");
  req.set_prompt("And");
  req.mutable_sampling()->set_max_tokens(1 << 20);
  req.mutable_sampling()->set_temperature(0.8f);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse m;
  uint64_t tokens = 0;
  while (reader->Read(&m)) tokens++;
  const grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << ended.error_message();
  EXPECT_GT(tokens, 10u);
  grpc::ClientContext next;
  next.set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
  v1::SnapshotModelSessionRequest snap;
  snap.set_session_id("full");
  v1::SnapshotModelSessionResponse bytes;
  const grpc::Status s = stub->Snapshot(&next, snap, &bytes);
  EXPECT_TRUE(s.ok()) << s.error_message()
                      << " (the session's queue is stuck behind the stream)";
  server->Kill();
}

// A state dir of `sessions` attention sessions (crash-0, crash-1, …) after
// a clean shutdown: the drain writes every session's snapshot file.
void StateDirAfterCleanShutdown(testing::TempDir& tmp, const std::string& state,
                                uint32_t sessions, uint32_t steps) {
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", "none"}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  LoadOptions o = CrashLoad(*server, tmp.Path("ledger.json"));
  o.sessions = sessions;
  o.steps = steps;
  auto summary = RunLoad(o);
  ASSERT_TRUE(summary.ok() && summary->ok());
  EXPECT_EQ(server->Stop(std::chrono::seconds(20)), 0);
}

TEST(DurableSessions, ADamagedSnapshotFileStopsTheStartNamingIt) {
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  ASSERT_NO_FATAL_FAILURE(StateDirAfterCleanShutdown(tmp, state, 2, 20));
  const std::string file = state + "/sessions/session-crash-1.snap";
  ASSERT_TRUE(std::filesystem::exists(file));
  std::string bytes = testing::ReadFile(file);
  bytes[bytes.size() / 2] ^= 0x40;
  testing::WriteFile(file, bytes);
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", "none"}, tmp.Path("refused.log"));
  EXPECT_EQ(server, nullptr) << "a damaged state dir must not be served";
  const std::string log = ReadLog(tmp.Path("refused.log"));
  EXPECT_THAT(log, HasSubstr(file));
  EXPECT_THAT(log, HasSubstr("checksum"));
}

// After a clean shutdown every session lives in its snapshot file alone
// (the journal is compacted): one deleted by hand is named at the start,
// from the manifest, instead of the session silently missing.
TEST(DurableSessions, AMissingSnapshotFileStopsTheStartNamingIt) {
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  ASSERT_NO_FATAL_FAILURE(StateDirAfterCleanShutdown(tmp, state, 3, 10));
  const std::string file = state + "/sessions/session-crash-1.snap";
  ASSERT_TRUE(std::filesystem::remove(file));
  auto server = testing::ServerProcess::Start(
      {"--state-dir", state, "--model", "none"}, tmp.Path("refused.log"));
  EXPECT_EQ(server, nullptr) << "a state dir missing a session was served";
  const std::string log = ReadLog(tmp.Path("refused.log"));
  EXPECT_THAT(log, HasSubstr("session 'crash-1'"));
  EXPECT_THAT(log, HasSubstr(file + " is missing"));
}

}  // namespace
}  // namespace linattn
