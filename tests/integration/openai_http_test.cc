// The HTTP listener's generation endpoints (server/openai/routes.h) on a real
// linattn-server process: completions and chat against gRPC Generate and
// against themselves (streamed = whole, token ids = text, n choices =
// forks), sessions continued with only their new text (cached_tokens), the
// responses API's stored state (a follow-up equals resending the whole
// conversation; two follow-ups branch independently), failed requests that
// change nothing, a stream its client leaves, limits as 429, and the
// explorer's JSON equal to `linattn explain --json`.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/model/model.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_call.h"
#include "tests/integration/server_process.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::ServerProcess;

using Reply = testing::HttpReply;

// GET, DELETE, or POST of a JSON body.
Reply Call(int port, const std::string& method, const std::string& path,
           const json& body = nullptr) {
  return testing::HttpCall(port, method, path,
                           body.is_null() ? "" : body.dump());
}

// The `data:` payloads of an event stream, in order ("[DONE]" included).
std::vector<std::string> DataLines(const std::string& stream) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (absl::ConsumePrefix(&line, "data: ")) out.emplace_back(line);
  }
  return out;
}

std::string Text(const Reply& r, int choice = 0) {
  const json& c = r.body["choices"][choice];
  return c.contains("message") ? c["message"]["content"].get<std::string>()
                               : c["text"].get<std::string>();
}

// POSTs `body` and hands what arrives to `receiver` until it returns false
// (the client then leaves); whether the whole answer arrived.
bool PostReading(int port, const std::string& path, const json& body,
                 std::function<bool(const char*, size_t)> receiver) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&receiver](const char* data, size_t size, uint64_t,
                                     uint64_t) { return receiver(data, size); };
  httplib::Response res;
  httplib::Error error;
  return client.send(req, res, error);
}

uint64_t Position(int port, const std::string& session) {
  Reply r = Call(port, "GET", "/v1/sessions/" + session);
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.body.value("position", uint64_t{0});
}

std::string NewSession(int port) {
  Reply r = Call(port, "POST", "/v1/sessions", json::object());
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.body.value("id", "");
}

// The API's requests on a byte-level model (a random one whose greedy text
// is ASCII, named "tiny" as the built-in model is): there a session continued
// with new text holds exactly the context of the whole text sent at once,
// which several tests compare. A subword tokenizer (the built-in model's)
// encodes text pieces sent apart differently from their concatenation; the
// official client's run (tests/http/run_clients.sh) and the HTTP tests use
// the built-in model.
class OpenAiHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = tmp_.Path("tiny");
    testing::WriteModel(dir, testing::SmallConfig(),
                        testing::AsciiModelTensors(testing::SmallConfig(), 7));
    server_ = ServerProcess::Start({"--model", dir});
    ASSERT_NE(server_, nullptr);
    port_ = server_->http_port();
  }
  testing::TempDir tmp_;
  std::unique_ptr<ServerProcess> server_;
  int port_ = 0;
};

TEST_F(OpenAiHttpTest, GreedyCompletionEqualsGrpcGenerateStreamedOrNot) {
  const std::string prompt = "In the beginning God created";
  // gRPC: CreateSession + Generate.
  auto stub = v1::GenerationService::NewStub(server_->Channel());
  {
    grpc::ClientContext c;
    v1::CreateModelSessionRequest create;
    create.set_session_id("g");
    v1::ModelSession s;
    ASSERT_TRUE(stub->CreateSession(&c, create, &s).ok());
  }
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id("g");
  req.set_prompt(prompt);
  req.mutable_sampling()->set_max_tokens(32);
  auto reader = stub->Generate(&ctx, req);
  std::string grpc_text;
  v1::GenerateResponse m;
  while (reader->Read(&m)) grpc_text += m.text();
  ASSERT_TRUE(reader->Finish().ok());

  const json body = {
      {"prompt", prompt}, {"max_tokens", 32}, {"temperature", 0}};
  Reply whole = Call(port_, "POST", "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(Text(whole), grpc_text);
  EXPECT_EQ(whole.body["object"], "text_completion");
  EXPECT_EQ(whole.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], 32);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], prompt.size());  // bytes
  EXPECT_EQ(whole.body["usage"]["total_tokens"], prompt.size() + 32);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // The same prompt as token ids, alone or as a list of one.
  Reply tokens = Call(port_, "POST", "/tokenize", {{"content", prompt}});
  json by_ids = body;
  by_ids["prompt"] = tokens.body["tokens"];
  EXPECT_EQ(Text(Call(port_, "POST", "/v1/completions", by_ids)), grpc_text);
  by_ids["prompt"] = json::array({tokens.body["tokens"]});
  EXPECT_EQ(Text(Call(port_, "POST", "/v1/completions", by_ids)), grpc_text);

  // Streamed: chunks that add up to the same text, then usage, then [DONE].
  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  Reply sse = Call(port_, "POST", "/v1/completions", streamed);
  ASSERT_EQ(sse.status, 200);
  EXPECT_THAT(sse.content_type, HasSubstr("text/event-stream"));
  std::vector<std::string> data = DataLines(sse.raw);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string joined;
  std::string finish;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json chunk = json::parse(data[i], nullptr, false);
    ASSERT_TRUE(chunk.is_object()) << data[i];
    if (i + 2 == data.size()) {  // the usage chunk
      EXPECT_TRUE(chunk["choices"].empty());
      EXPECT_EQ(chunk["usage"]["completion_tokens"], 32);
      continue;
    }
    EXPECT_TRUE(chunk["usage"].is_null());
    joined += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(joined, grpc_text);
  EXPECT_EQ(finish, "length");
  // No session is left behind by requests that named none.
  EXPECT_EQ(Call(port_, "GET", "/v1/sessions").body["data"].size(), 1u);  // g
}

