#include "server/http_frontend.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/attention/explainer.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"
#include "server/http_json.h"
#include "server/intake_http_server.h"

namespace linattn {
namespace {

json ModelJson(const Model& m, int64_t created) {
  return {{"id", m.name()},
          {"object", "model"},
          {"created", created},
          {"owned_by", "linattn"}};
}

}  // namespace

absl::StatusOr<int> BindHttpListener(httplib::Server& s,
                                     const ListenAddress& listen,
                                     absl::string_view flag) {
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let
  // a second server share the port and split its clients.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  std::string host = listen.host;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (listen.port == 0) {
    port = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, listen.port)) {
    port = listen.port;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": cannot bind ", listen.ToString()));
  }
  return port;
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const HttpFrontendOptions& options, GenerationEngine* engine,
    CallGate* gate) {
  LINATTN_RETURN_IF_ERROR(CheckCanListen(options.listen, "--http-listen"));
  std::unique_ptr<HttpFrontend> f(new HttpFrontend());
  f->engine_ = engine;
  f->models_ = &engine->models();
  f->gate_ = gate;
  OpenAiApiOptions api;
  api.max_generations = std::max(1, options.threads - 8);
  api.max_stored_responses = options.max_stored_responses;
  f->api_ = std::make_unique<OpenAiApi>(engine, gate, api);
  f->created_ = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  const HttpIntakeOptions intake{.request_timeout = options.request_timeout};
  constexpr int kProbeThreads = 2;
  if (options.tls != nullptr) {
    TlsIdentity* tls = options.tls;
    std::function<bool(SSL_CTX&)> setup = [tls](SSL_CTX& ctx) {
      return tls->SetUpHttpContext(ctx);
    };
    auto server = std::make_unique<IntakeHttpsServer>(
        intake, options.threads, kProbeThreads, std::move(setup));
    if (!server->is_valid()) {
      return absl::InternalError("--http-listen: setting up TLS failed");
    }
    f->intake_ = server.get();
    f->server_ = std::move(server);
  } else {
    auto server = std::make_unique<IntakeHttpServer>(intake, options.threads,
                                                     kProbeThreads);
    f->intake_ = server.get();
    f->server_ = std::move(server);
  }
  httplib::Server& s = *f->server_;
  s.set_payload_max_length(options.max_body_bytes);
  f->Route();
  LINATTN_ASSIGN_OR_RETURN(
      f->port_, BindHttpListener(s, options.listen, "--http-listen"));
  LINATTN_RETURN_IF_ERROR(f->intake_->Start());
  f->thread_ = std::thread([p = f.get()] {
    p->server_->listen_after_bind();
    p->listening_done_ = true;
  });
  return f;
}

