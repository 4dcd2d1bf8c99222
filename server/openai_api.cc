#include "server/openai_api.h"

#include <chrono>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/session/session_manager.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"
#include "server/engine_calls.h"

namespace linattn {

namespace {

// Replies of chat completions and responses that name no limit.
constexpr uint32_t kDefaultChatMaxTokens = 512;
// Stop strings a request may give.
constexpr size_t kMaxStops = 16;
// Tokens a whole, not streamed, answer may hold, and log-probabilities
// (each token's and its alternatives').
constexpr uint64_t kMaxHeldTokens = uint64_t{1} << 20;
constexpr uint64_t kMaxHeldLogprobs = uint64_t{1} << 16;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// An optional number field within [lo, hi] (null or absent: `*out` stays).
absl::Status ReadNumber(const json& body, const char* field, double lo,
                        double hi, bool integer, double* out) {
  if (!body.contains(field) || body[field].is_null()) return absl::OkStatus();
  const json& v = body[field];
  if (!v.is_number() || (integer && !v.is_number_integer())) {
    return FieldError(field,
                      integer ? "must be an integer" : "must be a number");
  }
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    auto bound = [integer](double b) {
      return integer ? absl::StrCat(static_cast<int64_t>(b)) : absl::StrCat(b);
    };
    return FieldError(field, absl::StrCat("must be in [", bound(lo), ", ",
                                          bound(hi), "], got ", v.dump()));
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status ReadBool(const json& body, const char* field, bool* out) {
  if (!body.contains(field) || body[field].is_null()) return absl::OkStatus();
  if (!body[field].is_boolean()) return FieldError(field, "must be a boolean");
  *out = body[field].get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const json& body, const char* field, std::string* out) {
  if (!body.contains(field) || body[field].is_null()) return absl::OkStatus();
  if (!body[field].is_string()) return FieldError(field, "must be a string");
  *out = body[field].get<std::string>();
  return absl::OkStatus();
}

// Text of a message's content: a string, or an array of text parts.
absl::StatusOr<std::string> ContentText(const json& content,
                                        const std::string& field) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return FieldError(field, "must be a string or an array of text parts");
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (!part.is_object() || !part.contains("text") ||
        !part["text"].is_string()) {
      return FieldError(name,
                        "a text part, {\"type\": \"text\", \"text\": ...}");
    }
    if (part.contains("type") && !part["type"].is_string()) {
      return FieldError(absl::StrCat(name, ".type"), "must be a string");
    }
    const std::string type = part.value("type", "text");
    if (type != "text" && type != "input_text" && type != "output_text") {
      return FieldError(name, absl::StrCat("parts of type '", ToValidUtf8(type),
                                           "' are not supported (text only)"));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// A message list (chat's messages, responses' input items).
absl::StatusOr<std::vector<ChatMessage>> ReadMessages(const json& list,
                                                      const char* field) {
  if (!list.is_array() || list.empty()) {
    return FieldError(field, "must be a non-empty array of messages");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return FieldError(absl::StrCat(name, ".role"),
                        "each message is an object with a role");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" &&
        role != "assistant") {
      return FieldError(absl::StrCat(name, ".role"),
                        absl::StrCat("must be system, developer, user or "
                                     "assistant, got '",
                                     ToValidUtf8(role), "'"));
    }
    if (m.contains("type") && m["type"] != "message") {
      return FieldError(absl::StrCat(name, ".type"),
                        "only message items are supported");
    }
    LINATTN_ASSIGN_OR_RETURN(
        std::string content,
        ContentText(m.contains("content") ? m["content"] : json(nullptr),
                    absl::StrCat(name, ".content")));
    out.push_back({role, std::move(content)});
  }
  return out;
}

// OpenAI's values: "length", or "stop" for a stop string, the end of
// sequence, and a generation its session's deletion ended.
const char* FinishReason(const std::string& engine_reason) {
  return engine_reason == "length" ? "length" : "stop";
}

json TokenBytesJson(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(int(c));
  return out;
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

// One completion request, parsed, and what it produced as it runs.
struct CompletionRun {
  enum class Kind { kCompletion, kChat, kResponse };
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
  json user = nullptr;

  // Filled as it runs.
  uint64_t cached = 0;
  struct Choice {
    // The text (kept whole unless a completion or chat is streamed) and
    // the tokens with their log-probabilities (streamed: the last only).
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<std::pair<int32_t, float>>> top;
    size_t text_offset = 0;  // streamed logprobs: bytes before the token
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
  bool cleaned = false;        // Cleanup ran
  std::shared_ptr<void> slot;  // of OpenAiApiOptions::max_generations
  // The tenant's rate was charged `charged` tokens (the prompt and n ×
  // max_tokens); what the choices did not generate goes back at the end.
  TokenRateLimiter* limiter = nullptr;
  double charged = 0;
  ~CompletionRun() {
    if (limiter == nullptr) return;
    double used = static_cast<double>(prompt.size());
    for (const Choice& c : choices) {
      used += static_cast<double>(c.completion_tokens);
    }
    limiter->GiveBack(tenant, charged - used);
  }
};

OpenAiApi::OpenAiApi(GenerationEngine* engine, CallGate* gate,
                     OpenAiApiOptions options)
    : engine_(engine), gate_(gate), options_(options) {}

const ChatTemplate& OpenAiApi::TemplateOf(const Model& model) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = templates_.find(&model);
  if (it == templates_.end()) {
    it = templates_.emplace(&model, ChatTemplate::ForModelDir(model.dir()))
             .first;
  }
  return it->second;
}

absl::Status OpenAiApi::ParseSampling(const json& body,
                                      CompletionRun& r) const {
  double temperature = 1.0, top_p = 1.0, top_k = 0, n = 1;
  double max_tokens =
      r.kind == CompletionRun::Kind::kCompletion ? 16 : kDefaultChatMaxTokens;
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "temperature", 0, 2, false, &temperature));
  LINATTN_RETURN_IF_ERROR(ReadNumber(body, "top_p", 0, 1, false, &top_p));
  if (top_p == 0) return FieldError("top_p", "must be > 0");
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "top_k", 0, r.model->tokenizer().size(), true, &top_k));
  const char* max_field =
      r.kind == CompletionRun::Kind::kResponse ? "max_output_tokens"
      : body.contains("max_completion_tokens") ? "max_completion_tokens"
                                               : "max_tokens";
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, max_field, 1, kMaxGenerateTokens, true, &max_tokens));
  if (r.kind != CompletionRun::Kind::kResponse) {
    LINATTN_RETURN_IF_ERROR(
        ReadNumber(body, "n", 1, options_.max_choices, true, &n));
  }
  r.params.temperature = static_cast<float>(temperature);
  r.params.top_p = static_cast<float>(top_p);
  r.params.top_k = static_cast<uint32_t>(top_k);
  r.params.max_tokens = static_cast<uint32_t>(max_tokens);
  r.n = static_cast<uint32_t>(n);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) {
      return FieldError("seed", "must be an integer");
    }
    r.params.seed = body["seed"].is_number_unsigned()
                        ? body["seed"].get<uint64_t>()
                        : static_cast<uint64_t>(body["seed"].get<int64_t>());
  } else {
    r.params.seed =
        (uint64_t{std::random_device()()} << 32) | std::random_device()();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      r.params.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= kMaxStops) {
      for (const json& s : stop) {
        if (!s.is_string()) return FieldError("stop", "strings only");
        r.params.stop.push_back(s.get<std::string>());
      }
    } else {
      return FieldError("stop", absl::StrCat("a string or an array of at most ",
                                             kMaxStops, " strings"));
    }
    for (const std::string& s : r.params.stop) {
      if (s.empty()) return FieldError("stop", "must not be empty");
    }
  }
  // Logprobs: an integer (completions: how many alternatives) or a boolean
  // with top_logprobs (chat).
  if (r.kind == CompletionRun::Kind::kCompletion) {
    double logprobs = -1;
    LINATTN_RETURN_IF_ERROR(
        ReadNumber(body, "logprobs", 0, kMaxTopLogprobs, true, &logprobs));
    if (logprobs >= 0) {
      r.logprobs = true;
      r.params.top_logprobs = static_cast<uint32_t>(logprobs);
    }
    LINATTN_RETURN_IF_ERROR(ReadBool(body, "echo", &r.echo));
  } else if (r.kind == CompletionRun::Kind::kChat) {
    LINATTN_RETURN_IF_ERROR(ReadBool(body, "logprobs", &r.logprobs));
    double top = 0;
    LINATTN_RETURN_IF_ERROR(
        ReadNumber(body, "top_logprobs", 0, kMaxTopLogprobs, true, &top));
    if (top > 0 && !r.logprobs) {
      return FieldError("top_logprobs", "needs logprobs: true");
    }
    r.params.top_logprobs = static_cast<uint32_t>(top);
  }
  r.params.logprobs = r.logprobs;
  // OpenAI's penalties, and llama.cpp's and vLLM's extensions (sampler.h).
  double presence = 0, frequency = 0, repetition = 1, min_p = 0, last_n = 64;
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "presence_penalty", -2, 2, false, &presence));
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "frequency_penalty", -2, 2, false, &frequency));
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "repetition_penalty", 0, 10, false, &repetition));
  if (repetition == 0) return FieldError("repetition_penalty", "must be > 0");
  LINATTN_RETURN_IF_ERROR(ReadNumber(body, "min_p", 0, 1, false, &min_p));
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "repeat_last_n", -1, kMaxPenaltyWindow, true, &last_n));
  r.params.presence_penalty = static_cast<float>(presence);
  r.params.frequency_penalty = static_cast<float>(frequency);
  r.params.repetition_penalty = static_cast<float>(repetition);
  r.params.min_p = static_cast<float>(min_p);
  r.params.penalty_last_n = static_cast<int32_t>(last_n);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
    return FieldError("logit_bias", "is not supported");
  }
  double best_of = 1;
  LINATTN_RETURN_IF_ERROR(ReadNumber(body, "best_of", 1, 1, true, &best_of));
  if (body.contains("suffix") && !body["suffix"].is_null() &&
      body["suffix"] != "") {
    return FieldError("suffix", "is not supported");
  }
  if (body.contains("tools") && !body["tools"].is_null() &&
      !(body["tools"].is_array() && body["tools"].empty())) {
    return FieldError("tools", "tool calls are not supported");
  }
  if (body.contains("user") && !body["user"].is_null() &&
      !body["user"].is_string()) {
    return FieldError("user", "must be a string");
  }
  LINATTN_RETURN_IF_ERROR(ReadBool(body, "stream", &r.stream));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object())
      return FieldError("stream_options", "must be an object");
    if (!r.stream) return FieldError("stream_options", "needs stream: true");
    LINATTN_RETURN_IF_ERROR(ReadBool(so, "include_usage", &r.include_usage));
  }
  // A whole answer is held until it is complete: bounded, so that one
  // request cannot take the server's memory (a stream holds nothing).
  if (!r.stream && r.kind != CompletionRun::Kind::kResponse) {
    const uint64_t tokens = uint64_t{r.n} * r.params.max_tokens;
    if (tokens > kMaxHeldTokens) {
      return FieldError(max_field,
                        absl::StrCat("an answer that is not streamed holds at "
                                     "most ",
                                     kMaxHeldTokens,
                                     " tokens (n × max_tokens); stream it for "
                                     "more"));
    }
    if (r.logprobs && tokens * (1 + r.params.top_logprobs) > kMaxHeldLogprobs) {
      return FieldError(
          max_field,
          absl::StrCat("an answer that is not streamed holds at most ",
                       kMaxHeldLogprobs,
                       " log-probabilities (n × max_tokens × (1 + top "
                       "logprobs)); stream it for more"));
    }
  }
  return absl::OkStatus();
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
      SendError(
          res, 400,
          absl::StrCat("model: ", bound_says, " model ", (*model)->name()),
          "model");
      return false;
    }
    r.model = *model;
  } else {
    const Model* m = ModelForRequest(engine_->models(), body, res);
    if (m == nullptr) return false;
    r.model = *engine_->FindModel(m->name());
  }
  if (absl::Status s = ParseSampling(body, r); !s.ok()) {
    SendStatus(res, s);
    return false;
  }
  return true;
}