TEST_F(OpenAiHttpTest, EchoStopAndLogprobs) {
  const json body = {
      {"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 0}};
  const std::string greedy = Text(Call(port_, "POST", "/v1/completions", body));
  ASSERT_GT(greedy.size(), 4u);
  // A stop string ends the text before it.
  const std::string stop = greedy.substr(3, 2);
  json stopped = body;
  stopped["stop"] = {stop};
  Reply s = Call(port_, "POST", "/v1/completions", stopped);
  EXPECT_EQ(Text(s), greedy.substr(0, greedy.find(stop)));
  EXPECT_EQ(s.body["choices"][0]["finish_reason"], "stop");
  json echoed = body;
  echoed["echo"] = true;
  EXPECT_EQ(Text(Call(port_, "POST", "/v1/completions", echoed)),
            "And God said" + greedy);
  // Greedy: each token is the most likely, so it heads its top list.
  json lp = body;
  lp["max_tokens"] = 6;
  lp["logprobs"] = 3;
  Reply l = Call(port_, "POST", "/v1/completions", lp);
  ASSERT_EQ(l.status, 200) << l.raw;
  const json& logprobs = l.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const json& top = logprobs["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u);
    const double chosen = logprobs["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    EXPECT_DOUBLE_EQ(
        top[logprobs["tokens"][i].get<std::string>()].get<double>(), chosen);
    for (const auto& [token, value] : top.items()) {
      EXPECT_LE(value.get<double>(), chosen + 1e-6) << token;
    }
  }
  EXPECT_EQ(logprobs["text_offset"][0], 0);
  // Streamed, chunk by chunk: the same tokens, log-probabilities and
  // offsets.
  json streamed = lp;
  streamed["stream"] = true;
  json tokens = json::array(), offsets = json::array(), values = json::array();
  for (const std::string& d :
       DataLines(Call(port_, "POST", "/v1/completions", streamed).raw)) {
    if (d == "[DONE]") continue;
    const json chunk = json::parse(d);
    const json& c = chunk["choices"][0];
    if (c["logprobs"].is_null()) continue;
    tokens.insert(tokens.end(), c["logprobs"]["tokens"].begin(),
                  c["logprobs"]["tokens"].end());
    offsets.insert(offsets.end(), c["logprobs"]["text_offset"].begin(),
                   c["logprobs"]["text_offset"].end());
    values.insert(values.end(), c["logprobs"]["token_logprobs"].begin(),
                  c["logprobs"]["token_logprobs"].end());
  }
  EXPECT_EQ(tokens, logprobs["tokens"]);
  EXPECT_EQ(offsets, logprobs["text_offset"]);
  EXPECT_EQ(values, logprobs["token_logprobs"]);
  // A whole answer is bounded; a stream is not held.
  json huge = body;
  huge["max_tokens"] = 1 << 20;
  huge["n"] = 2;
  Reply refused = Call(port_, "POST", "/v1/completions", huge);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body["error"]["param"], "max_tokens") << refused.raw;
}

TEST_F(OpenAiHttpTest, NChoicesAreForksOfOnePrefill) {
  const json body = {{"prompt", "Let there be light"},
                     {"max_tokens", 12},
                     {"temperature", 1.0},
                     {"seed", 7}};
  json three = body;
  three["n"] = 3;
  Reply r = Call(port_, "POST", "/v1/completions", three);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 36);
  // Choice i samples seed + i's stream from the same prefilled state: the
  // same as a single completion with that seed.
  for (int i = 0; i < 3; ++i) {
    json one = body;
    one["seed"] = 7 + i;
    EXPECT_EQ(Text(r, i), Text(Call(port_, "POST", "/v1/completions", one)))
        << "choice " << i;
    EXPECT_EQ(r.body["choices"][i]["index"], i);
  }
  // Streamed n: every choice's chunks, then [DONE].
  three["stream"] = true;
  std::vector<std::string> data =
      DataLines(Call(port_, "POST", "/v1/completions", three).raw);
  std::vector<std::string> texts(3);
  for (const std::string& d : data) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    texts[c["choices"][0]["index"].get<int>()] +=
        c["choices"][0]["text"].get<std::string>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(texts[i], Text(r, i));
  EXPECT_TRUE(Call(port_, "GET", "/v1/sessions").body["data"].empty());
}

