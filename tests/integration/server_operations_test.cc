// linattn-server as an operator meets it: the --listen address, a port that
// is taken, --version, JSON logs, and the drain on SIGTERM (health, refused
// calls, streams that outlive the grace period, a second signal).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "clients/load/load.h"
#include "grpc_health/v1/health.grpc.pb.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/listen_address.h"
#include "tests/integration/http_call.h"
#include "tests/integration/server_process.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs `command` (bounded by `timeout`), its output to `log`; the exit code.
int RunCommand(const std::string& command, const std::string& log) {
  const int status =
      std::system(("timeout 20 " + command + " > " + log + " 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Whether the server answers a health check.
bool Answers(const ServerProcess& server) {
  auto health = grpc::health::v1::Health::NewStub(server.Channel());
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  return health->Check(&ctx, {}, &resp).ok();
}

TEST(ServerListenTest, AnythingButHostAndPortIsRefusedNamingTheFlag) {
  testing::TempDir tmp;
  for (const char* listen :
       {"127.0.0.1:99999", "0.0.0.0", "127.0.0.1:", "127.0.0.1:5x", ":50051",
        "::1:50051", "unix:", "unix:relative/path.sock", "127.0.0.1:-1",
        "unix:/tmp/a-path-longer-than-a-unix-socket-address-holds/"
        "0123456789012345678901234567890123456789012345678901234567.sock"}) {
    const std::string log = tmp.Path("log");
    EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) + " --model none " +
                             "--listen '" + listen + "'",
                         log),
              2)
        << listen;
    EXPECT_THAT(ReadFile(log), HasSubstr("--listen")) << listen;
  }
}

TEST(ServerListenTest, APortAnotherServerListensOnIsRefused) {
  auto first = ServerProcess::Start({"--model", "none"});
  ASSERT_NE(first, nullptr);
  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) +
                           " --model none --http-listen none --listen " +
                           first->address(),
                       log),
            1);
  EXPECT_THAT(ReadFile(log), HasSubstr("already in use"));
  // The first server still has the port to itself and answers.
  EXPECT_TRUE(Answers(*first));
}

// Servers started side by side on their own --listen ports, without
// --http-listen, get their own HTTP ports (8080 + P − 50051; a free one for
// port 0) instead of the second failing on the first's 8080; an HTTP port
// that is taken stops the start naming the flag to give.
TEST(ServerListenTest, ServersSideBySideGetTheirOwnHttpPorts) {
  auto free_port = [](uint32_t port) {
    auto address = ParseListenAddress(absl::StrCat("127.0.0.1:", port), "");
    return address.ok() && CheckCanListen(*address, "").ok();
  };
  std::mt19937 rng(std::random_device{}());
  uint32_t grpc = 0;
  for (int attempt = 0; attempt < 100 && grpc == 0; ++attempt) {
    const uint32_t p =
        std::uniform_int_distribution<uint32_t>(52000, 57000)(rng);
    const uint32_t http = 8080 + (p - 50051);
    if (free_port(p) && free_port(p + 1) && free_port(http) &&
        free_port(http + 1)) {
      grpc = p;
    }
  }
  ASSERT_NE(grpc, 0u) << "no free pair of ports found";
  const int http = static_cast<int>(8080 + (grpc - 50051));
  auto first = ServerProcess::StartOn(absl::StrCat("127.0.0.1:", grpc),
                                      {"--model", "none"}, "", {},
                                      /*default_http=*/true);
  ASSERT_NE(first, nullptr);
  auto second = ServerProcess::StartOn(absl::StrCat("127.0.0.1:", grpc + 1),
                                       {"--model", "none"}, "", {},
                                       /*default_http=*/true);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->http_port(), http);
  EXPECT_EQ(second->http_port(), http + 1);
  EXPECT_EQ(testing::HttpCall(first->http_port(), "GET", "/health").status,
            200);
  EXPECT_EQ(testing::HttpCall(second->http_port(), "GET", "/health").status,
            200);
  auto ephemeral = ServerProcess::StartOn("127.0.0.1:0", {"--model", "none"},
                                          "", {}, /*default_http=*/true);
  ASSERT_NE(ephemeral, nullptr);
  EXPECT_GT(ephemeral->http_port(), 0);
  EXPECT_NE(ephemeral->http_port(), 8080);

  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) +
                           " --model none --listen 127.0.0.1:0 --http-listen "
                           "127.0.0.1:" +
                           std::to_string(http),
                       log),
            1);
  EXPECT_THAT(ReadFile(log),
              HasSubstr("is already in use (is another linattn-server running "
                        "there? give this one its own --http-listen"));
}

