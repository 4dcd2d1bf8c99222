// linattn-server's HTTP listener (--http-listen; docs/design.md §3, "HTTP"):
// the JSON endpoints that OpenAI-style clients and load balancers expect,
// on Debian's cpp-httplib, in the same process as the gRPC services and on
// the same engine, session table and limits.
//
//   GET  /health             {"status": "ok"}; 503 {"status": "draining"}
//                            once SIGTERM's drain began
//   GET  /v1/models          OpenAI's model list: the models served
//   GET  /v1/models/{model}  one of them; 404 otherwise
//   POST /tokenize           {"model"?, "content" | "prompt": text} →
//                            {"tokens": [ids], "count": n, "model": name}
//   POST /detokenize         {"model"?, "tokens": [ids]} → {"content": text}
//   GET  /                   the explorer page (server/assets/explorer.html,
//                            built into the binary): the seed's
//                            reassociation module and a playground
//   GET  /v1/explain         ?preset=&feature_map=&prefix= → the JSON of
//                            `linattn explain --json` (core/attention/
//                            explainer.h), computed by the engine
//   GET  /v1/explain/options the presets and feature maps it takes
//   the generation endpoints of server/openai/routes.h (completions, chat,
//   responses, sessions)
//
// Errors carry OpenAI's body, {"error": {"message", "type", "param",
// "code"}}, with the HTTP status that fits (400 for a bad request naming the
// field in `param`, 404 for an unknown path or model, 405 for a method an
// endpoint does not take, 413 for a body over --max-message-bytes, 503
// while draining). "model" may be left out when one model is served. Once
// a drain began, every endpoint but /health answers 503; requests under
// way (streams included) count as calls in flight for the drain's grace
// period.
#ifndef LINATTN_SERVER_HTTP_FRONTEND_H_
#define LINATTN_SERVER_HTTP_FRONTEND_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/scheduler/generation.h"
#include "server/listen_address.h"
#include "server/openai/routes.h"
#include "server/rpc_entry.h"
#include "server/tls.h"

namespace httplib {
class Server;
}

namespace linattn {

class IntakeControl;

struct HttpFrontendOptions {
  ListenAddress listen;
  size_t max_body_bytes = 64 << 20;
  // Requests served at once (a streaming completion holds one for its
  // length); more wait in the listener's queue. Connections wait for their
  // next request in an intake (server/http_intake.h), holding no thread
  // until its headers are in; two more threads serve only GET /health.
  int threads = 64;
  // The time a request's headers and body have to arrive.
  std::chrono::milliseconds request_timeout{30'000};
  // The generation endpoints' limits (server/openai/routes.h); generations at
  // once are threads − 8.
  size_t max_stored_responses = 1024;
  // HTTPS with these files (server/tls.h); null = plain HTTP. Outlives the
  // frontend.
  TlsIdentity* tls = nullptr;
};

// Binds `s` to `listen` (port 0 picks one) without SO_REUSEPORT; the port
// bound, or UNAVAILABLE naming `flag`.
absl::StatusOr<int> BindHttpListener(httplib::Server& s,
                                     const ListenAddress& listen,
                                     absl::string_view flag);

class HttpFrontend {
 public:
  // Binds (refusing a port another process listens on) and serves on a
  // thread of its own. `engine` and `gate` outlive the frontend.
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(
      const HttpFrontendOptions& options, GenerationEngine* engine,
      CallGate* gate);
  ~HttpFrontend();  // stops listening and joins
  HttpFrontend(const HttpFrontend&) = delete;
  HttpFrontend& operator=(const HttpFrontend&) = delete;

  int port() const { return port_; }

 private:
  HttpFrontend() = default;
  void Route();

  std::unique_ptr<httplib::Server> server_;
  IntakeControl* intake_ = nullptr;  // server_'s connection intake
  GenerationEngine* engine_ = nullptr;
  const std::vector<std::shared_ptr<const Model>>* models_ = nullptr;
  CallGate* gate_ = nullptr;
  std::unique_ptr<OpenAiApi> api_;
  int64_t created_ = 0;  // unix seconds, the models' "created"
  int port_ = 0;
  std::atomic<bool> listening_done_{false};
  std::thread thread_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_HTTP_FRONTEND_H_
