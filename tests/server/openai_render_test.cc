// The HTTP generation endpoints' answers (server/openai/render.h) and a
// run's bookkeeping (server/openai/completion_run.h), without a process:
// the objects OpenAI's clients parse, the event streams, and what a stream
// holds while it runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/openai/render.h"
#include "tests/server/tiny_model.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::unique_ptr<CompletionRun> NewRun(CompletionRun::Kind kind,
                                      uint32_t n = 1) {
  auto r = std::make_unique<CompletionRun>(nullptr);
  r->kind = kind;
  r->model = TinyModel();
  r->id = "id-1";
  r->created = 1700000000;
  r->n = n;
  r->choices.resize(n);
  r->item_id = "msg_1";
  return r;
}

// The event of one generated token of `choice` (a final one when
// `finish` is given).
GenerateMux::Event Token(int choice, int32_t id, const std::string& text,
                         uint64_t count, const char* finish = nullptr) {
  GenerateMux::Event e;
  e.choice = choice;
  e.event.token_id = id;
  e.event.text = text;
  e.event.logprob = -0.5f;
  e.event.top_logprobs = {{id, -0.5f}};
  e.event.completion_tokens = count;
  if (finish != nullptr) {
    e.event.finished = true;
    e.event.finish_reason = finish;
  }
  return e;
}

// The JSON of each `data:` line of an event stream (but [DONE]), and
// whether it ended with [DONE].
std::vector<json> DataLines(const std::string& stream, bool* done) {
  std::vector<json> out;
  *done = false;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    if (line == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(line));
  }
  return out;
}

TEST(OpenAiRender, FinishReasonsAreOpenAis) {
  EXPECT_STREQ(FinishReason("length"), "length");
  for (const char* engine : {"stop", "eos", "cancelled"}) {
    EXPECT_STREQ(FinishReason(engine), "stop");
  }
}

TEST(OpenAiRender, AWholeChatAnswerWithLogprobsAndCachedUsage) {
  auto r = NewRun(CompletionRun::Kind::kChat, 2);
  r->logprobs = true;
  r->prompt = {1, 2, 3};
  r->cached = 10;
  r->session_id = "conv";
  r->Absorb(Token(0, 5, "a", 1));
  r->Absorb(Token(0, 6, "b", 2, "stop"));
  r->Absorb(Token(1, 7, "c", 1, "length"));
  const json body = CompletionJson(*r);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["session_id"], "conv");
  EXPECT_EQ(body["system_fingerprint"], TinyModel()->fingerprint_hex());
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ab");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  const json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  const std::string bytes = TinyModel()->tokenizer().TokenBytes(5);
  EXPECT_EQ(content[0]["token"], bytes);
  EXPECT_EQ(content[0]["bytes"].size(), bytes.size());
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 13);  // cached + new
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"], 16);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
}

TEST(OpenAiRender, ACompletionEchoesItsPromptAndOffsetsItsLogprobs) {
  auto r = NewRun(CompletionRun::Kind::kCompletion);
  r->echo = true;
  r->logprobs = true;
  r->params.top_logprobs = 1;
  r->prompt_text = "Once";
  r->Absorb(Token(0, 5, "x", 1));
  r->Absorb(Token(0, 6, "y", 2, "length"));
  const json body = CompletionJson(*r);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Oncexy");
  const json& lp = body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["text_offset"].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1],
            TinyModel()->tokenizer().TokenBytes(5).size());
  EXPECT_EQ(lp["top_logprobs"].size(), 2u);
}

TEST(OpenAiRender, AStreamHoldsOneTokenPerChoiceAndItsOffsetMoves) {
  auto r = NewRun(CompletionRun::Kind::kCompletion);
  r->stream = true;
  r->logprobs = true;
  size_t offset = 0;
  for (int i = 0; i < 50; ++i) {
    r->Absorb(Token(0, 5, "x", i + 1));
    EXPECT_EQ(r->choices[0].tokens.size(), 1u);
    EXPECT_EQ(r->choices[0].text, "");  // sent, not kept
    EXPECT_EQ(r->choices[0].text_offset, offset);
    bool done = false;
    const json chunk =
        DataLines(StreamEvent(*r, Token(0, 5, "x", i + 1)), &done)[0];
    EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"][0], offset);
    offset += TinyModel()->tokenizer().TokenBytes(5).size();
  }
  EXPECT_EQ(r->choices[0].completion_tokens, 50u);
}

