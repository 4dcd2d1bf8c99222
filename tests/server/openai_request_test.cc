// The HTTP generation endpoints' request reading (server/openai/request.h),
// without a process: every field's bounds, the field each refusal names
// (message prefix and OpenAI `param`), and the run a valid body reads into.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/openai/request.h"
#include "tests/server/tiny_model.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

CompletionRun::Kind kCompletion = CompletionRun::Kind::kCompletion;
CompletionRun::Kind kChat = CompletionRun::Kind::kChat;
CompletionRun::Kind kResponse = CompletionRun::Kind::kResponse;

// Reads `body` as a request of `kind` into a fresh run.
absl::Status Read(const char* body, CompletionRun::Kind kind, CompletionRun* r,
                  uint32_t max_choices = 16) {
  r->kind = kind;
  r->model = TinyModel();
  return ReadSampling(json::parse(body), max_choices, *r);
}

absl::Status Read(const char* body, CompletionRun::Kind kind = kCompletion) {
  CompletionRun r(nullptr);
  return Read(body, kind, &r);
}

// The message and param an HTTP client receives for `status`.
std::pair<std::string, json> Answer(const absl::Status& status) {
  const json e = StatusErrorJson(status)["error"];
  return {e["message"].get<std::string>(), e["param"]};
}

TEST(OpenAiRequest, DefaultsDependOnTheEndpoint) {
  CompletionRun completion(nullptr), chat(nullptr), response(nullptr);
  ASSERT_TRUE(Read("{}", kCompletion, &completion).ok());
  ASSERT_TRUE(Read("{}", kChat, &chat).ok());
  ASSERT_TRUE(Read("{}", kResponse, &response).ok());
  EXPECT_EQ(completion.params.max_tokens, 16u);
  EXPECT_EQ(chat.params.max_tokens, kDefaultChatMaxTokens);
  EXPECT_EQ(response.params.max_tokens, kDefaultChatMaxTokens);
  EXPECT_EQ(completion.n, 1u);
  EXPECT_FLOAT_EQ(completion.params.temperature, 1.0f);
  EXPECT_FLOAT_EQ(completion.params.top_p, 1.0f);
  EXPECT_EQ(completion.params.penalty_last_n, 64);
  EXPECT_FALSE(completion.stream);
}

TEST(OpenAiRequest, ValidFieldsReadIntoTheRun) {
  CompletionRun r(nullptr);
  ASSERT_TRUE(Read(R"({"temperature": 0.5, "top_p": 0.9, "top_k": 7,
                       "max_tokens": 33, "n": 3, "seed": 42,
                       "stop": ["a", "bc"], "logprobs": 2,
                       "presence_penalty": -1.5, "frequency_penalty": 0.25,
                       "repetition_penalty": 1.1, "min_p": 0.05,
                       "repeat_last_n": -1, "stream": true,
                       "stream_options": {"include_usage": true}})",
                   kCompletion, &r)
                  .ok());
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 7u);
  EXPECT_EQ(r.params.max_tokens, 33u);
  EXPECT_EQ(r.n, 3u);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 2u);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.05f);
  EXPECT_EQ(r.params.penalty_last_n, -1);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, EveryRefusalNamesItsField) {
  struct Case {
    const char* body;
    CompletionRun::Kind kind;
    const char* field;
    const char* says;
  };
  const Case cases[] = {
      {R"({"temperature": 2.5})", kCompletion, "temperature",
       "must be in [0, 2], got 2.5"},
      {R"({"temperature": "hot"})", kCompletion, "temperature",
       "must be a number"},
      {R"({"top_p": 0})", kCompletion, "top_p", "must be > 0"},
      {R"({"top_k": 1.5})", kCompletion, "top_k", "must be an integer"},
      {R"({"max_tokens": 0})", kCompletion, "max_tokens", "must be in [1, "},
      {R"({"max_completion_tokens": 0})", kChat, "max_completion_tokens",
       "must be in [1, "},
      {R"({"max_output_tokens": 0})", kResponse, "max_output_tokens",
       "must be in [1, "},
      {R"({"n": 17})", kCompletion, "n", "must be in [1, 16], got 17"},
      {R"({"seed": "x"})", kCompletion, "seed", "must be an integer"},
      {R"({"stop": [""]})", kCompletion, "stop", "must not be empty"},
      {R"({"stop": [1]})", kCompletion, "stop", "strings only"},
      {R"({"stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m",
                    "n","o","p","q"]})",
       kCompletion, "stop", "at most 16 strings"},
      {R"({"top_logprobs": 2})", kChat, "top_logprobs", "needs logprobs: true"},
      {R"({"logprobs": 3})", kChat, "logprobs", "must be a boolean"},
      {R"({"repetition_penalty": 0})", kCompletion, "repetition_penalty",
       "must be > 0"},
      {R"({"logit_bias": {"5": 1}})", kCompletion, "logit_bias",
       "is not supported"},
      {R"({"best_of": 2})", kCompletion, "best_of", "must be in [1, 1]"},
      {R"({"suffix": "x"})", kCompletion, "suffix", "is not supported"},
      {R"({"tools": [{"type": "function"}]})", kCompletion, "tools",
       "a completion has no tools"},
      {R"({"tools": [{"type": "function"}]})", kResponse, "tools",
       "/v1/chat/completions"},
      {R"({"user": 5})", kCompletion, "user", "must be a string"},
      {R"({"stream_options": {"include_usage": true}})", kCompletion,
       "stream_options", "needs stream: true"},
      {R"({"stream": true, "stream_options": 3})", kCompletion,
       "stream_options", "must be an object"},
      {R"({"max_tokens": 1048576, "n": 2})", kCompletion, "max_tokens",
       "stream it for more"},
      {R"({"max_tokens": 70000, "logprobs": 0})", kCompletion, "max_tokens",
       "log-probabilities"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const absl::Status s = Read(c.body, c.kind);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    const auto [message, param] = Answer(s);
    EXPECT_THAT(message, StartsWith(std::string(c.field) + ": "));
    EXPECT_THAT(message, HasSubstr(c.says));
    EXPECT_EQ(param, c.field);
  }
}