HttpFrontend::~HttpFrontend() {
  if (server_ != nullptr) {
    // stop() stops a server that is listening: wait until it is (or its
    // loop has ended), so a frontend destroyed at once cannot leave the
    // loop running.
    while (thread_.joinable() && !server_->is_running() && !listening_done_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_->stop();
  }
  if (thread_.joinable()) thread_.join();
  if (intake_ != nullptr) intake_->Shutdown();
}

extern const unsigned char kExplorerHtml[];
extern const size_t kExplorerHtmlSize;

void HttpFrontend::Route() {
  httplib::Server& s = *server_;
  // Bodies httplib would read past the size limit are refused; once a
  // drain began, only /health answers (503, for load balancers).
  s.set_pre_routing_handler([this](const httplib::Request& req,
                                   httplib::Response& res) {
    using Outcome = httplib::Server::HandlerResponse;
    // A new request on this thread: its access line starts now.
    CurrentHttpCall() = HttpCallNote{std::chrono::steady_clock::now()};
    // Before the body is read: httplib holds --max-message-bytes against
    // Content-Length only, so a body it would read without one (chunked,
    // to the end of the stream) or that grows as it is read (compressed)
    // is refused, and the connection closed, its body unread.
    auto refuse = [&res](int status, absl::string_view message) {
      res.set_header("Connection", "close");
      SendError(res, status, message);
      return Outcome::Handled;
    };
    if (req.has_header("Transfer-Encoding")) {
      return refuse(411,
                    "send the body with Content-Length (Transfer-Encoding is "
                    "not taken)");
    }
    if (req.has_header("Content-Encoding") &&
        req.get_header_value("Content-Encoding") != "identity") {
      return refuse(415, "send the body uncompressed (no Content-Encoding)");
    }
    if ((req.method == "POST" || req.method == "PUT" ||
         req.method == "PATCH") &&
        !req.has_header("Content-Length")) {
      return refuse(411, "a POST needs Content-Length (send {} for no fields)");
    }
    if (gate_->draining() && req.path != "/health") {
      SendError(res, 503, "the server is shutting down", "", "draining");
      return Outcome::Handled;
    }
    // With keys, everything but the probes, the metrics and the explorer
    // (which hold no one's sessions) needs one, before its body is read.
    const bool open = req.path == "/" || req.path == "/health" ||
                      req.path == "/metrics" || req.path == "/v1/explain" ||
                      req.path == "/v1/explain/options";
    if (!open && !AuthenticateHttp(gate_->keys(), req, res).ok()) {
      return Outcome::Handled;
    }
    return Outcome::Unhandled;
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(reinterpret_cast<const char*>(kExplorerHtml),
                    kExplorerHtmlSize, "text/html; charset=utf-8");
  });
  s.Get("/v1/explain/options",
        [](const httplib::Request&, httplib::Response& res) {
          SendJson(res, ExplainOptionsJson());
        });
  s.Get("/v1/explain", [](const httplib::Request& req, httplib::Response& res) {
    ExplainOptions options;
    if (req.has_param("preset")) options.preset = req.get_param_value("preset");
    if (req.has_param("feature_map")) {
      options.feature_map = req.get_param_value("feature_map");
    }
    if (req.has_param("prefix")) {
      int prefix = 0;
      if (!absl::SimpleAtoi(req.get_param_value("prefix"), &prefix)) {
        return SendError(res, 400, "prefix: must be an integer", "prefix");
      }
      options.prefix = prefix;
    }
    auto result = Explain(options);
    if (!result.ok()) return SendStatus(res, result.status());
    SendJson(res, ExplainJson(*result));
  });
  // The access line and request metrics, once the response (a stream
  // included) is written; same thread as its handler.
  s.set_logger([this](const httplib::Request& req,
                      const httplib::Response& res) {
    Observability* o = gate_->observability();
    if (o == nullptr) return;
    HttpCallNote& note = CurrentHttpCall();
    CallRecord r;
    r.protocol = "http";
    r.method = absl::StrCat(req.method, " ", req.path);
    r.service_label = "http";
    r.method_label = HttpRouteLabel(req.method, req.path);
    r.code = res.status;
    r.status = absl::StrCat(res.status);
    r.failed = res.status >= 400;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              note.start)
                    .count();
    r.tenant = note.tenant;
    r.session = note.session;
    if (r.session.empty() && req.matches.size() > 1 &&
        (absl::StartsWith(req.path, "/v1/sessions/") ||
         absl::StartsWith(req.path, "/v1/responses/"))) {
      r.session = req.matches[1];
    }
    r.tokens_in = note.tokens_in;
    r.tokens_out = note.tokens_out;
    r.peer = absl::StrCat(req.remote_addr, ":", req.remote_port);
    o->CallEnded(r);
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    Observability* o = gate_->observability();
    if (o == nullptr || !o->metrics()) {
      return SendError(res, 404,
                       "this server keeps no metrics (--metrics off)");
    }
    res.set_content(o->Scrape(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (gate_->draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    SendJson(res, {{"status", "ok"}});
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& m : *models_) data.push_back(ModelJson(*m, created_));
    SendJson(res, {{"object", "list"}, {"data", data}});
  });
  s.Get(R"(/v1/models/(.+))",
        [this](const httplib::Request& req, httplib::Response& res) {
          const std::string name = req.matches[1];
          for (const auto& m : *models_) {
            if (m->name() == name)
              return SendJson(res, ModelJson(*m, created_));
          }
          SendError(res, 404,
                    absl::StrCat("The model '", ToValidUtf8(name),
                                 "' does not exist"),
                    "model", "model_not_found");
        });
  // The model a request names (or the only one); nullptr with the error
  // sent.
  auto model_of = [this](const json& body,
                         httplib::Response& res) -> const Model* {
    return ModelForRequest(*models_, body, res);
  };
  s.Post("/tokenize", [model_of](const httplib::Request& req,
                                 httplib::Response& res) {
    json body;
    if (!ParseJsonBody(req, res, &body)) return;
    const Model* m = model_of(body, res);
    if (m == nullptr) return;
    const char* field = body.contains("content") ? "content" : "prompt";
    if (!body.contains(field) || !body[field].is_string()) {
      return SendError(res, 400, "content: the text to tokenize, a string",
                       "content");
    }
    auto tokens = m->tokenizer().Encode(body[field].get<std::string>());
    if (!tokens.ok()) {
      return SendError(res, 400,
                       absl::StrCat(field, ": ", tokens.status().message()),
                       field);
    }
    SendJson(
        res,
        {{"tokens", *tokens}, {"count", tokens->size()}, {"model", m->name()}});
  });
  s.Post("/detokenize", [model_of](const httplib::Request& req,
                                   httplib::Response& res) {
    json body;
    if (!ParseJsonBody(req, res, &body)) return;
    const Model* m = model_of(body, res);
    if (m == nullptr) return;
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return SendError(res, 400, "tokens: an array of token ids", "tokens");
    }
    std::vector<int32_t> ids;
    const int64_t vocab = m->tokenizer().size();
    for (size_t i = 0; i < body["tokens"].size(); ++i) {
      const json& t = body["tokens"][i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= vocab) {
        return SendError(
            res, 400,
            absl::StrCat("tokens[", i, "]: not a token id of the model (0 to ",
                         vocab - 1, ")"),
            "tokens");
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    SendJson(res,
             {{"content", m->tokenizer().Decode(ids)}, {"model", m->name()}});
  });
  api_->Route(s);
  // Whatever no route above took: an endpoint that takes another method
  // (405, naming it), or none (404).
  auto unrouted = [](const httplib::Request& req, httplib::Response& res) {
    static const std::pair<const char*, const char*> kEndpoints[] = {
        {"/", "GET"},
        {"/health", "GET"},
        {"/v1/models", "GET"},
        {"/v1/models/", "GET"},
        {"/v1/explain", "GET"},
        {"/v1/explain/options", "GET"},
        {"/tokenize", "POST"},
        {"/detokenize", "POST"},
        {"/v1/completions", "POST"},
        {"/v1/chat/completions", "POST"},
        {"/v1/responses", "POST"},
        {"/v1/responses/", "GET, DELETE"},
        {"/v1/sessions", "GET, POST"},
        {"/v1/sessions/restore", "POST"},
        {"/v1/sessions/", "GET, DELETE, POST"}};
    for (const auto& [path, method] : kEndpoints) {
      const std::string p = path;
      // "/x/" stands for /x/{id} and what lies under it.
      const bool prefix = p.size() > 1 && p.back() == '/';
      if (prefix ? req.path.rfind(p, 0) == 0 && req.path.size() > p.size()
                 : req.path == p) {
        res.set_header("Allow", method);
        return SendError(res, 405,
                         absl::StrCat(req.path, " takes ", method, ", not ",
                                      ToValidUtf8(req.method)),
                         "", "method_not_allowed");
      }
    }
    SendError(res, 404,
              absl::StrCat("no such endpoint: ", ToValidUtf8(req.method), " ",
                           ToValidUtf8(req.path)),
              "", "not_found");
  };
  s.Get(".*", unrouted);
  s.Post(".*", unrouted);
  s.Put(".*", unrouted);
  s.Patch(".*", unrouted);
  s.Delete(".*", unrouted);
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    // Routes answer with their own bodies; this is for what no route took.
    if (!res.body.empty()) return;
    if (res.status == 404) {
      return SendError(res, 404,
                       absl::StrCat("no such endpoint: ", req.method, " ",
                                    ToValidUtf8(req.path)),
                       "", "not_found");
    }
    if (res.status == 413) {
      return SendError(res, 413,
                       "the request body is larger than the server takes");
    }
    SendError(res, res.status, "the request could not be served");
  });
}

}  // namespace linattn
