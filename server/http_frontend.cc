#include "server/http_frontend.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using nlohmann::json;

// JSON text whatever the strings hold (bytes that are not UTF-8, from a
// byte-level tokenizer's partial characters, become U+FFFD).
std::string Dump(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// OpenAI's error body.
void Error(httplib::Response& res, int status, absl::string_view message,
           absl::string_view param = "", absl::string_view code = "") {
  const char* type =
      status == 400 || status == 404 || status == 405 || status == 413
          ? "invalid_request_error"
      : status == 503 ? "service_unavailable"
                      : "server_error";
  json body = {{"error",
                {{"message", std::string(message)},
                 {"type", type},
                 {"param", param.empty() ? json(nullptr) : json(param)},
                 {"code", code.empty() ? json(nullptr) : json(code)}}}};
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void Reply(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(Dump(body), "application/json");
}

// The request body as a JSON object; false (the error sent) otherwise.
bool ParseBody(const httplib::Request& req, httplib::Response& res, json* out) {
  *out = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    Error(res, 400,
          "the request body must be a JSON object (Content-Type: "
          "application/json)");
    return false;
  }
  return true;
}

json ModelJson(const Model& m, int64_t created) {
  return {{"id", m.name()},
          {"object", "model"},
          {"created", created},
          {"owned_by", "linattn"}};
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const HttpFrontendOptions& options,
    const std::vector<std::shared_ptr<const Model>>* models,
    const CallGate* gate) {
  LINATTN_RETURN_IF_ERROR(CheckCanListen(options.listen, "--http-listen"));
  std::unique_ptr<HttpFrontend> f(new HttpFrontend());
  f->models_ = models;
  f->gate_ = gate;
  f->created_ = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  f->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *f->server_;
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let
  // a second server share the port and split its clients.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int threads = options.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(options.max_body_bytes);
  f->Route();
  std::string host = options.listen.host;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  if (options.listen.port == 0) {
    f->port_ = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, options.listen.port)) {
    f->port_ = options.listen.port;
  }
  if (f->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--http-listen: cannot bind ", options.listen.ToString()));
  }
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
}

void HttpFrontend::Route() {
  httplib::Server& s = *server_;
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (gate_->draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    Reply(res, {{"status", "ok"}});
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& m : *models_) data.push_back(ModelJson(*m, created_));
    Reply(res, {{"object", "list"}, {"data", data}});
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req,
                                     httplib::Response& res) {
    const std::string name = req.matches[1];
    for (const auto& m : *models_) {
      if (m->name() == name) return Reply(res, ModelJson(*m, created_));
    }
    Error(res, 404,
          absl::StrCat("The model '", ToValidUtf8(name), "' does not exist"),
          "model", "model_not_found");
  });
  // The model a request names (or the only one); nullptr with the error
  // sent.
  auto model_of = [this](const json& body,
                         httplib::Response& res) -> const Model* {
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) {
        Error(res, 400, "model: must be a string", "model");
        return nullptr;
      }
      const std::string name = body["model"].get<std::string>();
      for (const auto& m : *models_) {
        if (m->name() == name) return m.get();
      }
      Error(res, 404, absl::StrCat("The model '", name, "' does not exist"),
            "model", "model_not_found");
      return nullptr;
    }
    if (models_->size() == 1) return models_->front().get();
    Error(res, 400,
          models_->empty() ? "this server serves no model"
                           : "model: required (this server serves several)",
          "model");
    return nullptr;
  };
  s.Post("/tokenize", [model_of](const httplib::Request& req,
                                 httplib::Response& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    const Model* m = model_of(body, res);
    if (m == nullptr) return;
    const char* field = body.contains("content") ? "content" : "prompt";
    if (!body.contains(field) || !body[field].is_string()) {
      return Error(res, 400, "content: the text to tokenize, a string",
                   "content");
    }
    auto tokens = m->tokenizer().Encode(body[field].get<std::string>());
    if (!tokens.ok()) {
      return Error(res, 400,
                   absl::StrCat(field, ": ", tokens.status().message()), field);
    }
    Reply(
        res,
        {{"tokens", *tokens}, {"count", tokens->size()}, {"model", m->name()}});
  });
  s.Post("/detokenize", [model_of](const httplib::Request& req,
                                   httplib::Response& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    const Model* m = model_of(body, res);
    if (m == nullptr) return;
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return Error(res, 400, "tokens: an array of token ids", "tokens");
    }
    std::vector<int32_t> ids;
    const int64_t vocab = m->tokenizer().size();
    for (size_t i = 0; i < body["tokens"].size(); ++i) {
      const json& t = body["tokens"][i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= vocab) {
        return Error(
            res, 400,
            absl::StrCat("tokens[", i, "]: not a token id of the model (0 to ",
                         vocab - 1, ")"),
            "tokens");
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    Reply(res, {{"content", m->tokenizer().Decode(ids)}, {"model", m->name()}});
  });
  // Whatever no route above took: an endpoint that takes another method
  // (405, naming it), or none (404).
  auto unrouted = [](const httplib::Request& req, httplib::Response& res) {
    static const std::pair<const char*, const char*> kEndpoints[] = {
        {"/health", "GET"},
        {"/v1/models", "GET"},
        {"/tokenize", "POST"},
        {"/detokenize", "POST"}};
    for (const auto& [path, method] : kEndpoints) {
      if (req.path == path || (std::string(path) == "/v1/models" &&
                               req.path.rfind("/v1/models/", 0) == 0)) {
        res.set_header("Allow", method);
        return Error(res, 405,
                     absl::StrCat(req.path, " takes ", method, ", not ",
                                  ToValidUtf8(req.method)),
                     "", "method_not_allowed");
      }
    }
    Error(res, 404,
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
      return Error(res, 404,
                   absl::StrCat("no such endpoint: ", req.method, " ",
                                ToValidUtf8(req.path)),
                   "", "not_found");
    }
    if (res.status == 413) {
      return Error(res, 413,
                   "the request body is larger than the server takes");
    }
    Error(res, res.status, "the request could not be served");
  });
}

}  // namespace linattn
