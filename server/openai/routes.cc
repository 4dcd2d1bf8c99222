#include "server/openai/routes.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/session/session_manager.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"
#include "server/engine_calls.h"
#include "server/openai/render.h"
#include "server/openai/request.h"

namespace linattn {

namespace {

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const Model* ModelForRequest(
    const std::vector<std::shared_ptr<const Model>>& models, const json& body,
    httplib::Response& res) {
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) {
      SendError(res, 400, "model: must be a string", "model");
      return nullptr;
    }
    const std::string name = body["model"].get<std::string>();
    for (const auto& m : models) {
      if (m->name() == name) return m.get();
    }
    SendError(
        res, 404,
        absl::StrCat("The model '", ToValidUtf8(name), "' does not exist"),
        "model", "model_not_found");
    return nullptr;
  }
  if (models.size() == 1) return models.front().get();
  SendError(res, 400,
            models.empty() ? "this server serves no model"
                           : "model: required (this server serves several)",
            "model");
  return nullptr;
}

OpenAiApi::OpenAiApi(GenerationEngine* engine, CallGate* gate,
                     OpenAiApiOptions options)
    : engine_(engine),
      gate_(gate),
      options_(options),
      responses_(engine, options.max_stored_responses,
                 options.max_stored_bytes) {}

std::shared_ptr<CompletionRun> OpenAiApi::NewRun(CompletionRun::Kind kind,
                                                 const Tenant& tenant,
                                                 httplib::Response& res) {
  if (generations_.fetch_add(1) >= options_.max_generations) {
    generations_.fetch_sub(1);
    res.set_header("Retry-After", "1");
    SendError(res, 429,
              absl::StrCat("the server is running its most generations over "
                           "HTTP at once (",
                           options_.max_generations, "); retry shortly"),
              "", "too_many_requests");
    return nullptr;
  }
  auto r = std::make_shared<CompletionRun>(engine_);
  r->slot =
      std::shared_ptr<void>(this, [](OpenAiApi* api) { api->generations_--; });
  r->kind = kind;
  r->tenant = tenant;
  r->observability = gate_->observability();
  r->start = CurrentHttpCall().start;
  r->created = UnixSeconds();
  return r;
}

bool OpenAiApi::ChooseModel(const json& body, const std::string& bound,
                            absl::string_view bound_says, CompletionRun& r,
                            httplib::Response& res) {
  if (!bound.empty()) {
    auto model = engine_->ModelOf(bound, r.tenant);
    if (!model.ok()) {
      SendStatus(res, model.status());
      return false;
    }
    if (body.contains("model") && !body["model"].is_null() &&
        body["model"] != (*model)->name()) {
      SendStatus(res, FieldError("model", absl::StrCat(bound_says, " model ",
                                                       (*model)->name())));
      return false;
    }
    r.model = *model;
  } else {
    const Model* m = ModelForRequest(engine_->models(), body, res);
    if (m == nullptr) return false;
    r.model = *engine_->FindModel(m->name());
  }
  if (absl::Status s = ReadSampling(body, options_.max_choices, r); !s.ok()) {
    SendStatus(res, s);
    return false;
  }
  return true;
}

absl::Status OpenAiApi::RenderChat(const std::vector<ChatMessage>& messages,
                                   ChatTemplate::After after, CompletionRun& r,
                                   const std::vector<ChatMessage>* history) {
  const ChatTemplate& tmpl = r.model->chat_template();
  LINATTN_ASSIGN_OR_RETURN(r.prompt_text,
                           tmpl.Render(messages, after, history, r.tools));
  r.parse_tool_calls = !r.tools.is_null() && r.tool_choice == "auto" &&
                       tmpl.writes_tool_call_tags();
  if (!tmpl.end_of_turn().empty()) r.params.stop.push_back(tmpl.end_of_turn());
  return absl::OkStatus();
}

