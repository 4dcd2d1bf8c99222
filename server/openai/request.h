// The HTTP generation endpoints' request bodies (server/openai/routes.h),
// read into a CompletionRun: every field checked here, once, with an
// INVALID_ARGUMENT naming it (http_json.h turns it into OpenAI's error
// body with that field as `param`). Nothing here touches a session.
#ifndef LINATTN_SERVER_OPENAI_REQUEST_H_
#define LINATTN_SERVER_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/chat_template.h"
#include "core/model/tokenizer.h"
#include "server/http_json.h"
#include "server/openai/completion_run.h"

namespace linattn {

// Replies of chat completions and responses that name no limit.
inline constexpr uint32_t kDefaultChatMaxTokens = 512;
// Stop strings a request may give.
inline constexpr size_t kMaxStops = 16;
// Tokens a whole, not streamed, answer may hold, and log-probabilities
// (each token's and its alternatives').
inline constexpr uint64_t kMaxHeldTokens = uint64_t{1} << 20;
inline constexpr uint64_t kMaxHeldLogprobs = uint64_t{1} << 16;

// "field: message", INVALID_ARGUMENT.
absl::Status FieldError(absl::string_view field, absl::string_view message);

// Optional fields (null or absent: `*out` stays). A number within
// [lo, hi] (an integer when `integer`).
absl::Status ReadNumber(const json& body, const char* field, double lo,
                        double hi, bool integer, double* out);
absl::Status ReadBool(const json& body, const char* field, bool* out);
absl::Status ReadString(const json& body, const char* field, std::string* out);

using ordered_json = nlohmann::ordered_json;

// A message list (chat's messages, responses' input items): roles system,
// developer, user or assistant, content a string or text parts; with
// `tool_turns` (chat) also tool messages (tool_call_id, name) and an
// assistant's tool_calls (their arguments parsed: what the template reads).
// Read from the body as written (ordered_json): the template sees objects' keys
// in the client's order.
absl::StatusOr<std::vector<ChatMessage>> ReadMessages(const ordered_json& list,
                                                      const char* field,
                                                      bool tool_turns);

// Chat's tools (OpenAI's function definitions, kept as written for the
// template) and tool_choice: "auto" (the default with tools: the reply's
// calls are read back) or "none"; "required" and a named function need
// constrained decoding, which linattn does not do, and are refused.
absl::Status ReadTools(const ordered_json& body, CompletionRun& r);

// Token ids of a vocabulary of `vocab` at body field `field` (an array);
// an entry out of range is refused as "field[i]: `what` (0 to vocab-1)
// `tail`", param `field`.
absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const json& ids,
                                                  const char* field,
                                                  uint32_t vocab,
                                                  absl::string_view what,
                                                  absl::string_view tail = "");

// The sampling fields and the answer's shape (n up to `max_choices`,
// stream, logprobs, echo …) into `r`, whose kind and model are set. A whole
// answer that is not streamed is bounded (kMaxHeldTokens,
// kMaxHeldLogprobs).
absl::Status ReadSampling(const json& body, uint32_t max_choices,
                          CompletionRun& r);

// A completion's `prompt` (text, token ids, or a list of one of those)
// into r.prompt_text / r.prompt; r.session_id says whether it continues a
// session (then ids echo as their pieces).
absl::Status ReadCompletionPrompt(const json& body, const Tokenizer& tokenizer,
                                  CompletionRun& r);

// The responses API's `input` (a string or message items), after the
// instructions as a system message.
absl::StatusOr<std::vector<ChatMessage>> ReadResponseInput(
    const json& body, const std::string& instructions);

// r.prompt from r.prompt_text when no ids were given; `field` names what
// the text came from (prompt, messages, input). A stateless completion's
// text is encoded as the start of a context (Tokenizer::EncodeStart).
absl::Status EncodePrompt(const Tokenizer& tokenizer, const char* field,
                          CompletionRun& r);

// The checks of a completion or chat that need the whole request: n with a
// session, echo with logprobs, an empty prompt of a new session.
absl::Status CheckCompletion(const CompletionRun& r);

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_REQUEST_H_
