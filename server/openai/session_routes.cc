// linattn's sessions over HTTP (server/openai/routes.h): create, list,
// get, delete, fork, append, state (snapshot bytes) and restore.
#include "absl/strings/str_cat.h"
#include "server/engine_calls.h"
#include "server/openai/request.h"
#include "server/openai/routes.h"

namespace linattn {

namespace {

json SessionJson(const ModelSessionInfo& info) {
  return {{"id", info.session_id},
          {"object", "session"},
          {"model", info.model},
          {"position", info.position},
          {"state_bytes", info.state_bytes}};
}

// The tokens an append's `prompt` names: text in the model's tokenizer, or
// token ids of its vocabulary.
absl::StatusOr<std::vector<int32_t>> AppendTokens(const json& body,
                                                  const Tokenizer& tokenizer) {
  std::vector<int32_t> tokens;
  if (body.contains("prompt") && body["prompt"].is_string()) {
    auto encoded = tokenizer.Encode(body["prompt"].get<std::string>());
    if (!encoded.ok()) return FieldError("prompt", encoded.status().message());
    tokens = std::move(*encoded);
  } else if (body.contains("prompt") && body["prompt"].is_array()) {
    auto ids = ReadTokenIds(body["prompt"], "prompt", tokenizer.size(),
                            "not a token id of the model");
    if (!ids.ok()) return ids.status();
    tokens = std::move(*ids);
  }
  if (tokens.empty()) {
    return FieldError("prompt", "text or token ids to append, not empty");
  }
  return tokens;
}

}  // namespace

void OpenAiApi::RouteSessions(Routes& s) {
  s.Post("/v1/sessions", [this](const httplib::Request& req,
                                httplib::Response& res, const Tenant& tenant) {
    json body = json::object();
    if (!req.body.empty() && !ParseJsonBody(req, res, &body)) return;
    const Model* m = ModelForRequest(engine_->models(), body, res);
    if (m == nullptr) return;
    std::string id;
    if (absl::Status st = ReadString(body, "session_id", &id); !st.ok()) {
      return SendStatus(res, st);
    }
    auto info = engine_->CreateSession(m->name(), id, tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    SendJson(res, SessionJson(*info));
  });
  s.Get("/v1/sessions", [this](const httplib::Request&, httplib::Response& res,
                               const Tenant& tenant) {
    json data = json::array();
    for (const ModelSessionInfo& info : engine_->ListSessions(tenant)) {
      data.push_back(SessionJson(info));
    }
    SendJson(res, {{"object", "list"}, {"data", data}});
  });
  s.Post("/v1/sessions/restore", [this](const httplib::Request& req,
                                        httplib::Response& res,
                                        const Tenant& tenant) {
    if (req.body.empty()) {
      return SendError(res, 400,
                       "the body holds the bytes of GET "
                       "/v1/sessions/{id}/state (application/octet-stream)");
    }
    const std::string id = req.get_param_value("session_id");
    auto info = engine_->Restore(req.body, id, tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    SendJson(res, SessionJson(*info));
  });
  s.Get(R"(/v1/sessions/([^/]+))",
        [this](const httplib::Request& req, httplib::Response& res,
               const Tenant& tenant) {
          auto info = engine_->GetSession(req.matches[1], tenant);
          if (!info.ok()) return SendStatus(res, info.status());
          SendJson(res, SessionJson(*info));
        });
  s.Delete(R"(/v1/sessions/([^/]+))", [this](const httplib::Request& req,
                                             httplib::Response& res,
                                             const Tenant& tenant) {
    const std::string id = req.matches[1];
    absl::Status st = DeleteAndWait(*engine_, id, tenant);
    if (!st.ok()) return SendStatus(res, st);
    responses_.Forget(id);
    SendJson(res, {{"id", id}, {"object", "session"}, {"deleted", true}});
  });
  s.Post(R"(/v1/sessions/([^/]+)/fork)", [this](const httplib::Request& req,
                                                httplib::Response& res,
                                                const Tenant& tenant) {
    json body = json::object();
    if (!req.body.empty() && !ParseJsonBody(req, res, &body)) return;
    std::string new_id;
    if (absl::Status st = ReadString(body, "session_id", &new_id); !st.ok()) {
      return SendStatus(res, st);
    }
    auto info = ForkAndWait(*engine_, req.matches[1], new_id, tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    SendJson(res, SessionJson(*info));
  });
  s.Post(R"(/v1/sessions/([^/]+)/append)", [this](const httplib::Request& req,
                                                  httplib::Response& res,
                                                  const Tenant& tenant) {
    json body;
    if (!ParseJsonBody(req, res, &body)) return;
    const std::string id = req.matches[1];
    auto model = engine_->ModelOf(id, tenant);
    if (!model.ok()) return SendStatus(res, model.status());
    auto tokens = AppendTokens(body, (*model)->tokenizer());
    if (!tokens.ok()) return SendStatus(res, tokens.status());
    if (absl::Status st =
            gate_->limiter().Take(tenant, static_cast<double>(tokens->size()));
        !st.ok()) {
      return SendStatus(res, st);
    }
    auto info = AppendAndWait(*engine_, id, std::move(*tokens), tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    SendJson(res, SessionJson(*info));
  });
  s.Get(R"(/v1/sessions/([^/]+)/state)",
        [this](const httplib::Request& req, httplib::Response& res,
               const Tenant& tenant) {
          auto bytes = SnapshotAndWait(*engine_, req.matches[1], tenant);
          if (!bytes.ok()) return SendStatus(res, bytes.status());
          res.status = 200;
          res.set_content(std::move(*bytes), "application/octet-stream");
        });
}

}  // namespace linattn