TEST(OpenAiRequest, AStreamedAnswerIsNotBoundedByWhatAWholeOneHolds) {
  EXPECT_TRUE(Read(R"({"max_tokens": 1048576, "n": 2, "stream": true})").ok());
  EXPECT_TRUE(Read(R"({"max_output_tokens": 1048576})", kResponse).ok());
}

TEST(OpenAiRequest, TokenIdsOutOfTheVocabularyNameTheEntryAndTheField) {
  const uint32_t vocab = TinyModel()->tokenizer().size();
  auto ids = ReadTokenIds(json::parse("[1, 2, 3]"), "prompt", vocab, "what");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3}));
  for (const char* bad : {"[1, -1]", "[1, 2.5]", "[1, \"a\"]"}) {
    auto refused = ReadTokenIds(json::parse(bad), "prompt", vocab,
                                "not a token id of the model");
    ASSERT_FALSE(refused.ok());
    const auto [message, param] = Answer(refused.status());
    EXPECT_EQ(message, "prompt[1]: not a token id of the model (0 to " +
                           std::to_string(vocab - 1) + ")");
    EXPECT_EQ(param, "prompt");
  }
  auto past = ReadTokenIds(json::array({int64_t{vocab}}), "prompt", vocab,
                           "what", "; tail");
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("; tail"));
}

TEST(OpenAiRequest, MessagesAreCheckedItemByItem) {
  auto ok = ReadMessages(nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"},
                                   {"type": "input_text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}])"),
                         "messages", /*tool_turns=*/true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 4u);
  EXPECT_EQ((*ok)[1].content, "ab");
  EXPECT_EQ((*ok)[2].content, "");
  // The arguments' JSON text becomes the object, in the client's order.
  EXPECT_EQ((*ok)[2].tool_calls.dump(),
            R"([{"type":"function","function":{"name":"f","arguments":)"
            R"({"z":1,"a":2}},"id":"call_1"}])");
  EXPECT_EQ((*ok)[3].tool_call_id, "call_1");
  const std::pair<const char*, const char*> refused_calls[] = {
      {R"([{"role": "assistant", "tool_calls": {}}])",
       "messages[0].tool_calls: must be an array"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])",
       "messages[0].tool_calls[0].function.name: required"},
      {R"([{"role": "assistant", "tool_calls": [{"function":
          {"name": "f", "arguments": "{oops"}}]}])",
       "messages[0].tool_calls[0].function.arguments: is not the JSON text "
       "of an object"},
      {R"([{"role": "assistant", "tool_calls": [{"function":
          {"name": "f", "arguments": "[1]"}}]}])",
       "messages[0].tool_calls[0].function.arguments: is not the JSON text "
       "of an object"},
      {R"([{"role": "user", "tool_calls": []}])",
       "messages[0].tool_calls: only an assistant message"},
      {R"([{"role": "tool", "content": "x", "tool_call_id": 3}])",
       "messages[0].tool_call_id: must be a string"},
  };
  for (const auto& [body, says] : refused_calls) {
    SCOPED_TRACE(body);
    auto r = ReadMessages(nlohmann::ordered_json::parse(body), "messages",
                          /*tool_turns=*/true);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), StartsWith(says));
  }
  const std::pair<const char*, const char*> refused[] = {
      {"[]", "messages: must be a non-empty array"},
      {R"([{"content": "x"}])", "messages[0].role: each message"},
      {R"([{"role": "tool", "content": "x"}])",
       "messages[0].role: must be system, developer, user or assistant, got "
       "'tool'"},
      {R"([{"role": "user", "content": 5}])",
       "messages[0].content: must be a string or an array"},
      {R"([{"role": "user", "content": [{"type": "image_url", "text": ""}]}])",
       "messages[0].content[0]: parts of type 'image_url'"},
      {R"([{"role": "user", "type": "function_call"}])",
       "messages[0].type: only message items"},
  };
  for (const auto& [body, says] : refused) {
    SCOPED_TRACE(body);
    auto r = ReadMessages(nlohmann::ordered_json::parse(body), "messages",
                          /*tool_turns=*/false);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), StartsWith(says));
  }
}

