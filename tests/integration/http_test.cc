// The HTTP listener of a real linattn-server process, through an HTTP
// client (cpp-httplib's): health, the model list, tokenize and detokenize
// against the model's own tokenizer, and OpenAI's error body (message, type,
// param, code) with the right status for every kind of bad request.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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

// A raw loopback connection to `port` (or -1).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What `fd` sends until it closes, `limit` passes or `until` arrives.
std::string ReadAll(int fd, std::chrono::milliseconds limit,
                    const std::string& until = "") {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  pollfd p{fd, POLLIN, 0};
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
    if (!until.empty() && out.find(until) != std::string::npos) break;
  }
  return out;
}

// 64 connections that each send a byte every 0.2 s — 32 of their headers,
// 32 of a small body after complete headers — more than the listener's
// threads, hold no request thread: /health, /v1/models and a completion
// are each answered within a second meanwhile, and the slow ones are
// answered 408 and closed once their whole-request deadline passes, however
// steadily their bytes came.
TEST(HttpTest, SlowClientsStallNoOtherRequest) {
  auto server = ServerProcess::Start(
      {"--http-threads", "16", "--http-request-timeout-ms", "3000"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const std::string slow_head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: "
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  const std::string body = R"({"prompt":"In the beginning","max_tokens":2})";
  const std::string full_head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    if (i >= 32) {
      ASSERT_EQ(::send(fd, full_head.data(), full_head.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(full_head.size()));
    }
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; at < body.size() && !stop; ++at) {
      for (size_t i = 0; i < slow.size(); ++i) {
        const char byte = i < 32 ? slow_head[at] : body[at];
        (void)!::send(slow[i], &byte, 1, MSG_NOSIGNAL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const auto timed = [&](const std::string& method, const std::string& path,
                         const std::string& request) {
    const auto start = std::chrono::steady_clock::now();
    const Reply r = HttpCall(port, method, path, request);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(r.status, 200) << path << ": " << r.raw;
    EXPECT_LT(took, std::chrono::seconds(1)) << path;
  };
  timed("GET", "/health", "");
  timed("GET", "/v1/models", "");
  timed("POST", "/v1/completions",
        R"({"prompt":"In the beginning","max_tokens":2})");
  // From their first byte (about a second ago) they have three seconds.
  for (int fd : slow) {
    // Read as soon as it comes (the connection then closes, and a client
    // that went on sending could lose what it had not read).
    const std::string answer =
        ReadAll(fd, std::chrono::milliseconds(4000), "}}");
    EXPECT_THAT(answer, HasSubstr("HTTP/1.1 408")) << fd;
  }
  stop = true;
  trickle.join();
  for (int fd : slow) ::close(fd);
  // Keep-alive and pipelining still work: two requests in one write on one
  // connection, two answers.
  const int fd = Connect(port);
  const std::string two =
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, two.data(), two.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(two.size()));
  const std::string answers = ReadAll(fd, std::chrono::milliseconds(3000));
  ::close(fd);
  EXPECT_THAT(answers, HasSubstr("{\"status\":\"ok\"}"));
  EXPECT_THAT(answers, HasSubstr("\"object\":\"list\""));
  // A request sent whole before the client shuts its side is answered.
  const int half = Connect(port);
  const std::string probe = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(half, probe.data(), probe.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(probe.size()));
  ::shutdown(half, SHUT_WR);
  EXPECT_THAT(ReadAll(half, std::chrono::milliseconds(3000)),
              HasSubstr("{\"status\":\"ok\"}"));
  ::close(half);
  // A client that waits for 100 Continue before its body gets it.
  const int expect = Connect(port);
  const std::string expecting =
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nExpect: 100-continue\r\nContent-Length: 19\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(::send(expect, expecting.data(), expecting.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(expecting.size()));
  EXPECT_THAT(ReadAll(expect, std::chrono::milliseconds(1000), "\r\n\r\n"),
              HasSubstr("100 Continue"));
  const std::string tokenize = R"({"content":"Hello"})";
  ASSERT_EQ(tokenize.size(), 19u);
  ASSERT_EQ(::send(expect, tokenize.data(), tokenize.size(), MSG_NOSIGNAL), 19);
  EXPECT_THAT(ReadAll(expect, std::chrono::milliseconds(3000)),
              HasSubstr("\"count\""));
  ::close(expect);
}

}  // namespace
}  // namespace linattn
