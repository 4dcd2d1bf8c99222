#include "core/model/chat_template.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/file_io.h"
#include "nlohmann/json.hpp"

namespace linattn {

namespace {

using ordered_json = nlohmann::ordered_json;

// A template file's "chat_template", if it holds one as a string (a list
// of named templates gives the one named "default"); *error says why a
// file that exists cannot be read.
std::string TemplateText(const std::string& path, std::string* error,
                         std::string* tool_use) {
  if (!std::ifstream(path).good()) return "";
  auto text = ReadWholeFile("chat template", path);
  if (!text.ok()) {
    *error = std::string(text.status().message());
    return "";
  }
  const ordered_json j = ordered_json::parse(*text, nullptr, false);
  if (j.is_discarded()) {
    *error = absl::StrCat(path, ": not valid JSON");
    return "";
  }
  if (!j.is_object() || !j.contains("chat_template")) return "";
  const ordered_json& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    std::string found;
    for (const ordered_json& item : t) {
      if (!item.is_object() || !item.contains("name") ||
          !item.contains("template") || !item["template"].is_string()) {
        continue;
      }
      if (item["name"] == "default") found = item["template"];
      if (item["name"] == "tool_use") *tool_use = item["template"];
    }
    if (!found.empty()) return found;
    *error = absl::StrCat(path,
                          ": chat_template: a list of templates with none "
                          "named \"default\"");
  }
  return "";
}

// The special tokens tokenizer_config.json names (bos_token, eos_token,
// unk_token, pad_token … as strings or AddedToken objects), the values
// apply_chat_template passes to the template.
jinja::Dict SpecialTokens(const std::string& dir) {
  jinja::Dict out;
  const std::string path = dir + "/tokenizer_config.json";
  if (!std::ifstream(path).good()) return out;
  auto text = ReadWholeFile("tokenizer config", path);
  if (!text.ok()) return out;
  const ordered_json j = ordered_json::parse(*text, nullptr, false);
  if (!j.is_object()) return out;
  for (const auto& [key, value] : j.items()) {
    if (!absl::EndsWith(key, "_token")) continue;
    if (value.is_string()) {
      out.Set(key, jinja::Value::String(value.get<std::string>()));
    } else if (value.is_object() && value.contains("content") &&
               value["content"].is_string()) {
      out.Set(key, jinja::Value::String(value["content"].get<std::string>()));
    }
  }
  return out;
}

}  // namespace

// BlinkDL's clean_txt: \r\n → \n, every run of two or more newlines → one,
// then Python's str.strip() (whitespace at both ends), so that no turn holds
// the blank line that ends one.
std::string CleanRwkvTurn(absl::string_view text) {
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    lf.push_back(text[i]);
  }
  std::string out;
  out.reserve(lf.size());
  for (size_t i = 0; i < lf.size(); ++i) {
    if (lf[i] == '\n' && i > 0 && lf[i - 1] == '\n') continue;
    out.push_back(lf[i]);
  }
  // str.strip() at the ASCII characters Python counts as whitespace
  // (\x1c-\x1f among them); Unicode spaces at the ends (U+00A0, U+2000 …)
  // are kept.
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f' || (c >= '\x1c' && c <= '\x1f');
  };
  size_t b = 0, e = out.size();
  while (b < e && space(out[b])) ++b;
  while (e > b && space(out[e - 1])) --e;
  return out.substr(b, e - b);
}

ChatTemplate ChatTemplate::FromJinja(absl::string_view source,
                                     std::string origin,
                                     jinja::Dict special_tokens) {
  auto parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) {
    ChatTemplate t(Kind::kRefused);
    t.origin_ = origin;
    t.refusal_ = absl::StrCat("the chat template of ", origin, " (",
                              parsed.status().message(), ")");
    return t;
  }
  ChatTemplate t(Kind::kJinja);
  t.origin_ = std::move(origin);
  t.tool_call_tags_ = absl::StrContains(source, "<tool_call>");
  t.jinja_ = std::move(*parsed);
  if (const jinja::Value* eos = special_tokens.Find("eos_token");
      eos != nullptr && eos->is_string()) {
    t.eos_token_ = eos->as_string();
  }
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