void OpenAiApi::Completions(const httplib::Request& req, httplib::Response& res,
                            const Tenant& tenant, bool chat) {
  json body;
  if (!ParseJsonBody(req, res, &body)) return;
  auto r = NewRun(
      chat ? CompletionRun::Kind::kChat : CompletionRun::Kind::kCompletion,
      tenant, res);
  if (r == nullptr) return;
  r->id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", RandomSessionId());
  // The model: the session's, or the one named.
  if (absl::Status s = ReadString(body, "session_id", &r->session_id);
      !s.ok()) {
    return SendStatus(res, s);
  }
  if (!ChooseModel(body, r->session_id,
                   absl::StrCat("session ", r->session_id, " runs"), *r, res)) {
    return;
  }
  const Tokenizer& tokenizer = r->model->tokenizer();
  auto read = [&]() -> absl::Status {
    if (!chat) return ReadCompletionPrompt(body, tokenizer, *r);
    if (!body.contains("messages")) return FieldError("messages", "required");
    // The body again with its objects' keys in the client's order: the
    // template sees tools and calls as written.
    const ordered_json ordered = ordered_json::parse(req.body, nullptr, false);
    LINATTN_RETURN_IF_ERROR(ReadTools(ordered, *r));
    LINATTN_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages,
                             ReadMessages(ordered["messages"], "messages",
                                          /*tool_turns=*/true));
    // A session that holds a conversation continues after its last turn.
    ChatTemplate::After after = ChatTemplate::After::kNothing;
    if (!r->session_id.empty()) {
      LINATTN_ASSIGN_OR_RETURN(ModelSessionInfo info,
                               engine_->GetSession(r->session_id, r->tenant));
      if (info.position > 0) after = ChatTemplate::After::kEndOfTurn;
    }
    return RenderChat(messages, after, *r);
  };
  if (absl::Status s = read(); !s.ok()) return SendStatus(res, s);
  if (absl::Status s =
          EncodePrompt(tokenizer, chat ? "messages" : "prompt", *r);
      !s.ok()) {
    return SendStatus(res, s);
  }
  if (absl::Status s = CheckCompletion(*r); !s.ok()) return SendStatus(res, s);
  Run(std::move(r), res);
}

void OpenAiApi::Responses(const httplib::Request& req, httplib::Response& res,
                          const Tenant& tenant) {
  json body;
  if (!ParseJsonBody(req, res, &body)) return;
  auto r = NewRun(CompletionRun::Kind::kResponse, tenant, res);
  if (r == nullptr) return;
  r->id = absl::StrCat("resp_", RandomSessionId());
  r->store = true;
  std::optional<ResponseStore::Entry> previous;
  auto read_ids = [&]() -> absl::Status {
    LINATTN_RETURN_IF_ERROR(ReadBool(body, "store", &r->store));
    LINATTN_RETURN_IF_ERROR(
        ReadString(body, "previous_response_id", &r->previous_response_id));
    LINATTN_RETURN_IF_ERROR(ReadString(body, "instructions", &r->instructions));
    return absl::OkStatus();
  };
  if (absl::Status s = read_ids(); !s.ok()) return SendStatus(res, s);
  if (!r->previous_response_id.empty()) {
    previous = responses_.Find(r->previous_response_id, r->tenant);
    if (!previous) {
      return SendError(res, 404,
                       absl::StrCat("previous_response_id: no stored response "
                                    "'",
                                    ToValidUtf8(r->previous_response_id),
                                    "' (never stored, deleted, or expired)"),
                       "previous_response_id", "not_found");
    }
  }
  if (!ChooseModel(body, r->previous_response_id, "the previous response ran",
                   *r, res)) {
    return;
  }
  auto read = [&]() -> absl::Status {
    if (body.contains("stop") && !body["stop"].is_null()) {
      return FieldError("stop",
                        "not a field of the responses API (a reply ends at "
                        "the chat template's end of turn)");
    }
    LINATTN_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages,
                             ReadResponseInput(body, r->instructions));
    // A follow-up begins after the previous reply's end of turn, or after
    // a reply cut short.
    ChatTemplate::After after = ChatTemplate::After::kNothing;
    if (previous) {
      after = previous->ended_at_marker ? ChatTemplate::After::kEndOfTurn
                                        : ChatTemplate::After::kCutReply;
      r->conversation = previous->conversation;
    }
    LINATTN_RETURN_IF_ERROR(RenderChat(
        messages, after, *r, previous ? &previous->conversation : nullptr));
    r->conversation.insert(r->conversation.end(), messages.begin(),
                           messages.end());
    return EncodePrompt(r->model->tokenizer(), "input", *r);
  };
  if (absl::Status s = read(); !s.ok()) return SendStatus(res, s);
  Run(std::move(r), res);
}

absl::Status OpenAiApi::ChargeRate(CompletionRun& r) {
  const double charge =
      static_cast<double>(r.prompt.size()) +
      static_cast<double>(r.n) * static_cast<double>(r.params.max_tokens);
  LINATTN_RETURN_IF_ERROR(gate_->limiter().Take(r.tenant, charge));
  r.limiter = &gate_->limiter();
  r.charged = charge;
  return absl::OkStatus();
}