TEST_F(OpenAiHttpTest, ASessionIsContinuedWithOnlyItsNewText) {
  const std::string id = NewSession(port_);
  const json first = {{"session_id", id},
                      {"prompt", "In the beginning"},
                      {"max_tokens", 10},
                      {"temperature", 0}};
  Reply a = Call(port_, "POST", "/v1/completions", first);
  ASSERT_EQ(a.status, 200) << a.raw;
  EXPECT_EQ(a.body["session_id"], id);
  const uint64_t after_a = Position(port_, id);
  EXPECT_EQ(after_a, 16u + 10u);
  Reply b = Call(port_, "POST", "/v1/completions",
                 {{"session_id", id},
                  {"prompt", " and"},
                  {"max_tokens", 10},
                  {"temperature", 0}});
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(b.body["usage"]["prompt_tokens_details"]["cached_tokens"], after_a);
  EXPECT_EQ(b.body["usage"]["prompt_tokens"], after_a + 4);
  // The same as sending the whole context as one prompt.
  Reply whole = Call(port_, "POST", "/v1/completions",
                     {{"prompt", "In the beginning" + Text(a) + " and"},
                      {"max_tokens", 10},
                      {"temperature", 0}});
  EXPECT_EQ(Text(b), Text(whole));
  // Sessions over HTTP: fork, state, restore, delete.
  Reply fork =
      Call(port_, "POST", "/v1/sessions/" + id + "/fork", json::object());
  ASSERT_EQ(fork.status, 200) << fork.raw;
  EXPECT_EQ(fork.body["position"], Position(port_, id));
  Reply state = Call(port_, "GET", "/v1/sessions/" + id + "/state");
  ASSERT_EQ(state.status, 200);
  EXPECT_EQ(state.content_type, "application/octet-stream");
  httplib::Client client("127.0.0.1", port_);
  auto restored = client.Post("/v1/sessions/restore?session_id=copy", state.raw,
                              "application/octet-stream");
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->status, 200) << restored->body;
  const json next = {
      {"prompt", " light"}, {"max_tokens", 8}, {"temperature", 0}};
  json on_copy = next, on_fork = next;
  on_copy["session_id"] = "copy";
  on_fork["session_id"] = fork.body["id"];
  EXPECT_EQ(Text(Call(port_, "POST", "/v1/completions", on_copy)),
            Text(Call(port_, "POST", "/v1/completions", on_fork)));
  EXPECT_EQ(Call(port_, "DELETE", "/v1/sessions/copy").body["deleted"], true);
  EXPECT_EQ(Call(port_, "GET", "/v1/sessions/copy").status, 404);
  EXPECT_EQ(Call(port_, "DELETE", "/v1/sessions/copy").status, 404);
}

