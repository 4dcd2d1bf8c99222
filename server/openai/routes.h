// The HTTP listener's generation endpoints (docs/design.md, "HTTP"):
// OpenAI's completions, chat completions and responses, and linattn's
// sessions, on the generation engine that GenerationService uses.
//
//   POST /v1/completions        prompt (text or token ids) → n choices
//   POST /v1/chat/completions   messages, rendered by the model's chat
//                               template (core/model/chat_template.h)
//   POST /v1/responses          input (+ instructions); store keeps the end
//                               state as a session named by the response's
//                               id, previous_response_id continues a fork
//                               of it (O(state), whatever the conversation's
//                               length)
//   GET|DELETE /v1/responses/{id}
//   POST /v1/sessions, GET /v1/sessions, GET|DELETE /v1/sessions/{id},
//   POST /v1/sessions/{id}/fork, POST /v1/sessions/{id}/append,
//   GET /v1/sessions/{id}/state (snapshot bytes), POST /v1/sessions/restore
//
// Each handler reads its body (server/openai/request.h), runs it on the
// engine, and renders the answer (server/openai/render.h). `stream: true`
// answers with Server-Sent Events. A stream is paced by its client
// (engine_calls.h): a client that stops reading holds at most one token per
// choice here and ends its generation when the write times out; a
// cancelled stream leaves in a session exactly the tokens sent.
// `session_id` (completions, chat) appends to an existing session: only the
// new text is prefilled; usage.prompt_tokens_details.cached_tokens counts
// the context it already held. `n > 1` prefills once, then forks the state
// per choice (choice 0 continues in the session itself, the others in
// forks deleted after).
#ifndef LINATTN_SERVER_OPENAI_ROUTES_H_
#define LINATTN_SERVER_OPENAI_ROUTES_H_

#include <httplib.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/model/chat_template.h"
#include "core/scheduler/generation.h"
#include "server/http_json.h"
#include "server/openai/completion_run.h"
#include "server/openai/response_store.h"
#include "server/rpc_entry.h"

namespace linattn {

// The model a request's body names (or the only one served); nullptr with
// the error sent.
const Model* ModelForRequest(
    const std::vector<std::shared_ptr<const Model>>& models, const json& body,
    httplib::Response& res);

struct OpenAiApiOptions {
  uint32_t max_choices = 16;  // n
  // Completions, chats and responses under way at once (each holds a
  // listener thread, a stream for its whole length); past it, 429 with
  // Retry-After. Below the listener's threads, so /health and the sessions
  // endpoints always have some.
  int max_generations = 56;
  // Stored responses kept with their bodies per tenant, by count and by the
  // bytes of their JSON (each also holds a session: the session table's
  // limits, idle TTL and budget, apply to those); past either, the tenant's
  // own oldest goes (response_store.h).
  size_t max_stored_responses = 1024;
  size_t max_stored_bytes = 64 << 20;
};

class OpenAiApi {
 public:
  // `engine` and `gate` outlive the API; every request, its stream
  // included, counts as a call in flight at `gate`.
  OpenAiApi(GenerationEngine* engine, CallGate* gate,
            OpenAiApiOptions options = {});
  void Route(httplib::Server& server);

 private:
  // A handler with the tenant its key names.
  using Handler = std::function<void(const httplib::Request&,
                                     httplib::Response&, const Tenant&)>;
  // Registers handlers that count as calls in flight at `gate` while they
  // run and answer 401 without a key when keys are on.
  struct Routes {
    httplib::Server& server;
    CallGate* gate;
    httplib::Server::Handler Wrap(Handler h);
    void Get(const std::string& pattern, Handler h);
    void Post(const std::string& pattern, Handler h);
    void Delete(const std::string& pattern, Handler h);
  };

  // The handlers' parts: read the request into a run, then Run it.
  void Completions(const httplib::Request& req, httplib::Response& res,
                   const Tenant& tenant, bool chat);
  void Responses(const httplib::Request& req, httplib::Response& res,
                 const Tenant& tenant);
  // A new run of `kind` with a generation slot; nullptr with the 429 sent
  // when every slot is taken.
  std::shared_ptr<CompletionRun> NewRun(CompletionRun::Kind kind,
                                        const Tenant& tenant,
                                        httplib::Response& res);
  // The run's model — `bound`'s (a session or a stored response, whose
  // model a "model" field must then name) or the one the body names — and
  // its sampling fields; false with the error sent.
  bool ChooseModel(const json& body, const std::string& bound,
                   absl::string_view bound_says, CompletionRun& r,
                   httplib::Response& res);
  // The prompt of chat messages in the model's template, with its end of
  // turn as a stop string.
  // The prompt text of `messages` in the run's model's chat template;
  // `history` is the conversation a continuation follows (Render's).
  absl::Status RenderChat(const std::vector<ChatMessage>& messages,
                          ChatTemplate::After after, CompletionRun& r,
                          const std::vector<ChatMessage>* history = nullptr);
  // The template of a model (looked up once).

  // Runs a read request: non-streaming answers at once; streaming sets the
  // response's event stream. Its steps:
  void Run(std::shared_ptr<CompletionRun> r, httplib::Response& res);
  // The tenant's rate: the prompt and every choice's max_tokens.
  absl::Status ChargeRate(CompletionRun& r);
  // The session choice 0 runs in: a fork of the previous response's state,
  // the client's session, or a new one.
  absl::Status OpenBase(CompletionRun& r);
  // The session of each choice: n > 1 prefills `prompt` once in the base
  // (clearing it), then forks it per further choice.
  absl::StatusOr<std::vector<std::string>> OpenChoices(
      CompletionRun& r, std::vector<int32_t>& prompt);
  void AnswerWhole(CompletionRun& r, GenerateMux& mux, httplib::Response& res);
  void AnswerStream(std::shared_ptr<CompletionRun> r,
                    std::shared_ptr<GenerateMux> mux, httplib::Response& res);
  // A finished response's body into the store (when it asked to be
  // stored); too large, it says "store": false and its session goes.
  void KeepResponse(CompletionRun& r, json& body);

  void RouteResponses(Routes& routes);
  void RouteSessions(Routes& routes);  // server/openai/session_routes.cc

  GenerationEngine* const engine_;
  CallGate* const gate_;
  const OpenAiApiOptions options_;
  std::atomic<int> generations_{0};
  ResponseStore responses_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_ROUTES_H_