absl::Status OpenAiApi::OpenBase(CompletionRun& r) {
  const bool keep = r.kind == CompletionRun::Kind::kResponse && r.store;
  if (!r.previous_response_id.empty()) {
    LINATTN_ASSIGN_OR_RETURN(ModelSessionInfo info,
                             ForkAndWait(*engine_, r.previous_response_id,
                                         keep ? r.id : "", r.tenant));
    r.base = info.session_id;
    r.own_base = true;
    r.cached = info.position;
  } else if (!r.session_id.empty()) {
    LINATTN_ASSIGN_OR_RETURN(ModelSessionInfo info,
                             engine_->GetSession(r.session_id, r.tenant));
    r.base = r.session_id;
    r.cached = info.position;
  } else {
    LINATTN_ASSIGN_OR_RETURN(
        ModelSessionInfo info,
        engine_->CreateSession(r.model->name(), keep ? r.id : "", r.tenant));
    r.base = info.session_id;
    r.own_base = true;
  }
  // A base made for this run goes at its end unless a response keeps it.
  if (r.own_base && !keep) r.cleanup.push_back(r.base);
  r.own_base = r.own_base && keep;
  CurrentHttpCall().session = r.base;
  CurrentHttpCall().tokens_in = r.cached + r.prompt.size();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> OpenAiApi::OpenChoices(
    CompletionRun& r, std::vector<int32_t>& prompt) {
  std::vector<std::string> sessions = {r.base};
  if (r.n == 1) return sessions;
  if (!prompt.empty()) {
    LINATTN_RETURN_IF_ERROR(
        AppendAndWait(*engine_, r.base, std::move(prompt), r.tenant).status());
    prompt.clear();
  }
  for (uint32_t i = 1; i < r.n; ++i) {
    LINATTN_ASSIGN_OR_RETURN(ModelSessionInfo info,
                             ForkAndWait(*engine_, r.base, "", r.tenant));
    sessions.push_back(info.session_id);
    r.cleanup.push_back(info.session_id);
  }
  return sessions;
}

void OpenAiApi::Run(std::shared_ptr<CompletionRun> r, httplib::Response& res) {
  // Every way out below that does not finish the run fails it: ~CompletionRun
  // deletes the sessions it made before the answer goes out.
  if (absl::Status s = ChargeRate(*r); !s.ok()) return SendStatus(res, s);
  if (absl::Status s = OpenBase(*r); !s.ok()) return SendStatus(res, s);
  std::vector<int32_t> prompt = r->prompt;
  auto sessions = OpenChoices(*r, prompt);
  if (!sessions.ok()) return SendStatus(res, sessions.status());
  r->choices.resize(r->n);
  for (auto& c : r->choices) {
    c.text_offset = r->echo ? r->prompt_text.size() : 0;
  }
  r->item_id = absl::StrCat("msg_", RandomSessionId());
  auto mux =
      std::make_shared<GenerateMux>(engine_, /*paced=*/r->stream, r->tenant);
  for (uint32_t i = 0; i < r->n; ++i) {
    SamplingParams params = r->params;
    params.seed += i;  // the choices sample independently
    mux->Start((*sessions)[i], i == 0 ? prompt : std::vector<int32_t>(),
               std::move(params));
  }
  if (r->stream) return AnswerStream(std::move(r), std::move(mux), res);
  AnswerWhole(*r, *mux, res);
}

void OpenAiApi::AnswerWhole(CompletionRun& r, GenerateMux& mux,
                            httplib::Response& res) {
  GenerateMux::Event e;
  while (mux.Next(&e)) {
    r.Absorb(e);
    if (e.event.finished && !e.event.status.ok()) mux.CancelAll();
  }
  if (absl::Status failed = r.Failed(); !failed.ok()) {
    return SendStatus(res, failed);
  }
  json body;
  if (r.kind == CompletionRun::Kind::kResponse) {
    body = ResponseJson(r, EndStatus(r));
    KeepResponse(r, body);
  } else {
    body = CompletionJson(r);
  }
  r.Finish(true);
  SendJson(res, body);
}

void OpenAiApi::AnswerStream(std::shared_ptr<CompletionRun> r,
                             std::shared_ptr<GenerateMux> mux,
                             httplib::Response& res) {
  // The first event decides between an error answer and the event stream
  // (a request refused before any token gets its status).
  auto first = std::make_shared<GenerateMux::Event>();
  if (!mux->Next(first.get())) {
    return SendError(res, 500, "the generation ended without an event");
  }
  if (first->event.finished && !first->event.status.ok()) {
    // Nothing went out yet: the request fails as a whole (with n > 1 every
    // session is its own).
    const absl::Status failed = first->event.status;
    mux->CancelAll();
    GenerateMux::Event rest;
    while (mux->Next(&rest)) {
    }
    return SendStatus(res, failed);
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies: pass events at once
  auto success = std::make_shared<bool>(false);
  std::shared_ptr<void> in_flight = gate_->Track();  // until the stream ends
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, r, mux, first, success](size_t, httplib::DataSink& sink) {
        auto send = [&sink](const std::string& text) {
          return sink.write(text.data(), text.size());
        };
        const std::string prelude = StreamPrelude(*r);
        if (!prelude.empty() && !send(prelude)) return false;
        GenerateMux::Event e = std::move(*first);
        bool have = true;
        while (have || mux->Next(&e)) {
          have = false;
          r->Absorb(e);
          const std::string out = StreamEvent(*r, e);
          if (!out.empty() && !send(out)) return false;  // the client left
          if (e.event.token_id >= 0) mux->Delivered(e.choice);
        }
        const absl::Status failed = r->Failed();
        const std::string tail = StreamTail(
            *r, failed, [this, &r](json& body) { KeepResponse(*r, body); });
        *success = failed.ok();
        // Before the end reaches the client: what it lists next is clean.
        r->Finish(*success);
        send(tail);
        sink.done();
        return true;
      },
      [r, mux, success, in_flight](bool) {
        mux->CancelAll();  // a stream cut short ends its generations
        r->Finish(*success);
      });
}

