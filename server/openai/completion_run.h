// One completion, chat completion or response as it runs through the HTTP
// listener (server/openai/routes.h): the request as parsed
// (server/openai/request.h), the sessions it made, and what its choices
// produced so far (rendered by server/openai/render.h).
//
// What a run undoes is undone in one place: the sessions it made for
// itself are deleted when it ends (Finish) or, on every way out that does
// not finish it, when it is destroyed; its rate charge is settled then too.
#ifndef LINATTN_SERVER_OPENAI_COMPLETION_RUN_H_
#define LINATTN_SERVER_OPENAI_COMPLETION_RUN_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/model/chat_template.h"
#include "core/model/model.h"
#include "core/scheduler/generation.h"
#include "core/session/tenant.h"
#include "nlohmann/json.hpp"
#include "server/engine_calls.h"
#include "server/observability.h"
#include "server/rate_limiter.h"

namespace linattn {

struct CompletionRun {
  enum class Kind { kCompletion, kChat, kResponse };

  // Deletes the sessions the run made on `engine` when it ends.
  explicit CompletionRun(GenerationEngine* on) : engine(on) {}
  ~CompletionRun();
  CompletionRun(const CompletionRun&) = delete;
  CompletionRun& operator=(const CompletionRun&) = delete;

  GenerationEngine* const engine;
  Kind kind = Kind::kCompletion;
  Tenant tenant;  // whose request it is
  // Where first-token and between-token times go (null: nowhere), timed
  // from the request's start.
  Observability* observability = nullptr;
  std::chrono::steady_clock::time_point start;
  std::shared_ptr<const Model> model;
  std::string id;  // cmpl-…, chatcmpl-…, resp_…
  int64_t created = 0;
  std::string session_id;  // a client's session to continue
  std::string previous_response_id;
  bool store = false;  // responses: keep the end state as session `id`
  std::vector<int32_t> prompt;
  std::string prompt_text;  // for echo
  SamplingParams params;
  uint32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool logprobs = false;
  std::string instructions;  // responses
  // Chat: the tools the template was given (null: none), tool_choice, and
  // whether the reply's tool calls are read back (the template writes them
  // in a form tool_calls.h reads, and tool_choice is "auto").
  nlohmann::ordered_json tools;
  std::string tool_choice = "none";
  bool parse_tool_calls = false;
  // Responses: the conversation the run's session holds once the prompt
  // is in (the previous response's, then this request's messages).
  std::vector<ChatMessage> conversation;
  nlohmann::json user = nullptr;

  // Filled as it runs.
  uint64_t cached = 0;
  struct Choice {
    // The text (kept whole unless a completion or chat is streamed without
    // tool calls to read back) and
    // the tokens with their log-probabilities (streamed: the last only).
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<std::pair<int32_t, float>>> top;
    size_t text_offset = 0;  // streamed logprobs: bytes before the token
    size_t text_sent = 0;    // streamed with tools: bytes sent as content
    std::string finish_reason;
    uint64_t completion_tokens = 0;
    absl::Status status;
    std::chrono::steady_clock::time_point last_token;  // unset: none yet
  };
  std::vector<Choice> choices;
  std::vector<std::string> cleanup;  // sessions to delete at the end
  std::string base;                  // the session choice 0 runs in
  bool own_base = false;       // made by this run (and kept only if `store`)
  std::string item_id;         // responses: the output message's id
  int sequence = 0;            // responses: events streamed so far
  std::shared_ptr<void> slot;  // of OpenAiApiOptions::max_generations
  // The tenant's rate was charged `charged` tokens (the prompt and n ×
  // max_tokens); what the choices did not generate goes back at the end.
  TokenRateLimiter* limiter = nullptr;
  double charged = 0;

  // Takes one event into its choice. What a stream has sent is not kept
  // (but a response's text, which its last event and GET return): a
  // stream holds O(1) per choice whatever its length.
  void Absorb(const GenerateMux::Event& e);
  // The first failed choice's status (OK when none failed).
  absl::Status Failed() const;
  // Deletes the sessions the run made for itself (and, unless it
  // succeeded, the one it made to keep), waiting for each so that a client
  // that lists sessions after its answer sees none of them. Once; the
  // destructor finishes a run not finished as failed.
  void Finish(bool success);

 private:
  bool finished_ = false;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_COMPLETION_RUN_H_
