// ChatTemplate: chat messages → the text a model continues (docs/design.md
// §3, "Chat templates").
//
// A model directory may name its template in tokenizer_config.json or
// chat_template.json ("chat_template", as Hugging Face writes it). Those are
// Jinja programs; linattn does not run Jinja, so it recognises the one
// family it renders exactly, ChatML (a template using <|im_start|> and
// <|im_end|>), and otherwise uses its plain template, saying why:
//
//   plain:   "<|{role}|>\n{content}<|end|>\n" per message, then the
//            generation prompt "<|assistant|>\n"; a reply ends at "<|end|>"
//   chatml:  "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//            "<|im_start|>assistant\n"; a reply ends at "<|im_end|>"
// (role: system, user or assistant; OpenAI's "developer" is system). A
// reply stops before its end-of-turn marker, whose text the model produced
// and the context keeps; messages that continue the conversation then
// begin with the newline after it (or, after a reply cut short, with the
// marker itself).
#ifndef LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_
#define LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace linattn {

struct ChatMessage {
  std::string role;  // system | developer | user | assistant
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kPlain, kChatMl };

  // The template of the model in `dir`; `note` (if given) says which file
  // gave it, or why the plain one is used.
  static ChatTemplate ForModelDir(const std::string& dir,
                                  std::string* note = nullptr);
  static ChatTemplate Plain() { return ChatTemplate(Kind::kPlain); }
  static ChatTemplate ChatMl() { return ChatTemplate(Kind::kChatMl); }

  Kind kind() const { return kind_; }
  const char* name() const {
    return kind_ == Kind::kPlain ? "plain" : "chatml";
  }

  // What the messages follow in the context.
  enum class After {
    kNothing,    // a new conversation
    kEndOfTurn,  // a reply that ended at its end-of-turn marker
    kCutReply,   // a reply that ended without it (length, eos, cancel)
  };
  // The messages as the model reads them, then the generation prompt.
  // INVALID_ARGUMENT naming messages[i].role for a role it does not know.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     After after) const;
  // The end-of-turn marker: a reply's generation stops at it.
  std::string end_of_turn() const;

 private:
  explicit ChatTemplate(Kind kind) : kind_(kind) {}
  Kind kind_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_
