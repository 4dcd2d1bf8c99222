// The HTTP generation endpoints' answers (server/openai/routes.h), from a
// CompletionRun: OpenAI's completion, chat completion and response objects,
// and their Server-Sent Event streams (`data: {chunk}` lines ending with
// `data: [DONE]`; responses: typed events). Pure functions of the run but
// for the sequence number a response's events carry.
#ifndef LINATTN_SERVER_OPENAI_RENDER_H_
#define LINATTN_SERVER_OPENAI_RENDER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "server/http_json.h"
#include "server/openai/completion_run.h"

namespace linattn {

// OpenAI's values: "length", or "stop" for a stop string, the end of
// sequence, and a generation its session's deletion ended.
const char* FinishReason(const std::string& engine_reason);

json UsageJson(const CompletionRun& r);
// The whole answer of a completion or chat completion.
json CompletionJson(const CompletionRun& r);
// The response object (POST /v1/responses, GET /v1/responses/{id}) with
// `status` in_progress, completed or incomplete.
json ResponseJson(const CompletionRun& r, const std::string& status);
// The status a finished response has: incomplete when it was cut at
// max_output_tokens.
std::string EndStatus(const CompletionRun& r);

// The events a stream begins with, before any token.
std::string StreamPrelude(CompletionRun& r);
// The stream's text for one event (empty when it has nothing to say).
std::string StreamEvent(CompletionRun& r, const GenerateMux::Event& e);
// The events a stream ends with: the error of `failed`, or the closing
// events (a response's final object, passed to `keep` first, which may
// mark it not stored; a completion's usage) and `data: [DONE]`.
std::string StreamTail(CompletionRun& r, const absl::Status& failed,
                       const std::function<void(json& body)>& keep);

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_RENDER_H_