ChatTemplate ChatTemplate::ForModelDir(const std::string& dir,
                                       std::string* note, Kind fallback) {
  std::string error;
  std::string source, origin, tool_use;
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (std::ifstream(jinja_path).good()) {
    auto text = ReadWholeFile("chat template", jinja_path);
    if (text.ok()) {
      source = *text;
      origin = "chat_template.jinja";
    } else {
      error = std::string(text.status().message());
    }
  }
  for (const char* file : {"chat_template.json", "tokenizer_config.json"}) {
    if (!source.empty() || !error.empty()) break;
    source = TemplateText(absl::StrCat(dir, "/", file), &error, &tool_use);
    if (!source.empty()) origin = file;
  }
  if (!error.empty()) {
    ChatTemplate t(Kind::kRefused);
    t.refusal_ = error;
    if (note) *note = absl::StrCat("refused: ", error);
    return t;
  }
  if (source.empty()) {
    const ChatTemplate own(fallback == Kind::kRwkv || fallback == Kind::kChatMl
                               ? fallback
                               : Kind::kPlain);
    if (note) {
      *note = absl::StrCat(own.name(), ": the model names no chat template",
                           own.kind_ == Kind::kRwkv
                               ? " (RWKV's User:/Assistant: convention)"
                               : "");
    }
    return own;
  }
  ChatTemplate t = FromJinja(source, origin, SpecialTokens(dir));
  if (!tool_use.empty() && t.kind_ == Kind::kJinja) {
    // transformers renders requests with tools with this one instead.
    ChatTemplate with_tools =
        FromJinja(tool_use, absl::StrCat(origin, " (tool_use)"), {});
    if (with_tools.kind_ == Kind::kJinja) {
      t.tool_use_ = with_tools.jinja_;
      t.tool_call_tags_ |= with_tools.tool_call_tags_;
    } else {
      t.tool_use_refusal_ = with_tools.refusal_;
    }
  }
  if (note) {
    *note = t.kind_ == Kind::kJinja ? absl::StrCat("jinja, from ", origin)
                                    : absl::StrCat("refused: ", t.refusal_);
  }
  return t;
}

const char* ChatTemplate::name() const {
  switch (kind_) {
    case Kind::kPlain:
      return "plain";
    case Kind::kChatMl:
      return "chatml";
    case Kind::kRwkv:
      return "rwkv";
    case Kind::kJinja:
      return "jinja";
    case Kind::kRefused:
      return "refused";
  }
  return "?";
}

absl::Status ChatTemplate::Usable() const {
  if (kind_ != Kind::kRefused) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this model's chat endpoints are unavailable: linattn does not render ",
      refusal_));
}

