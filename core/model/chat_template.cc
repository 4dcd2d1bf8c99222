#include "core/model/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/file_io.h"
#include "nlohmann/json.hpp"

namespace linattn {

namespace {

// A template file's "chat_template", if it holds one as a string (a list
// of named templates takes the one named "default").
std::string TemplateText(const std::string& path) {
  auto text = ReadWholeFile("chat template", path);
  if (!text.ok()) return "";
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("chat_template")) return "";
  const nlohmann::json& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const nlohmann::json& item : t) {
      if (item.is_object() && item.value("name", "") == "default" &&
          item.contains("template") && item["template"].is_string()) {
        return item["template"].get<std::string>();
      }
    }
  }
  return "";
}

}  // namespace

ChatTemplate ChatTemplate::ForModelDir(const std::string& dir,
                                       std::string* note) {
  for (const char* file : {"chat_template.json", "tokenizer_config.json"}) {
    const std::string text = TemplateText(absl::StrCat(dir, "/", file));
    if (text.empty()) continue;
    if (absl::StrContains(text, "<|im_start|>") &&
        absl::StrContains(text, "<|im_end|>")) {
      if (note) *note = absl::StrCat("chatml, from ", file);
      return ChatMl();
    }
    if (note) {
      *note = absl::StrCat(
          "plain: the chat_template of ", file,
          " is a Jinja program linattn does not render (it renders ChatML)");
    }
    return Plain();
  }
  if (note) *note = "plain: the model names no chat template";
  return Plain();
}

absl::StatusOr<std::string> ChatTemplate::Render(
    const std::vector<ChatMessage>& messages, After after) const {
  const bool plain = kind_ == Kind::kPlain;
  std::string out;
  if (after == After::kCutReply) out = end_of_turn();
  if (after != After::kNothing) out += "\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string role = messages[i].role;
    if (role == "developer") role = "system";  // OpenAI's newer name
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i,
                       "].role: must be system, developer, user or "
                       "assistant, got '",
                       role, "'"));
    }
    absl::StrAppend(&out, plain ? "<|" : "<|im_start|>", role,
                    plain ? "|>\n" : "\n", messages[i].content, end_of_turn(),
                    "\n");
  }
  absl::StrAppend(&out, plain ? "<|assistant|>\n" : "<|im_start|>assistant\n");
  return out;
}

std::string ChatTemplate::end_of_turn() const {
  return kind_ == Kind::kPlain ? "<|end|>" : "<|im_end|>";
}

}  // namespace linattn
