// The HTTP listener of a real linattn-server process, through an HTTP
// client (cpp-httplib's): health, the model list, tokenize and detokenize
// against the model's own tokenizer, and OpenAI's error body (message, type,
// param, code) with the right status for every kind of bad request.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <thread>

#include "core/model/model.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_call.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::ServerProcess;

using Reply = testing::HttpReply;
using testing::HttpCall;

// OpenAI's error body, with `param` (or null).
void ExpectError(const Reply& r, int status, const std::string& param,
                 const std::string& type = "invalid_request_error") {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << r.body;
  const json& e = r.body["error"];
  EXPECT_TRUE(e["message"].is_string() &&
              !e["message"].get<std::string>().empty());
  EXPECT_EQ(e["type"], type);
  if (param.empty()) {
    EXPECT_TRUE(e["param"].is_null()) << e;
  } else {
    EXPECT_EQ(e["param"], param);
  }
  EXPECT_TRUE(e.contains("code"));
}

TEST(HttpTest, HealthModelsTokenizeAndDetokenize) {
  auto server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  ASSERT_GT(port, 0);

  Reply health = HttpCall(port, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, json({{"status", "ok"}}));

  Reply models = HttpCall(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  ASSERT_EQ(models.body["data"].size(), 1u);
  const json& tiny = models.body["data"][0];
  EXPECT_EQ(tiny["id"], "tiny");
  EXPECT_EQ(tiny["object"], "model");
  EXPECT_TRUE(tiny["created"].is_number_integer());
  EXPECT_EQ(tiny["owned_by"], "linattn");
  Reply one = HttpCall(port, "GET", "/v1/models/tiny");
  EXPECT_EQ(one.status, 200);
  EXPECT_EQ(one.body, tiny);
  Reply none = HttpCall(port, "GET", "/v1/models/nope");
  ExpectError(none, 404, "model");
  EXPECT_EQ(none.body["error"]["code"], "model_not_found");

  // The model's own tokenizer decides the ids.
  auto model = Model::Load(LINATTN_BUILTIN_MODEL_DIR, "tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string text = "In the beginning God created the heaven — ünïcode";
  auto expected = (*model)->tokenizer().Encode(text);
  ASSERT_TRUE(expected.ok());
  Reply tok =
      HttpCall(port, "POST", "/tokenize", json({{"content", text}}).dump());
  ASSERT_EQ(tok.status, 200) << tok.body;
  EXPECT_EQ(tok.body["tokens"].get<std::vector<int32_t>>(), *expected);
  EXPECT_EQ(tok.body["count"], expected->size());
  EXPECT_EQ(tok.body["model"], "tiny");
  // vLLM's field name and an explicit model work too.
  Reply tok2 = HttpCall(port, "POST", "/tokenize",
                        json({{"model", "tiny"}, {"prompt", text}}).dump());
  EXPECT_EQ(tok2.body["tokens"], tok.body["tokens"]);
  Reply detok = HttpCall(port, "POST", "/detokenize",
                         json({{"tokens", tok.body["tokens"]}}).dump());
  ASSERT_EQ(detok.status, 200) << detok.body;
  EXPECT_EQ(detok.body["content"], text);
  // Half a character (a byte-level token alone) is still valid JSON.
  const std::vector<int32_t> cut(expected->end() - 1, expected->end());
  Reply half =
      HttpCall(port, "POST", "/detokenize", json({{"tokens", cut}}).dump());
  EXPECT_EQ(half.status, 200);
  EXPECT_TRUE(half.body.is_object()) << "not JSON";
}

TEST(HttpTest, BadRequestsGetOpenAisErrorBodyNamingTheField) {
  auto server = ServerProcess::Start({"--max-message-bytes", "1048576"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  ExpectError(HttpCall(port, "POST", "/tokenize", "{not json"), 400, "");
  ExpectError(HttpCall(port, "POST", "/tokenize", "[1, 2]"), 400, "");
  ExpectError(HttpCall(port, "POST", "/tokenize", R"({"content": 5})"), 400,
              "content");
  ExpectError(
      HttpCall(port, "POST", "/tokenize", R"({"model": 7, "content": ""})"),
      400, "model");
  Reply unknown = HttpCall(port, "POST", "/tokenize",
                           R"({"model": "gpt-4", "content": "x"})");
  ExpectError(unknown, 404, "model");
  ExpectError(HttpCall(port, "POST", "/detokenize", R"({"tokens": "abc"})"),
              400, "tokens");
  Reply out_of_range =
      HttpCall(port, "POST", "/detokenize", R"({"tokens": [65, 99999999]})");
  ExpectError(out_of_range, 400, "tokens");
  EXPECT_THAT(out_of_range.body["error"]["message"].get<std::string>(),
              HasSubstr("tokens[1]"));
  ExpectError(HttpCall(port, "POST", "/detokenize", R"({"tokens": [1.5]})"),
              400, "tokens");
  Reply no_route = HttpCall(port, "GET", "/v2/nothing");
  ExpectError(no_route, 404, "");
  EXPECT_EQ(no_route.body["error"]["code"], "not_found");
  ExpectError(HttpCall(port, "POST", "/v2/nothing", "{}"), 404, "");
  Reply wrong_method = HttpCall(port, "POST", "/health", "{}");
  ExpectError(wrong_method, 405, "");
  EXPECT_EQ(wrong_method.body["error"]["code"], "method_not_allowed");
  ExpectError(HttpCall(port, "GET", "/tokenize"), 405, "");
  // A body larger than --max-message-bytes is refused before it is read
  // whole.
  const std::string big = json({{"content", std::string(2 << 20, 'a')}}).dump();
  ExpectError(HttpCall(port, "POST", "/tokenize", big), 413, "");
  // The server is still there.
  EXPECT_EQ(HttpCall(port, "GET", "/health").status, 200);
}

TEST(HttpTest, HealthSaysDrainingOnceSigtermArrives) {
  auto server = ServerProcess::Start({"--grace-period", "20"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  // A Generate that stays in flight (its client reads one message and
  // stops), so the drain lasts.
  auto stub = v1::GenerationService::NewStub(server->Channel());
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  v1::CreateModelSessionRequest create;
  create.set_session_id("h");
  v1::ModelSession session;
  {
    grpc::ClientContext c;
    ASSERT_TRUE(stub->CreateSession(&c, create, &session).ok());
  }
  req.set_session_id("h");
  req.set_prompt("And God said");
  req.mutable_sampling()->set_max_tokens(100000);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  Reply health;
  for (int i = 0; i < 100; ++i) {
    health = HttpCall(port, "GET", "/health");
    if (health.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, json({{"status", "draining"}}));
  ctx.TryCancel();
  v1::GenerateResponse rest;
  while (reader->Read(&rest)) {
  }
  (void)reader->Finish();
}

TEST(HttpTest, AnHttpPortAnotherProcessListensOnIsRefused) {
  auto first = ServerProcess::Start({"--model", "none"});
  ASSERT_NE(first, nullptr);
  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  const std::string command =
      std::string(LINATTN_SERVER_BINARY) +
      " --model none --listen 127.0.0.1:0 --http-listen 127.0.0.1:" +
      std::to_string(first->http_port()) + " > " + log + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(command.c_str())), 1);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("--http-listen"));
  EXPECT_THAT(text, HasSubstr("already in use"));
}

}  // namespace
}  // namespace linattn