TEST(OpenAiRequest, ACompletionPromptIsTextIdsOrAListOfOne) {
  const Tokenizer& tok = TinyModel()->tokenizer();
  CompletionRun text(nullptr);
  ASSERT_TRUE(
      ReadCompletionPrompt(json::parse(R"({"prompt": ["hi"]})"), tok, text)
          .ok());
  EXPECT_EQ(text.prompt_text, "hi");
  EXPECT_TRUE(text.prompt.empty());
  ASSERT_TRUE(EncodePrompt(tok, "prompt", text).ok());
  EXPECT_EQ(text.prompt, tok.Encode("hi").value());

  const std::vector<int32_t> hi = tok.Encode("hi").value();
  CompletionRun ids(nullptr);
  ASSERT_TRUE(
      ReadCompletionPrompt(json{{"prompt", json::array({json(hi)})}}, tok, ids)
          .ok());
  EXPECT_EQ(ids.prompt, hi);
  EXPECT_EQ(ids.prompt_text, tok.Decode(hi));  // what echo returns

  CompletionRun none(nullptr);
  EXPECT_EQ(Answer(ReadCompletionPrompt(json::object(), tok, none)).first,
            "prompt: required");
  const absl::Status two =
      ReadCompletionPrompt(json::parse(R"({"prompt": [[1], [2]]})"), tok, none);
  EXPECT_EQ(Answer(two).second, "prompt");
  EXPECT_THAT(std::string(two.message()), HasSubstr("one prompt per request"));
  EXPECT_EQ(
      Answer(ReadCompletionPrompt(json::parse(R"({"prompt": 5})"), tok, none))
          .first,
      "prompt: a string or an array of token ids");
}

TEST(OpenAiRequest, AResponseInputFollowsItsInstructions) {
  auto messages =
      ReadResponseInput(json::parse(R"({"input": "hello"})"), "answer briefly");
  ASSERT_TRUE(messages.ok());
  ASSERT_EQ(messages->size(), 2u);
  EXPECT_EQ((*messages)[0].role, "system");
  EXPECT_EQ((*messages)[0].content, "answer briefly");
  EXPECT_EQ((*messages)[1].role, "user");
  EXPECT_EQ(Answer(ReadResponseInput(json::object(), "").status()).first,
            "input: required");
  EXPECT_THAT(
      Answer(ReadResponseInput(json::parse(R"({"input": 3})"), "").status())
          .first,
      StartsWith("input: must be a non-empty array"));
}

TEST(OpenAiRequest, WholeRequestChecks) {
  CompletionRun r(nullptr);
  r.prompt = {1};
  EXPECT_TRUE(CheckCompletion(r).ok());
  r.n = 2;
  r.session_id = "s";
  EXPECT_THAT(Answer(CheckCompletion(r)).first, StartsWith("n: one choice"));
  r.n = 1;
  r.echo = r.logprobs = true;
  EXPECT_THAT(Answer(CheckCompletion(r)).first, StartsWith("echo: "));
  r.echo = r.logprobs = false;
  r.prompt.clear();
  EXPECT_TRUE(CheckCompletion(r).ok());  // a session has a context
  r.session_id.clear();
  EXPECT_THAT(Answer(CheckCompletion(r)).first,
              StartsWith("prompt: must not be empty"));
}

}  // namespace
}  // namespace linattn