std::shared_ptr<void> OpenAiApi::TakeSlot() {
  if (generations_.fetch_add(1) >= options_.max_generations) {
    generations_.fetch_sub(1);
    return nullptr;
  }
  return std::shared_ptr<void>(this,
                               [](OpenAiApi* api) { api->generations_--; });
}

bool OpenAiApi::RefuseWhenBusy(std::shared_ptr<void>* slot,
                               httplib::Response& res) {
  *slot = TakeSlot();
  if (*slot != nullptr) return false;
  res.set_header("Retry-After", "1");
  SendError(res, 429,
            absl::StrCat("the server is running its most generations over "
                         "HTTP at once (",
                         options_.max_generations, "); retry shortly"),
            "", "too_many_requests");
  return true;
}

void OpenAiApi::Completions(const httplib::Request& req, httplib::Response& res,
                            const Tenant& tenant, bool chat) {
  json body;
  if (!ParseJsonBody(req, res, &body)) return;
  auto r = std::make_shared<CompletionRun>();
  r->tenant = tenant;
  r->observability = gate_->observability();
  r->start = CurrentHttpCall().start;
  if (RefuseWhenBusy(&r->slot, res)) return;
  r->kind =
      chat ? CompletionRun::Kind::kChat : CompletionRun::Kind::kCompletion;
  r->created = UnixSeconds();
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
  if (chat) {
    if (!body.contains("messages")) {
      return SendError(res, 400, "messages: required", "messages");
    }
    auto messages = ReadMessages(body["messages"], "messages");
    if (!messages.ok()) return SendStatus(res, messages.status());
    ChatTemplate::After after = ChatTemplate::After::kNothing;
    if (!r->session_id.empty()) {
      auto info = engine_->GetSession(r->session_id, r->tenant);
      if (!info.ok()) return SendStatus(res, info.status());
      if (info->position > 0) after = ChatTemplate::After::kEndOfTurn;
    }
    const ChatTemplate& tmpl = TemplateOf(*r->model);
    auto text = tmpl.Render(*messages, after);
    if (!text.ok()) return SendStatus(res, text.status());
    r->params.stop.push_back(tmpl.end_of_turn());
    r->prompt_text = std::move(*text);
  } else {
    if (!body.contains("prompt")) {
      return SendError(res, 400, "prompt: required", "prompt");
    }
    json prompt = body["prompt"];
    // One prompt per request: a list of one prompt (text or ids) is it.
    if (prompt.is_array() && prompt.size() == 1 &&
        (prompt[0].is_string() || prompt[0].is_array())) {
      prompt = json(prompt[0]);
    }
    if (prompt.is_string()) {
      r->prompt_text = prompt.get<std::string>();
    } else if (prompt.is_array()) {
      for (size_t i = 0; i < prompt.size(); ++i) {
        const json& t = prompt[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= int64_t(tokenizer.size())) {
          return SendError(
              res, 400,
              absl::StrCat("prompt[", i,
                           "]: a prompt array holds token ids of the model (0 "
                           "to ",
                           tokenizer.size() - 1,
                           "); one prompt per request (n gives several "
                           "completions)"),
              "prompt");
        }
        r->prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      // For echo: a new text as the tokenizer decodes it; ids that continue
      // a session's text as their pieces (a leading space is theirs).
      r->prompt_text = r->session_id.empty() ? tokenizer.Decode(r->prompt)
                                             : tokenizer.Pieces(r->prompt);
    } else {
      return SendError(res, 400, "prompt: a string or an array of token ids",
                       "prompt");
    }
  }
  if (r->prompt.empty() && !r->prompt_text.empty()) {
    auto tokens = tokenizer.Encode(r->prompt_text);
    if (!tokens.ok()) {
      return SendError(res, 400,
                       absl::StrCat(chat ? "messages: " : "prompt: ",
                                    tokens.status().message()),
                       chat ? "messages" : "prompt");
    }
    r->prompt = std::move(*tokens);
  }
  if (r->n > 1 && !r->session_id.empty()) {
    return SendError(res, 400,
                     "n: one choice per request with session_id (fork the "
                     "session for branches: POST /v1/sessions/{id}/fork)",
                     "n");
  }
  if (r->echo && r->logprobs) {
    return SendError(res, 400,
                     "echo: with logprobs it would need the prompt's "
                     "log-probabilities, which linattn does not compute",
                     "echo");
  }
  if (r->prompt.empty() && r->session_id.empty()) {
    return SendError(res, 400,
                     "prompt: must not be empty (the model needs a context to "
                     "continue)",
                     "prompt");
  }
  Run(std::move(r), res);
}

void OpenAiApi::Responses(const httplib::Request& req, httplib::Response& res,
                          const Tenant& tenant) {
  json body;
  if (!ParseJsonBody(req, res, &body)) return;
  auto r = std::make_shared<CompletionRun>();
  r->tenant = tenant;
  r->observability = gate_->observability();
  r->start = CurrentHttpCall().start;
  if (RefuseWhenBusy(&r->slot, res)) return;
  r->kind = CompletionRun::Kind::kResponse;
  r->created = UnixSeconds();
  r->id = absl::StrCat("resp_", RandomSessionId());
  r->store = true;
  if (absl::Status s = ReadBool(body, "store", &r->store); !s.ok()) {
    return SendStatus(res, s);
  }
  if (absl::Status s =
          ReadString(body, "previous_response_id", &r->previous_response_id);
      !s.ok()) {
    return SendStatus(res, s);
  }
  if (absl::Status s = ReadString(body, "instructions", &r->instructions);
      !s.ok()) {
    return SendStatus(res, s);
  }
  std::optional<StoredResponse> previous;
  if (!r->previous_response_id.empty()) {
    previous = Stored(r->previous_response_id, r->tenant);
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
  if (body.contains("stop") && !body["stop"].is_null()) {
    return SendError(res, 400,
                     "stop: not a field of the responses API (a reply ends at "
                     "the chat template's end of turn)",
                     "stop");
  }
  if (!body.contains("input")) {
    return SendError(res, 400, "input: required", "input");
  }
  std::vector<ChatMessage> messages;
  if (!r->instructions.empty()) messages.push_back({"system", r->instructions});
  if (body["input"].is_string()) {
    messages.push_back({"user", body["input"].get<std::string>()});
  } else {
    auto items = ReadMessages(body["input"], "input");
    if (!items.ok()) return SendStatus(res, items.status());
    messages.insert(messages.end(), items->begin(), items->end());
  }
  ChatTemplate::After after = ChatTemplate::After::kNothing;
  if (previous) {
    after = previous->ended_at_marker ? ChatTemplate::After::kEndOfTurn
                                      : ChatTemplate::After::kCutReply;
  }
  const ChatTemplate& tmpl = TemplateOf(*r->model);
  auto text = tmpl.Render(messages, after);
  if (!text.ok()) return SendStatus(res, text.status());
  r->params.stop.push_back(tmpl.end_of_turn());
  auto tokens = r->model->tokenizer().Encode(*text);
  if (!tokens.ok()) {
    return SendError(
        res, 400, absl::StrCat("input: ", tokens.status().message()), "input");
  }
  r->prompt = std::move(*tokens);
  Run(std::move(r), res);
}

namespace {

json UsageJson(const CompletionRun& r) {
  uint64_t completion = 0;
  for (const auto& c : r.choices) completion += c.completion_tokens;
  const uint64_t prompt = r.cached + r.prompt.size();
  if (r.kind == CompletionRun::Kind::kResponse) {
    return {{"input_tokens", prompt},
            {"input_tokens_details", {{"cached_tokens", r.cached}}},
            {"output_tokens", completion},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", prompt + completion}};
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached}}}};
}

// Log-probabilities of choice tokens [from, to), as completions (legacy)
// or chat write them.
json LogprobsJson(const CompletionRun& r, const CompletionRun::Choice& c,
                  size_t from, size_t to, size_t text_offset) {
  const Tokenizer& tok = r.model->tokenizer();
  if (r.kind == CompletionRun::Kind::kChat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const std::string bytes = tok.TokenBytes(c.tokens[i]);
      json top = json::array();
      for (const auto& [id, lp] : c.top[i]) {
        const std::string b = tok.TokenBytes(id);
        top.push_back(
            {{"token", b}, {"logprob", lp}, {"bytes", TokenBytesJson(b)}});
      }
      content.push_back({{"token", bytes},
                         {"logprob", c.logprobs[i]},
                         {"bytes", TokenBytesJson(bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), offsets = json::array();
  json tops = r.params.top_logprobs > 0 ? json::array() : json(nullptr);
  for (size_t i = from; i < to; ++i) {
    const std::string bytes = tok.TokenBytes(c.tokens[i]);
    tokens.push_back(bytes);
    lps.push_back(c.logprobs[i]);
    offsets.push_back(text_offset);
    text_offset += bytes.size();
    if (!tops.is_null()) {
      json top = json::object();
      for (const auto& [id, lp] : c.top[i]) top[tok.TokenBytes(id)] = lp;
      tops.push_back(top);
    }
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json OutputItem(const CompletionRun& r, const std::string& status) {
  const std::string text = r.choices.empty() ? "" : r.choices[0].text;
  return {{"type", "message"},
          {"id", r.item_id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"},
                                    {"text", text},
                                    {"annotations", json::array()}}})}};
}

// The response object (POST /v1/responses, GET /v1/responses/{id}).
json ResponseJson(const CompletionRun& r, const std::string& status) {
  const bool cut = !r.choices.empty() && r.choices[0].finish_reason == "length";
  json output = json::array();
  if (status != "in_progress") {
    output.push_back(OutputItem(r, cut ? "incomplete" : "completed"));
  }
  return {
      {"id", r.id},
      {"object", "response"},
      {"created_at", r.created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details",
       cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
      {"instructions",
       r.instructions.empty() ? json(nullptr) : json(r.instructions)},
      {"max_output_tokens", r.params.max_tokens},
      {"model", r.model->name()},
      {"output", output},
      {"parallel_tool_calls", false},
      {"previous_response_id", r.previous_response_id.empty()
                                   ? json(nullptr)
                                   : json(r.previous_response_id)},
      {"store", r.store},
      {"temperature", r.params.temperature},
      {"top_p", r.params.top_p},
      {"text", {{"format", {{"type", "text"}}}}},
      {"tool_choice", "auto"},
      {"tools", json::array()},
      {"truncation", "disabled"},
      {"usage", status == "in_progress" ? json(nullptr) : UsageJson(r)},
      {"metadata", json::object()},
  };
}

// The whole answer of a completion or chat completion.
json CompletionJson(const CompletionRun& r) {
  const bool chat = r.kind == CompletionRun::Kind::kChat;
  json choices = json::array();
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const auto& c = r.choices[i];
    json choice = {
        {"index", i},
        {"logprobs", r.logprobs ? LogprobsJson(r, c, 0, c.tokens.size(), 0)
                                : json(nullptr)},
        {"finish_reason", FinishReason(c.finish_reason)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = r.echo ? r.prompt_text + c.text : c.text;
    }
    choices.push_back(std::move(choice));
  }
  json body = {{"id", r.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", r.created},
               {"model", r.model->name()},
               {"system_fingerprint", r.model->fingerprint_hex()},
               {"choices", choices},
               {"usage", UsageJson(r)}};
  if (!r.session_id.empty()) body["session_id"] = r.session_id;
  return body;
}

// Takes one event into its choice. What a stream has sent is not kept
// (but a response's text, which its last event and GET return): a stream
// holds O(1) per choice whatever its length.
void Absorb(CompletionRun& r, const GenerateMux::Event& e) {
  CompletionRun::Choice& c = r.choices[e.choice];
  const GenerateEvent& g = e.event;
  if (g.token_id >= 0 && r.logprobs) {
    if (r.stream) {
      if (!c.tokens.empty()) {
        c.text_offset += r.model->tokenizer().TokenBytes(c.tokens[0]).size();
      }
      c.tokens.clear();
      c.logprobs.clear();
      c.top.clear();
    }
    c.tokens.push_back(g.token_id);
    c.logprobs.push_back(g.logprob);
    c.top.push_back(g.top_logprobs);
  }
  if (g.token_id >= 0) {
    c.completion_tokens = g.completion_tokens;
    CurrentHttpCall().tokens_out++;
    const auto now = std::chrono::steady_clock::now();
    if (r.observability != nullptr) {
      const bool first =
          c.last_token == std::chrono::steady_clock::time_point();
      const auto since = first ? r.start : c.last_token;
      const double seconds = std::chrono::duration<double>(now - since).count();
      if (first) {
        r.observability->FirstToken(seconds);
      } else {
        r.observability->BetweenTokens(seconds);
      }
    }
    c.last_token = now;
  }
  if (!r.stream || r.kind == CompletionRun::Kind::kResponse) c.text += g.text;
  if (g.finished) {
    c.finish_reason = g.finish_reason;
    c.status = g.status;
  }
}

std::string Sse(const json& data) {
  return absl::StrCat("data: ", DumpJson(data), "\n\n");
}

std::string SseEvent(CompletionRun& r, const char* type, json data) {
  data["type"] = type;
  data["sequence_number"] = r.sequence++;
  return absl::StrCat("event: ", type, "\ndata: ", DumpJson(data), "\n\n");
}

// A chunk of a completion or chat completion stream for one choice.
json Chunk(const CompletionRun& r, int choice, json delta_or_text,
           json logprobs, json finish_reason) {
  const bool chat = r.kind == CompletionRun::Kind::kChat;
  json c = {{"index", choice},
            {"logprobs", std::move(logprobs)},
            {"finish_reason", std::move(finish_reason)}};
  c[chat ? "delta" : "text"] = std::move(delta_or_text);
  json chunk = {{"id", r.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", r.created},
                {"model", r.model->name()},
                {"system_fingerprint", r.model->fingerprint_hex()},
                {"choices", json::array({c})}};
  if (r.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

// The stream's text for one event (empty when it has nothing to say).
std::string StreamEvent(CompletionRun& r, const GenerateMux::Event& e) {
  const CompletionRun::Choice& c = r.choices[e.choice];
  const GenerateEvent& g = e.event;
  std::string out;
  if (r.kind == CompletionRun::Kind::kResponse) {
    if (!g.text.empty()) {
      out += SseEvent(r, "response.output_text.delta",
                      {{"item_id", r.item_id},
                       {"output_index", 0},
                       {"content_index", 0},
                       {"delta", g.text}});
    }
    return out;
  }
  const bool chat = r.kind == CompletionRun::Kind::kChat;
  const bool token = g.token_id >= 0;
  json logprobs = nullptr;
  if (r.logprobs && token) {
    logprobs = LogprobsJson(r, c, 0, 1, c.text_offset);
  }
  if (!g.text.empty() || !logprobs.is_null()) {
    out +=
        Sse(Chunk(r, e.choice, chat ? json{{"content", g.text}} : json(g.text),
                  std::move(logprobs), nullptr));
  }
  if (g.finished && g.status.ok()) {
    out += Sse(Chunk(r, e.choice, chat ? json::object() : json(""), nullptr,
                     FinishReason(g.finish_reason)));
  }
  return out;
}

}  // namespace

void OpenAiApi::Cleanup(CompletionRun& r, bool success) {
  if (r.cleaned) return;
  r.cleaned = true;
  std::vector<std::string> ids = r.cleanup;
  if (r.own_base && !(success && r.store)) ids.push_back(r.base);
  // Waited for, so that a client that lists sessions after its answer
  // sees none of them.
  for (const std::string& id : ids) {
    (void)DeleteAndWait(*engine_, id, r.tenant);
  }
}

void OpenAiApi::Run(std::shared_ptr<CompletionRun> r, httplib::Response& res) {
  GenerationEngine& engine = *engine_;
  // The tenant's rate: the prompt and every choice's max_tokens now.
  const double charge =
      static_cast<double>(r->prompt.size()) +
      static_cast<double>(r->n) * static_cast<double>(r->params.max_tokens);
  if (absl::Status s = gate_->limiter().Take(r->tenant, charge); !s.ok()) {
    return SendStatus(res, s);
  }
  r->limiter = &gate_->limiter();
  r->charged = charge;
  const bool keep = r->kind == CompletionRun::Kind::kResponse && r->store;
  // The session choice 0 runs in: a fork of the previous response's state,
  // the client's session, or a new one.
  if (!r->previous_response_id.empty()) {
    auto info = ForkAndWait(engine, r->previous_response_id, keep ? r->id : "",
                            r->tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    r->base = info->session_id;
    r->own_base = true;
    r->cached = info->position;
  } else if (!r->session_id.empty()) {
    r->base = r->session_id;
    auto info = engine.GetSession(r->base, r->tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    r->cached = info->position;
  } else {
    auto info =
        engine.CreateSession(r->model->name(), keep ? r->id : "", r->tenant);
    if (!info.ok()) return SendStatus(res, info.status());
    r->base = info->session_id;
    r->own_base = true;
  }
  if (r->own_base && !keep) r->cleanup.push_back(r->base);
  r->own_base = r->own_base && keep;
  CurrentHttpCall().session = r->base;
  CurrentHttpCall().tokens_in = r->cached + r->prompt.size();
  // n > 1: the prompt once, then a fork per further choice.
  std::vector<std::string> sessions = {r->base};
  std::vector<int32_t> prompt = r->prompt;
  if (r->n > 1) {
    if (!prompt.empty()) {
      auto info = AppendAndWait(engine, r->base, std::move(prompt), r->tenant);
      prompt.clear();
      if (!info.ok()) {
        Cleanup(*r, false);
        return SendStatus(res, info.status());
      }
    }
    for (uint32_t i = 1; i < r->n; ++i) {
      auto info = ForkAndWait(engine, r->base, "", r->tenant);
      if (!info.ok()) {
        Cleanup(*r, false);
        return SendStatus(res, info.status());
      }
      sessions.push_back(info->session_id);
      r->cleanup.push_back(info->session_id);
    }
  }
  r->choices.resize(r->n);
  for (auto& c : r->choices)
    c.text_offset = r->echo ? r->prompt_text.size() : 0;
  r->item_id = absl::StrCat("msg_", RandomSessionId());
  auto mux =
      std::make_shared<GenerateMux>(&engine, /*paced=*/r->stream, r->tenant);
  for (uint32_t i = 0; i < r->n; ++i) {
    SamplingParams params = r->params;
    params.seed += i;  // the choices sample independently
    mux->Start(sessions[i], i == 0 ? prompt : std::vector<int32_t>(),
               std::move(params));
  }

  if (!r->stream) {
    GenerateMux::Event e;
    while (mux->Next(&e)) {
      Absorb(*r, e);
      if (e.event.finished && !e.event.status.ok()) mux->CancelAll();
    }
    for (const auto& c : r->choices) {
      if (!c.status.ok()) {
        Cleanup(*r, false);
        return SendStatus(res, c.status);
      }
    }
    if (r->kind == CompletionRun::Kind::kResponse) {
      const bool cut = r->choices[0].finish_reason == "length";
      json body = ResponseJson(*r, cut ? "incomplete" : "completed");
      if (keep) Store(*r, body);
      Cleanup(*r, true);
      return SendJson(res, body);
    }
    Cleanup(*r, true);
    return SendJson(res, CompletionJson(*r));
  }

  // Streaming: the first event decides between an error answer and the
  // event stream (a request refused before any token gets its status).
  auto first = std::make_shared<GenerateMux::Event>();
  if (!mux->Next(first.get())) {
    Cleanup(*r, false);
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
    Cleanup(*r, false);
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
        const bool response = r->kind == CompletionRun::Kind::kResponse;
        std::string prelude;
        if (response) {
          prelude += SseEvent(*r, "response.created",
                              {{"response", ResponseJson(*r, "in_progress")}});
          prelude += SseEvent(*r, "response.in_progress",
                              {{"response", ResponseJson(*r, "in_progress")}});
          json item = OutputItem(*r, "in_progress");
          item["content"] = json::array();
          prelude += SseEvent(*r, "response.output_item.added",
                              {{"output_index", 0}, {"item", item}});
          prelude += SseEvent(*r, "response.content_part.added",
                              {{"item_id", r->item_id},
                               {"output_index", 0},
                               {"content_index", 0},
                               {"part",
                                {{"type", "output_text"},
                                 {"text", ""},
                                 {"annotations", json::array()}}}});
        } else {
          for (uint32_t i = 0; i < r->n; ++i) {
            if (r->kind == CompletionRun::Kind::kChat) {
              prelude +=
                  Sse(Chunk(*r, i, {{"role", "assistant"}, {"content", ""}},
                            nullptr, nullptr));
            } else if (r->echo) {
              prelude += Sse(Chunk(*r, i, r->prompt_text, nullptr, nullptr));
            }
          }
        }
        if (!prelude.empty() && !send(prelude)) return false;
        GenerateMux::Event e = std::move(*first);
        bool have = true;
        while (have || mux->Next(&e)) {
          have = false;
          Absorb(*r, e);
          const std::string out = StreamEvent(*r, e);
          if (!out.empty() && !send(out)) return false;  // the client left
          if (e.event.token_id >= 0) mux->Delivered(e.choice);
        }
        absl::Status failed;
        for (const auto& c : r->choices) {
          if (!c.status.ok() && failed.ok()) failed = c.status;
        }
        std::string tail;
        if (!failed.ok()) {
          const json error = StatusErrorJson(failed);
          tail = response ? SseEvent(*r, "error",
                                     {{"code", error["error"]["code"]},
                                      {"message", error["error"]["message"]},
                                      {"param", error["error"]["param"]}})
                          : Sse(error);
        } else if (response) {
          const bool cut = r->choices[0].finish_reason == "length";
          const json part = {{"type", "output_text"},
                             {"text", r->choices[0].text},
                             {"annotations", json::array()}};
          tail += SseEvent(*r, "response.output_text.done",
                           {{"item_id", r->item_id},
                            {"output_index", 0},
                            {"content_index", 0},
                            {"text", r->choices[0].text}});
          tail += SseEvent(*r, "response.content_part.done",
                           {{"item_id", r->item_id},
                            {"output_index", 0},
                            {"content_index", 0},
                            {"part", part}});
          tail += SseEvent(
              *r, "response.output_item.done",
              {{"output_index", 0},
               {"item", OutputItem(*r, cut ? "incomplete" : "completed")}});
          json body = ResponseJson(*r, cut ? "incomplete" : "completed");
          if (r->store) Store(*r, body);
          tail +=
              SseEvent(*r, cut ? "response.incomplete" : "response.completed",
                       {{"response", body}});
        } else if (r->include_usage) {
          json chunk = Chunk(*r, 0, "", nullptr, nullptr);
          chunk["choices"] = json::array();
          chunk["usage"] = UsageJson(*r);
          tail += Sse(chunk);
        }
        if (!response) tail += "data: [DONE]\n\n";
        *success = failed.ok();
        // Before the end reaches the client: what it lists next is clean.
        Cleanup(*r, *success);
        send(tail);
        sink.done();
        return true;
      },
      [this, r, mux, success, in_flight](bool) {
        mux->CancelAll();  // a stream cut short ends its generations
        Cleanup(*r, *success);
      });
}

// --- Stored responses ---

void OpenAiApi::Store(CompletionRun& r, json& body) {
  const std::string& id = r.id;
  const size_t bytes = DumpJson(body).size();
  if (bytes > options_.max_stored_bytes / 16) {
    // One body must not push out the others: its state goes (Cleanup) and
    // the answer says it was not stored.
    r.store = false;
    body["store"] = false;
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stored_.size() >= options_.max_stored_responses ||
      stored_bytes_ + bytes > options_.max_stored_bytes) {
    // Those whose sessions went (idle TTL, deleted) go first.
    for (auto it = stored_.begin(); it != stored_.end();) {
      it = engine_->sessions().Contains(it->first) ? std::next(it)
                                                   : EraseLocked(it);
    }
  }
  while (!stored_.empty() &&
         (stored_.size() >= options_.max_stored_responses ||
          stored_bytes_ + bytes > options_.max_stored_bytes)) {
    // Still full: the oldest goes, with its state.
    auto oldest = stored_.begin();
    for (auto it = stored_.begin(); it != stored_.end(); ++it) {
      if (it->second.order < oldest->second.order) oldest = it;
    }
    engine_->Delete(
        oldest->first, [](absl::Status) {}, CallLiveness(), Tenant::Server());
    EraseLocked(oldest);
  }
  stored_bytes_ += bytes;
  // It ended at the template's end of turn (the engine's "stop"; the
  // responses API takes no stop strings of its own) or was cut short: what a
  // follow-up's messages begin with.
  stored_[id] =
      StoredResponse{body, next_order_++, bytes,
                     r.choices[0].finish_reason == "stop", r.tenant.name()};
}

std::optional<OpenAiApi::StoredResponse> OpenAiApi::Stored(
    const std::string& id, const Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stored_.find(id);
  if (it == stored_.end() || !tenant.Sees(it->second.owner)) {
    return std::nullopt;
  }
  if (!engine_->sessions().Contains(id)) {  // its state expired
    EraseLocked(it);
    return std::nullopt;
  }
  return it->second;
}

void OpenAiApi::Forget(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stored_.find(id);
  if (it != stored_.end()) EraseLocked(it);
}

OpenAiApi::StoredMap::iterator OpenAiApi::EraseLocked(StoredMap::iterator it) {
  stored_bytes_ -= it->second.bytes;
  return stored_.erase(it);
}

// --- Sessions ---

json OpenAiApi::SessionJson(const ModelSessionInfo& info) const {
  return {{"id", info.session_id},
          {"object", "session"},
          {"model", info.model},
          {"position", info.position},
          {"state_bytes", info.state_bytes}};
}

void OpenAiApi::Route(httplib::Server& server) {
  // Every handler counts as a call in flight while it runs, and runs for
  // the tenant its key names (401 without one when keys are on).
  struct Counted {
    httplib::Server& server;
    CallGate* gate;
    using Handler = std::function<void(const httplib::Request&,
                                       httplib::Response&, const Tenant&)>;
    httplib::Server::Handler Wrap(Handler h) {
      return [gate = gate, h = std::move(h)](const httplib::Request& req,
                                             httplib::Response& res) {
        std::shared_ptr<void> in_flight = gate->Track();
        auto tenant = AuthenticateHttp(gate->keys(), req, res);
        if (!tenant.ok()) return;
        h(req, res, *tenant);
      };
    }
    void Get(const std::string& p, Handler h) {
      server.Get(p, Wrap(std::move(h)));
    }
    void Post(const std::string& p, Handler h) {
      server.Post(p, Wrap(std::move(h)));
    }
    void Delete(const std::string& p, Handler h) {
      server.Delete(p, Wrap(std::move(h)));
    }
  } s{server, gate_};
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
  s.Get(R"(/v1/responses/([^/]+))",
        [this](const httplib::Request& req, httplib::Response& res,
               const Tenant& tenant) {
          auto stored = Stored(req.matches[1], tenant);
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
    if (!Stored(id, tenant)) {
      return SendError(
          res, 404, absl::StrCat("no stored response '", ToValidUtf8(id), "'"),
          "response_id", "not_found");
    }
    Forget(id);
    absl::Status st = DeleteAndWait(*engine_, id, tenant);
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
      return SendStatus(res, st);
    }
    SendJson(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
  });
  RouteSessions(s);
}

template <typename Routes>
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
    Forget(id);
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
    std::vector<int32_t> tokens;
    if (body.contains("prompt") && body["prompt"].is_string()) {
      auto encoded =
          (*model)->tokenizer().Encode(body["prompt"].get<std::string>());
      if (!encoded.ok()) {
        return SendError(res, 400,
                         absl::StrCat("prompt: ", encoded.status().message()),
                         "prompt");
      }
      tokens = std::move(*encoded);
    } else if (body.contains("prompt") && body["prompt"].is_array()) {
      const uint32_t vocab = (*model)->tokenizer().size();
      for (size_t i = 0; i < body["prompt"].size(); ++i) {
        const json& t = body["prompt"][i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= int64_t(vocab)) {
          return SendError(res, 400,
                           absl::StrCat("prompt[", i, "]: not a token id of ",
                                        "the model (0 to ", vocab - 1, ")"),
                           "prompt");
        }
        tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    }
    if (tokens.empty()) {
      return SendError(
          res, 400, "prompt: text or token ids to append, not empty", "prompt");
    }
    if (absl::Status st =
            gate_->limiter().Take(tenant, static_cast<double>(tokens.size()));
        !st.ok()) {
      return SendStatus(res, st);
    }
    auto info = AppendAndWait(*engine_, id, std::move(tokens), tenant);
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
