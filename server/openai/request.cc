#include "server/openai/request.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/util/json_depth.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"

namespace linattn {

using Kind = CompletionRun::Kind;

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

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

namespace {

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

// The seed a request gives, or a random one.
absl::Status ReadSeed(const json& body, SamplingParams& params) {
  if (!body.contains("seed") || body["seed"].is_null()) {
    params.seed =
        (uint64_t{std::random_device()()} << 32) | std::random_device()();
    return absl::OkStatus();
  }
  if (!body["seed"].is_number_integer()) {
    return FieldError("seed", "must be an integer");
  }
  params.seed = body["seed"].is_number_unsigned()
                    ? body["seed"].get<uint64_t>()
                    : static_cast<uint64_t>(body["seed"].get<int64_t>());
  return absl::OkStatus();
}

absl::Status ReadStops(const json& body, SamplingParams& params) {
  if (!body.contains("stop") || body["stop"].is_null()) {
    return absl::OkStatus();
  }
  const json& stop = body["stop"];
  if (stop.is_string()) {
    params.stop.push_back(stop.get<std::string>());
  } else if (stop.is_array() && stop.size() <= kMaxStops) {
    for (const json& s : stop) {
      if (!s.is_string()) return FieldError("stop", "strings only");
      params.stop.push_back(s.get<std::string>());
    }
  } else {
    return FieldError("stop", absl::StrCat("a string or an array of at most ",
                                           kMaxStops, " strings"));
  }
  for (const std::string& s : params.stop) {
    if (s.empty()) return FieldError("stop", "must not be empty");
  }
  return absl::OkStatus();
}

// Logprobs: an integer (completions: how many alternatives) or a boolean
// with top_logprobs (chat); completions' echo.
absl::Status ReadLogprobs(const json& body, CompletionRun& r) {
  if (r.kind == Kind::kCompletion) {
    double logprobs = -1;
    LINATTN_RETURN_IF_ERROR(
        ReadNumber(body, "logprobs", 0, kMaxTopLogprobs, true, &logprobs));
    if (logprobs >= 0) {
      r.logprobs = true;
      r.params.top_logprobs = static_cast<uint32_t>(logprobs);
    }
    LINATTN_RETURN_IF_ERROR(ReadBool(body, "echo", &r.echo));
  } else if (r.kind == Kind::kChat) {
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
  return absl::OkStatus();
}

// OpenAI's penalties, and llama.cpp's and vLLM's extensions (sampler.h).
absl::Status ReadPenalties(const json& body, SamplingParams& params) {
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
  params.presence_penalty = static_cast<float>(presence);
  params.frequency_penalty = static_cast<float>(frequency);
  params.repetition_penalty = static_cast<float>(repetition);
  params.min_p = static_cast<float>(min_p);
  params.penalty_last_n = static_cast<int32_t>(last_n);
  return absl::OkStatus();
}

// OpenAI fields linattn does not implement, refused unless they ask for
// nothing.
absl::Status RefuseUnsupported(const json& body, Kind kind) {
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
  if (kind != Kind::kChat && body.contains("tools") &&
      !body["tools"].is_null() &&
      !(body["tools"].is_array() && body["tools"].empty())) {
    return FieldError("tools", kind == Kind::kResponse
                                   ? "tools are read by /v1/chat/completions"
                                   : "a completion has no tools (chat has)");
  }
  if (body.contains("user") && !body["user"].is_null() &&
      !body["user"].is_string()) {
    return FieldError("user", "must be a string");
  }
  return absl::OkStatus();
}

absl::Status ReadStreaming(const json& body, CompletionRun& r) {
  LINATTN_RETURN_IF_ERROR(ReadBool(body, "stream", &r.stream));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) {
      return FieldError("stream_options", "must be an object");
    }
    if (!r.stream) return FieldError("stream_options", "needs stream: true");
    LINATTN_RETURN_IF_ERROR(ReadBool(so, "include_usage", &r.include_usage));
  }
  return absl::OkStatus();
}

// A whole answer is held until it is complete: bounded, so that one
// request cannot take the server's memory (a stream holds nothing).
absl::Status BoundHeldAnswer(const char* max_field, const CompletionRun& r) {
  if (r.stream || r.kind == Kind::kResponse) return absl::OkStatus();
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
        max_field, absl::StrCat("an answer that is not streamed holds at most ",
                                kMaxHeldLogprobs,
                                " log-probabilities (n × max_tokens × (1 + top "
                                "logprobs)); stream it for more"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// An assistant message's tool_calls: [{id, type: "function", function:
// {name, arguments}}], arguments a JSON text (OpenAI) or object, given to
// the template as an object (what transformers' templates expect).
absl::StatusOr<ordered_json> ReadToolCalls(const ordered_json& calls,
                                           const std::string& field) {
  if (!calls.is_array()) return FieldError(field, "must be an array");
  ordered_json out = ordered_json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const ordered_json& c = calls[j];
    const std::string name = absl::StrCat(field, "[", j, "]");
    if (!c.is_object() || !c.contains("function") ||
        !c["function"].is_object()) {
      return FieldError(name,
                        "a call is {\"type\": \"function\", "
                        "\"function\": {\"name\": …, \"arguments\": …}}");
    }
    if (c.contains("type") && c["type"] != "function") {
      return FieldError(absl::StrCat(name, ".type"), "must be \"function\"");
    }
    const ordered_json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) {
      return FieldError(absl::StrCat(name, ".function.name"),
                        "required, a string");
    }
    ordered_json arguments = ordered_json::object();
    if (f.contains("arguments") && !f["arguments"].is_null()) {
      const ordered_json& a = f["arguments"];
      if (a.is_string()) {
        const std::string text = a.get<std::string>();
        if (!JsonDepthWithin(text, kMaxJsonDepth)) {
          return FieldError(
              absl::StrCat(name, ".function.arguments"),
              absl::StrCat("nests deeper than ", kMaxJsonDepth, " levels"));
        }
        arguments = ordered_json::parse(text, nullptr, false);
        if (arguments.is_discarded() || !arguments.is_object()) {
          return FieldError(absl::StrCat(name, ".function.arguments"),
                            "is not the JSON text of an object");
        }
      } else if (a.is_object()) {
        arguments = a;
      } else {
        return FieldError(absl::StrCat(name, ".function.arguments"),
                          "a JSON object, or its text");
      }
    }
    ordered_json call = {
        {"type", "function"},
        {"function", {{"name", f["name"]}, {"arguments", arguments}}}};
    if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ReadMessages(const ordered_json& list,
                                                      const char* field,
                                                      bool tool_turns) {
  if (!list.is_array() || list.empty()) {
    return FieldError(field, "must be a non-empty array of messages");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const ordered_json& m = list[i];
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return FieldError(absl::StrCat(name, ".role"),
                        "each message is an object with a role");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" &&
        role != "assistant" && !(tool_turns && role == "tool")) {
      return FieldError(
          absl::StrCat(name, ".role"),
          absl::StrCat("must be system, developer, user",
                       tool_turns ? ", assistant or tool" : " or assistant",
                       ", got '", ToValidUtf8(role), "'"));
    }
    if (m.contains("type") && m["type"] != "message") {
      return FieldError(absl::StrCat(name, ".type"),
                        "only message items are supported");
    }
    ChatMessage message;
    message.role = role;
    LINATTN_ASSIGN_OR_RETURN(
        message.content,
        ContentText(m.contains("content") ? json(m["content"]) : json(nullptr),
                    absl::StrCat(name, ".content")));
    message.content_null = !m.contains("content") || m["content"].is_null();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!tool_turns) {
        return FieldError(absl::StrCat(name, ".tool_calls"),
                          "tool calls are read by /v1/chat/completions");
      }
      if (role != "assistant") {
        return FieldError(absl::StrCat(name, ".tool_calls"),
                          "only an assistant message makes tool calls");
      }
      LINATTN_ASSIGN_OR_RETURN(
          message.tool_calls,
          ReadToolCalls(m["tool_calls"], absl::StrCat(name, ".tool_calls")));
    }
    for (const char* key : {"tool_call_id", "name"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) {
        return FieldError(absl::StrCat(name, ".", key), "must be a string");
      }
      (std::string(key) == "name" ? message.name : message.tool_call_id) =
          m[key].get<std::string>();
    }
    out.push_back(std::move(message));
  }
  return out;
}