// `linattn generate`'s greedy text from the server at `address`.
std::string GreedyText(const std::string& address, const std::string& log) {
  EXPECT_EQ(
      RunCommand(std::string(LINATTN_BINARY) + " generate --server " + address +
                     " --temperature 0 --repeat-penalty 1 "
                     "--max-tokens 24 'And God said'",
                 log),
      0)
      << ReadFile(log);
  return ReadFile(log);
}

// --listen unix:PATH serves both services to clients on this machine: the
// load tool's verified sessions and the CLI's text are what a TCP listener
// gives, and a clean stop removes the socket's file.
TEST(ServerListenTest, AUnixSocketServesBothServicesAndGoesAwayOnStop) {
  testing::TempDir tmp;
  const std::string path = tmp.Path("linattn.sock");
  auto server =
      ServerProcess::StartOn("unix:" + path, {"--http-listen", "none"});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->address(), "unix:" + path);
  EXPECT_TRUE(std::filesystem::is_socket(path));

  LoadOptions o;
  o.server = server->address();
  o.sessions = 8;
  o.steps = 30;
  o.prefill = 40;
  o.batch = 4;
  o.duration_s = 120;
  o.progress = false;
  auto summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok());
  EXPECT_EQ(summary->verified_sessions, 8u);
  EXPECT_EQ(summary->steps, 8u * 30u);

  auto tcp = ServerProcess::Start({"--http-listen", "none"});
  ASSERT_NE(tcp, nullptr);
  const std::string over_unix = GreedyText(server->address(), tmp.Path("a"));
  EXPECT_FALSE(over_unix.empty());
  EXPECT_EQ(over_unix, GreedyText(tcp->address(), tmp.Path("b")));

  EXPECT_EQ(server->Stop(std::chrono::seconds(20)), 0);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A unix path a live server accepts on is refused (gRPC alone would remove
// its file and take the path over); one left by a killed server is taken;
// a path that is not a socket is refused and left as it was.
TEST(ServerListenTest, AUnixPathIsTakenOnlyFromNobody) {
  testing::TempDir tmp;
  const std::string path = tmp.Path("linattn.sock");
  const std::string log = tmp.Path("log");
  auto first = ServerProcess::StartOn(
      "unix:" + path, {"--model", "none", "--http-listen", "none"});
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(
      RunCommand(std::string(LINATTN_SERVER_BINARY) +
                     " --model none --http-listen none --listen unix:" + path,
                 log),
      1);
  EXPECT_THAT(ReadFile(log), HasSubstr("already in use"));
  EXPECT_TRUE(Answers(*first));

  first->Kill();  // its socket file stays, with nobody behind it
  ASSERT_TRUE(std::filesystem::is_socket(path));
  auto second = ServerProcess::StartOn(
      "unix:" + path, {"--model", "none", "--http-listen", "none"});
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(Answers(*second));
  second->Stop(std::chrono::seconds(20));

  const std::string file = tmp.Path("not-a-socket");
  std::ofstream(file) << "keep me";
  EXPECT_EQ(
      RunCommand(std::string(LINATTN_SERVER_BINARY) +
                     " --model none --http-listen none --listen unix:" + file,
                 log),
      1);
  EXPECT_THAT(ReadFile(log), HasSubstr("is not a socket"));
  EXPECT_EQ(ReadFile(file), "keep me");

  // Only --listen serves a unix socket.
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) +
                           " --model none --listen 127.0.0.1:0 --http-listen "
                           "unix:" +
                           tmp.Path("http.sock"),
                       log),
            1);
  EXPECT_THAT(ReadFile(log), HasSubstr("--http-listen"));
}