void OpenAiApi::KeepResponse(CompletionRun& r, json& body) {
  if (!r.store) return;
  // It ended at the template's end of turn (the engine's "stop"; the
  // responses API takes no stop strings of its own) or was cut short: what
  // a follow-up's messages begin with.
  const bool at_marker = r.choices[0].finish_reason == "stop";
  std::vector<ChatMessage> conversation = r.conversation;
  conversation.push_back({"assistant", r.choices[0].text});
  if (!responses_.Keep(r.id, body, at_marker, r.tenant,
                       std::move(conversation))) {
    r.store = false;  // its state goes when the run finishes
    body["store"] = false;
  }
}

// --- Routes ---

httplib::Server::Handler OpenAiApi::Routes::Wrap(Handler h) {
  return [gate = gate, h = std::move(h)](const httplib::Request& req,
                                         httplib::Response& res) {
    std::shared_ptr<void> in_flight = gate->Track();
    auto tenant = AuthenticateHttp(gate->keys(), req, res);
    if (!tenant.ok()) return;
    h(req, res, *tenant);
  };
}

void OpenAiApi::Routes::Get(const std::string& p, Handler h) {
  server.Get(p, Wrap(std::move(h)));
}

void OpenAiApi::Routes::Post(const std::string& p, Handler h) {
  server.Post(p, Wrap(std::move(h)));
}

void OpenAiApi::Routes::Delete(const std::string& p, Handler h) {
  server.Delete(p, Wrap(std::move(h)));
}

void OpenAiApi::Route(httplib::Server& server) {
  Routes s{server, gate_};
  s.Post("/v1/completions",
         [this](const httplib::Request& req, httplib::Response& res,
                const Tenant& tenant) {
           Completions(req, res, tenant, /*chat=*/false);
         });
  s.Post("/v1/chat/completions",
         [this](const httplib::Request& req, httplib::Response& res,
                const Tenant& tenant) {
           Completions(req, res, tenant, /*chat=*/true);
         });
  s.Post("/v1/responses",
         [this](const httplib::Request& req, httplib::Response& res,
                const Tenant& tenant) { Responses(req, res, tenant); });
  RouteResponses(s);
  RouteSessions(s);
}

void OpenAiApi::RouteResponses(Routes& s) {
  s.Get(R"(/v1/responses/([^/]+))",
        [this](const httplib::Request& req, httplib::Response& res,
               const Tenant& tenant) {
          auto stored = responses_.Find(req.matches[1], tenant);
          if (!stored) {
            return SendError(
                res, 404,
                absl::StrCat("no stored response '",
                             ToValidUtf8(std::string(req.matches[1])), "'"),
                "response_id", "not_found");
          }
          SendJson(res, stored->body);
        });
  s.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req,
                                              httplib::Response& res,
                                              const Tenant& tenant) {
    const std::string id = req.matches[1];
    if (!responses_.Find(id, tenant)) {
      return SendError(
          res, 404, absl::StrCat("no stored response '", ToValidUtf8(id), "'"),
          "response_id", "not_found");
    }
    responses_.Forget(id);
    absl::Status st = DeleteAndWait(*engine_, id, tenant);
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
      return SendStatus(res, st);
    }
    SendJson(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
  });
}

}  // namespace linattn
