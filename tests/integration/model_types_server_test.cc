// A real linattn-server serving one model of each gated and delta-rule type
// (retnet, gla, delta_net, gated_deltanet, mamba2, rwkv7, rwkv6, and
// granitemoehybrid with experts and attention layers; the reference fixtures
// tests/python/make_model_fixtures.py writes) through
// GenerationService and the OpenAI-style HTTP API, against the same models run
// in this process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/http_call.h"
#include "tests/integration/model_server_calls.h"
#include "tests/integration/server_process.h"
#include "tests/model/fixtures.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

const char* const kModels[] = {
    "retnet_gqa_nogate",       "gla_conv_gqa",
    "delta_net_silu_l2",       "gated_deltanet_gva",
    "mamba2_groups",           "rwkv7_unfused_nobias",
    "rwkv6_expand_no_prenorm", "granitemoehybrid_moe_shared_top2_gqa_nope",
    "qwen3_next_moe_gva"};
constexpr int kTypes = sizeof(kModels) / sizeof(kModels[0]);

using testing::GenerateGreedy;
using testing::LocalGreedy;
using testing::Streamed;

std::string Dir(const std::string& name) { return testing::FixtureDir(name); }

struct ModelTypesServerTestModels {
  static constexpr auto& kNames = kModels;
};
class ModelTypesServerTest
    : public testing::FixtureServerTest<ModelTypesServerTestModels> {};

TEST_F(ModelTypesServerTest, ListModelsReportsEachTypeAndItsState) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  ASSERT_TRUE(stub_->ListModels(&ctx, {}, &resp).ok());
  ASSERT_EQ(resp.models_size(), kTypes);
  const char* types[] = {"retnet",    "gla",   "delta_net", "gated_deltanet",
                         "mamba2",    "rwkv7", "rwkv6",     "granitemoehybrid",
                         "qwen3_next"};
  const char* rules[] = {"gated", "gated", "delta", "gated_delta", "gated",
                         "rwkv7", "rwkv6", "gated", "gated_delta"};
  for (int i = 0; i < kTypes; ++i) {
    const v1::ModelInfo& m = resp.models(i);
    auto local = Model::Load(Dir(kModels[i])).value();
    EXPECT_EQ(m.name(), kModels[i]);
    EXPECT_EQ(m.model_type(), types[i]);
    EXPECT_EQ(m.update_rule(), rules[i]);
    EXPECT_EQ(m.feature_map(), "");
    EXPECT_EQ(m.state_bytes(), local->state_bytes());
    EXPECT_EQ(m.kv_bytes_per_token(), local->kv_bytes_per_token());
    // The hybrids: granitemoehybrid and qwen3_next.
    EXPECT_EQ(m.kv_bytes_per_token() > 0, i >= kTypes - 2) << m.name();
    EXPECT_EQ(m.conv_window_floats(), local->conv_window_floats());
    EXPECT_EQ(m.conv_window_floats() > 0, i > 0) << m.name();
  }
}

TEST_F(ModelTypesServerTest, GreedyStreamsAreTheModelsOwn) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const Streamed g = GenerateGreedy(*stub_, Create(name), "Hello, w", 12);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, LocalGreedy(name, "Hello, w", 12));
  }
}

// Append, then a fork, a snapshot restored as a new session, and the
// original all continue alike: the convolution windows travel with them.
TEST_F(ModelTypesServerTest, ForksAndRestoredSnapshotsContinueAlike) {
  const std::string context = "In the beginning";
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    testing::ExpectForkAndRestoreContinueAlike(*stub_, name, Create(name),
                                               context);
  }
}

TEST_F(ModelTypesServerTest, OpenAiCompletionsServeEveryType) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const Streamed g = GenerateGreedy(*stub_, Create(name), "Hello, w", 12);
    nlohmann::json body = {{"model", name},
                           {"prompt", "Hello, w"},
                           {"max_tokens", 12},
                           {"temperature", 0}};
    const testing::HttpReply r = testing::HttpCall(
        server_->http_port(), "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["model"], name);
    EXPECT_EQ(r.body["choices"][0]["text"], g.text);
  }
}