// A model whose sessions could never be snapshotted in one message stops
// the start, naming the flag, instead of failing every Snapshot later.
TEST(ServerListenTest, AModelWhoseSnapshotsCannotBeSentIsRefusedAtStart) {
  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) +
                           " --listen 127.0.0.1:0 --http-listen none "
                           "--max-message-bytes 65536",
                       log),
            1);
  EXPECT_THAT(ReadFile(log), HasSubstr("--max-message-bytes: 65536"));
  EXPECT_THAT(ReadFile(log), HasSubstr("model 'tiny'"));
}

TEST(ServerFlagsTest, EveryProgramTellsItsVersion) {
  testing::TempDir tmp;
  for (const char* program :
       {LINATTN_SERVER_BINARY, LINATTN_BINARY, LINATTN_LOAD_BINARY}) {
    const std::string log = tmp.Path("log");
    EXPECT_EQ(RunCommand(std::string(program) + " --version", log), 0)
        << program;
    EXPECT_THAT(ReadFile(log), HasSubstr(LINATTN_VERSION)) << program;
  }
}

TEST(ServerFlagsTest, SizesTakeTheUsualUnitsAndNonsenseIsNamed) {
  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  auto ok = ServerProcess::Start(
      {"--model", "none", "--max-state-memory", "4G", "--log-level", "info"},
      log);
  ASSERT_NE(ok, nullptr);
  ok->Stop(std::chrono::seconds(10));
  EXPECT_THAT(ReadFile(log), HasSubstr("max state memory 4 GiB"));
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) +
                           " --model none --max-state-memory 4X",
                       log),
            2);
  EXPECT_THAT(ReadFile(log), HasSubstr("--max-state-memory"));
  EXPECT_EQ(RunCommand(std::string(LINATTN_BINARY) +
                           " generate --server 127.0.0.1:1 --temperature -1 hi",
                       log),
            2);
  EXPECT_THAT(ReadFile(log), HasSubstr("--temperature: must be ≥ 0"));
  EXPECT_LT(ReadFile(log).size(), 200u);  // no 300-digit bound
}

// Every line of --log-json is one JSON object, whatever the message holds
// (here a model directory whose name has a quote and a backslash).
TEST(ServerLogTest, JsonLinesStayJsonAndTheSummaryCountsGeneration) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("model \"quoted\" \\ dir");
  const nlohmann::json config = testing::SmallConfig();
  testing::WriteModel(dir, config, testing::OneTokenModelTensors(config, 'a'));
  const std::string log = tmp.Path("log");
  auto server = ServerProcess::Start(
      {"--model", dir, "--log-json", "--log-level", "info"}, log);
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  {
    grpc::ClientContext ctx;
    v1::ModelSession s;
    ASSERT_TRUE(stub->CreateSession(&ctx, {}, &s).ok());
    grpc::ClientContext gen_ctx;
    v1::GenerateRequest req;
    req.set_session_id(s.session_id());
    req.set_prompt("abc");
    req.mutable_sampling()->set_max_tokens(7);
    auto reader = stub->Generate(&gen_ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_EQ(server->Stop(std::chrono::seconds(10)), 0);
  std::istringstream lines(ReadFile(log));
  std::string line, all_messages;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    if (j.at("logger") == "access") continue;  // fields, no message
    all_messages += j.at("msg").get<std::string>() + "\n";
  }
  EXPECT_GE(n, 3);
  EXPECT_THAT(all_messages, HasSubstr(dir));
  EXPECT_THAT(all_messages, HasSubstr("1 generate"));
  EXPECT_THAT(all_messages, HasSubstr("3 prompt tokens, 7 tokens generated"));
}

class DrainTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& grace) {
    server_ = ServerProcess::Start(
        {"--model", LINATTN_BUILTIN_MODEL_DIR, "--grace-period", grace});
    ASSERT_NE(server_, nullptr);
    gen_ = v1::GenerationService::NewStub(server_->Channel());
  }

  // A Generate that would run for minutes, with two messages read.
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> LongGenerate(
      grpc::ClientContext* ctx) {
    grpc::ClientContext create_ctx;
    v1::ModelSession s;
    EXPECT_TRUE(gen_->CreateSession(&create_ctx, {}, &s).ok());
    v1::GenerateRequest req;
    req.set_session_id(s.session_id());
    req.set_prompt("And");
    req.mutable_sampling()->set_max_tokens(1000000);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(60));
    auto reader = gen_->Generate(ctx, req);
    v1::GenerateResponse r;
    EXPECT_TRUE(reader->Read(&r));
    EXPECT_TRUE(reader->Read(&r));
    return reader;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::GenerationService::Stub> gen_;
};

// During the drain the listener stays open: a new connection's health
// check says NOT_SERVING and a new call gets UNAVAILABLE with the reason,
// while the call in flight goes on.
TEST_F(DrainTest, HealthSaysNotServingAndNewCallsAreRefusedWithTheReason) {
  StartServer("30");
  grpc::ClientContext ctx;
  auto reader = LongGenerate(&ctx);
  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto fresh = server_->Channel();  // a new connection
  auto health = grpc::health::v1::Health::NewStub(fresh);
  grpc::ClientContext health_ctx;
  health_ctx.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse status;
  const grpc::Status checked = health->Check(&health_ctx, {}, &status);
  ASSERT_TRUE(checked.ok()) << checked.error_message();
  EXPECT_EQ(status.status(),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  auto attention = v1::AttentionService::NewStub(fresh);
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  const grpc::Status refused = attention->ListSessions(&list_ctx, {}, &list);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("shutting down"));
  v1::GenerateResponse r;
  EXPECT_TRUE(reader->Read(&r)) << "the stream in flight goes on";
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  reader->Finish();
  const int exit = server_->Wait(std::chrono::seconds(10));
  ASSERT_NE(exit, -1) << "did not exit once its last call ended";
  EXPECT_EQ(WEXITSTATUS(exit), 0);
}

// A stream still running when the grace period ends gets UNAVAILABLE that
// says so, not gRPC's generic cancellation.
TEST_F(DrainTest, StreamsStillRunningAtTheEndOfTheGraceEndWithTheReason) {
  StartServer("1");
  grpc::ClientContext gen_ctx;
  auto reader = LongGenerate(&gen_ctx);
  // And a Decode stream that waits for its client's next message.
  auto attention = v1::AttentionService::NewStub(server_->Channel());
  grpc::ClientContext create_ctx;
  v1::CreateSessionRequest create;
  create.mutable_spec()->set_num_heads(1);
  create.mutable_spec()->set_key_dim(2);
  create.mutable_spec()->set_value_dim(2);
  v1::Session session;
  ASSERT_TRUE(attention->CreateSession(&create_ctx, create, &session).ok());
  grpc::ClientContext decode_ctx;
  auto decode = attention->Decode(&decode_ctx);
  v1::DecodeRequest step;
  step.set_session_id(session.session_id());
  for (int i = 0; i < 2; ++i) {
    step.add_q(0.5f);
    step.add_k(0.25f);
    step.add_v(1.0f);
  }
  v1::DecodeResponse stepped;
  ASSERT_TRUE(decode->Write(step) && decode->Read(&stepped));

  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  const grpc::Status generate = reader->Finish();
  EXPECT_EQ(generate.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(generate.error_message(), HasSubstr("grace period"));
  EXPECT_LT(std::chrono::steady_clock::now() - signalled,
            std::chrono::seconds(8));
  // The Decode stream was idle (waiting for its client): it ended at once,
  // not at the end of the grace period.
  EXPECT_FALSE(decode->Read(&stepped));
  const grpc::Status decoded = decode->Finish();
  EXPECT_EQ(decoded.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(decoded.error_message(), HasSubstr("shutting down"));
  EXPECT_THAT(decoded.error_message(), Not(HasSubstr("grace period")));
  const int exit = server_->Wait(std::chrono::seconds(10));
  ASSERT_NE(exit, -1);
  EXPECT_EQ(WEXITSTATUS(exit), 0);
}

TEST_F(DrainTest, ASecondSignalExitsAtOnce) {
  StartServer("60");
  grpc::ClientContext ctx;
  auto reader = LongGenerate(&ctx);
  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto second = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server_->pid(), SIGINT), 0);
  const int exit = server_->Wait(std::chrono::seconds(10));
  ASSERT_NE(exit, -1) << "still running 10 s after the second signal";
  EXPECT_LT(std::chrono::steady_clock::now() - second, std::chrono::seconds(3));
  EXPECT_TRUE(WIFEXITED(exit));
  EXPECT_EQ(WEXITSTATUS(exit), 1);
  ctx.TryCancel();
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  reader->Finish();
}

