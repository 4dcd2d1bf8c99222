// The HTTP listener's generation endpoints (docs/design.md §3, "HTTP"):
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
// `stream: true` answers with Server-Sent Events, `data: {chunk}` lines
// ending with `data: [DONE]` (responses: typed events). A stream is paced
// by its client (engine_calls.h): a client that stops reading holds at most
// one token per choice here and ends its generation when the write times
// out; a cancelled stream leaves in a session exactly the tokens sent.
// `session_id` (completions, chat) appends to an existing session: only the
// new text is prefilled; usage.prompt_tokens_details.cached_tokens counts
// the context it already held. `n > 1` prefills once, then forks the state
// per choice (choice 0 continues in the session itself, the others in
// forks deleted after).
#ifndef LINATTN_SERVER_OPENAI_API_H_
#define LINATTN_SERVER_OPENAI_API_H_

#include <httplib.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/model/chat_template.h"
#include "core/scheduler/generation.h"
#include "server/http_json.h"
#include "server/rpc_entry.h"

namespace linattn {

// The model a request's body names (or the only one served); nullptr with
// the error sent.
const Model* ModelForRequest(
    const std::vector<std::shared_ptr<const Model>>& models, const json& body,
    httplib::Response& res);

struct CompletionRun;  // one completion request, as it runs

struct OpenAiApiOptions {
  uint32_t max_choices = 16;  // n
  // Completions, chats and responses under way at once (each holds a
  // listener thread, a stream for its whole length); past it, 429 with
  // Retry-After. Below the listener's threads, so /health and the sessions
  // endpoints always have some.
  int max_generations = 56;
  // Stored responses kept with their bodies, by count and by the bytes of
  // their JSON (each also holds a session: the session table's limits,
  // idle TTL and budget, apply to those); past either, the oldest goes.
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
  struct StoredResponse {
    json body;                     // the response object as GET returns it
    uint64_t order = 0;            // stored after `order` others
    size_t bytes = 0;              // of its JSON text
    bool ended_at_marker = false;  // at the end-of-turn marker, not cut
    std::string owner;             // the tenant whose request stored it
  };
  using StoredMap = std::map<std::string, StoredResponse>;

  void Completions(const httplib::Request& req, httplib::Response& res,
                   const Tenant& tenant, bool chat);
  void Responses(const httplib::Request& req, httplib::Response& res,
                 const Tenant& tenant);
  // Runs a parsed request: non-streaming answers at once; streaming sets
  // the response's event stream.
  void Run(std::shared_ptr<CompletionRun> r, httplib::Response& res);
  absl::Status ParseSampling(const json& body, CompletionRun& r) const;
  // The run's model — `bound`'s (a session or a stored response, whose
  // model a "model" field must then name) or the one the body names — and
  // its sampling fields; false with the error sent.
  bool ChooseModel(const json& body, const std::string& bound,
                   absl::string_view bound_says, CompletionRun& r,
                   httplib::Response& res);
  // Deletes the sessions a run made for itself (and, unless it succeeded,
  // the one it made to keep).
  void Cleanup(CompletionRun& r, bool success);
  // The template of a model (looked up once).
  const ChatTemplate& TemplateOf(const Model& model);

  json SessionJson(const ModelSessionInfo& info) const;
  template <typename Routes>
  void RouteSessions(Routes& routes);

  // Stored responses: (id → body); entries whose session is gone go.
  // Keeps `body` (and so the run's session) unless it is too large, which
  // then says so in the body ("store": false) and lets Cleanup delete it.
  void Store(CompletionRun& r, json& body);
  // Only `tenant`'s (another tenant's is as absent).
  std::optional<StoredResponse> Stored(const std::string& id,
                                       const Tenant& tenant);
  void Forget(const std::string& id);
  // Under mu_.
  StoredMap::iterator EraseLocked(StoredMap::iterator it);

  // A generation slot (nullptr when all are taken), and the 429 for that.
  std::shared_ptr<void> TakeSlot();
  bool RefuseWhenBusy(std::shared_ptr<void>* slot, httplib::Response& res);

  GenerationEngine* const engine_;
  CallGate* const gate_;
  const OpenAiApiOptions options_;
  std::atomic<int> generations_{0};
  std::mutex mu_;
  std::map<const Model*, ChatTemplate> templates_;
  StoredMap stored_;
  uint64_t next_order_ = 0;
  size_t stored_bytes_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_API_H_