absl::Status ReadTools(const ordered_json& body, CompletionRun& r) {
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ordered_json& tools = body["tools"];
    if (!tools.is_array()) return FieldError("tools", "must be an array");
    for (size_t i = 0; i < tools.size(); ++i) {
      const ordered_json& t = tools[i];
      const std::string name = absl::StrCat("tools[", i, "]");
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
          !t.contains("function") || !t["function"].is_object()) {
        return FieldError(name,
                          "a tool is {\"type\": \"function\", "
                          "\"function\": {\"name\": …, …}}");
      }
      if (!t["function"].contains("name") ||
          !t["function"]["name"].is_string()) {
        return FieldError(absl::StrCat(name, ".function.name"),
                          "required, a string");
      }
    }
    if (!tools.empty()) r.tools = tools;
  }
  r.tool_choice = r.tools.is_null() ? "none" : "auto";
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ordered_json& choice = body["tool_choice"];
    if (!choice.is_string() ||
        (choice != "auto" && choice != "none" && choice != "required")) {
      return FieldError("tool_choice",
                        "\"auto\" or \"none\" (a named function is not "
                        "supported: linattn does not constrain decoding)");
    }
    if (choice == "required") {
      return FieldError("tool_choice",
                        "\"required\" is not supported: linattn does not "
                        "constrain decoding (\"auto\" lets the model call)");
    }
    r.tool_choice = choice.get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const json& ids,
                                                  const char* field,
                                                  uint32_t vocab,
                                                  absl::string_view what,
                                                  absl::string_view tail) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& t = ids[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= int64_t(vocab)) {
      return InvalidParam(field, absl::StrCat(field, "[", i, "]: ", what,
                                              " (0 to ", vocab - 1, ")", tail));
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

absl::Status ReadSampling(const json& body, uint32_t max_choices,
                          CompletionRun& r) {
  double temperature = 1.0, top_p = 1.0, top_k = 0, n = 1;
  double max_tokens = r.kind == Kind::kCompletion ? 16 : kDefaultChatMaxTokens;
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "temperature", 0, 2, false, &temperature));
  LINATTN_RETURN_IF_ERROR(ReadNumber(body, "top_p", 0, 1, false, &top_p));
  if (top_p == 0) return FieldError("top_p", "must be > 0");
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, "top_k", 0, r.model->tokenizer().size(), true, &top_k));
  const char* max_field = r.kind == Kind::kResponse ? "max_output_tokens"
                          : body.contains("max_completion_tokens")
                              ? "max_completion_tokens"
                              : "max_tokens";
  LINATTN_RETURN_IF_ERROR(
      ReadNumber(body, max_field, 1, kMaxGenerateTokens, true, &max_tokens));
  if (r.kind != Kind::kResponse) {
    LINATTN_RETURN_IF_ERROR(ReadNumber(body, "n", 1, max_choices, true, &n));
  }
  r.params.temperature = static_cast<float>(temperature);
  r.params.top_p = static_cast<float>(top_p);
  r.params.top_k = static_cast<uint32_t>(top_k);
  r.params.max_tokens = static_cast<uint32_t>(max_tokens);
  r.n = static_cast<uint32_t>(n);
  LINATTN_RETURN_IF_ERROR(ReadSeed(body, r.params));
  LINATTN_RETURN_IF_ERROR(ReadStops(body, r.params));
  LINATTN_RETURN_IF_ERROR(ReadLogprobs(body, r));
  LINATTN_RETURN_IF_ERROR(ReadPenalties(body, r.params));
  LINATTN_RETURN_IF_ERROR(RefuseUnsupported(body, r.kind));
  LINATTN_RETURN_IF_ERROR(ReadStreaming(body, r));
  return BoundHeldAnswer(max_field, r);
}