// `cmake --install` gives a tree that works wherever it is put: the server
// finds the built-in model and serves it, the client and load generator
// run, and the protos and the licence are there.
TEST(InstallTest, AnInstalledTreeServesItsBuiltInModel) {
  testing::TempDir tmp;
  const std::string prefix = tmp.Path("prefix");
  const std::string log = tmp.Path("install.log");
  ASSERT_EQ(RunCommand(std::string("cmake --install ") + LINATTN_BUILD_DIR +
                           " --prefix " + prefix,
                       log),
            0)
      << ReadFile(log);
  // Moved after installing: nothing may point back at the build or source.
  const std::string moved = tmp.Path("moved");
  std::filesystem::rename(prefix, moved);
  for (const char* file :
       {"bin/linattn-server", "bin/linattn", "bin/linattn-load",
        "lib/linattn/liblinattn_sentencepiece.so",
        "share/linattn/models/tiny/config.json",
        "share/linattn/models/tiny/model.safetensors",
        "share/linattn/models/tiny/tokenizer.model",
        "share/linattn/models/tiny-rwkv7/config.json",
        "share/linattn/models/tiny-rwkv7/model.safetensors",
        "share/linattn/models/tiny-rwkv7/tokenizer.model",
        "share/linattn/proto/linattn/v1/attention.proto",
        "share/linattn/proto/grpc_health/v1/health.proto",
        "share/doc/linattn/LICENSE"}) {
    EXPECT_TRUE(std::filesystem::exists(moved + "/" + file)) << file;
  }
  const std::string port_file = tmp.Path("port");
  const std::string server_log = tmp.Path("server.log");
  const std::string command =
      moved + "/bin/linattn-server --listen 127.0.0.1:0 --http-listen none " +
      "--port-file " + port_file + " > " + server_log + " 2>&1 & echo $! > " +
      tmp.Path("pid");
  ASSERT_EQ(std::system(command.c_str()), 0);
  int port = 0;
  for (int i = 0; i < 400 && port == 0; ++i) {
    std::ifstream(port_file) >> port;
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int pid = 0;
  std::ifstream(tmp.Path("pid")) >> pid;
  ASSERT_GT(port, 0) << ReadFile(server_log);
  auto stub = v1::GenerationService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub->ListModels(&ctx, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).name(), "tiny");
  kill(pid, SIGTERM);
  for (int i = 0; i < 200 && kill(pid, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(ReadFile(server_log), HasSubstr(moved + "/share/linattn"));
  const std::string out = tmp.Path("out");
  EXPECT_EQ(RunCommand(moved + "/bin/linattn explain", out), 0);
  EXPECT_THAT(ReadFile(out), HasSubstr("output"));
}

// Both services busy at once on one server: a Generate stream and a
// Decode stream share the one compute worker, and each keeps making
// progress while the other runs.
TEST(SharedWorkerTest, AGenerateStreamAndADecodeStreamBothProgress) {
  auto server = ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR});
  ASSERT_NE(server, nullptr);
  auto gen = v1::GenerationService::NewStub(server->Channel());
  auto attention = v1::AttentionService::NewStub(server->Channel());
  grpc::ClientContext create_ctx;
  v1::ModelSession model_session;
  ASSERT_TRUE(gen->CreateSession(&create_ctx, {}, &model_session).ok());
  grpc::ClientContext acreate_ctx;
  v1::CreateSessionRequest create;
  create.mutable_spec()->set_num_heads(2);
  create.mutable_spec()->set_key_dim(8);
  create.mutable_spec()->set_value_dim(8);
  v1::Session session;
  ASSERT_TRUE(attention->CreateSession(&acreate_ctx, create, &session).ok());

  constexpr int kTokens = 1000;
  std::atomic<int> steps{0};
  std::atomic<int> steps_at_first{-1}, steps_at_last{-1};
  std::atomic<int> tokens{0};
  std::thread generator([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::GenerateRequest req;
    req.set_session_id(model_session.session_id());
    req.set_prompt("And");
    req.mutable_sampling()->set_max_tokens(kTokens);
    auto reader = gen->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      if (!r.text().empty() || r.token_id() >= 0) {
        if (tokens++ == 0) steps_at_first = steps.load();
      }
    }
    steps_at_last = steps.load();
    EXPECT_TRUE(reader->Finish().ok());
  });
  grpc::ClientContext decode_ctx;
  auto decode = attention->Decode(&decode_ctx);
  v1::DecodeRequest step;
  step.set_session_id(session.session_id());
  for (int i = 0; i < 16; ++i) {
    step.add_q(0.5f);
    step.add_k(0.25f);
    step.add_v(1.0f);
  }
  // The decoder starts once the generator is streaming.
  while (tokens.load() == 0 && steps_at_last.load() < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int tokens_at_step20 = -1;
  v1::DecodeResponse stepped;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (steps_at_last.load() < 0 &&
         std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(decode->Write(step) && decode->Read(&stepped));
    if (++steps == 20) tokens_at_step20 = tokens.load();
  }
  decode->WritesDone();
  EXPECT_TRUE(decode->Finish().ok());
  generator.join();
  EXPECT_GE(tokens.load(), kTokens);
  // The decoder stepped all through the generation, and tokens kept coming
  // while it stepped.
  EXPECT_GE(steps_at_last - steps_at_first, 20);
  EXPECT_GT(tokens_at_step20, 0);
  EXPECT_LT(tokens_at_step20, kTokens);
}

}  // namespace
// --check: what a model directory holds, and whether it can be served.
TEST(ServerCheckTest, ReportsEachModelAndFailsForOneThatCannotBeServed) {
  testing::TempDir tmp;
  const std::string good = tmp.Path("good");
  testing::WriteRandomModel(good, testing::SmallConfig(), 1);
  std::ofstream(good + "/chat_template.jinja")
      << "{% for m in messages %}{{ m.content }}{% endfor %}";
  const std::string log = tmp.Path("check.log");
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) + " --model " + good +
                           " --check",
                       log),
            0)
      << ReadFile(log);
  const std::string report = ReadFile(log);
  EXPECT_THAT(report, HasSubstr("model 'good' from " + good));
  EXPECT_THAT(report, HasSubstr("tokenizer      byte, 256 ids"));
  EXPECT_THAT(report,
              HasSubstr("chat template  jinja, from chat_template.jinja"));
  EXPECT_THAT(report, HasSubstr("  ok"));
  // A template outside the subset: reported with its place, exit 1.
  const std::string bad = tmp.Path("bad");
  testing::WriteRandomModel(bad, testing::SmallConfig(), 1);
  std::ofstream(bad + "/chat_template.jinja") << "{% extends 'base' %}";
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) + " --model " + good +
                           " --model " + bad + " --check",
                       log),
            1);
  EXPECT_THAT(ReadFile(log), HasSubstr("line 1, column 4: 'extends'"));
  // A directory that names no tokenizer cannot be served at all.
  const std::string none = tmp.Path("none");
  nlohmann::json config = testing::SmallConfig();
  config["linattn_tokenizer"] = nullptr;
  testing::WriteRandomModel(none, config, 1);
  EXPECT_EQ(RunCommand(std::string(LINATTN_SERVER_BINARY) + " --model " + none +
                           " --check",
                       log),
            1);
  EXPECT_THAT(ReadFile(log), HasSubstr("names no tokenizer"));
}

}  // namespace linattn