// Sessions of every type in a server with a state dir survive kill -9:
// after the restart each continues its greedy stream as if uncrashed (the
// convolution windows come back with the state).
TEST(ModelTypesDurableTest, SessionsOfEveryTypeContinueAfterKillNine) {
  testing::TempDir tmp;
  std::vector<std::string> args = {"--state-dir", tmp.Path("state")};
  for (const char* name : kModels) {
    args.push_back("--model");
    args.push_back(Dir(name));
  }
  const std::string context = "In the beginning";
  std::map<std::string, std::vector<int32_t>> first;
  {
    auto server = testing::ServerProcess::Start(args, tmp.Path("server.log"));
    ASSERT_NE(server, nullptr);
    auto stub = v1::GenerationService::NewStub(server->Channel());
    for (const char* name : kModels) {
      grpc::ClientContext ctx;
      v1::CreateModelSessionRequest req;
      req.set_model(name);
      req.set_session_id(std::string("d-") + name);
      v1::ModelSession s;
      ASSERT_TRUE(stub->CreateSession(&ctx, req, &s).ok()) << name;
      const Streamed g = GenerateGreedy(*stub, s.session_id(), context, 5);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      first[name] = g.ids;
    }
    server->Kill();
  }
  auto server = testing::ServerProcess::Start(args, tmp.Path("server2.log"));
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  int continued = 0;
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> whole = LocalGreedy(name, context, 13);
    ASSERT_EQ(
        first[name],
        std::vector<int32_t>(
            whole.begin(), whole.begin() + std::min<size_t>(5, whole.size())));
    if (whole.size() < 13) continue;  // the model ended its text early
    const Streamed next =
        GenerateGreedy(*stub, std::string("d-") + name, "", 8);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids, std::vector<int32_t>(whole.begin() + 5, whole.end()));
    ++continued;
  }
  EXPECT_EQ(continued, static_cast<int>(std::size(kModels)))
      << "models that ended their text early";
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// RWKV's state files through the server: --initial-state starts every new
// session of the model from the file (a restart with --state-dir recovers
// its sessions from it), and a value that names no served model is refused.
TEST(ModelTypesInitialStateTest, SessionsStartFromTheStateFile) {
  testing::TempDir tmp;
  const std::string dir = Dir("rwkv7_converted");
  const std::string file = dir + "/initial_state.safetensors";
  const std::vector<int32_t> local = LocalGreedy(
      Model::Load(dir, "", WeightType::kF32, file).value(), "Hello", 12);
  ASSERT_NE(local, LocalGreedy("rwkv7_converted", "Hello", 12));
  const std::vector<std::string> args = {
      "--model",         dir,
      "--initial-state", "rwkv7_converted=" + file,
      "--state-dir",     tmp.Path("state")};
  {
    auto server = testing::ServerProcess::Start(args, tmp.Path("server.log"));
    ASSERT_NE(server, nullptr);
    auto stub = v1::GenerationService::NewStub(server->Channel());
    for (const char* id : {"a", "b"}) {
      grpc::ClientContext ctx;
      v1::CreateModelSessionRequest req;
      req.set_session_id(id);
      v1::ModelSession session;
      ASSERT_TRUE(stub->CreateSession(&ctx, req, &session).ok());
      const Streamed g = GenerateGreedy(*stub, id, "Hello", 5);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      EXPECT_EQ(g.ids, std::vector<int32_t>(
                           local.begin(),
                           local.begin() + std::min<size_t>(5, local.size())));
    }
    server->Kill();
  }
  if (local.size() == 12) {
    auto server = testing::ServerProcess::Start(args, tmp.Path("server2.log"));
    ASSERT_NE(server, nullptr);
    auto stub = v1::GenerationService::NewStub(server->Channel());
    const Streamed next = GenerateGreedy(*stub, "a", "", 7);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids, std::vector<int32_t>(local.begin() + 5, local.end()));
  }
  // Two models and a file without a model's name: which one is meant?
  const std::string log = tmp.Path("refused.log");
  const int status = std::system(
      absl::StrCat("timeout 20 ", LINATTN_SERVER_BINARY, " --model ", dir,
                   " --model ", Dir("gla_plain"), " --initial-state ", file,
                   " --listen 127.0.0.1:0 > ", log, " 2>&1")
          .c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_THAT(testing::ReadFile(log),
              ::testing::HasSubstr("--initial-state: '" + file +
                                   "' names no served model"));
}

}  // namespace
}  // namespace linattn