absl::StatusOr<std::string> ChatTemplate::RenderJinja(
    const std::vector<ChatMessage>& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& tools) const {
  // The values apply_chat_template passes: the special tokens, then
  // messages, tools, documents and add_generation_prompt.
  jinja::Dict context = special_tokens_;
  std::vector<jinja::Value> list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.Set("role",
          jinja::Value::String(m.role == "developer" ? "system" : m.role));
    d.Set("content", m.content_null ? jinja::Value::None()
                                    : jinja::Value::String(m.content));
    if (!m.tool_calls.is_null()) {
      d.Set("tool_calls", jinja::Value::FromJson(m.tool_calls));
    }
    if (!m.tool_call_id.empty()) {
      d.Set("tool_call_id", jinja::Value::String(m.tool_call_id));
    }
    if (!m.name.empty()) d.Set("name", jinja::Value::String(m.name));
    list.push_back(jinja::Value::DictOf(std::move(d)));
  }
  context.Set("messages", jinja::Value::List(std::move(list)));
  context.Set("tools", tools.is_null() ? jinja::Value::None()
                                       : jinja::Value::FromJson(tools));
  context.Set("documents", jinja::Value::None());
  context.Set("add_generation_prompt",
              jinja::Value::Bool(add_generation_prompt));
  auto out =
      (!tools.is_null() && tool_use_ ? tool_use_ : jinja_)->Render(context);
  if (out.ok()) return out;
  switch (out.status().code()) {
    case absl::StatusCode::kFailedPrecondition:  // raise_exception
      return absl::InvalidArgumentError(
          absl::StrCat("messages: the model's chat template (", origin_,
                       ") refuses them: ", out.status().message()));
    case absl::StatusCode::kResourceExhausted:
      return absl::ResourceExhaustedError(
          absl::StrCat("messages: the model's chat template (", origin_, ") ",
                       out.status().message()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("messages: the model's chat template (", origin_,
                       ") fails on them: ", out.status().message()));
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(
    const std::vector<ChatMessage>& messages, After after,
    const std::vector<ChatMessage>* history,
    const nlohmann::ordered_json& tools) const {
  const bool own = kind_ == Kind::kJinja || kind_ == Kind::kRefused;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "developer" && role != "user" &&
        role != "assistant" && !(own && role == "tool")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].role: must be system, developer, user",
          own ? ", assistant or tool" : " or assistant", ", got '", role, "'",
          own ? "" : " (linattn's own chat template has no tool turns)"));
    }
    if (!own && !messages[i].tool_calls.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i,
          "].tool_calls: this model has no chat template of its own, and "
          "linattn's has no tool format"));
    }
  }
  if (!tools.is_null() && !tool_use_refusal_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tools: linattn does not render ", tool_use_refusal_));
  }
  if (!own && !tools.is_null()) {
    return absl::InvalidArgumentError(
        "tools: this model has no chat template of its own, and linattn's has "
        "no tool format");
  }
  if (kind_ == Kind::kRefused) return Usable();
  if (kind_ == Kind::kJinja) {
    if (after == After::kNothing) return RenderJinja(messages, true, tools);
    if (history == nullptr) {
      return absl::FailedPreconditionError(
          "this model's chat template renders whole conversations: "
          "continue it with the whole conversation (no session)");
    }
    if (history->empty() || history->back().role != "assistant") {
      return absl::InvalidArgumentError(
          "a continued conversation's history ends with the assistant's "
          "reply");
    }
    // What the context holds: the prompt the history's last reply
    // answered, the reply as the model wrote it, and its end-of-turn
    // marker when the reply ended there.
    const std::vector<ChatMessage> asked(history->begin(), history->end() - 1);
    auto prompt = RenderJinja(asked, true, tools);
    if (!prompt.ok()) return prompt.status();
    std::string held = *prompt + history->back().content;
    if (after == After::kEndOfTurn) held += end_of_turn();
    std::vector<ChatMessage> all = *history;
    all.insert(all.end(), messages.begin(), messages.end());
    auto whole = RenderJinja(all, true, tools);
    if (!whole.ok()) return whole.status();
    if (!absl::StartsWith(*whole, held)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model's chat template (", origin_,
          ") writes the conversation so far differently once it goes on, so "
          "the continuation cannot be sent as new text: send the whole "
          "conversation"));
    }
    return whole->substr(held.size());
  }
  if (kind_ == Kind::kRwkv) return RenderRwkv(messages, after);
  const bool plain = kind_ == Kind::kPlain;
  std::string out;
  if (after == After::kCutReply) out = end_of_turn();
  if (after != After::kNothing) out += "\n";
  for (const ChatMessage& m : messages) {
    const std::string role = m.role == "developer" ? "system" : m.role;
    absl::StrAppend(&out, plain ? "<|" : "<|im_start|>", role,
                    plain ? "|>\n" : "\n", m.content, end_of_turn(), "\n");
  }
  absl::StrAppend(&out, plain ? "<|assistant|>\n" : "<|im_start|>assistant\n");
  return out;
}

std::string ChatTemplate::RenderRwkv(const std::vector<ChatMessage>& messages,
                                     After after) {
  // After a reply that ended at its "\n\n" the next turn follows at once;
  // after one cut short, the blank line comes first.
  std::string out = after == After::kCutReply ? "\n\n" : "";
  for (const ChatMessage& m : messages) {
    const absl::string_view role = m.role == "user"        ? "User"
                                   : m.role == "assistant" ? "Assistant"
                                                           : "System";
    absl::StrAppend(&out, role, ": ", CleanRwkvTurn(m.content), "\n\n");
  }
  out += "Assistant:";
  return out;
}

std::string ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::kPlain:
      return "<|end|>";
    case Kind::kChatMl:
      return "<|im_end|>";
    case Kind::kRwkv:
      return "\n\n";
    default:
      return eos_token_;
  }
}

}  // namespace linattn