TEST(OpenAiRender, AChatStreamBeginsWithRolesAndEndsWithUsageAndDone) {
  auto r = NewRun(CompletionRun::Kind::kChat, 2);
  r->stream = true;
  r->include_usage = true;
  r->prompt = {1, 2};
  bool done = false;
  auto prelude = DataLines(StreamPrelude(*r), &done);
  ASSERT_EQ(prelude.size(), 2u);
  EXPECT_EQ(prelude[1]["choices"][0]["index"], 1);
  EXPECT_EQ(prelude[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(prelude[0]["usage"].is_null());
  const GenerateMux::Event last = Token(1, 5, "z", 1, "eos");
  r->Absorb(last);
  auto chunks = DataLines(StreamEvent(*r, last), &done);
  ASSERT_EQ(chunks.size(), 2u);  // the text, then the finish
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "z");
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  bool kept = false;
  auto tail = DataLines(
      StreamTail(*r, absl::OkStatus(), [&](json&) { kept = true; }), &done);
  EXPECT_FALSE(kept);  // only responses are kept
  EXPECT_TRUE(done);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_TRUE(tail[0]["choices"].empty());
  EXPECT_EQ(tail[0]["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(tail[0]["usage"]["completion_tokens"], 1);
}

TEST(OpenAiRender, AFailedStreamEndsWithTheErrorBody) {
  auto r = NewRun(CompletionRun::Kind::kCompletion);
  bool done = false;
  auto tail = DataLines(
      StreamTail(*r,
                 absl::ResourceExhaustedError("sessions: the table is full"),
                 [](json&) {}),
      &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0]["error"]["message"], "sessions: the table is full");
  EXPECT_EQ(tail[0]["error"]["type"], "rate_limit_error");

  auto response = NewRun(CompletionRun::Kind::kResponse);
  const std::string events = StreamTail(
      *response, absl::InvalidArgumentError("input: too long"), [](json&) {});
  EXPECT_THAT(events, HasSubstr("event: error\n"));
  EXPECT_THAT(events, Not(HasSubstr("[DONE]")));
  EXPECT_EQ(DataLines(events, &done)[0]["param"], "input");
}

TEST(OpenAiRender, AResponseStreamIsTypedAndNumberedAndKeepsItsBody) {
  auto r = NewRun(CompletionRun::Kind::kResponse);
  r->stream = true;
  r->store = true;
  r->instructions = "be brief";
  r->params.max_tokens = 2;
  std::string stream = StreamPrelude(*r);
  for (int i = 0; i < 2; ++i) {
    const GenerateMux::Event e =
        Token(0, 5, "w", i + 1, i == 1 ? "length" : nullptr);
    r->Absorb(e);
    stream += StreamEvent(*r, e);
  }
  EXPECT_EQ(r->choices[0].text, "ww");  // a response's text is kept
  std::string kept_id;
  stream += StreamTail(*r, absl::OkStatus(), [&](json& body) {
    kept_id = body["id"];
    body["store"] = false;  // as a store too full for it says
  });
  EXPECT_EQ(kept_id, "id-1");
  std::vector<std::string> types;
  for (absl::string_view line : absl::StrSplit(stream, '\n')) {
    if (absl::ConsumePrefix(&line, "event: ")) types.emplace_back(line);
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{
                "response.created", "response.in_progress",
                "response.output_item.added", "response.content_part.added",
                "response.output_text.delta", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.incomplete"}));
  bool done = false;
  const auto data = DataLines(stream, &done);
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(data[i]["sequence_number"], i);
  }
  const json& final_body = data.back()["response"];
  EXPECT_EQ(final_body["status"], "incomplete");
  EXPECT_EQ(final_body["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(final_body["store"], false);
  EXPECT_EQ(final_body["instructions"], "be brief");
  EXPECT_EQ(final_body["output"][0]["content"][0]["text"], "ww");
  EXPECT_EQ(final_body["usage"]["output_tokens"], 2);
}

TEST(OpenAiRender, AResponseInProgressHasNoOutputOrUsage) {
  auto r = NewRun(CompletionRun::Kind::kResponse);
  const json body = ResponseJson(*r, "in_progress");
  EXPECT_TRUE(body["output"].empty());
  EXPECT_TRUE(body["usage"].is_null());
  EXPECT_TRUE(body["previous_response_id"].is_null());
  r->Absorb(Token(0, 5, "v", 1, "stop"));
  EXPECT_EQ(EndStatus(*r), "completed");
  EXPECT_EQ(ResponseJson(*r, EndStatus(*r))["output"][0]["status"],
            "completed");
}

TEST(OpenAiRender, AFailedChoiceIsTheRunsFailure) {
  auto r = NewRun(CompletionRun::Kind::kCompletion, 3);
  EXPECT_TRUE(r->Failed().ok());
  GenerateMux::Event e;
  e.choice = 2;
  e.event.finished = true;
  e.event.status = absl::NotFoundError("session gone");
  r->Absorb(e);
  EXPECT_EQ(r->Failed().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace linattn