// OpenAI's penalties and llama.cpp's repetition_penalty, repeat_last_n and
// min_p give what the same settings give over gRPC.
TEST_F(OpenAiHttpTest, PenaltiesAndMinPMatchGrpc) {
  const std::string prompt = "In the beginning God created";
  auto stub = v1::GenerationService::NewStub(server_->Channel());
  std::string id;
  {
    grpc::ClientContext c;
    v1::ModelSession s;
    ASSERT_TRUE(stub->CreateSession(&c, {}, &s).ok());
    id = s.session_id();
  }
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id(id);
  req.set_prompt(prompt);
  v1::SamplingParams* p = req.mutable_sampling();
  p->set_max_tokens(40);
  p->set_temperature(0.8f);
  p->set_seed(4);
  p->set_presence_penalty(0.5f);
  p->set_frequency_penalty(0.25f);
  p->set_repetition_penalty(1.3f);
  p->set_penalty_last_n(16);
  p->set_min_p(0.1f);
  auto reader = stub->Generate(&ctx, req);
  std::string grpc_text;
  for (v1::GenerateResponse m; reader->Read(&m);) grpc_text += m.text();
  ASSERT_TRUE(reader->Finish().ok());
  const json body = {{"prompt", prompt},
                     {"max_tokens", 40},
                     {"temperature", 0.8},
                     {"seed", 4},
                     {"presence_penalty", 0.5},
                     {"frequency_penalty", 0.25},
                     {"repetition_penalty", 1.3},
                     {"repeat_last_n", 16},
                     {"min_p", 0.1}};
  Reply r = Call(port_, "POST", "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(Text(r), grpc_text);
}

TEST_F(OpenAiHttpTest, AFailedRequestLeavesTheSessionAsItWas) {
  const std::string id = NewSession(port_);
  ASSERT_EQ(Call(port_, "POST", "/v1/sessions/" + id + "/append",
                 {{"prompt", "The earth was without form"}})
                .status,
            200);
  const std::string before =
      Call(port_, "GET", "/v1/sessions/" + id + "/state").raw;
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"temperature", 5}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"stop", {""}}}, "stop"},
      {{{"stop", 3}}, "stop"},
      {{{"n", 2}}, "n"},
      {{{"prompt", {65, 99999999}}}, "prompt"},
      {{{"presence_penalty", 2.5}}, "presence_penalty"},
      {{{"frequency_penalty", "x"}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"min_p", 1.5}}, "min_p"},
      {{{"repeat_last_n", -2}}, "repeat_last_n"},
      {{{"logprobs", 99}}, "logprobs"},
      {{{"seed", "x"}}, "seed"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"model", "gpt-4"}}, "model"},
  };
  for (const auto& [fields, param] : bad) {
    json body = {{"session_id", id}, {"prompt", " and"}, {"max_tokens", 4}};
    body.update(fields);
    Reply r = Call(port_, "POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << fields;
    EXPECT_EQ(r.body["error"]["param"], param) << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
  }
  Reply chat = Call(port_, "POST", "/v1/chat/completions",
                    {{"session_id", id},
                     {"messages", {{{"role", "wizard"}, {"content", "x"}}}}});
  EXPECT_EQ(chat.status, 400);
  EXPECT_EQ(chat.body["error"]["param"], "messages[0].role") << chat.raw;
  EXPECT_EQ(Call(port_, "POST", "/v1/completions",
                 {{"session_id", "nobody"}, {"prompt", "x"}})
                .status,
            404);
  EXPECT_EQ(Call(port_, "GET", "/v1/sessions/" + id + "/state").raw, before);
}

TEST_F(OpenAiHttpTest, AStreamItsClientLeavesStopsAndKeepsWhatWasSent) {
  const std::string id = NewSession(port_);
  const uint64_t max_tokens = 200000;
  int chunks = 0;
  const bool whole = PostReading(port_, "/v1/completions",
                                 {{"session_id", id},
                                  {"prompt", "And God said"},
                                  {"max_tokens", max_tokens},
                                  {"temperature", 0.8},
                                  {"stream", true}},
                                 [&](const char*, size_t) {
                                   return ++chunks < 20;  // then leave
                                 });
  EXPECT_FALSE(whole);
  // The generation stops: the position settles far below max_tokens, with
  // at least the tokens read in the context.
  uint64_t last = 0, now = Position(port_, id);
  for (int i = 0; i < 100 && now != last; ++i) {
    last = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    now = Position(port_, id);
  }
  EXPECT_EQ(now, last) << "still generating";
  EXPECT_GE(now, 12u + 10u);
  EXPECT_LT(now, max_tokens / 2);
  // The session goes on from there.
  Reply more = Call(port_, "POST", "/v1/completions",
                    {{"session_id", id}, {"prompt", "."}, {"max_tokens", 3}});
  EXPECT_EQ(more.status, 200) << more.raw;
  EXPECT_EQ(more.body["usage"]["prompt_tokens_details"]["cached_tokens"], now);
}