absl::Status ReadCompletionPrompt(const json& body, const Tokenizer& tokenizer,
                                  CompletionRun& r) {
  if (!body.contains("prompt")) return FieldError("prompt", "required");
  json prompt = body["prompt"];
  // One prompt per request: a list of one prompt (text or ids) is it.
  if (prompt.is_array() && prompt.size() == 1 &&
      (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = json(prompt[0]);
  }
  if (prompt.is_string()) {
    r.prompt_text = prompt.get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt.is_array()) {
    return FieldError("prompt", "a string or an array of token ids");
  }
  LINATTN_ASSIGN_OR_RETURN(
      r.prompt, ReadTokenIds(prompt, "prompt", tokenizer.size(),
                             "a prompt array holds token ids of the model",
                             "; one prompt per request (n gives several "
                             "completions)"));
  // For echo: a new text as the tokenizer decodes it; ids that continue a
  // session's text as their pieces (a leading space is theirs).
  r.prompt_text = r.session_id.empty() ? tokenizer.Decode(r.prompt)
                                       : tokenizer.Pieces(r.prompt);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatMessage>> ReadResponseInput(
    const json& body, const std::string& instructions) {
  if (!body.contains("input")) return FieldError("input", "required");
  std::vector<ChatMessage> messages;
  if (!instructions.empty()) messages.push_back({"system", instructions});
  if (body["input"].is_string()) {
    messages.push_back({"user", body["input"].get<std::string>()});
    return messages;
  }
  LINATTN_ASSIGN_OR_RETURN(std::vector<ChatMessage> items,
                           ReadMessages(ordered_json(body["input"]), "input",
                                        /*tool_turns=*/false));
  messages.insert(messages.end(), items.begin(), items.end());
  return messages;
}

absl::Status EncodePrompt(const Tokenizer& tokenizer, const char* field,
                          CompletionRun& r) {
  if (!r.prompt.empty() || r.prompt_text.empty()) return absl::OkStatus();
  // A completion that starts a context gets what the tokenizer puts at the
  // start of a text (tokenizer.json's post-processor: a BOS, say), as
  // transformers' and vLLM's completions do; text that continues a session
  // does not, and a chat template writes its own.
  const bool starts = r.kind == Kind::kCompletion && r.session_id.empty();
  auto tokens = starts ? tokenizer.EncodeStart(r.prompt_text)
                       : tokenizer.Encode(r.prompt_text);
  if (!tokens.ok()) return FieldError(field, tokens.status().message());
  r.prompt = std::move(*tokens);
  return absl::OkStatus();
}

absl::Status CheckCompletion(const CompletionRun& r) {
  if (r.n > 1 && !r.session_id.empty()) {
    return FieldError("n",
                      "one choice per request with session_id (fork the "
                      "session for branches: POST /v1/sessions/{id}/fork)");
  }
  if (r.echo && r.logprobs) {
    return FieldError("echo",
                      "with logprobs it would need the prompt's "
                      "log-probabilities, which linattn does not compute");
  }
  if (r.prompt.empty() && r.session_id.empty()) {
    return FieldError("prompt",
                      "must not be empty (the model needs a context to "
                      "continue)");
  }
  return absl::OkStatus();
}

}  // namespace linattn