TEST_F(OpenAiHttpTest, ChatRendersThePlainTemplateAndStopsAtTheEndOfTurn) {
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Who made light?"}}};
  Reply chat =
      Call(port_, "POST", "/v1/chat/completions",
           {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  EXPECT_EQ(chat.body["object"], "chat.completion");
  EXPECT_EQ(chat.body["choices"][0]["message"]["role"], "assistant");
  // docs/design.md, "Chat templates": the plain template.
  const std::string rendered =
      "<|system|>\nBe brief.<|end|>\n<|user|>\nWho made light?<|end|>\n"
      "<|assistant|>\n";
  Reply completion = Call(port_, "POST", "/v1/completions",
                          {{"prompt", rendered},
                           {"max_tokens", 24},
                           {"temperature", 0},
                           {"stop", {"<|end|>"}}});
  EXPECT_EQ(Text(chat), Text(completion));
  EXPECT_EQ(chat.body["usage"]["prompt_tokens"], rendered.size());
}

TEST_F(OpenAiHttpTest, StoredResponsesContinueAndBranchFromTheirState) {
  Reply r1 = Call(port_, "POST", "/v1/responses",
                  {{"input", "Who divided the light from the darkness?"},
                   {"max_output_tokens", 20},
                   {"temperature", 0}});
  ASSERT_EQ(r1.status, 200) << r1.raw;
  EXPECT_EQ(r1.body["object"], "response");
  const std::string id1 = r1.body["id"];
  const std::string text1 = r1.body["output"][0]["content"][0]["text"];
  const uint64_t end1 = Position(port_, id1);  // its state, kept
  EXPECT_EQ(r1.body["usage"]["input_tokens"].get<uint64_t>() +
                r1.body["usage"]["output_tokens"].get<uint64_t>(),
            end1);
  EXPECT_EQ(Call(port_, "GET", "/v1/responses/" + id1).body, r1.body);

  const json follow = {{"previous_response_id", id1},
                       {"input", "And then?"},
                       {"max_output_tokens", 16},
                       {"temperature", 0}};
  Reply a = Call(port_, "POST", "/v1/responses", follow);
  Reply b = Call(port_, "POST", "/v1/responses", follow);
  ASSERT_EQ(a.status, 200) << a.raw;
  // Both continue from r1's state (not a's): they branch independently.
  EXPECT_EQ(a.body["output"][0]["content"], b.body["output"][0]["content"]);
  EXPECT_NE(a.body["id"], b.body["id"]);
  EXPECT_EQ(a.body["usage"]["input_tokens_details"]["cached_tokens"], end1);
  EXPECT_EQ(Position(port_, id1), end1);
  // The same as resending the whole conversation.
  const std::string cut =
      r1.body["incomplete_details"].is_null() ? "" : "<|end|>";
  Reply resent =
      Call(port_, "POST", "/v1/completions",
           {{"prompt",
             "<|user|>\nWho divided the light from the darkness?<|end|>\n"
             "<|assistant|>\n" +
                 text1 + cut + "\n<|user|>\nAnd then?<|end|>\n<|assistant|>\n"},
            {"max_tokens", 16},
            {"temperature", 0},
            {"stop", {"<|end|>"}}});
  EXPECT_EQ(a.body["output"][0]["content"][0]["text"], Text(resent));

  // Deleted: gone, with its state; a follow-up of it is a 404.
  EXPECT_EQ(Call(port_, "DELETE", "/v1/responses/" + id1).body["deleted"],
            true);
  EXPECT_EQ(Call(port_, "GET", "/v1/responses/" + id1).status, 404);
  EXPECT_EQ(Call(port_, "GET", "/v1/sessions/" + id1).status, 404);
  Reply orphan = Call(port_, "POST", "/v1/responses", follow);
  EXPECT_EQ(orphan.status, 404);
  EXPECT_EQ(orphan.body["error"]["param"], "previous_response_id");
  // A bad input item is named as the responses API names it.
  Reply bad_role = Call(port_, "POST", "/v1/responses",
                        {{"instructions", "Be brief."},
                         {"input",
                          {{{"role", "user"}, {"content", "a"}},
                           {{"role", "tool"}, {"content", "b"}}}}});
  EXPECT_EQ(bad_role.status, 400);
  EXPECT_EQ(bad_role.body["error"]["param"], "input[1].role") << bad_role.raw;
  EXPECT_EQ(
      Call(port_, "POST", "/v1/responses", {{"input", "a"}, {"stop", "x"}})
          .body["error"]["param"],
      "stop");
  // store: false keeps nothing.
  Reply unstored =
      Call(port_, "POST", "/v1/responses",
           {{"input", "x"}, {"store", false}, {"max_output_tokens", 2}});
  ASSERT_EQ(unstored.status, 200);
  EXPECT_EQ(Call(port_, "GET",
                 "/v1/responses/" + unstored.body["id"].get<std::string>())
                .status,
            404);
}

// A model directory with its own Jinja chat template (ChatML, as Qwen's
// checkpoints write it) and the eos_token its tokenizer_config.json names.
class OpenAiJinjaTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = tmp_.Path("tiny");
    testing::WriteModel(dir, testing::SmallConfig(),
                        testing::AsciiModelTensors(testing::SmallConfig(), 7));
    std::ofstream(dir + "/tokenizer_config.json") << json{
        {"eos_token", "<|im_end|>"},
        {"chat_template",
         "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + "
         "(m.content | trim if m.role == 'user' else m.content) + "
         "'<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
         "}}{%- endif %}"}}.dump();
    // A second model whose template linattn refuses.
    const std::string refused = tmp_.Path("refused");
    testing::WriteModel(refused, testing::SmallConfig(),
                        testing::AsciiModelTensors(testing::SmallConfig(), 7));
    std::ofstream(refused + "/chat_template.jinja")
        << "{% for m in messages %}\n{% include 'turn.jinja' %}{% endfor %}";
    server_ = ServerProcess::Start({"--model", dir, "--model", refused});
    ASSERT_NE(server_, nullptr);
    port_ = server_->http_port();
  }
  testing::TempDir tmp_;
  std::unique_ptr<ServerProcess> server_;
  int port_ = 0;
};

TEST_F(OpenAiJinjaTemplateTest, ChatAndFollowUpsRenderTheModelsTemplate) {
  Reply chat = Call(port_, "POST", "/v1/chat/completions",
                    {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", " Hi "}}}},
                     {"max_tokens", 12},
                     {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  const std::string rendered =
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(chat.body["usage"]["prompt_tokens"], rendered.size());
  Reply completion = Call(port_, "POST", "/v1/completions",
                          {{"model", "tiny"},
                           {"prompt", rendered},
                           {"max_tokens", 12},
                           {"temperature", 0},
                           {"stop", {"<|im_end|>"}}});
  EXPECT_EQ(Text(chat), Text(completion));

  // A stored response continues with what the template adds past what its
  // session holds: the same as sending the whole conversation.
  Reply r1 = Call(port_, "POST", "/v1/responses",
                  {{"model", "tiny"},
                   {"input", "Who made light?"},
                   {"max_output_tokens", 10},
                   {"temperature", 0}});
  ASSERT_EQ(r1.status, 200) << r1.raw;
  const std::string text1 = r1.body["output"][0]["content"][0]["text"];
  Reply a = Call(port_, "POST", "/v1/responses",
                 {{"previous_response_id", r1.body["id"]},
                  {"input", "And then?"},
                  {"max_output_tokens", 10},
                  {"temperature", 0}});
  ASSERT_EQ(a.status, 200) << a.raw;
  // Ended at its marker or cut short, the whole conversation reads the
  // same: the template closes the reply either way.
  Reply resent = Call(port_, "POST", "/v1/completions",
                      {{"model", "tiny"},
                       {"prompt",
                        "<|im_start|>user\nWho made light?<|im_end|>\n"
                        "<|im_start|>assistant\n" +
                            text1 +
                            "<|im_end|>\n<|im_start|>user\nAnd then?"
                            "<|im_end|>\n<|im_start|>assistant\n"},
                       {"max_tokens", 10},
                       {"temperature", 0},
                       {"stop", {"<|im_end|>"}}});
  EXPECT_EQ(a.body["output"][0]["content"][0]["text"], Text(resent));
  EXPECT_EQ(a.body["usage"]["input_tokens_details"]["cached_tokens"],
            r1.body["usage"]["input_tokens"].get<uint64_t>() +
                r1.body["usage"]["output_tokens"].get<uint64_t>());

  // A chat session keeps no message history: continuing it with the
  // model's own template is refused, naming the way out.
  Reply created = Call(port_, "POST", "/v1/sessions", {{"model", "tiny"}});
  ASSERT_EQ(created.status, 200) << created.raw;
  const std::string session = created.body["id"];
  json turn = {{"session_id", session},
               {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"max_tokens", 4}};
  ASSERT_EQ(Call(port_, "POST", "/v1/chat/completions", turn).status, 200);
  Reply again = Call(port_, "POST", "/v1/chat/completions", turn);
  EXPECT_EQ(again.status, 400) << again.raw;
  EXPECT_THAT(again.raw, HasSubstr("whole conversation"));
}

TEST_F(OpenAiJinjaTemplateTest, AModelWhoseTemplateIsRefusedAnswersWhy) {
  Reply chat = Call(port_, "POST", "/v1/chat/completions",
                    {{"model", "refused"},
                     {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(chat.status, 400) << chat.raw;
  EXPECT_THAT(chat.raw, HasSubstr("chat_template.jinja"));
  EXPECT_THAT(chat.raw, HasSubstr("line 2, column 4"));
  EXPECT_THAT(chat.raw, HasSubstr("'include'"));
  // A body nested deeper than any request needs is refused before it is
  // parsed (copying it would recurse per level), and the server goes on.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  httplib::Client client("127.0.0.1", port_);
  auto nested = client.Post(
      "/v1/chat/completions",
      R"({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],)"
      R"( "tools": )" +
          deep + "}",
      "application/json");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->status, 400);
  EXPECT_THAT(nested->body, HasSubstr("nests deeper than"));
  // Its completions are served.
  EXPECT_EQ(Call(port_, "POST", "/v1/completions",
                 {{"model", "refused"}, {"prompt", "In"}, {"max_tokens", 2}})
                .status,
            200);
}

TEST(OpenAiHttpLimitsTest, SessionLimitsAnswer429AndIdleResponsesExpire) {
  auto server =
      ServerProcess::Start({"--max-sessions", "2", "--idle-ttl", "3"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  Reply r = Call(port, "POST", "/v1/responses",
                 {{"input", "a"}, {"max_output_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(Call(port, "POST", "/v1/sessions", json::object()).status, 200);
  Reply full = Call(port, "POST", "/v1/completions",
                    {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(full.status, 429) << full.raw;
  EXPECT_EQ(full.body["error"]["type"], "rate_limit_error");
  // The idle TTL takes stored responses' states too.
  const std::string id = r.body["id"];
  int status = 200;
  for (int i = 0; i < 100 && status == 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    status = Call(port, "GET", "/v1/responses/" + id).status;
  }
  EXPECT_EQ(status, 404);
}

TEST(OpenAiHttpDrainTest, NewRequestsAreRefusedOnceADrainBegins) {
  auto server = ServerProcess::Start({"--grace-period", "20"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  // A stream in flight holds the drain open.
  std::atomic<int> chunks{0};
  std::thread stream([&] {
    PostReading(port, "/v1/completions",
                {{"prompt", "And"}, {"max_tokens", 100000}, {"stream", true}},
                [&](const char*, size_t) { return ++chunks < 400; });
  });
  while (chunks == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  Reply health;
  for (int i = 0; i < 100; ++i) {
    health = Call(port, "GET", "/health");
    if (health.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(health.status, 503);
  Reply refused = Call(port, "POST", "/v1/completions", {{"prompt", "x"}});
  EXPECT_EQ(refused.status, 503) << refused.raw;
  EXPECT_EQ(refused.body["error"]["code"], "draining");
  stream.join();
}

// What a client could make the server hold or wait for is refused before
// it is read: bodies without Content-Length or compressed, and more
// generations at once than --http-threads leaves for them (the health
// check still answers).
TEST(OpenAiHttpLimitsTest, BodiesAndConcurrentGenerationsAreBounded) {
  auto server = ServerProcess::Start(
      {"--http-threads", "10", "--max-message-bytes", "1048576"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  auto raw = [port](const std::string& request) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              ssize_t(request.size()));
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string reply;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, n);
    close(fd);
    return reply;  // whole: the server closed the connection
  };
  // A chunked body (httplib would read it past the limit): refused unread.
  std::string chunked =
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
      "chunked\r\n\r\n";
  EXPECT_THAT(raw(chunked), HasSubstr("HTTP/1.1 411"));
  EXPECT_THAT(raw("POST /tokenize HTTP/1.1\r\nHost: x\r\n\r\n{}"),
              HasSubstr("HTTP/1.1 411"));
  EXPECT_THAT(raw("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
                  "gzip\r\nContent-Length: 2\r\n\r\n{}"),
              HasSubstr("HTTP/1.1 415"));
  // Two generations (10 threads − 8) held open by readers that wait.
  std::atomic<bool> release{false};
  std::atomic<int> started{0};
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back([&] {
      bool counted = false;
      PostReading(port, "/v1/completions",
                  {{"prompt", "And"}, {"max_tokens", 100000}, {"stream", true}},
                  [&](const char*, size_t) {
                    if (!counted) {
                      counted = true;
                      started++;
                    }
                    return !release.load();
                  });
    });
  }
  while (started < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Reply busy = Call(port, "POST", "/v1/completions",
                    {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(busy.status, 429) << busy.raw;
  EXPECT_EQ(busy.body["error"]["code"], "too_many_requests");
  EXPECT_EQ(Call(port, "GET", "/health").status, 200);
  EXPECT_EQ(Call(port, "GET", "/v1/sessions").status, 200);
  release = true;
  for (auto& t : streams) t.join();
  // Their slots are back.
  Reply again;
  for (int i = 0; i < 100; ++i) {
    again = Call(port, "POST", "/v1/completions",
                 {{"prompt", "x"}, {"max_tokens", 2}});
    if (again.status != 429) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(again.status, 200) << again.raw;
}

// The page's numbers are the engine's: GET /v1/explain is `linattn explain
// --json` for every preset, map and prefix.
TEST_F(OpenAiHttpTest, ExplainEndpointEqualsTheCli) {
  Reply options = Call(port_, "GET", "/v1/explain/options");
  ASSERT_EQ(options.status, 200);
  for (const json& preset : options.body["presets"]) {
    for (const json& map : options.body["feature_maps"]) {
      for (int prefix = 1; prefix <= preset["keys"].get<int>(); ++prefix) {
        const std::string query = absl::StrCat(
            "preset=", preset["name"].get<std::string>(),
            "&feature_map=", map.get<std::string>(), "&prefix=", prefix);
        Reply r = Call(port_, "GET", "/v1/explain?" + query);
        ASSERT_EQ(r.status, 200) << query << r.raw;
        const std::string command =
            absl::StrCat(LINATTN_BINARY, " explain --json --preset ",
                         preset["name"].get<std::string>(), " --feature-map ",
                         map.get<std::string>(), " --prefix ", prefix);
        FILE* pipe = popen(command.c_str(), "r");
        ASSERT_NE(pipe, nullptr);
        std::string out;
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
        ASSERT_EQ(pclose(pipe), 0) << command;
        EXPECT_EQ(r.body, json::parse(out)) << query;
      }
    }
  }
  Reply bad = Call(port_, "GET", "/v1/explain?prefix=9");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["param"], "prefix");
  Reply page = Call(port_, "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.content_type, HasSubstr("text/html"));
  EXPECT_THAT(page.raw, HasSubstr("v1/explain"));
}

// The built-in model's SentencePiece tokenizer through the API: usage
// counts its tokens, and a prompt of its ids is the prompt of its text (the
// same continuation; echo decodes the ids to the same text).
TEST(OpenAiHttpBuiltinModelTest, SubwordPromptsAsTextOrIdsAgree) {
  auto server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  auto model = Model::Load(LINATTN_BUILTIN_MODEL_DIR);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->tokenizer().kind(), "sentencepiece");
  const std::string text = "In the beginning God created the heaven";
  const std::vector<int32_t> ids = (*model)->tokenizer().Encode(text).value();
  ASSERT_LT(ids.size(), text.size());
  const json request = {{"max_tokens", 12}, {"temperature", 0}, {"echo", true}};
  json as_text = request, as_ids = request;
  as_text["prompt"] = text;
  as_ids["prompt"] = ids;
  Reply a = Call(server->http_port(), "POST", "/v1/completions", as_text);
  Reply b = Call(server->http_port(), "POST", "/v1/completions", as_ids);
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(a.body["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(b.body["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(Text(a).substr(0, text.size()), text);
  EXPECT_GT(Text(a).size(), text.size());
  EXPECT_EQ(Text(b), Text(a));
}

}  // namespace
}  // namespace linattn
